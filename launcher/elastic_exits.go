// The exits of an elastic job's processes, and the processes gorun ends:
// a rank lost, finished, left, sent away or failing late; one frozen, or
// one that keeps a finishing job from ending.

package launcher

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// exitedRank handles the exit of a process once the job runs.
func (e *elasticRun) exitedRank(p *rankProc) {
	p.exitHandled = true
	defer e.endStragglers()
	byGorun := p.frozen.Load() // ended by gorun: its exit status is gorun's doing
	switch {
	case p.departed != "":
		// It left the job at a commit (said when the rendezvous let it
		// go): neither finished nor lost, whatever its exit status.
		if p.err != nil {
			e.job.Logf("%s exited with %s after it left the job", e.name(p), errText(p))
		}
		why := p.departed
		if p.stopReq.Load() {
			why += ", as the discovery script dropped its slot"
		} else if d, _, started := e.cd.failed(p.hostName, time.Now()); started && e.wouldRefill(p.hostName) {
			// Its host is probably going away (a drain, a spot VM): no
			// new rank there for a while, as after a failure.
			e.job.Logf("no new rank on host %s for %v (a rank left it; --blacklist-cooldown)", p.hostName, d.Round(time.Millisecond))
		}
		e.departed = append(e.departed, fmt.Sprintf("%s: %s", strings.TrimSuffix(e.name(p), pidSuffix(p)), why))
	case p.stopReq.Load():
		// gorun stopped it (its host left the list): said when stopped.
		if e.job.Verbose {
			e.job.Logf("%s ended (%s)", e.name(p), cmp.Or(errText(p), "exit status 0"))
		}
	case e.cutOff(p):
		// Cut off with its host: said once for the host, and lost.
	case p.err == nil && !byGorun:
		e.finished++
		e.finishing = true
	case e.departures.abortCause() != "":
		// The rendezvous aborted the job: the ranks end because of it, and
		// the summary says why.
	case e.finishing:
		// After the first rank finished, a rank that fails fails the job
		// (as in a fixed-size job), unless gorun ended it, the rendezvous
		// sent it away (a joiner never admitted), or the rendezvous had
		// lost it before the job began to finish. None costs a host a
		// cooldown: no new rank comes any more. The job is finishing as
		// soon as a rank announced its leave (handleRdv), which the
		// rendezvous reports before that rank can exit: a rank that left
		// cleanly and then fails is this case even when its exit is
		// handled before those of the ranks that finished before it (the
		// processes' waits hand exits over in any order).
		how := cmp.Or(errText(p), "exit status 0")
		switch {
		case byGorun:
			e.job.Logf("%s ended after the job had begun to finish: ended by gorun", e.name(p))
		case p.sentAway:
			e.job.Logf("%s ended after the job had begun to finish: %s (a joiner the rendezvous sent away)", e.name(p), how)
		case p.rdvLost && !p.lostAfterLeave:
			e.job.Logf("%s ended after the job had begun to finish: %s (the rendezvous had lost it before: %s)", e.name(p), how, p.rdvLostCause)
		default:
			e.lateFailed = append(e.lateFailed, fmt.Sprintf("%s (%s)", strings.TrimSuffix(e.name(p), pidSuffix(p)), how))
			e.lastLost = p
			e.job.Logf("%s failed after the job had begun to finish: %s; the job fails", e.name(p), how)
		}
	case p.sentAway:
		// A joiner the rendezvous refused (or sent away before admitting
		// it): not a member, so not lost, and no failure of its host.
		e.job.Logf("%s ended (%s): the rendezvous sent it away: %s", e.name(p), cmp.Or(errText(p), "exit status 0"), p.sentAwayWhy)
	default:
		how := cmp.Or(errText(p), "exit status 0")
		if byGorun {
			how = "stopped (SIGSTOP) until the rendezvous lost it, then ended by gorun"
		}
		e.lost = append(e.lost, fmt.Sprintf("%s: %s", strings.TrimSuffix(e.name(p), pidSuffix(p)), how))
		e.lastLost = p
		e.job.Logf("%s was lost: %s; %s", e.name(p), how, e.standing(p, "it"))
		d, n, started := e.cd.failed(p.hostName, time.Now())
		if started && e.wouldRefill(p.hostName) {
			e.job.Logf("no new rank on host %s for %v (its %s failure in a row; the cooldown doubles with each, up to %v)",
				p.hostName, d.Round(time.Millisecond), ordinal(n), e.el.CooldownMax)
		}
	}
	e.fill()
}

