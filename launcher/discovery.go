// The host discovery script of an elastic job: running it, and following
// the host lists it prints.

package launcher

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"syscall"
	"time"
)

// Discover runs a host discovery script once, bounded by timeout, and
// parses what it printed (ParseDiscovery). The error says what went wrong
// and ends with the script's last stderr line, if any.
func Discover(ctx context.Context, script string, timeout time.Duration) ([]Host, error) {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(timeout, DefaultDiscoveryTimeout))
	defer cancel()
	cmd := exec.CommandContext(ctx, script)
	// Its own process group, killed whole on timeout: a script that runs
	// ssh or sleeps must not outlive its run, nor hold its pipes open.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	var out, errb limitedBuffer
	out.max, errb.max = 1<<20, 64<<10
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if cmd.Process != nil {
		// Whatever the script left behind (a background child, an ssh
		// master) goes with it: it must not pile up, one per interval.
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if ctx.Err() == context.DeadlineExceeded {
		return nil, fmt.Errorf("did not finish within %v%s", cmp.Or(timeout, DefaultDiscoveryTimeout), stderrHint(errb.String()))
	}
	if errors.Is(err, exec.ErrWaitDelay) && cmd.ProcessState != nil && cmd.ProcessState.Success() {
		// It exited 0 but left a process holding its output open: what it
		// printed before it exited is the list (the leftover is killed).
		err = nil
	}
	if err != nil {
		return nil, fmt.Errorf("%v%s", err, stderrHint(errb.String()))
	}
	return ParseDiscovery(out.String())
}

func stderrHint(s string) string {
	if l := lastLine(s); l != "" {
		return ": " + l
	}
	return ""
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// discover runs the discovery script every interval and hands each list
// that differs from the last one on; a failed run is logged (once until
// the script works again) and changes nothing.
func (e *elasticRun) discover(ctx context.Context, out chan<- []Host) {
	last := slices.Clone(e.hosts)
	lastErr := ""
	t := time.NewTicker(e.el.DiscoveryInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		hosts, err := Discover(ctx, e.el.DiscoveryScript, e.el.DiscoveryTimeout)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if msg := err.Error(); msg != lastErr {
				e.job.Logf("--host-discovery-script %s failed: %s; keeping the hosts it listed last (%s) and trying again every %v",
					e.el.DiscoveryScript, msg, FormatHosts(last), e.el.DiscoveryInterval)
				lastErr = msg
			}
			continue
		}
		if lastErr != "" {
			e.job.Logf("--host-discovery-script %s works again", e.el.DiscoveryScript)
			lastErr = ""
		}
		if slices.Equal(hosts, last) {
			continue
		}
		last = hosts
		select {
		case out <- hosts:
		case <-ctx.Done():
			return
		}
	}
}

// setHosts takes a new host list from the discovery script: the ranks of
// hosts it no longer lists, and those beyond the slots it lists now
// (newest first), are stopped; free slots get joiners.
func (e *elasticRun) setHosts(hosts []Host) {
	old := e.hosts
	e.hosts = hosts
	e.job.Logf("--host-discovery-script lists %s (was %s)", FormatHosts(hosts), FormatHosts(old))
	slots := map[string]int{}
	for _, h := range hosts {
		slots[h.Name] = h.Slots
	}
	count := map[string]int{}
	var stop []*rankProc
	for _, p := range e.procs {
		if isDone(p) || p.stopReq.Load() {
			continue
		}
		count[p.hostName]++
	}
	for i := len(e.procs) - 1; i >= 0; i-- {
		p := e.procs[i]
		if isDone(p) || p.stopReq.Load() || count[p.hostName] <= slots[p.hostName] {
			continue
		}
		count[p.hostName]--
		stop = append(stop, p)
	}
	for _, p := range stop {
		p.stopReq.Store(true)
		why := "it no longer lists host " + p.hostName
		if slots[p.hostName] > 0 {
			why = fmt.Sprintf("it lists %d slot%s on host %s now", slots[p.hostName], plural(slots[p.hostName]), p.hostName)
		}
		e.job.Logf("stopping %s: %s (the job goes on without it)", e.name(p), why)
		e.stops.Add(1)
		go func() {
			defer e.stops.Done()
			stopAll([]*rankProc{p}, e.job.Grace)
		}()
	}
	e.fill()
}
