// The errors a job ends with, and how they read: a rank that failed a
// fixed-size job (RankError), a job stopped from outside (StoppedError),
// an elastic job that failed as a whole (ElasticError).

package launcher

import (
	"fmt"
	"strconv"
	"strings"
)

// RankError says which rank failed a job and how.
type RankError struct {
	Rank       int
	Host       string   // "" when every rank runs on this host
	PID        int      // of the rank, or of its ssh client for a remote rank
	Status     string   // "exit status 3", "signal: killed", "did not register within 30s"
	LastStderr []string // its last lines of stderr
	// StderrShown says that LastStderr was printed just above (and has not
	// scrolled away), so the message does not repeat it.
	StderrShown bool
	// Same are the other ranks that failed with the same status and the
	// same last stderr lines (rank numbers in them aside): a usage error, or
	// the same bug, is reported once.
	Same []int
	// LeftEarly are the ranks that closed their communicator while the job
	// was still running, e.g. "rank 1 closed its communicator after call
	// #3": the ranks still in later calls failed
	// because of them, so they are named before the rank that failed.
	LeftEarly []string
	// JobCause is the first cause of the job's abort as the rendezvous
	// heard it ("rank 2 (...) stopped responding: no heartbeat within 4s",
	// "rank 1 aborted: ..."), when there was one: the rank named above may
	// only be the first to exit because of it.
	JobCause string
	// Lost is JobCause when it was a rank that stopped responding (a host
	// that died, a rank frozen): that rank, not the first to exit, is the
	// culprit, so the message starts with it, naming its host. Fixed-size
	// jobs only: an elastic job's rendezvous re-forms the job instead, and
	// numbers its members per epoch, not as gorun numbers its processes.
	Lost string
	// Others are the other ranks seen failing at about the same time, e.g.
	// "rank 1 (exit status 1)": when a rank fails cleanly its peers may exit
	// first, so the rank named above is a guess the user can check here.
	Others []string
}

// summaryLines is how many of a rank's last stderr lines the message
// repeats when they are not just above.
const summaryLines = 5

// scrollLines: a rank's last stderr line counts as still on the screen when
// at most this many lines were printed after it.
const scrollLines = 10

func (e *RankError) Error() string {
	var b strings.Builder
	if e.Lost != "" && len(e.LeftEarly) == 0 {
		fmt.Fprintf(&b, "%s, so the job was aborted; then ", e.Lost)
	}
	if len(e.LeftEarly) > 0 {
		fmt.Fprintf(&b, "%s while other ranks were still making collective calls (every rank must make the same calls before Close); then ",
			strings.Join(e.LeftEarly, ", "))
	}
	if e.Host == "" {
		fmt.Fprintf(&b, "rank %d (pid %d) failed: %s", e.Rank, e.PID, e.Status)
	} else {
		fmt.Fprintf(&b, "rank %d on host %s failed: %s", e.Rank, e.Host, e.Status)
	}
	if e.StderrShown && len(e.LastStderr) > 0 {
		b.WriteString(" (its stderr is above)")
	}
	if len(e.Same) > 0 {
		fmt.Fprintf(&b, "; %s failed the same way (%s)", rankList(e.Same), e.Status)
	}
	if e.JobCause != "" && e.Lost == "" && len(e.LeftEarly) == 0 { // a departure or a lost rank is said already
		fmt.Fprintf(&b, "; the job was aborted because %s", e.JobCause)
	}
	if len(e.Others) > 0 {
		fmt.Fprintf(&b, "; also failed: %s", strings.Join(e.Others, ", "))
	}
	if !e.StderrShown && len(e.LastStderr) > 0 {
		fmt.Fprintf(&b, "; its last stderr lines:")
		for _, l := range e.LastStderr[max(0, len(e.LastStderr)-summaryLines):] {
			fmt.Fprintf(&b, "\n    %s", l)
		}
	}
	return b.String()
}

// rankList is "rank 2" or "ranks 1, 2, 3".
func rankList(ranks []int) string {
	s := make([]string, len(ranks))
	for i, r := range ranks {
		s[i] = strconv.Itoa(r)
	}
	if len(s) == 1 {
		return "rank " + s[0]
	}
	return "ranks " + strings.Join(s, ", ")
}

