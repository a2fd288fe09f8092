package ring

import (
	"context"
	"fmt"
)

// What the race detector cannot see in a pipelined run (runSteps' sender
// and receiver goroutines).
//
// A ring schedule comes back to the same part of the buffer every Size
// steps: the chunk the receiver writes in step s is the one the sender
// read for step s-(Size-1). The receiver cannot get that chunk before the
// sender has sent it: the data it receives in step s comes around the
// ring from the message this rank sent in step s-(Size-1) (each rank
// forwards a chunk only after receiving it). But that order goes through
// the other processes, which the race detector does not see, so in -race
// builds it reports the sender's read and the receiver's later write as a
// race. There, and only there (raceBuild), the receiver waits until its
// own sender has counted that message sent: it always has, or is about
// to, and the count gives the detector the order.

// raceSent counts a message sent in a pipelined run (race builds).
func (r *Ring) raceSent() {
	if !raceBuild || !r.racePipelined {
		return
	}
	r.raceSentMsgs.Add(1)
	select {
	case r.raceSentWake <- struct{}{}:
	default:
	}
}

// raceAwaitSent waits, in race builds, until the sender has sent the
// message whose chunk recv (t, c) overwrites: chunk c of step
// t-(Size-1), if that step sends one.
func (r *Ring) raceAwaitSent(ctx context.Context, t, c int) error {
	if !raceBuild || !r.racePipelined || t < r.size-1 {
		return nil
	}
	st := t - (r.size - 1)
	if r.raceIndex == nil {
		r.raceIndex = r.messageIndex()
	}
	if c >= r.raceIndex[st+1]-r.raceIndex[st] {
		return nil // that step sends no chunk c
	}
	need := int64(r.raceIndex[st] + c + 1)
	for r.raceSentMsgs.Load() < need {
		select {
		case <-r.raceSentWake:
		case <-ctx.Done():
			return fmt.Errorf("%s: waiting for the send of step %d: %w", r.errPrefix(t), st, context.Cause(ctx))
		}
	}
	return nil
}

// messageIndex is, for every step t, how many messages the sender sends
// before step t (and, last, in all).
func (r *Ring) messageIndex() []int {
	p := &r.p
	idx := make([]int, p.steps+1)
	for t := range p.steps {
		n := 0
		if st := p.step(r.rank, r.size, t); st.send >= 0 {
			_, size := p.segment(st.send)
			n = numChunks(size, p.ce)
		}
		idx[t+1] = idx[t] + n
	}
	return idx
}
