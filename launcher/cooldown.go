// The cooldown of hosts on which ranks failed: no new rank there for a
// while, longer with each failure in a row.

package launcher

import (
	"strconv"
	"time"
)

// cooldown keeps hosts on which ranks failed from getting new ranks for a
// while, never for good (Horovod's blacklist bans a host for the rest of
// the job, horovod#3264): a host's first failure costs it base, each
// further failure in a row doubles that, up to max. Failures while the
// host is cooling down already are the same incident (a host that dies
// takes all its ranks at once) and do not count again. A host that runs
// for max after its cooldown ended without a failure starts from base
// again. Times are passed in, so tests need no clock.
type cooldown struct {
	base, max time.Duration
	hosts     map[string]*hostCooldown
}

type hostCooldown struct {
	failures int       // in a row
	until    time.Time // no new rank before
}

func newCooldown(base, max time.Duration) *cooldown {
	return &cooldown{base: base, max: max, hosts: map[string]*hostCooldown{}}
}

// failed records a failure on host at now. It returns the host's cooldown
// from now, its failures in a row, and whether this failure started a new
// cooldown (false: the host was cooling down already).
func (c *cooldown) failed(host string, now time.Time) (d time.Duration, failures int, started bool) {
	h := c.hosts[host]
	if h == nil {
		h = &hostCooldown{}
		c.hosts[host] = h
	}
	if now.Before(h.until) {
		return h.until.Sub(now), h.failures, false
	}
	if h.failures > 0 && now.Sub(h.until) >= c.max {
		h.failures = 0 // healthy for a while: forgiven
	}
	h.failures++
	d = c.base
	for i := 1; i < h.failures && d < c.max; i++ {
		d *= 2
	}
	d = min(d, c.max)
	h.until = now.Add(d)
	return d, h.failures, true
}

// until is when host may get new ranks again (zero: now).
func (c *cooldown) until(host string) time.Time {
	if h := c.hosts[host]; h != nil {
		return h.until
	}
	return time.Time{}
}

// ordinal is "1st", "2nd", "3rd", "4th", ...
func ordinal(n int) string {
	suffix := "th"
	if n%100 < 11 || n%100 > 13 {
		switch n % 10 {
		case 1:
			suffix = "st"
		case 2:
			suffix = "nd"
		case 3:
			suffix = "rd"
		}
	}
	return strconv.Itoa(n) + suffix
}
