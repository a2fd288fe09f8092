// The rendezvous' reports in an elastic job (membership epochs, members
// lost, left, sent away), queued by its goroutines and handled in order by
// the run's.

package launcher

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gorun/gorun/p2p"
)

// rdvReport is one of the rendezvous' reports: a process event, an
// established epoch, or a member's announcement that it leaves.
type rdvReport struct {
	proc   *p2p.ProcEvent
	change *p2p.Change
	// leaving: a rank announced that it leaves the job (OnLeave, the
	// start of its Close). The rendezvous calls OnLeave before it confirms
	// the leave, so before the rank's Close returns and the process can
	// exit; its ProcLeft comes when the rank's stream ends, which may be
	// after the exit.
	leaving bool
}

func (e *elasticRun) report(r rdvReport) {
	e.rdvMu.Lock()
	e.rdvQueue = append(e.rdvQueue, r)
	e.rdvMu.Unlock()
	select {
	case e.rdvWake <- struct{}{}:
	default:
	}
}

// procOf is the process whose GORUN_PROC_ID is id (nil: none of this
// run's, e.g. a joiner started by hand).
func (e *elasticRun) procOf(id string) *rankProc {
	n, err := strconv.Atoi(id)
	if err != nil || n < 0 || n >= len(e.procs) || strconv.Itoa(n) != id {
		return nil
	}
	return e.procs[n]
}

// handleRdv handles the rendezvous' reports queued so far, in order.
func (e *elasticRun) handleRdv() {
	e.rdvMu.Lock()
	q := e.rdvQueue
	e.rdvQueue = nil
	e.rdvMu.Unlock()
	for _, r := range q {
		if c := r.change; c != nil {
			// Name hosts as gorun does (the -H or script name, not the
			// host's own name).
			for i := range c.Lost {
				if p := e.procOf(c.Lost[i].Proc); p != nil {
					c.Lost[i].Host = p.hostName
				}
			}
			for i := range c.Joined {
				if p := e.procOf(c.Joined[i].Proc); p != nil {
					c.Joined[i].Host = p.hostName
					p.admitted = true
				}
			}
			line := ChangeLine(*c, func(m p2p.Member) string {
				p := e.procOf(m.Proc)
				if p == nil {
					return ""
				}
				s := "proc " + strconv.Itoa(p.rank)
				if !p.remote && p.cmd != nil && p.cmd.Process != nil {
					s += ", pid " + strconv.Itoa(p.cmd.Process.Pid)
				}
				return s
			})
			if skipped := c.Epoch - e.lastEpoch - 1; skipped > 0 {
				if skipped == 1 {
					line += fmt.Sprintf(" (epoch %d was overtaken by a further change before it was established)", c.Epoch-1)
				} else {
					line += fmt.Sprintf(" (epochs %d to %d were overtaken by further changes before they were established)", e.lastEpoch+1, c.Epoch-1)
				}
			}
			e.lastEpoch = max(e.lastEpoch, c.Epoch)
			e.job.Logf("%s", line)
			continue
		}
		if r.leaving {
			// A rank leaves the job: it is finishing, as the rendezvous
			// takes it too (it sends the waiting joiners away). Unless
			// gorun is stopping a process (its host left the discovery
			// list), which may be the one that leaves, closing cleanly
			// on SIGTERM: then a member's ProcLeft, or an exit 0, says
			// so.
			if !slices.ContainsFunc(e.procs, func(p *rankProc) bool { return p.stopReq.Load() && !isDone(p) }) {
				e.finishing = true
			}
			continue
		}
		ev := r.proc
		p := e.procOf(ev.Member.Proc)
		left := ev.Kind == p2p.ProcLeft || ev.Kind == p2p.ProcLost && strings.HasPrefix(ev.Cause, "closed")
		if left && (p == nil || !stopping(p)) {
			// A member (maybe one started by hand) left cleanly.
			e.finishing = true
		}
		if ev.Kind == p2p.ProcDeparted && ev.Members == 0 {
			// The last member left: nobody would admit a joiner.
			e.finishing = true
		}
		if p == nil {
			who := fmt.Sprintf("rank %d on host %s (started by hand)", ev.Member.Rank, hostOfID(ev.Member.Host))
			switch ev.Kind {
			case p2p.ProcDeparted:
				e.job.Logf("%s left the job (%s): the job goes on with %d rank%s; no step lost", who, ev.Cause, ev.Members, plural(ev.Members))
				e.byHandLeft = append(e.byHandLeft, fmt.Sprintf("%s: %s", who, ev.Cause))
			case p2p.ProcLost:
				e.job.Logf("%s was lost: %s; the job goes on without it (%d members left)", who, ev.Cause, ev.Members)
				e.byHandLost = append(e.byHandLost, fmt.Sprintf("%s: %s", who, ev.Cause))
			}
			continue
		}
		switch {
		case left:
			// It closed cleanly (maybe while the others re-formed): it
			// ends on its own, and may take its time (a final save).
			p.left = true
		case ev.Kind == p2p.ProcLost:
			p.rdvLost, p.rdvLostCause, p.lostAfterLeave = true, ev.Cause, ev.AfterLeave
			if strings.HasPrefix(ev.Cause, "stopped responding") {
				e.endIfStopped(p)
			}
		case ev.Kind == p2p.ProcSentAway:
			p.sentAway, p.sentAwayWhy = true, ev.Cause
		case ev.Kind == p2p.ProcDeparted:
			p.departed = ev.Cause
			if ev.Members == 0 {
				e.job.Logf("%s left the job (%s): it was the last member; the job ends", e.name(p), ev.Cause)
			} else {
				e.job.Logf("%s left the job (%s): the job goes on with %d rank%s; no step lost", e.name(p), ev.Cause, ev.Members, plural(ev.Members))
			}
		}
	}
	e.endStragglers()
}