// StoppedError is what Run returns when the job was stopped from outside
// (ctx ended: Ctrl-C, SIGTERM, or gorun's output was closed) rather than by
// a rank failing: every rank was stopped, none is to blame.
type StoppedError struct {
	Cause   error // context.Cause of Run's ctx, or an *OutputClosedError
	NP      int   // ranks in the job
	Stopped int   // ranks that were still running and were stopped
	Killed  int   // of them, how many needed SIGKILL after the grace period
	Joiners int   // elastic jobs: of them, joiners not admitted yet
	// Hidden is how many lines the ranks wrote to stderr while being stopped
	// (the abort errors the stop itself causes), left out of the output
	// (--output-dir keeps them; --verbose shows them).
	Hidden int
}

func (e *StoppedError) Error() string {
	return fmt.Sprintf("stopped: %v; %s", e.Cause, e.Outcome())
}

func (e *StoppedError) Unwrap() error { return e.Cause }

// Outcome says what became of the ranks: "all 4 ranks stopped", ...
func (e *StoppedError) Outcome() string {
	var b strings.Builder
	switch {
	case e.Stopped == e.NP && e.NP == 1:
		b.WriteString("its rank stopped")
	case e.Stopped == e.NP:
		fmt.Fprintf(&b, "all %d ranks stopped", e.NP)
	default:
		fmt.Fprintf(&b, "%d of %d ranks were still running and stopped", e.Stopped, e.NP)
	}
	if e.Joiners > 0 {
		fmt.Fprintf(&b, " (%d of them joiner%s not admitted yet)", e.Joiners, plural(e.Joiners))
	}
	if e.Killed > 0 {
		fmt.Fprintf(&b, " (%d killed after the grace period)", e.Killed)
	}
	if e.Hidden > 0 {
		lines := "lines"
		if e.Hidden == 1 {
			lines = "line"
		}
		fmt.Fprintf(&b, " (--verbose shows the %d stderr %s they wrote while stopping)", e.Hidden, lines)
	}
	return b.String()
}

// ElasticError is why an elastic job failed as a whole: the rendezvous
// aborted it (below --min-np for longer than --elastic-timeout, or a rank
// aborted it), or no rank was left.
type ElasticError struct {
	Cause   string   // the rendezvous' abort cause; "" when no rank was left
	NP      int      // ranks at start
	Started int      // processes started, joiners included
	Lost    []string // "rank 2: killed by signal 9 (SIGKILL)", in order
	Stopped int      // processes gorun stopped because their host left the discovery list
	// Departed: "rank 2: SIGTERM", the ranks that left gracefully at a
	// commit (the job went on without them), in order.
	Departed []string
	// LastStderr: the last stderr lines of the last rank lost, when no
	// rank was left.
	LastStderr []string
	// LateFailed: processes that failed after the job had begun to finish
	// (a rank exited 0), which fails it as it would a fixed-size job;
	// Finished ranks had exited 0.
	LateFailed []string
	Finished   int
}

func (e *ElasticError) Error() string {
	var b strings.Builder
	switch {
	case e.Cause != "":
		fmt.Fprintf(&b, "the rendezvous aborted the elastic job: %s", hostIDRE.ReplaceAllString(e.Cause, "$1"))
	case len(e.LateFailed) > 0:
		fmt.Fprintf(&b, "%s failed after the job had begun to finish, when %d rank%s had exited 0: as in a fixed-size job, that fails the job",
			strings.Join(e.LateFailed, " and "), e.Finished, plural(e.Finished))
	case len(e.Lost) == 0 && len(e.Departed) > 0:
		fmt.Fprintf(&b, "every rank left the job before it finished (%s): nobody is left to train", strings.Join(e.Departed, "; "))
	default:
		fmt.Fprintf(&b, "no rank left: of the %d processes the elastic job started, %d were lost", e.Started, len(e.Lost))
		if len(e.Departed) > 0 {
			fmt.Fprintf(&b, " and %d left (%s)", len(e.Departed), strings.Join(e.Departed, "; "))
		}
		if e.Stopped > 0 {
			fmt.Fprintf(&b, " and %d stopped because the discovery script no longer listed their hosts (or slots)", e.Stopped)
		}
	}
	fmt.Fprintf(&b, " (it started with %d ranks", e.NP)
	if j := e.Started - e.NP; j > 0 {
		fmt.Fprintf(&b, " and %d joiner%s", j, plural(j))
	}
	b.WriteString(")")
	if len(e.Lost) > 0 {
		fmt.Fprintf(&b, "; lost: %s", strings.Join(e.Lost, "; "))
	}
	if len(e.LastStderr) > 0 {
		b.WriteString("; the last one's last stderr lines:")
		for _, l := range e.LastStderr[max(0, len(e.LastStderr)-summaryLines):] {
			fmt.Fprintf(&b, "\n    %s", l)
		}
	}
	return b.String()
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
