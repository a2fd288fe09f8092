package collective

import (
	"strings"
	"sync"
	"time"

	"github.com/gorun/gorun/p2p"
	"github.com/gorun/gorun/ring"
)

// flightCalls is how many finished calls a rank's flight recorder keeps:
// enough to see where ranks parted ways, small enough to send in a hang
// diagnosis.
const flightCalls = 64

// flightEntry is one call in the flight recorder. It holds the call and
// its error as they are (no formatting), so recording costs no
// allocation; they are formatted only for a diagnosis.
type flightEntry struct {
	call       ring.Call
	start, end time.Time
	err        error
}

// flightRecorder keeps the call a rank is in and the last flightCalls
// calls it finished, in a ring buffer, for hang diagnoses (p2p/diagnose.go:
// the rank's answer to the rendezvous carries its snapshot). A Comm runs
// one call at a time (execMu), so begin and end never overlap; the lock
// orders them with snapshot, which runs on a p2p goroutine.
type flightRecorder struct {
	mu     sync.Mutex
	inCall bool
	cur    flightEntry
	done   [flightCalls]flightEntry
	next   int // the slot the next finished call goes to
	count  int // finished calls recorded, at most flightCalls
}

// begin records that call started running at start.
func (f *flightRecorder) begin(call ring.Call, start time.Time) {
	f.mu.Lock()
	f.inCall = true
	f.cur = flightEntry{call: call, start: start}
	f.mu.Unlock()
}

// end records that the current call ended at end with err.
func (f *flightRecorder) end(end time.Time, err error) {
	f.mu.Lock()
	if f.inCall {
		e := f.cur
		e.end, e.err = end, err
		f.done[f.next] = e
		f.next = (f.next + 1) % flightCalls
		f.count = min(f.count+1, flightCalls)
		f.inCall = false
		f.cur = flightEntry{}
	}
	f.mu.Unlock()
}

// snapshot returns the current call (nil between calls) and the finished
// ones, oldest first (a p2p.CallReporter).
func (f *flightRecorder) snapshot() (*p2p.CallRecord, []p2p.CallRecord) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var cur *p2p.CallRecord
	if f.inCall {
		r := record(f.cur)
		cur = &r
	}
	recent := make([]p2p.CallRecord, 0, f.count)
	for i := range f.count {
		recent = append(recent, record(f.done[(f.next-f.count+i+flightCalls)%flightCalls]))
	}
	return cur, recent
}

func record(e flightEntry) p2p.CallRecord {
	r := p2p.CallRecord{Seq: e.call.Seq, Kind: strings.ToLower(e.call.Kind.Name()), Name: e.call.Name,
		Call: e.call.String(), Start: e.start, End: e.end}
	if e.err != nil {
		r.Err = e.err.Error()
	}
	return r
}

// flight returns c's flight recorder, which its node reports in hang
// diagnoses; nil without a node (a job of one rank never waits for
// another).
func (c *Comm) flight() *flightRecorder {
	if c.node == nil {
		return nil
	}
	return &c.recorder
}
