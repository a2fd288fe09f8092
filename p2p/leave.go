package p2p

// Leaving early.
//
// A rank that closes while others still make collective calls used to be
// seen by them as a bare EOF on a link (after linkGrace), and its own Close
// returned nil. Now Close first announces "rank L leaves after call #N"
// (N: its last SetProgress) on the control path, before it ends its links;
// the rendezvous relays it to every rank still in the job. A rank that is
// in, or later enters, a call numbered above N can never finish that call:
// it fails at once with a *PeerLeftError. Before it does, it reports "rank
// P was in call #M" to the rendezvous, which passes it to the leaver and
// only then acknowledges, so the report is on the leaver's control stream
// before the late rank's links close. The leaver's Close waits for every
// peer's links to end anyway (drainLinks), then for the rendezvous' bye,
// which comes after any such report: Close returns an *EarlyCloseError
// naming the ranks it left behind. When every rank closes after the same
// call nobody is behind, and nothing waits longer than before.

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// PeerLeftError is why a rank fails when another rank closed (left the job
// in good health) after an earlier collective call than the one this rank
// is in: that call can never complete.
type PeerLeftError struct {
	Rank     int    // the rank that left
	LastCall uint64 // the last call it made
	Self     int    // this rank
	Call     uint64 // the call this rank was in, or entering
}

func (e *PeerLeftError) Error() string {
	return fmt.Sprintf("rank %d closed its communicator after call #%d while rank %d was in call #%d: every rank must make the same collective calls before Close",
		e.Rank, e.LastCall, e.Self, e.Call)
}

// EarlyCloseError is what Close returns on a rank that left while other
// ranks were in later calls than its last one (or entered one before Close
// was done): it closed too early, or they called too much.
type EarlyCloseError struct {
	Rank     int            // this rank
	LastCall uint64         // its last call
	Behind   map[int]uint64 // the ranks left behind, and the call each was in
}

func (e *EarlyCloseError) Error() string {
	if len(e.Behind) == 0 {
		return fmt.Sprintf("close: this rank left after call #%d while other ranks were in later calls", e.LastCall)
	}
	ranks := make([]int, 0, len(e.Behind))
	for r := range e.Behind {
		ranks = append(ranks, r)
	}
	slices.Sort(ranks)
	same := true
	for _, r := range ranks {
		same = same && e.Behind[r] == e.Behind[ranks[0]]
	}
	names := make([]string, len(ranks))
	for i, r := range ranks {
		names[i] = fmt.Sprintf("rank %d", r)
		if !same {
			names[i] += fmt.Sprintf(" (call #%d)", e.Behind[r])
		}
	}
	who := names[0]
	if len(names) > 1 {
		who = strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
	}
	where := "in later calls"
	if same {
		where = fmt.Sprintf("in call #%d", e.Behind[ranks[0]])
	}
	verb := "was"
	if len(names) > 1 {
		verb = "were"
	}
	return fmt.Sprintf("close: %s %s still %s after this rank's last call #%d; every rank must make the same collective calls before Close",
		who, verb, where, e.LastCall)
}

// departure is a rank that announced it leaves after call lastCall.
type departure struct {
	rank     int
	lastCall uint64
}

// leaveTracker is what the control client knows of ranks that left early.
type leaveTracker struct {
	mu             sync.Mutex
	departed       []departure    // ranks that announced they leave, in order
	reportedBehind bool           // this rank reported being in a later call
	behind         map[int]uint64 // peers in later calls than ours when we left
	lateOK         chan struct{}  // the rendezvous passed our report on
}

// SetProgress records the sequence number of the last collective this rank
// entered. It is reported to the rendezvous within progressInterval, so that
// QueryProgress on any rank can tell which ranks have not reached a call.
// If a rank has already left after an earlier call, the node fails at once
// with a *PeerLeftError (Err, Done), as the call can not complete.
func (n *Node) SetProgress(seq uint64) {
	c := n.ctl
	c.leave.mu.Lock()
	c.progress.last.Store(seq)
	behind := c.leave.leftBeforeLocked(seq) != nil
	c.leave.mu.Unlock()
	if behind {
		c.leftBehind(seq)
	}
}

