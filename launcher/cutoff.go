// A host cut off from an elastic job (down, or a network partition): the
// rendezvous lost its ranks for their silence, and ssh got no answer from
// it either. gorun says so once for the host, in one line, and waits for
// nothing there: the ranks on a cut-off host stop by themselves.

package launcher

import (
	"cmp"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// silent says whether the rendezvous lost p as a host that goes away
// looks: it stopped responding, or the others could not reach it (not a
// process that disconnected, which its host's kernel says, nor one that
// left).
func silent(p *rankProc) bool {
	return p.rdvLost && (strings.HasPrefix(p.rdvLostCause, "stopped responding") || strings.HasPrefix(p.rdvLostCause, "unreachable"))
}

// sshGotNoAnswer says whether p, which has exited, is a remote rank whose
// ssh session ended because its host answered nothing: ssh's keepalives
// gave up (exit status 255, see SSH.sessionArgs), or gorun killed the
// session when its stop went unanswered (stopAll).
func sshGotNoAnswer(p *rankProc) bool {
	if !p.remote || cmp.Or(p.via, "ssh") != "ssh" {
		return false
	}
	if p.unanswered.Load() {
		return true
	}
	var ee *exec.ExitError
	return errors.As(p.err, &ee) && ee.ExitCode() == 255
}

// cutOff handles the exit of p, and says so, if p was cut off from the job
// with its host: the rendezvous lost it for its silence and its ssh
// session got no answer from the host. The first such exit of an incident
// says it for the host in one line, naming every rank there that the
// rendezvous lost so (their exits follow); each is counted among the lost.
func (e *elasticRun) cutOff(p *rankProc) bool {
	if !silent(p) || !sshGotNoAnswer(p) {
		return false
	}
	e.lost = append(e.lost, e.name(p)+": cut off with its host (unreachable)")
	e.lastLost = p
	host := p.hostName
	if e.unreachable[host] {
		return true
	}
	e.unreachable[host] = true
	var there []*rankProc
	for _, q := range e.procs {
		// Of those that exited already, only those whose exits wait to
		// be handled, and will be so.
		if q == p || q.hostName == host && silent(q) && !q.exitHandled && (!isDone(q) || sshGotNoAnswer(q)) {
			there = append(there, q)
		}
	}
	they, were, stop := "they", "were", "stop by themselves"
	if len(there) == 1 {
		they, were, stop = "it", "was", "stops by itself"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "host %s is unreachable: the rendezvous lost its %s (%s), and ssh got no answer from the host either; %s %s cut off from the job (and %s if still running)",
		host, procList(there), p.rdvLostCause, they, were, stop)
	if !e.finishing && e.departures.abortCause() == "" {
		fmt.Fprintf(&b, "; %s", e.standing(p, "them"))
		if d, _, started := e.cd.failed(host, time.Now()); started && e.wouldRefill(host) {
			fmt.Fprintf(&b, "; no new rank there for %v (--blacklist-cooldown)", d.Round(time.Millisecond))
		}
	}
	fmt.Fprintf(&b, "; check that the host is up and the network between this host and %s", host)
	e.job.Logf("%s", b.String())
	return true
}

// procList names processes as gorun numbers them: "rank 2", "ranks 1 and
// 2", "ranks 1, 2 and 3 and joiner 5".
func procList(ps []*rankProc) string {
	var ranks, joiners []string
	for _, p := range ps {
		if p.joiner {
			joiners = append(joiners, strconv.Itoa(p.rank))
		} else {
			ranks = append(ranks, strconv.Itoa(p.rank))
		}
	}
	var parts []string
	for _, k := range []struct {
		word string
		nums []string
	}{{"rank", ranks}, {"joiner", joiners}} {
		switch n := len(k.nums); n {
		case 0:
		case 1:
			parts = append(parts, k.word+" "+k.nums[0])
		default:
			parts = append(parts, k.word+"s "+strings.Join(k.nums[:n-1], ", ")+" and "+k.nums[n-1])
		}
	}
	return strings.Join(parts, " and ")
}
