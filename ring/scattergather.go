package ring

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Scatter-gather allreduce over a Mesh: a direct reduce-scatter followed by
// a direct allgather (the schedule of the compressed allreduce in
// compressed.go, without compression; NCCL calls the pattern
// "all-to-all reduce-scatter").
//
// The buffer is split into N segments as the ring splits it (Segment; rank
// j owns segment j), and every segment into chunks of at most
// Config.ChunkBytes (an empty segment is one header-only chunk):
//
//	step 1, scatter: rank r sends chunk c of segment j straight to rank j,
//	    for every j != r.
//	reduce: as soon as chunk c of its segment has arrived from every peer,
//	    rank j folds the N contributions in rank order,
//	    ((x0 op x1) op x2) op ... op x(N-1) (its own at position j),
//	    divides by N for Avg (once), and writes the result into its buffer.
//	step 2, allgather: rank j sends each reduced chunk straight to every
//	    other rank, which copies it into its buffer.
//
// Two hops whatever N is, and 2(N-1)/N*S payload bytes per rank (S
// divisible by N), like the ring: on a Mesh whose links are all fast
// (shared memory, one switch) it beats the ring's 2(N-1) dependent hops
// for medium sizes; each rank talks to N-1 peers at once, so it suits
// small N.
//
// The order depends only on N and the length, and every rank ends with
// the bytes computed by each segment's owner: results are bitwise identical
// everywhere and across runs.
//
// Execution: when everything a rank sends on one link fits a transport's
// buffer (SmallBytes), the caller's goroutine sends its scatter messages,
// receives and folds the contributions in rank order, sends its segment to
// everybody and receives theirs: no goroutine hand-off. Otherwise one
// sender and one receiver goroutine per peer run concurrently (every link
// is drained while every link is written, so a full transport buffer never
// deadlocks the all-to-all): a sender writes its peer's scatter chunks and,
// as soon as the reducer (the caller's goroutine) has finished a chunk of
// the own segment, that chunk's allgather message; a receiver reads the
// peer's messages in the order they were sent (scatter chunks into a
// staging area and allgather chunks into the buffer).
//
// The direct allreduce (direct.go) is the same engine with every rank
// owning the whole buffer and no allgather.

const (
	stepScatter = 1
	stepGather  = 2
)

// meshReduce runs scatter-gather (direct false) or the direct allreduce
// (direct true) of buf over r.mesh. buf must be aligned for the dtype.
func (r *Ring) meshReduce(ctx context.Context, buf []byte, direct bool) error {
	p := &r.p
	n, esz, count := r.size, p.esz, p.call.Count
	rng := func(j int) (off, cnt int) {
		if direct {
			return 0, count
		}
		return Segment(count, n, j)
	}
	ownOff, ownN := rng(r.rank)
	gather := !direct
	// Every rank must make the same choice: a sequential rank expects all
	// scatter messages of a peer before its allgather messages, which a
	// pipelined peer may interleave. So it is taken for the largest
	// segment, the same on every rank.
	bytesOn := func(cnt int) int { return cnt*esz + numChunks(cnt, p.ce)*HeaderSize }
	_, maxSeg := rng(0)
	link := bytesOn(maxSeg)
	if gather {
		link *= 2
	}
	small := link <= SmallBytes
	r.startPhases(0)
	if small {
		return r.meshReduceSeq(ctx, buf, direct, rng, ownOff, ownN)
	}
	return r.meshReducePipe(ctx, buf, direct, rng, ownOff, ownN)
}

// foldInOrder reduces the N contributions to one piece of the buffer into
// acc, in rank order, ((x(0) op x(1)) op x(2)) op ..., and divides by N
// for Avg: x(j) returns rank j's contribution (as long as acc, aligned).
func (r *Ring) foldInOrder(acc []byte, x func(j int) []byte) {
	p := &r.p
	dt, op := p.call.DType, p.call.Op
	reduceBytes(dt, op, acc, x(0), x(1))
	for j := 2; j < r.size; j++ {
		reduceBytes(dt, op, acc, acc, x(j))
	}
	if op == Avg {
		divBytes(dt, acc, r.size)
	}
}

