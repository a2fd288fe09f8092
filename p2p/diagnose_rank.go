package p2p

// A rank's side of a hang diagnosis: asking the rendezvous for one
// (DiagnoseHang), and answering its request for this rank's state with
// the call it is in, its blocked transfers and its telling stacks.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// hangAnswers is the control client's side of hang diagnoses.
type hangAnswers struct {
	reporter atomic.Pointer[CallReporter] // SetCallReporter's
	ask      sync.Mutex                   // one DiagnoseHang at a time
	answer   chan hangAnswer              // the rendezvous' report
}

// hangAnswer is a report as it reached this rank: the rank the
// rendezvous sent it to, to tell whether this rank asked first.
type hangAnswer struct {
	rep *HangReport
	to  int
}

// SetCallReporter makes this rank's answers to a hang diagnosis carry the
// calls f reports (the collective layer's flight recorder).
func (n *Node) SetCallReporter(f CallReporter) { n.ctl.hang.reporter.Store(&f) }

// DiagnoseHang asks the rendezvous to gather every rank's state because
// this rank has waited past the stall threshold in call seq, and returns
// the report, with First set if this rank was the first to ask about the
// call. Bounded by ctx.
func (n *Node) DiagnoseHang(ctx context.Context, seq uint64) (*HangReport, error) {
	c := n.ctl
	c.hang.ask.Lock()
	defer c.hang.ask.Unlock()
	select { // drop a stale answer to an earlier, abandoned request
	case <-c.hang.answer:
	default:
	}
	if !c.registered() {
		return nil, errors.New("p2p: hang diagnosis: no control path to a rendezvous")
	}
	// Call numbers restart at every epoch of an elastic job: the epoch
	// says which call #seq is.
	epoch := max(n.Epoch(), 0)
	if err := c.send(&msg{T: tHangAsk, Rank: max(n.rank(), 0), Seq: seq, Epoch: epoch}); err != nil {
		return nil, fmt.Errorf("p2p: hang diagnosis: %w", err)
	}
	for {
		select {
		case a := <-c.hang.answer:
			if a.rep.Seq != seq || a.rep.Epoch != epoch {
				// A late answer to an earlier request, abandoned at its
				// deadline, or one of another epoch: not this call's.
				continue
			}
			a.rep.First = a.rep.Requester == a.to
			return a.rep, nil
		case <-ctx.Done():
			return nil, fmt.Errorf("p2p: hang diagnosis: no answer from the rendezvous: %w", context.Cause(ctx))
		case <-c.dead:
			return nil, errors.New("p2p: hang diagnosis: the control path to the rendezvous is closed")
		}
	}
}

// hangReportArrived hands the rendezvous' report, sent to rank to, to
// DiagnoseHang. The newest report wins: one left unread in the channel is
// an answer nobody waits for any more.
func (c *ctlClient) hangReportArrived(text string, to int) {
	var rep HangReport
	if err := json.Unmarshal([]byte(text), &rep); err != nil {
		c.n.logf("bad hang diagnosis from the rendezvous: %v", err)
		return
	}
	a := hangAnswer{rep: &rep, to: to}
	for {
		select {
		case c.hang.answer <- a:
			return
		default:
		}
		select { // only this goroutine (the control reader) sends
		case <-c.hang.answer:
		default:
		}
	}
}

// answerHang sends this rank's state to the rendezvous for the gathering
// whose id is gathering (the stateq's Text). It runs on a goroutine of its
// own: the control reader goes on reading meanwhile.
func (c *ctlClient) answerHang(gathering string) {
	n := c.n
	defer n.life.wg.Done()
	id, _ := strconv.ParseUint(gathering, 10, 64)
	b, err := json.Marshal(stateAnswer{RankState: n.State(), Gathering: id})
	if err != nil {
		n.logf("hang diagnosis: encoding this rank's state: %v", err)
		return
	}
	if err := c.send(&msg{T: tState, Rank: max(n.rank(), 0), Seq: c.progress.last.Load(), Text: string(b)}); err != nil {
		n.logf("hang diagnosis: sending this rank's state to the rendezvous: %v", err)
	}
}

// State returns this rank's state for a hang diagnosis.
func (n *Node) State() RankState {
	st := RankState{Rank: n.rank(), PID: os.Getpid(), Progress: n.ctl.progress.last.Load()}
	st.Host, _ = os.Hostname()
	if f := n.ctl.hang.reporter.Load(); f != nil {
		st.Current, st.Recent = (*f)()
	}
	st.Waits = n.pendingWaits()
	st.Goroutines = relevantGoroutines(parseStacks(allStacks()), st.Current != nil)
	return st
}

// pendingWaits lists the transfers on this rank's links that are blocked
// now, the longest waiting first.
func (n *Node) pendingWaits() []PeerWait {
	n.mu.Lock()
	tr := n.links.tr
	n.mu.Unlock()
	if tr == nil {
		return nil
	}
	var w []PeerWait
	for _, dir := range []struct {
		links []*link
		op    string
	}{{tr.from, "recv from"}, {tr.to, "send to"}} {
		for r, l := range dir.links {
			if l == nil {
				continue
			}
			if since := l.waitSince(); since != 0 {
				w = append(w, PeerWait{Peer: r, Op: dir.op, Since: time.Unix(0, since)})
			}
		}
	}
	slices.SortFunc(w, func(a, b PeerWait) int { return a.Since.Compare(b.Since) })
	return w
}