// standing says how the job stands once it lost p (it: how to call what
// it lost): it goes on, or waits for joiners below --min-np.
func (e *elasticRun) standing(p *rankProc, it string) string {
	members := e.membersRunning()
	still := fmt.Sprintf("%d still running", members)
	if j := e.waitingJoiners(p); j > 0 {
		still += fmt.Sprintf(" and %d joiner%s not admitted yet", j, plural(j))
	}
	if members >= e.el.MinNP {
		return fmt.Sprintf("the job goes on without %s (%s, --min-np %d)", it, still, e.el.MinNP)
	}
	return fmt.Sprintf("%s, below --min-np %d: the job waits up to --elastic-timeout %v for ranks to join, then fails",
		still, e.el.MinNP, e.el.Timeout)
}

// stopping says whether gorun is ending p on purpose.
func stopping(p *rankProc) bool { return p.stopReq.Load() || p.frozen.Load() }

// membersRunning counts the running processes that are members of the
// job: ranks of epoch 0 and admitted joiners, not those gorun is ending.
func (e *elasticRun) membersRunning() int {
	n := 0
	for _, p := range e.procs {
		if !isDone(p) && !stopping(p) && !p.rdvLost && p.departed == "" && (!p.joiner || p.admitted) {
			n++
		}
	}
	return n
}

// waitingJoiners counts the running joiners not admitted yet (but
// except).
func (e *elasticRun) waitingJoiners(except *rankProc) int {
	n := 0
	for _, p := range e.procs {
		if p != except && !isDone(p) && !stopping(p) && p.joiner && !p.admitted && !p.sentAway {
			n++
		}
	}
	return n
}

// endIfStopped ends p, which the rendezvous lost for its silence, if it is
// a process on this host that is stopped (SIGSTOP, Ctrl-Z, a tracer:
// state T or t in /proc): the job went on without it, and it would
// otherwise keep the job from ending. (A frozen process on another host
// is not seen here: it ends when it runs again and finds itself cut off,
// or when the job finishes, see endStragglers.)
func (e *elasticRun) endIfStopped(p *rankProc) {
	if p.remote || isDone(p) || stopping(p) || !processStopped(p.cmd.Process.Pid) {
		return
	}
	e.endProc(p, fmt.Sprintf("%s is stopped (SIGSTOP) and the rendezvous went on without it: ending it", e.name(p)))
}

// endProc stops p in the background (SIGTERM, SIGKILL after --grace), as
// ended by gorun, saying why (unless why is "").
func (e *elasticRun) endProc(p *rankProc, why string) {
	p.frozen.Store(true)
	if why != "" {
		e.job.Logf("%s", why)
	}
	e.stops.Add(1)
	go func() {
		defer e.stops.Done()
		stopAll([]*rankProc{p}, e.job.Grace)
	}()
}

// endStragglers ends what keeps a finishing job from ending: a process
// the rendezvous lost that still runs (frozen on another host, or cut off
// from the rendezvous and stuck) is ended now; once the rendezvous has no
// member left, whatever still runs --grace later and never left it
// cleanly (a joiner that came too late, a process that never registered)
// is ended then.
//
// Of a remote process gorun sees only its ssh session, which stays open
// when the process has ended on a host cut off by the network (until ssh
// gives up on the host, see SSH.sessionArgs): it is ended without a word,
// and its exit says what it was (cutOff, or ended by gorun).
func (e *elasticRun) endStragglers() {
	if !e.finishing || e.running == 0 {
		return
	}
	for _, p := range e.procs {
		if isDone(p) || stopping(p) || !p.rdvLost {
			continue
		}
		if p.remote {
			e.endProc(p, "")
			continue
		}
		if p.cmd != nil && p.cmd.Process != nil && exitedUnreaped(p.cmd.Process.Pid) {
			continue // its exit comes next, with its cause
		}
		e.endProc(p, fmt.Sprintf("%s still runs after the job began to finish, though the rendezvous lost it (%s): ending it", e.name(p), p.rdvLostCause))
	}
	if !e.emptyArmed && e.rdvMembers() == 0 && e.anyToEnd() {
		e.emptyArmed = true
		e.empty.Reset(e.job.Grace)
	}
}

func (e *elasticRun) anyToEnd() bool {
	return slices.ContainsFunc(e.procs, func(p *rankProc) bool { return !isDone(p) && !stopping(p) && !p.left })
}

// endRemaining ends every process still running --grace after the
// finishing job's last member left the rendezvous (but those that left it
// cleanly: they end on their own).
func (e *elasticRun) endRemaining() {
	for _, p := range e.procs {
		if isDone(p) || stopping(p) || p.left {
			continue
		}
		e.endProc(p, fmt.Sprintf("%s still runs %v after the job's last member left the rendezvous (--grace): ending it", e.name(p), e.job.Grace))
	}
}