func (r *Ring) meshReduceSeq(ctx context.Context, buf []byte, direct bool, rng func(int) (int, int), ownOff, ownN int) error {
	p := &r.p
	n, me, esz := r.size, r.rank, p.esz
	s := r.newSenderOnce()
	for k := 1; k < n; k++ {
		to := mod(me+k, n)
		off, cnt := rng(to)
		if err := r.sendRange(ctx, s, to, stepScatter, buf, off, cnt, nil); err != nil {
			return err
		}
	}
	// Receive every contribution to the own range (whole, it is small),
	// then fold in rank order.
	ownB := ownN * esz
	r.work = growAligned(r.work, (n-1)*ownB+ownB)
	stage := r.work[:(n-1)*ownB]
	acc := r.work[(n-1)*ownB : n*ownB]
	slot := func(j int) []byte { i := mod(j-me, n) - 1; return stage[i*ownB : (i+1)*ownB] }
	for k := 1; k < n; k++ {
		from := mod(me-k, n)
		if err := r.recvRange(ctx, from, stepScatter, slot(from), ownOff, ownN); err != nil {
			return err
		}
	}
	tReduce := time.Now()
	own := buf[ownOff*esz : ownOff*esz+ownB]
	if ownN > 0 {
		r.foldInOrder(acc, func(j int) []byte {
			if j == me {
				return own
			}
			return slot(j)
		})
		copy(own, acc)
	}
	tReduced := time.Now()
	if !direct {
		for k := 1; k < n; k++ {
			to := mod(me+k, n)
			if err := r.sendRange(ctx, s, to, stepGather, buf, ownOff, ownN, nil); err != nil {
				return err
			}
		}
		for k := 1; k < n; k++ {
			from := mod(me-k, n)
			off, cnt := rng(from)
			if err := r.recvRange(ctx, from, stepGather, buf[off*esz:(off+cnt)*esz], off, cnt); err != nil {
				return err
			}
		}
	}
	r.reportMeshPhases(direct, tReduce, tReduced)
	return nil
}

// recvRange receives elements [off, off+cnt) of step from rank from into
// dst (cnt elements).
func (r *Ring) recvRange(ctx context.Context, from, step int, dst []byte, off, cnt int) error {
	p := &r.p
	for c, nc := 0, numChunks(cnt, p.ce); c < nc; c++ {
		lo := c * p.ce
		k := min(p.ce, cnt-lo)
		h, err := r.recvHeader(ctx, from, r.rhdr[:], step)
		if err != nil {
			return err
		}
		if err := r.checkPos(&h, from, step, c, off+lo, k*p.esz); err != nil {
			return err
		}
		r.markFirstRecv()
		if err := r.recvPayload(ctx, from, step, dst[lo*p.esz:(lo+k)*p.esz]); err != nil {
			return err
		}
	}
	return nil
}

// reportMeshPhases tells Config.Phase about a scatter-gather ("wait for
// peers", "reduce-scatter", "allgather") or direct ("wait for peers",
// "gather") allreduce.
func (r *Ring) reportMeshPhases(direct bool, tReduce, tReduced time.Time) {
	if r.phase == nil {
		return
	}
	c, start, end := r.p.call, r.callStart, time.Now()
	if !r.firstRecv.IsZero() {
		r.phase(c, "wait for peers", start, r.firstRecv)
		start = r.firstRecv
	}
	if direct {
		r.phase(c, "gather", start, end)
		return
	}
	if tReduced.Before(start) {
		tReduced = start
	}
	r.phase(c, "reduce-scatter", start, tReduced)
	r.phase(c, "allgather", tReduced, end)
}

