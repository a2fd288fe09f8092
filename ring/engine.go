package ring

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// The pipelined engine shared by the ring collectives: it runs a plan
// (plan.go) over the Transport, chunk by chunk.
//
// Two goroutines run the plan: the receiver (the caller's goroutine) and the
// sender. The receiver processes incoming chunks strictly in order and bumps
// a progress counter after each one. Sends marked dependent (data that must
// first be received/reduced here) consume that progress in the same order:
// the k-th dependent chunk is sent as soon as progress >= k. Because the
// segment sent at step t is the one received at step t-1 (or, for
// Broadcast, at the same step), chunk (t, c) leaves as soon as (t-1, c) has
// been reduced, so sending, receiving and reducing overlap.
//
// runSteps chooses how to run a plan. A plan whose steps fit what a link
// holds unread (SmallBytes, LinkBuffers) needs no sender goroutine: each
// step is sent, then received, on the caller's goroutine (runSequential).
// Where the transport says a sender goroutine would find no CPU of its own
// (GroupedSteps), larger steps go the same way as groups of chunks that
// fit (runGrouped). Otherwise, and always for Broadcast, which forwards
// what it receives within a step, the two goroutines pipeline the plan.
// Every received header is checked before its payload is read
// (checkHeader).

// SmallBytes is the largest step (payload and headers) that run moves
// without a sender goroutine on any transport (a transport whose links say
// they hold more, LinkBuffers, gets up to half of that; see
// sendFirstBound): each step sends, then receives, on the caller's goroutine.
// Small collectives are bound by latency, and on a virtual machine every
// hand-off between goroutines on different threads can cost a wake-up of an
// idle CPU, a large part of a tiny allreduce's time; doing without one
// spares every step that wake-up (see BENCHMARKS.md, "Small steps"). It is
// safe because every Transport must buffer more than SmallBytes plus a
// header in each direction (sockets buffer 4 MiB, p2p's shared-memory
// links at least 2*SmallBytes, NewMemRing 1 MiB), so a send never waits
// for the peer's receive. Recursive doubling, Rabenseifner and the
// scatter-gather exchange rely on the same bound.
const SmallBytes = 64 << 10

// sendFirstBound is the largest message to peer that a schedule may send
// before it receives, on the caller's goroutine: SmallBytes, or half the
// link's buffer where the transport says it is larger (LinkBuffers).
func (r *Ring) sendFirstBound(peer int) int {
	if r.linkBufs != nil {
		return max(SmallBytes, r.linkBufs.LinkBuffer(peer)/2)
	}
	return SmallBytes
}

// concurrent tells the transport, if it implements Concurrency, that this
// call now runs goroutines besides the caller's (on) or has joined them.
func (r *Ring) concurrent(on bool) {
	if h, ok := r.t.(Concurrency); ok {
		h.Concurrent(on)
	}
}

// run executes r.p and returns the first (root-cause) error.
func (r *Ring) run(ctx context.Context) error {
	r.startPhases(r.p.steps)
	err := r.runSteps(ctx)
	if err == nil {
		r.reportPhases()
	}
	return err
}

