// Joiners in an elastic job's free slots: how many processes it should
// have, and on which hosts they may start.

package launcher

import (
	"fmt"
	"slices"
	"time"
)

// target is how many processes the job should have running: NP on a fixed
// host list (lost ranks are replaced once their host's cooldown is over,
// so the job grows back to -np), and with a discovery script every slot it
// lists; never more than MaxNP.
func (e *elasticRun) target() int {
	t := e.job.NP
	if e.el.DiscoveryScript != "" {
		t = TotalSlots(e.hosts)
	}
	if e.el.MaxNP > 0 {
		t = min(t, e.el.MaxNP)
	}
	return t
}

// wouldRefill says whether host is still a place for new ranks (for the
// cooldown message: a host the script removed gets none anyway).
func (e *elasticRun) wouldRefill(host string) bool {
	return !e.finishing && slices.ContainsFunc(e.hosts, func(h Host) bool { return h.Name == host })
}

// fill starts joiners on free slots of hosts not cooling down until the
// job has target() processes, and arms the refill timer for the end of
// the earliest cooldown that keeps a free slot empty.
func (e *elasticRun) fill() {
	if !e.registered || e.finishing || e.departures.abortCause() != "" || e.ctx.Err() != nil {
		return
	}
	now := time.Now()
	var wake time.Time
	for e.running < e.target() {
		started := false
		for _, h := range e.hosts {
			if e.perHost[h.Name] >= h.Slots || !e.usable(h.Name) {
				continue
			}
			if u := e.cd.until(h.Name); now.Before(u) {
				if wake.IsZero() || u.Before(wake) {
					wake = u
				}
				continue
			}
			lr := e.freeLocalRank(h.Name)
			if err := e.start(h.Name, -1, lr, e.perHost[h.Name]+1); err != nil {
				e.job.Logf("could not start a joiner on host %s: %v", h.Name, err)
				d, n, ok := e.cd.failed(h.Name, now)
				if ok {
					e.job.Logf("no new rank on host %s for %v (its %s failure in a row)", h.Name, d, ordinal(n))
				}
				// Try again when its cooldown is over.
				if u := e.cd.until(h.Name); wake.IsZero() || u.Before(wake) {
					wake = u
				}
				continue
			}
			p := e.procs[len(e.procs)-1]
			pid := ""
			if !p.remote {
				pid = fmt.Sprintf("pid %d, ", p.cmd.Process.Pid)
			}
			e.job.Logf("started joiner %d%s (%sGORUN_RANK=-1) in a free slot: %d of the job's %d processes run (it joins when the ranks admit it)",
				p.rank, onHost(p.host), pid, e.running, e.target())
			started = true
			break
		}
		if !started {
			break
		}
	}
	if e.running < e.target() && !wake.IsZero() {
		e.refill.Reset(time.Until(wake))
	}
}

// usable says whether gorun can start ranks on host; if not, it says why
// once.
func (e *elasticRun) usable(host string) bool {
	if IsLocalHost(host) || e.lay.listenIP != "127.0.0.1" {
		return true
	}
	if !e.warned[host] {
		e.warned[host] = true
		e.job.Logf("can not start ranks on host %s from the discovery script: the job started on this host only, so its rendezvous listens on 127.0.0.1, which %s can not reach; start the job with --network-interface (or a remote host in the script's first list)", host, host)
	}
	return false
}

// freeLocalRank is the lowest GORUN_LOCAL_RANK no running process on host
// has.
func (e *elasticRun) freeLocalRank(host string) int {
	used := map[int]bool{}
	for _, p := range e.procs {
		if p.hostName == host && !isDone(p) {
			used[p.localRank] = true
		}
	}
	lr := 0
	for used[lr] {
		lr++
	}
	return lr
}