func (r *Ring) meshReducePipe(ctx context.Context, buf []byte, direct bool, rng func(int) (int, int), ownOff, ownN int) error {
	r.concurrent(true)
	defer r.concurrent(false)
	p := &r.p
	n, me, esz, ce := r.size, r.rank, p.esz, p.ce
	ownB := ownN * esz
	ownC := numChunks(ownN, ce)
	r.work = growAligned(r.work, (n-1)*ownB)
	stage := r.work[:(n-1)*ownB]
	slot := func(j int) []byte { i := mod(j-me, n) - 1; return stage[i*ownB : (i+1)*ownB] }
	r.tmp = growAligned(r.tmp, min(ce, ownN)*esz)

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	var failed atomic.Bool
	var mu sync.Mutex
	var errs []error
	run := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				failed.Store(true)
				cancel(err)
			}
		}()
	}

	var reduced atomic.Int64 // own chunks reduced (and written into buf)
	wakes := make([]chan struct{}, n)
	arrived := make([]chan struct{}, n)
	sent := make([]atomic.Int64, n) // scatter chunks handed to the transport, per peer
	sentWake := make(chan struct{}, 1)
	var firsts sync.WaitGroup
	for k := 1; k < n; k++ {
		j := mod(me+k, n)
		wakes[j] = make(chan struct{}, 1)
		arrived[j] = make(chan struct{}, ownC)
	}
	firsts.Add(n - 1)
	for k := 1; k < n; k++ {
		to, from := mod(me+k, n), mod(me-k, n)
		run(func() error {
			return r.meshSender(ctx, buf, to, direct, rng, ownOff, ownN, &reduced, wakes[to], &sent[to], sentWake, &firsts)
		})
		run(func() error {
			return r.meshReceiver(ctx, buf, from, direct, rng, ownOff, ownN, slot(from), arrived[from])
		})
	}

	// The reducer.
	var tReduce, tReduced time.Time
	rerr := func() error {
		for c := 0; c < ownC; c++ {
			for j := range n {
				if j == me {
					continue
				}
				select {
				case <-arrived[j]:
				case <-ctx.Done():
					return fmt.Errorf("%s: waiting for chunk %d from rank %d: %w", r.stepPrefix(stepScatter), c, j, context.Cause(ctx))
				}
			}
			if c == 0 {
				tReduce = time.Now()
				if r.phase != nil {
					r.firstRecv = tReduce // the receivers run on other goroutines
				}
			}
			lo := c * ce
			k := min(ce, ownN-lo)
			if direct { // the senders read the buffer we are about to overwrite
				for j := range n {
					for j != me && sent[j].Load() <= int64(c) {
						select {
						case <-sentWake:
						case <-ctx.Done():
							return fmt.Errorf("%s: waiting to send chunk %d to rank %d: %w", r.stepPrefix(stepScatter), c, j, context.Cause(ctx))
						}
					}
				}
			}
			own := buf[(ownOff+lo)*esz : (ownOff+lo+k)*esz]
			if k > 0 {
				acc := r.tmp[:k*esz]
				r.foldInOrder(acc, func(j int) []byte {
					if j == me {
						return own
					}
					return slot(j)[lo*esz : (lo+k)*esz]
				})
				copy(own, acc)
			}
			reduced.Store(int64(c + 1))
			for _, w := range wakes {
				if w != nil {
					notify(w)
				}
			}
		}
		tReduced = time.Now()
		return nil
	}()
	if rerr != nil {
		var me *MismatchError
		if errors.As(rerr, &me) {
			waitGroupGrace(ctx, &firsts)
		}
		failed.Store(true)
		cancel(rerr)
	}
	wg.Wait()
	if failed.Load() {
		mu.Lock()
		defer mu.Unlock()
		return rootCause(ctx, append(errs, rerr)...)
	}
	r.reportMeshPhases(direct, tReduce, tReduced)
	return nil
}

// waitGroupGrace waits (at most mismatchGrace) for wg.
func waitGroupGrace(ctx context.Context, wg *sync.WaitGroup) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	awaitFirst(ctx, done)
}