func (r *Ring) runSteps(ctx context.Context) error {
	p := &r.p
	// Broadcast forwards what it receives in the same step, so it must
	// receive first: it always pipelines.
	maxSeg := (p.count + p.nseg - 1) / p.nseg
	bound := r.sendFirstBound(r.next)
	if p.call.Kind != Broadcast && maxSeg*p.esz+numChunks(maxSeg, p.ce)*HeaderSize <= bound {
		return r.runSequential(ctx)
	}
	if per := bound / (p.ce*p.esz + HeaderSize); p.call.Kind != Broadcast && per > 0 && r.grouped != nil && r.grouped.GroupedSteps() {
		return r.runGrouped(ctx, per)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r.progress.Store(0)
	select { // drop stale wake-ups from a previous call
	case <-r.wake:
	default:
	}
	select {
	case <-r.first:
	default:
	}
	r.concurrent(true)
	defer r.concurrent(false)
	if raceBuild {
		r.racePipelined, r.raceIndex = true, nil
		r.raceSentMsgs.Store(0)
		select {
		case <-r.raceSentWake:
		default:
		}
		defer func() { r.racePipelined = false }()
	}
	go r.sendLoop(ctx, cancel)
	rerr := r.recvLoop(ctx)
	if rerr != nil {
		var me *MismatchError
		if errors.As(rerr, &me) {
			r.awaitFirstSend(ctx)
		}
		cancel(rerr)
	}
	serr := <-r.sendErr
	if rerr == nil && serr == nil {
		return nil
	}
	// Whichever loop failed first canceled ctx with its own error; the
	// other one usually failed only because of that cancellation.
	if cause := context.Cause(ctx); cause != nil && (cause == rerr || cause == serr) {
		return cause
	}
	if rerr != nil {
		return rerr
	}
	return serr
}

// mismatchGrace bounds how long a rank that detected a mismatch keeps its
// sender running so that its own first message reaches the next rank.
const mismatchGrace = time.Second

// awaitFirstSend lets the sender finish its first message before the call is
// torn down after a mismatch. That message carries this rank's fingerprint,
// so the next rank reports the mismatch too instead of waiting for its
// context to expire: both neighbours of a rank that called something else
// fail with *MismatchError.
func (r *Ring) awaitFirstSend(ctx context.Context) {
	t := time.NewTimer(mismatchGrace)
	defer t.Stop()
	select {
	case <-r.first:
	case <-ctx.Done():
	case <-t.C:
	}
}

func (r *Ring) sendLoop(ctx context.Context, cancel context.CancelCauseFunc) {
	err := r.sendAll(ctx)
	if err != nil {
		cancel(err)
	}
	r.sendErr <- err
}

// runSequential runs each step as a send followed by a receive, on this
// goroutine; see SmallBytes.
func (r *Ring) runSequential(ctx context.Context) error {
	r.progress.Store(0)
	for t := 0; t < r.p.steps; t++ {
		if err := r.sendSteps(ctx, t, t+1, false); err != nil {
			return err
		}
		if err := r.recvSteps(ctx, t, t+1); err != nil {
			return err
		}
	}
	return nil
}

// runGrouped runs a call whose steps do not fit the send-first bound on
// the caller's goroutine too, where the transport says so (GroupedSteps):
// each step goes as groups of per chunks (per chunks and their headers
// fit sendFirstBound), and each group is sent, then the step's matching
// group received. A link then holds at most two groups unread (the one
// being sent, and the one before, which its receiver takes without
// waiting for anything else), which fits its buffer, so no send waits for
// a receive that waits for it; and the receiver of a rank that runs the
// sender goroutine instead takes each group as it comes. A step's sends
// depend only on earlier steps (Kind Broadcast, which forwards within a
// step, never comes here).
//
// Where a rank has a CPU of its own but none to spare, this spares the
// hand-offs between a sender goroutine and the receiver, which then cost
// more than the copies; where ranks outnumber CPUs it gains nothing, and
// p2p does not ask for it (see BENCHMARKS.md, "Grouped steps").
func (r *Ring) runGrouped(ctx context.Context, per int) error {
	r.progress.Store(0)
	p := &r.p
	for t := 0; t < p.steps; t++ {
		st := p.step(r.rank, r.size, t)
		nc := 0
		if st.send >= 0 {
			_, n := p.segment(st.send)
			nc = numChunks(n, p.ce)
		}
		if st.recv >= 0 {
			_, n := p.segment(st.recv)
			nc = max(nc, numChunks(n, p.ce))
		}
		for c := 0; c < nc; c += per {
			if err := r.sendChunks(ctx, t, t+1, c, c+per, false); err != nil {
				return err
			}
			if err := r.recvChunks(ctx, t, t+1, c, c+per); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *Ring) sendAll(ctx context.Context) error { return r.sendSteps(ctx, 0, r.p.steps, true) }

// allChunks is the chunk range of whole steps.
const allChunks = math.MaxInt

// sendSteps sends the messages of steps [t0, t1). signal says whether to
// report the first message on r.first (for the pipelined run).
func (r *Ring) sendSteps(ctx context.Context, t0, t1 int, signal bool) error {
	return r.sendChunks(ctx, t0, t1, 0, allChunks, signal)
}

// sendChunks sends chunks [c0, c1) of each of steps [t0, t1) (those it
// has), as sendSteps.
func (r *Ring) sendChunks(ctx context.Context, t0, t1, c0, c1 int, signal bool) error {
	p := &r.p
	h := Header{
		Kind: p.call.Kind, Op: p.call.Op, DType: p.call.DType, Seq: p.call.Seq,
		Count: uint64(p.call.Count), Root: uint32(p.call.Root), Sender: uint32(r.rank), Algo: p.call.Algo, Epoch: r.epoch,
	}
	var need int64
	first := true
	signalFirst := func() {
		if first && signal {
			first = false
			r.first <- struct{}{}
		}
	}
	defer signalFirst()
	defer func() { r.sendBufs[1] = nil }()
	for t := t0; t < t1; t++ {
		st := p.step(r.rank, r.size, t)
		if st.send < 0 {
			continue
		}
		off, n := p.segment(st.send)
		nc := min(numChunks(n, p.ce), c1)
		for c := c0; c < nc; c++ {
			if st.dep {
				signalFirst() // nothing of our own to send before this point
				need++
				for r.progress.Load() < need {
					select {
					case <-r.wake:
					case <-ctx.Done():
						return fmt.Errorf("%s: waiting to forward chunk %d to rank %d: %w", r.errPrefix(t), c, r.next, context.Cause(ctx))
					}
				}
			}
			lo := c * p.ce
			k := min(p.ce, n-lo)
			payload := p.bytes(st.src, off+lo, k)
			h.Step, h.Chunk, h.Offset, h.Length = uint32(t), uint32(c), uint64(off+lo), uint32(len(payload))
			EncodeHeader(r.shdr[:], &h)
			r.sendBufs[0], r.sendBufs[1] = r.shdr[:], payload
			bufs := r.sendBufs[:]
			if len(payload) == 0 {
				bufs = bufs[:1]
			}
			if err := r.t.SendNext(ctx, bufs...); err != nil {
				return fmt.Errorf("%s: send to rank %d: %w", r.errPrefix(t), r.next, err)
			}
			r.payloadSent.Add(uint64(len(payload)))
			r.headerSent.Add(HeaderSize)
			r.msgs.Add(1)
			if raceBuild {
				r.raceSent()
			}
			signalFirst()
		}
	}
	return nil
}

func (r *Ring) recvLoop(ctx context.Context) error { return r.recvSteps(ctx, 0, r.p.steps) }

// recvSteps receives (and reduces) the messages of steps [t0, t1).
func (r *Ring) recvSteps(ctx context.Context, t0, t1 int) error {
	return r.recvChunks(ctx, t0, t1, 0, allChunks)
}

// recvChunks receives chunks [c0, c1) of each of steps [t0, t1) (those
// it has), as recvSteps.
func (r *Ring) recvChunks(ctx context.Context, t0, t1, c0, c1 int) error {
	p := &r.p
	for t := t0; t < t1; t++ {
		st := p.step(r.rank, r.size, t)
		if st.recv < 0 {
			continue
		}
		off, n := p.segment(st.recv)
		nc := min(numChunks(n, p.ce), c1)
		for c := c0; c < nc; c++ {
			lo := c * p.ce
			k := min(p.ce, n-lo)
			nb := k * p.esz
			if err := r.t.RecvPrev(ctx, r.rhdr[:]); err != nil {
				return fmt.Errorf("%s: recv from rank %d: %w", r.errPrefix(t), r.prev, err)
			}
			if err := r.checkHeader(t, c, off+lo, nb); err != nil {
				return err
			}
			if r.phase != nil && r.firstRecv.IsZero() {
				r.firstRecv = time.Now()
			}
			if nb > 0 {
				if raceBuild {
					if err := r.raceAwaitSent(ctx, t, c); err != nil {
						return err
					}
				}
				if st.reduce {
					if err := r.recvReduce(ctx, p.bytes(st.dst, off+lo, k), p.bytes(st.a, off+lo, k), st.final); err != nil {
						return fmt.Errorf("%s: recv from rank %d: %w", r.errPrefix(t), r.prev, err)
					}
				} else if err := r.t.RecvPrev(ctx, p.bytes(st.dst, off+lo, k)); err != nil {
					return fmt.Errorf("%s: recv from rank %d: %w", r.errPrefix(t), r.prev, err)
				}
				r.payloadRecv.Add(uint64(nb))
			}
			r.progress.Add(1)
			select {
			case r.wake <- struct{}{}:
			default:
			}
		}
		if r.phase != nil {
			r.stepDone[t] = time.Now()
		}
	}
	return nil
}

// checkHeader validates the header in r.rhdr before its payload is read.
func (r *Ring) checkHeader(t, c, off, nb int) error {
	h, err := DecodeHeader(r.rhdr[:])
	if err != nil {
		return fmt.Errorf("%s: recv from rank %d: %w", r.errPrefix(t), r.prev, err)
	}
	if err := r.checkEpoch(&h, r.p.call, r.prev); err != nil {
		return err
	}
	remote := h.Call()
	if !sameFingerprint(r.p.call, remote) {
		return &MismatchError{Local: r.p.call, Remote: remote, LocalRank: r.rank, RemoteRank: int(h.Sender)}
	}
	if h.Sender != uint32(r.prev) {
		return fmt.Errorf("%s: recv from rank %d: message claims to come from rank %d", r.errPrefix(t), r.prev, h.Sender)
	}
	if h.Step != uint32(t) || h.Chunk != uint32(c) || h.Offset != uint64(off) || h.Length != uint32(nb) {
		return fmt.Errorf("%s: recv from rank %d: protocol error: got step %d chunk %d offset %d length %d, want step %d chunk %d offset %d length %d",
			r.errPrefix(t), r.prev, h.Step, h.Chunk, h.Offset, h.Length, t, c, off, nb)
	}
	return nil
}
