// How gorun tells which rank failed a job and how each ended: the
// culprit among the ranks that failed together, the rank that stopped
// responding, the ranks that never registered, and an exit status in
// words.

package launcher

import (
	"cmp"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/p2p"
)

// causeWindow is how long, after a rank fails, gorun waits for other ranks'
// exits before naming the culprit.
const causeWindow = 500 * time.Millisecond

// firstCause names the rank that made the job fail. The first rank seen to
// fail is often a survivor reporting a lost peer (a remote rank's death
// reaches gorun through ssh, later than its peers notice it), so gorun
// collects the failures of a short window and prefers a rank killed by a
// signal; otherwise the first one.
func firstCause(first *rankProc, exited <-chan *rankProc, running *int) *RankError {
	failed := []*rankProc{first}
	timer := time.NewTimer(causeWindow)
	defer timer.Stop()
wait:
	for *running > 0 && !killedBySignal(first) {
		select {
		case p := <-exited:
			*running--
			if p.err != nil {
				failed = append(failed, p)
				if killedBySignal(p) {
					break wait
				}
			}
		case <-timer.C:
			break wait
		}
	}
	culprit := first
	for _, p := range failed {
		if killedBySignal(p) {
			culprit = p
			break
		}
	}
	// Ranks that failed the same way are reported once, by the lowest.
	shown, same := culprit, []int(nil)
	var others []string
	for _, o := range failed {
		switch {
		case o == culprit:
		case sameFailure(o, culprit):
			same = append(same, o.rank)
			if o.rank < shown.rank {
				shown = o
			}
		default:
			others = append(others, fmt.Sprintf("rank %d%s (%s)", o.rank, onHost(o.host), status(o)))
		}
	}
	if len(same) > 0 {
		same = append(same, culprit.rank)
		same = slices.DeleteFunc(same, func(r int) bool { return r == shown.rank })
		slices.Sort(same)
	}
	p := shown
	return &RankError{Rank: p.rank, Host: p.host, PID: p.cmd.Process.Pid, Status: status(p), LastStderr: p.tail.lines(), Same: same, Others: others}
}

// sameFailure says whether two ranks failed with the same status and the
// same last stderr lines, but for the rank numbers in them.
func sameFailure(a, b *rankProc) bool {
	if status(a) != status(b) {
		return false
	}
	la, lb := a.tail.lines(), b.tail.lines()
	la, lb = la[max(0, len(la)-summaryLines):], lb[max(0, len(lb)-summaryLines):]
	return slices.Equal(withoutRank(la), withoutRank(lb))
}

var rankNumberRE = regexp.MustCompile(`(?i)\b(ranks?)([ =:#]+)\d+`)

// withoutRank replaces the rank numbers in lines ("rank 3", "GORUN_RANK=3")
// with "#".
func withoutRank(lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = rankNumberRE.ReplaceAllString(l, "${1}${2}#")
	}
	return out
}

func killedBySignal(p *rankProc) bool {
	var ee *exec.ExitError
	if !errors.As(p.err, &ee) {
		return false
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && !p.remote {
		return true
	}
	c := ee.ExitCode()
	return p.remote && c > 128 && c < 160
}

// lostRank names the rank that stopped responding, if that was the job's
// abort a, with its host, as gorun names ranks ("rank 2 on host node2
// (/ip4/...) stopped responding: no heartbeat within 5s"); "" for any
// other cause.
func lostRank(a p2p.Abort, procs []*rankProc) string {
	if !a.Unresponsive {
		return ""
	}
	for _, p := range procs {
		if p.rank == a.Rank && p.host != "" {
			return fmt.Sprintf("rank %d on host %s (%s) stopped responding: %s", a.Rank, p.host, a.Addr, a.Why)
		}
	}
	return a.Cause
}

var missingRE = regexp.MustCompile(`missing ranks \[([0-9 ]*)\]`)

// startTimeoutError names the ranks (and their hosts) that did not register.
func startTimeoutError(job Job, lay *layout, err error) error {
	m := missingRE.FindStringSubmatch(err.Error())
	if m == nil || strings.TrimSpace(m[1]) == "" {
		return fmt.Errorf("not every rank registered within --start-timeout %v: %w", job.StartTimeout, err)
	}
	var names []string
	for _, f := range strings.Fields(m[1]) {
		r, _ := strconv.Atoi(f)
		n := "rank " + f
		if lay.multiHost() && r >= 0 && r < len(lay.pl.host) {
			n += " on host " + lay.hosts[lay.pl.host[r]].Name
		}
		names = append(names, n)
	}
	return fmt.Errorf("%s did not register with the rendezvous within --start-timeout %v (is the program calling collective.Init? can the host reach %s?)",
		strings.Join(names, ", "), job.StartTimeout, lay.listenIP)
}

// status describes how a rank ended; for a remote rank, the status ssh
// passed on.
func status(p *rankProc) string {
	s := p.err.Error()
	if !p.remote {
		return s
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		via := cmp.Or(p.via, "ssh")
		switch c := ee.ExitCode(); {
		case c == 255 && via == "ssh":
			return s + " (from ssh: the connection failed or was lost)"
		case c == 1 && via != "ssh":
			// srun passes on its tasks' highest status and exits 1 when it
			// fails itself.
			return s + fmt.Sprintf(" (the rank's, or %s's own failure to start or keep the step: GORUN_SRUN_OPTS=-v shows its errors)", via)
		case c > 128 && c < 160:
			return fmt.Sprintf("%s (killed by signal %d: %v)", s, c-128, syscall.Signal(c-128))
		}
	}
	return s
}

func onHost(h string) string {
	if h == "" {
		return ""
	}
	return " on host " + h
}

// exitText says how a rank ended, for gorun's messages: "killed by signal
// 9 (SIGKILL)", "exit status 3", or for a remote rank what ssh passed on.
func exitText(p *rankProc) string {
	var ee *exec.ExitError
	if !p.remote && errors.As(p.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return fmt.Sprintf("killed by signal %d (%s)", int(ws.Signal()), unix.SignalName(ws.Signal()))
		}
	}
	return status(p)
}

func errText(p *rankProc) string {
	if p.err == nil {
		return ""
	}
	return exitText(p)
}

func pidSuffix(p *rankProc) string {
	if p.remote || p.cmd == nil || p.cmd.Process == nil {
		return ""
	}
	return fmt.Sprintf(" (pid %d)", p.cmd.Process.Pid)
}