// meshSender writes to peer to: its scatter chunks (its segment, or the
// whole buffer for direct) and, for scatter-gather, each chunk of the own
// segment once reduced, preferring those.
func (r *Ring) meshSender(ctx context.Context, buf []byte, to int, direct bool, rng func(int) (int, int), ownOff, ownN int,
	reduced *atomic.Int64, wake <-chan struct{}, sent *atomic.Int64, sentWake chan struct{}, first *sync.WaitGroup) error {
	p := &r.p
	s := r.newSender()
	once := sync.OnceFunc(first.Done)
	defer once()
	off, cnt := rng(to)
	sc := numChunks(cnt, p.ce)
	gc := 0
	if !direct {
		gc = numChunks(ownN, p.ce)
	}
	for si, gi := 0, 0; si < sc || gi < gc; {
		if gi < gc && reduced.Load() > int64(gi) {
			lo := gi * p.ce
			k := min(p.ce, ownN-lo)
			if err := r.send(ctx, s, to, stepGather, gi, ownOff+lo, buf[(ownOff+lo)*p.esz:(ownOff+lo+k)*p.esz]); err != nil {
				return err
			}
			gi++
			once()
			continue
		}
		if si < sc {
			lo := si * p.ce
			k := min(p.ce, cnt-lo)
			if err := r.send(ctx, s, to, stepScatter, si, off+lo, buf[(off+lo)*p.esz:(off+lo+k)*p.esz]); err != nil {
				return err
			}
			si++
			sent.Store(int64(si))
			notify(sentWake)
			once()
			continue
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return fmt.Errorf("%s: waiting to send chunk %d to rank %d: %w", r.stepPrefix(stepGather), gi, to, context.Cause(ctx))
		}
	}
	return nil
}

// meshReceiver reads everything peer from sends: its contributions to the
// own range (scatter chunks, into stage, announced on arrived) and, for
// scatter-gather, its reduced segment (allgather chunks, into buf). Each
// kind arrives in chunk order; they interleave as the peer sent them.
func (r *Ring) meshReceiver(ctx context.Context, buf []byte, from int, direct bool, rng func(int) (int, int), ownOff, ownN int,
	stage []byte, arrived chan<- struct{}) error {
	p := &r.p
	var hdr [HeaderSize]byte
	wantS := numChunks(ownN, p.ce)
	gOff, gN := rng(from)
	wantG := 0
	if !direct {
		wantG = numChunks(gN, p.ce)
	}
	for ns, ng := 0, 0; ns < wantS || ng < wantG; {
		want := stepScatter
		if ns == wantS {
			want = stepGather
		}
		h, err := r.recvHeader(ctx, from, hdr[:], want)
		if err != nil {
			return err
		}
		var dst []byte
		switch {
		case h.Step == stepScatter && ns < wantS:
			lo := ns * p.ce
			k := min(p.ce, ownN-lo)
			if err := r.checkPos(&h, from, stepScatter, ns, ownOff+lo, k*p.esz); err != nil {
				return err
			}
			dst = stage[lo*p.esz : (lo+k)*p.esz]
		case h.Step == stepGather && ng < wantG:
			lo := ng * p.ce
			k := min(p.ce, gN-lo)
			if err := r.checkPos(&h, from, stepGather, ng, gOff+lo, k*p.esz); err != nil {
				return err
			}
			dst = buf[(gOff+lo)*p.esz : (gOff+lo+k)*p.esz]
		default:
			return fmt.Errorf("%s: recv from rank %d: protocol error: got step %d chunk %d, want scatter chunk %d of %d or allgather chunk %d of %d",
				r.stepPrefix(want), from, h.Step, h.Chunk, ns, wantS, ng, wantG)
		}
		if err := r.recvPayload(ctx, from, int(h.Step), dst); err != nil {
			return err
		}
		if h.Step == stepScatter {
			ns++
			arrived <- struct{}{} // room for every chunk: never blocks
		} else {
			ng++
		}
	}
	return nil
}
