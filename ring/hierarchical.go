package ring

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Hierarchical allreduce (as Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE and
// NCCL's trees): reduce inside each host, allreduce across hosts, gather
// inside each host, striped so that every rank's links work at once and
// only 2(H-1)/H of the buffer leaves each host, whatever the number of
// ranks on it.
//
// Layout. Config.Hosts gives every rank a host. Hosts are ordered by their
// lowest rank (host position g = 0..H-1), and the ranks of a host by rank
// (local index l = 0..L-1). Every host must have the same number L of
// ranks. Rank (g, l) is the l-th rank of the g-th host.
//
// Buffer. The Count elements are split into L segments as the ring splits
// them (the first Count%L get one extra element; some may be empty), and
// segment l into H subsegments the same way. Every subsegment travels in
// chunks of at most Config.ChunkBytes; an empty one as one header-only
// message, so every link checks the call even for Count 0 or Count < N.
//
// Schedule, for rank (g, l) (subsegment indices mod H):
//
//	(a) host reduce-scatter, direct: send segment j of the buffer to local
//	    rank j, for every j != l, subsegments in the order g-1, g-2, ...,
//	    g-H (message step s = 0..H-1 for the s-th), and receive every local
//	    rank's copy of segment l. As soon as chunk c of a subsegment has
//	    arrived from all L-1 peers it is folded in local-rank order:
//	    P_g = ((x(g,0) op x(g,1)) op x(g,2)) ... op x(g,L-1).
//	(b) cross-host allreduce of segment l among the H ranks with local
//	    index l, one per host, as a pipelined chunked ring on host
//	    positions (next g+1, previous g-1): a header-only hello (step H),
//	    then reduce-scatter steps t = 0..H-2 (send subsegment g-t-1,
//	    receive g-t-2 and reduce: buf = buf op received), then allgather
//	    steps t = H-1..2H-3 (send g-s, receive g-s-1, s = t-H+1, copied),
//	    message steps H+1+t. The subsegment sent at step t is the one
//	    received at step t-1 (or, at t = 0, the first one folded in (a)),
//	    so every chunk moves on as soon as it is ready: (a) and (b) overlap.
//	    When the subsegments are tiny this is the whole-segment exchange:
//	    one message per step.
//	(c) host allgather: every chunk of segment l that becomes final (the
//	    owned subsegment g at step H-2, then g-1, g-2, ... as the allgather
//	    brings them) goes at once to every other local rank (message steps
//	    3H-1+s for the s-th subsegment), and segment j arrives from local
//	    rank j straight into the buffer.
//
// Links: intra-host pairs carry (a) then (c); the pairs (g, l) -> (g+1, l)
// carry (b); no other pair talks. Every link has its own sender and
// receiver goroutine, and senders take their messages from queues sized
// for the whole call, so no producer waits for the network and no
// transport buffer can deadlock the schedule: receivers read every message
// as it comes, and the only thing one ever waits for is this rank's own
// host fold of a chunk (the cross-host receiver, before it reduces into
// it), which needs intra-host messages only.
//
// Memory: the copies of our segment sent by the L-1 local peers,
// (L-1)/L * S bytes, kept in the Ring (its ReduceScatter work buffer) and
// reused; one chunk of scratch for the cross-host reduce.
//
// Example H = 2, L = 2 (ranks 0,1 on host A, 2,3 on host B), S bytes:
// rank 0 sends segment 1 to rank 1 and folds segment 0 of ranks 0 and 1;
// ranks 0 and 2 allreduce segment 0 (each owns one half of it), ranks 1
// and 3 segment 1, over the two cross-host links at the same time; rank 0
// sends segment 0 to rank 1 and receives segment 1. Each host sends
// 2(H-1)/H * S = S bytes across, half of it from each rank; the flat ring
// 0-1-2-3 sends 2(N-1)/N * S = 1.5 S across each of its two cross-host
// links.
//
// Reduction order: subsegment k of segment l is
//
//	(((P_{k+1} op P_{k+2}) op ...) op P_{k+H-1}) op P_k   (host positions mod H)
//
// up to the order of the two operands of each op (commutative for every
// op), with P_g the host fold above, computed once by the owner (k, l) and
// copied everywhere else: it depends only on N, the host layout and the
// length, and every rank ends with bitwise-identical bytes. Avg is a Sum
// followed by one division by N (truncating for integers) by the owner,
// at the last reduce-scatter step (at the end of (a) when H = 1).
//
// Traffic: every rank sends 2(L-1)/L * S within its host and 2(H-1)/(HL)
// * S across hosts, so each host sends 2(H-1)/H * S across (the flat ring
// sends 2(N-1)/N * S on each link, and a ring of hosts laid out rank by
// rank crosses hosts on H of its links).
//
// Ranks that call something else are caught by the header check on every
// link they share (*MismatchError, *EpochError), as in the other
// schedules; the hello makes the cross-host links report a mismatch at
// once even when the data of (b) never comes.
//
// Code: hierarchical_layout.go says where the schedule runs (the host
// layout, HierarchicalMinBytes); this file holds a call's state, its
// message numbering and orders, and run, which queues the messages and
// starts the per-link work of hierarchical_links.go.

// hmsg is one message queued for a peer.
type hmsg struct {
	step, chunk uint32
	off         int // element offset in the buffer
	payload     []byte
}

// hier is the state of one hierarchical allreduce on one rank.
type hier struct {
	r    *Ring
	mesh Mesh
	c    Call
	lay  hierLayout
	buf  []byte // the (aligned) buffer
	esz  int
	ce   int // elements per chunk

	segOff, segLen int    // this rank's segment (elements)
	scratchA       []byte // (L-1) copies of segment idx, one per local peer
	scratchB       []byte // one chunk, for the cross-host reduce

	ctx    context.Context
	cancel context.CancelCauseFunc
	queues map[int]chan hmsg // per peer rank
	// arrivedA[j]: chunks of phase (a) that arrived from local index j.
	arrivedA  []chan struct{}
	aProgress atomic.Int64 // chunks folded in (a)
	aWake     chan struct{}
	firstWG   sync.WaitGroup // senders that have not sent their first message
	allFirst  chan struct{}  // closed when firstWG is done
	tA, tB    time.Time
}

// Message steps of the four kinds of messages.
func (x *hier) stepA(s int) uint32 { return uint32(s) }
func (x *hier) stepHello() uint32  { return uint32(x.lay.h) }
func (x *hier) stepB(t int) uint32 { return uint32(x.lay.h + 1 + t) }
func (x *hier) stepC(s int) uint32 { return uint32(3*x.lay.h - 1 + s) }

func (x *hier) phaseOf(step uint32) string {
	h := uint32(x.lay.h)
	switch {
	case step < h:
		return "host reduce-scatter"
	case step == h:
		return "cross-host hello"
	case step < 3*h-1:
		return "cross-host allreduce"
	}
	return "host allgather"
}

func (x *hier) prefix(step uint32) string {
	return fmt.Sprintf("%s #%d hierarchical step %d (%s)", x.c.Kind, x.c.Seq, step, x.phaseOf(step))
}

// sub returns the element offset and length of subsegment k of segment seg.
func (x *hier) sub(seg, k int) (off, n int) {
	so, sn := Segment(x.c.Count, x.lay.l, seg)
	o, n := Segment(sn, x.lay.h, k)
	return so + o, n
}

// chunk returns the element range of chunk c of a subsegment at off, n.
func (x *hier) chunk(off, n, c int) (lo, k int) {
	lo = c * x.ce
	return off + lo, min(x.ce, n-lo)
}

func (x *hier) bytes(off, n int) []byte { return x.buf[off*x.esz : (off+n)*x.esz] }

// Subsegment orders: the s-th folded in (a) (and sent there), and the s-th
// to become final (and sent in (c)). Both depend only on the host, which
// the two ends of an intra-host link share.
func (x *hier) foldOrder(s int) int  { return mod(x.lay.host-1-s, x.lay.h) }
func (x *hier) finalOrder(s int) int { return mod(x.lay.host-s, x.lay.h) }

// Cross-host ring: subsegments sent and received at step t.
func (x *hier) sendSub(t int) int {
	if t < x.lay.h-1 {
		return mod(x.lay.host-t-1, x.lay.h)
	}
	return mod(x.lay.host-(t-x.lay.h+1), x.lay.h)
}

func (x *hier) recvSub(t int) int {
	if t < x.lay.h-1 {
		return mod(x.lay.host-t-2, x.lay.h)
	}
	return mod(x.lay.host-(t-x.lay.h+1)-1, x.lay.h)
}

// segChunks is the number of messages segment seg takes (all subsegments).
func (x *hier) segChunks(seg int) int {
	n := 0
	for k := range x.lay.h {
		_, sn := x.sub(seg, k)
		n += numChunks(sn, x.ce)
	}
	return n
}

func (x *hier) peer(g, j int) int { return x.lay.members[g][j] }

// allreduceHierarchical runs the hierarchical allreduce of buf (see the top
// of this file). c is a validated, normalized Allreduce call; it runs with
// c.Algo = AlgoHierarchical. It needs a Mesh and the same number of ranks
// on every host.
func (r *Ring) allreduceHierarchical(ctx context.Context, c Call, buf []byte) error {
	c.Algo = AlgoHierarchical
	if r.size == 1 {
		return nil
	}
	mesh, ok := r.t.(Mesh)
	if !ok {
		return fmt.Errorf("ring: %s #%d: the hierarchical allreduce needs a Mesh transport", c.Kind, c.Seq)
	}
	lay, ok := hierLayoutOf(r.hosts, r.size, r.rank)
	if !ok {
		return fmt.Errorf("ring: %s #%d: the hierarchical allreduce needs the same number of ranks on every host (hosts %v)", c.Kind, c.Seq, r.hosts)
	}
	esz := c.DType.Size()
	if err := checkLen(c, "buffer", buf, c.Count*esz); err != nil {
		return err
	}
	work := buf
	if !aligned(buf, esz) {
		r.tmp = growAligned(r.tmp, len(buf))
		work = r.tmp[:len(buf)]
		copy(work, buf)
	}
	x := &hier{r: r, mesh: mesh, c: c, lay: lay, buf: work, esz: esz, ce: max(1, r.chunkBytes/esz)}
	x.segOff, x.segLen = Segment(c.Count, lay.l, lay.idx)
	r.work = growAligned(r.work, (lay.l-1)*x.segLen*esz)
	x.scratchA = r.work[:(lay.l-1)*x.segLen*esz]
	r.scratch = growAligned(r.scratch, min(x.ce, (x.segLen+lay.h-1)/lay.h)*esz)
	x.scratchB = r.scratch
	if err := x.run(ctx); err != nil {
		return err
	}
	if len(work) > 0 && &work[0] != &buf[0] {
		copy(buf, work)
	}
	return nil
}

func (x *hier) run(parent context.Context) error {
	r, lay := x.r, x.lay
	r.concurrent(true)
	defer r.concurrent(false)
	start := time.Now()
	ctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)
	x.ctx, x.cancel = ctx, cancel
	x.aWake = make(chan struct{}, 1)
	x.allFirst = make(chan struct{})
	x.queues = make(map[int]chan hmsg, lay.l+1)
	x.arrivedA = make([]chan struct{}, lay.l)
	var next, prev int
	if lay.h > 1 {
		next, prev = x.peer(mod(lay.host+1, lay.h), lay.idx), x.peer(mod(lay.host-1, lay.h), lay.idx)
	}

	// Queues: intra-host peers get (a) now and (c) later; the next host
	// gets the 2(H-1) steps of (b).
	own := x.segChunks(lay.idx)
	for j := range lay.l {
		if j == lay.idx {
			continue
		}
		q := make(chan hmsg, x.segChunks(j)+own)
		for s := range lay.h {
			off, n := x.sub(j, x.foldOrder(s))
			for c := range numChunks(n, x.ce) {
				lo, k := x.chunk(off, n, c)
				q <- hmsg{step: x.stepA(s), chunk: uint32(c), off: lo, payload: x.bytes(lo, max(k, 0))}
			}
		}
		x.queues[x.peer(lay.host, j)] = q
		x.arrivedA[j] = make(chan struct{}, own)
	}
	bSends := 0
	if lay.h > 1 {
		for t := range 2 * (lay.h - 1) {
			_, n := x.sub(lay.idx, x.sendSub(t))
			bSends += numChunks(n, x.ce)
		}
		x.queues[next] = make(chan hmsg, bSends)
	}

	var wg sync.WaitGroup
	var mu sync.Mutex
	// The root cause: later failures follow from its cancel. A sender
	// that waited for data in vain says less than the receiver that
	// waited with it, so it is kept only when nothing else failed.
	var firstErr, idleErr error
	fail := func(err error) {
		mu.Lock()
		var idle *sendIdleError
		if errors.As(err, &idle) {
			if idleErr == nil {
				idleErr = idle.err
			}
		} else if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		var me *MismatchError
		var ee *EpochError
		if errors.As(err, &me) || errors.As(err, &ee) {
			// Let our own first messages go out, so that the peers
			// report the mismatch too instead of waiting for ctx.
			t := time.NewTimer(mismatchGrace)
			select {
			case <-x.allFirst:
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
		}
		cancel(err)
	}
	goRun := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				fail(err)
			}
		}()
	}
	for j := range lay.l {
		if j == lay.idx {
			continue
		}
		p := x.peer(lay.host, j)
		x.firstWG.Add(1)
		goRun(func() error { return x.sendLoop(p, false, x.segChunks(j)+own) })
		goRun(func() error { return x.recvLocal(j) })
	}
	if lay.h > 1 {
		x.firstWG.Add(1)
		goRun(func() error { return x.sendLoop(next, true, bSends) })
		goRun(func() error { return x.recvCross(prev, next) })
	}
	go func() {
		x.firstWG.Wait()
		close(x.allFirst)
	}()

	if err := x.fold(next); err != nil {
		fail(err)
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	if idleErr != nil {
		return idleErr
	}
	if r.phase != nil {
		tB := x.tB
		if lay.h == 1 {
			tB = x.tA
		}
		r.phase(x.c, "host reduce-scatter", start, x.tA)
		r.phase(x.c, "cross-host allreduce", x.tA, tB)
		r.phase(x.c, "host allgather", tB, time.Now())
	}
	return nil
}