// leftBeforeLocked returns the first rank that left after a call earlier
// than call, or nil. Called with mu held.
func (t *leaveTracker) leftBeforeLocked(call uint64) *departure {
	for i, d := range t.departed {
		if d.lastCall < call {
			return &t.departed[i]
		}
	}
	return nil
}

// peerLeaving handles the rendezvous' notice that rank left after call
// lastCall. It runs on the control reader, which must go on reading (the
// acknowledgement of our report comes that way), so a rank that is behind
// fails on a goroutine of its own.
func (c *ctlClient) peerLeaving(rank int, lastCall uint64) {
	n := c.n
	c.leave.mu.Lock()
	c.leave.departed = append(c.leave.departed, departure{rank, lastCall})
	call := c.progress.last.Load()
	c.leave.mu.Unlock()
	n.logf("rank %d leaves the job after call #%d", rank, lastCall)
	if call > lastCall {
		n.life.wg.Add(1) // the control reader is counted: never races with Wait
		go func() {
			defer n.life.wg.Done()
			c.leftBehind(call)
		}()
	}
}

// leftBehind fails this rank, which is in call `call`, because a rank left
// after an earlier call. It first tells the rendezvous, and waits (briefly)
// until the leaver has been told, because failing closes the links, which
// ends the leaver's drain: its Close must have the report by then.
func (c *ctlClient) leftBehind(call uint64) {
	n := c.n
	c.leave.mu.Lock()
	d := c.leave.leftBeforeLocked(call)
	if d == nil || c.leave.reportedBehind {
		c.leave.mu.Unlock()
		return
	}
	c.leave.reportedBehind = true
	cause := &PeerLeftError{Rank: d.rank, LastCall: d.lastCall, Self: n.rank(), Call: call}
	c.leave.mu.Unlock()
	if n.Err() == nil && c.registered() {
		if err := c.send(&msg{T: tLate, Rank: max(n.rank(), 0), Seq: call}); err != nil {
			n.logf("could not report to the rendezvous that rank %d left before call #%d: %v", d.rank, call, err)
		} else {
			t := time.NewTimer(n.handshakeTimeout())
			select {
			case <-c.leave.lateOK:
			case <-c.dead:
			case <-n.Done():
			case <-t.C:
				n.logf("the rendezvous did not confirm within %v that rank %d was told this rank was behind", n.handshakeTimeout(), d.rank)
			}
			t.Stop()
		}
	}
	n.abortLocal(cause)
}

// announceLeaving tells the rendezvous, when the job is healthy, that this
// rank leaves after its last call. It returns that call and whether the
// announcement was sent.
func (c *ctlClient) announceLeaving() (uint64, bool) {
	n := c.n
	if !c.registered() || n.Err() != nil || n.life.departedJob.Load() || c.closed() {
		return 0, false
	}
	last := c.progress.last.Load()
	if err := c.send(&msg{T: tLeaving, Rank: max(n.rank(), 0), Seq: last}); err != nil {
		n.logf("could not tell the rendezvous this rank leaves after call #%d: %v", last, err)
		return last, false
	}
	return last, true
}

// earlyCloseErr is nil unless peers reported being in calls after lastCall.
func (c *ctlClient) earlyCloseErr(lastCall uint64) error {
	c.leave.mu.Lock()
	defer c.leave.mu.Unlock()
	if len(c.leave.behind) == 0 {
		return nil
	}
	b := make(map[int]uint64, len(c.leave.behind))
	for r, call := range c.leave.behind {
		b[r] = call
	}
	return &EarlyCloseError{Rank: c.n.rank(), LastCall: lastCall, Behind: b}
}

// peerBehind records the rendezvous' report that rank was in call `call`
// after this rank announced it leaves.
func (c *ctlClient) peerBehind(rank int, call uint64) {
	c.leave.mu.Lock()
	c.leave.behind[rank] = call
	c.leave.mu.Unlock()
	c.n.logf("rank %d was still in call #%d when this rank left", rank, call)
}
