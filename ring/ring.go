package ring

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"
)

// DefaultChunkBytes is the chunk size used when Config.ChunkBytes is 0.
//
// A chunk is the unit of pipelining. Too small, and the per-message cost
// (header, two syscalls per message, a goroutine wake-up) dominates. Too
// large, and a segment is only a few chunks, so the pipeline never fills,
// and a chunk no longer fits a socket or pipe buffer, so sender and
// receiver take turns instead of overlapping. In between, 128 KiB..1 MiB,
// the choice makes no difference beyond the noise (BenchmarkChunk; see
// BENCHMARKS.md, "Chunk size"): the in-memory transport prefers the low
// end, TCP the high end.
//
// 256 KiB is in the middle of that range, keeps a chunk (and the scratch
// receive buffer being reduced) L2-resident, fits default socket buffers,
// and still yields >= 2N chunks per segment (Gloo's rule of thumb) for
// tensors from 2N*N*256 KiB upward (8 MiB at N=4); KungFu uses 1 MiB and
// NCCL 128-512 KiB slices, so it is in the usual range.
const DefaultChunkBytes = 256 << 10

// maxChunkBytes bounds Config.ChunkBytes so a chunk length fits the header.
const maxChunkBytes = 1 << 30

// Config configures a Ring.
type Config struct {
	Rank, Size int
	// ChunkBytes is the largest payload of one message; each segment is
	// split into chunks of at most this size which are pipelined. 0 means
	// DefaultChunkBytes. It is rounded down to whole elements (at least one).
	ChunkBytes int
	// Phase, if set, is told the phases of every collective once it has
	// finished: "wait for peers" (until the first message arrived),
	// "reduce-scatter" and "allgather" for a ring, scatter-gather or
	// Rabenseifner allreduce, "gather" for a direct one,
	// "recursive-doubling" for that one,
	// "compress+scatter+reduce" (until
	// the last owned chunk is reduced) and "allgather+decode" (the rest) for
	// a compressed one, and the kind's name for the
	// others. It runs on the caller's goroutine and must be quick.
	Phase func(c Call, phase string, start, end time.Time)
	// Epoch is the membership epoch this ring belongs to (an opaque
	// generation, at most MaxEpoch; see EpochOf). It travels in every
	// message header, and a message of another epoch is refused with an
	// *EpochError, so nothing sent on a ring of an earlier membership is
	// ever mixed into this one. 0, the value of a fixed-size job, sends
	// exactly the bytes sent before epochs existed.
	Epoch uint32
	// Elastic says the ring belongs to a job whose membership changes, so
	// a message of another epoch means a peer of another membership. A
	// ring that is not elastic must have Epoch 0, and a message with
	// nonzero epoch bytes is reported as it was before epochs existed: a
	// nonzero reserved header field (a peer of another version, or noise).
	Elastic bool
	// Hosts, if set, has one entry per rank: the index of the host the
	// rank runs on (ranks with equal entries share a host). The ring uses
	// it to pick the hierarchical allreduce (hierarchical.go) when several
	// ranks share a host; nil means every rank is on its own host.
	Hosts []int
	// Allreduce chooses the allreduce algorithm by buffer size (see
	// AllreducePolicy and ParseAllreducePolicy); the zero value is the
	// measured default for the ring's size and transport. Every rank must
	// use the same policy: the algorithm is part of the call fingerprint.
	Allreduce AllreducePolicy
}

// Ring runs collectives over a Transport connecting Rank to Rank+1 (send)
// and Rank-1 (receive), modulo Size.
//
// A Ring runs one collective at a time: callers must serialize calls (a
// concurrent call fails with an error instead of corrupting state). Scratch
// buffers (one chunk for receiving, and the size of the input for
// ReduceScatter partial sums) are kept in the Ring and reused across calls,
// so steady-state calls do not allocate per chunk.
type Ring struct {
	rank, size int
	prev, next int
	epoch      uint32
	elastic    bool
	chunkBytes int
	t          Transport
	mesh       Mesh // t, when it is a Mesh
	policy     AllreducePolicy
	phase      func(Call, string, time.Time, time.Time)
	hosts      []int           // Config.Hosts
	defaults   []AllreduceRule // defaultRules for this ring: what the zero policy picks from
	// What the transport offers besides Transport (nil if not), asked
	// once in New rather than on every step or chunk.
	view     ViewReceiver
	linkBufs LinkBuffers
	grouped  GroupedSteps

	// Phase timing of the running call (only when phase is set).
	callStart, firstRecv time.Time
	midPhase             time.Time // Rabenseifner: end of the reduce-scatter
	stepDone             []time.Time
	busy                 atomic.Bool

	// Per-call state, owned by the running collective.
	p        plan
	progress atomic.Int64  // receive chunks completed in this call
	wake     chan struct{} // cap 1: receiver -> sender "progress advanced"
	sendErr  chan error    // cap 1: sender goroutine result
	first    chan struct{} // cap 1: sender sent its first message (or cannot)
	sendBufs [2][]byte     // header + payload handed to SendNext (avoids a variadic allocation)
	shdr     [HeaderSize]byte
	rhdr     [HeaderSize]byte
	scratch  []byte // receive buffer for chunks that are reduced
	// fold is the chunk being reduced from a ViewReceiver's spans, and
	// foldSpan its span method bound once (a method value or closure per
	// chunk would allocate on every chunk).
	fold     viewFold
	foldSpan func(span []byte)
	work     []byte // ReduceScatter partial results
	tmp      []byte // realignment of misaligned user buffers; tiny allreduce accumulator
	gather   []byte // every rank's buffer, for tiny allreduces
	cbufs    compressedBufs
	snd      sender // the caller's (or one exchange goroutine's) header and buffer list, Mesh schedules
	align    []byte // aligned copy of a misaligned user buffer, Mesh schedules

	payloadSent, headerSent, msgs, payloadRecv atomic.Uint64
}

// New returns a Ring for cfg over t. t may be nil only when cfg.Size is 1.
func New(cfg Config, t Transport) (*Ring, error) {
	switch {
	case cfg.Size < 1:
		return nil, fmt.Errorf("ring: size %d < 1", cfg.Size)
	case cfg.Size > maxRoot:
		return nil, fmt.Errorf("ring: size %d too large", cfg.Size)
	case cfg.Rank < 0 || cfg.Rank >= cfg.Size:
		return nil, fmt.Errorf("ring: rank %d out of range [0, %d)", cfg.Rank, cfg.Size)
	case cfg.ChunkBytes < 0 || cfg.ChunkBytes > maxChunkBytes:
		return nil, fmt.Errorf("ring: chunk size %d out of range [0, %d]", cfg.ChunkBytes, maxChunkBytes)
	case t == nil && cfg.Size > 1:
		return nil, errors.New("ring: nil transport")
	case cfg.Epoch > MaxEpoch:
		return nil, fmt.Errorf("ring: epoch %d does not fit the header's 24 bits (wrap it with EpochOf)", cfg.Epoch)
	case cfg.Hosts != nil && len(cfg.Hosts) != cfg.Size:
		return nil, fmt.Errorf("ring: %d host entries for %d ranks", len(cfg.Hosts), cfg.Size)
	case cfg.Epoch != 0 && !cfg.Elastic:
		return nil, fmt.Errorf("ring: epoch %d on a ring that is not elastic (set Config.Elastic)", cfg.Epoch)
	}
	if err := cfg.Allreduce.validate(); err != nil {
		return nil, fmt.Errorf("ring: allreduce policy: %w", err)
	}
	mesh, _ := t.(Mesh)
	cb := cfg.ChunkBytes
	if cb == 0 {
		cb = DefaultChunkBytes
	}
	r := &Ring{
		rank:       cfg.Rank,
		size:       cfg.Size,
		prev:       (cfg.Rank + cfg.Size - 1) % cfg.Size,
		next:       (cfg.Rank + 1) % cfg.Size,
		epoch:      cfg.Epoch,
		elastic:    cfg.Elastic,
		chunkBytes: cb,
		t:          t,
		mesh:       mesh,
		policy:     AllreducePolicy{Rules: slices.Clone(cfg.Allreduce.Rules)},
		phase:      cfg.Phase,
		hosts:      slices.Clone(cfg.Hosts),
		wake:       make(chan struct{}, 1),
		sendErr:    make(chan error, 1),
		first:      make(chan struct{}, 1),
	}
	r.defaults = defaultRules(r.size, mesh != nil, oneHost(r.hosts))
	r.view, _ = t.(ViewReceiver)
	r.linkBufs, _ = t.(LinkBuffers)
	r.grouped, _ = t.(GroupedSteps)
	r.fold.r = r
	r.foldSpan = r.fold.span
	return r, nil
}

// Rank returns this ring member's rank.
func (r *Ring) Rank() int { return r.rank }

// Size returns the number of ranks.
func (r *Ring) Size() int { return r.size }

// Epoch returns the membership epoch the ring's messages carry.
func (r *Ring) Epoch() uint32 { return r.epoch }

// checkEpoch refuses a message whose header names another membership epoch
// than this ring's. A ring that is not elastic has no epochs: there the
// three bytes are the reserved field they were, and must be zero.
func (r *Ring) checkEpoch(h *Header, c Call, from int) error {
	if h.Epoch == r.epoch {
		return nil
	}
	if !r.elastic {
		return fmt.Errorf("%s #%d: rank %d: recv from rank %d: %w", c.Kind, c.Seq, r.rank, from, ErrReservedHeader)
	}
	return &EpochError{Call: c, Rank: r.rank, From: from, Local: r.epoch, Remote: h.Epoch}
}

// Stats returns cumulative traffic counters. It is safe to call at any time.
func (r *Ring) Stats() Stats {
	return Stats{
		PayloadBytesSent: r.payloadSent.Load(),
		HeaderBytesSent:  r.headerSent.Load(),
		MessagesSent:     r.msgs.Load(),
		PayloadBytesRecv: r.payloadRecv.Load(),
	}
}

// ---------------------------------------------------------------------------
// Call validation.

// begin validates c for kind, normalizes it and marks the ring busy. The
// caller must call r.end() when begin succeeds.
func (r *Ring) begin(kind Kind, c Call) (Call, error) {
	if c.Kind == 0 {
		c.Kind = kind
	}
	if c.Kind != kind {
		return c, fmt.Errorf("ring: %s called with a %s Call", kind.Name(), c.Kind.Name())
	}
	if kind != Barrier {
		switch {
		case !c.DType.valid():
			return c, fmt.Errorf("ring: %s #%d: invalid dtype %d", kind, c.Seq, c.DType)
		case c.Count < 0:
			return c, fmt.Errorf("ring: %s #%d: negative count %d", kind, c.Seq, c.Count)
		case c.Count > math.MaxInt/8/max(r.size, 1):
			return c, fmt.Errorf("ring: %s #%d: count %d too large", kind, c.Seq, c.Count)
		}
	}
	switch kind {
	case Allreduce, ReduceScatter:
		if !c.DType.reducible() {
			return c, fmt.Errorf("ring: %s #%d: cannot reduce dtype %s", kind, c.Seq, c.DType)
		}
		if !c.Op.valid() {
			return c, fmt.Errorf("ring: %s #%d: invalid op %d", kind, c.Seq, c.Op)
		}
	case Broadcast:
		if c.Root < 0 || c.Root >= r.size {
			return c, fmt.Errorf("ring: %s #%d: root %d out of range [0, %d)", kind, c.Seq, c.Root, r.size)
		}
	}
	c = c.normalize()
	if !r.busy.CompareAndSwap(false, true) {
		return c, fmt.Errorf("ring: %s #%d: another collective is running on this Ring (calls must be serialized)", kind, c.Seq)
	}
	return c, nil
}

func (r *Ring) end() {
	r.p = plan{} // drop references to user buffers
	r.busy.Store(false)
}

func checkLen(c Call, what string, b []byte, want int) error {
	if len(b) != want {
		return fmt.Errorf("ring: %s #%d: %s has %d bytes, want %d for %s", c.Kind, c.Seq, what, len(b), want, c)
	}
	return nil
}

// ---------------------------------------------------------------------------
// The pipelined engine shared by all collectives.
//
// A collective is described by a plan: a segment space of count elements
// split into nseg near-equal segments (the first count%nseg get one extra
// element), and a number of steps. At every step a rank sends at most one
// segment to the next rank and receives at most one segment from the
// previous rank (see the step functions in allreduce.go, reducescatter.go,
// allgather.go, broadcast.go, barrier.go). Each segment travels as chunks of
// at most ce elements, one message (header + payload) per chunk; an empty
// segment travels as one header-only message, so every step is checked even
// when there is nothing to move (Count 0, or Count < Size).
//
// Two goroutines run the plan: the receiver (the caller's goroutine) and the
// sender. The receiver processes incoming chunks strictly in order and bumps
// a progress counter after each one. Sends marked dependent (data that must
// first be received/reduced here) consume that progress in the same order:
// the k-th dependent chunk is sent as soon as progress >= k. Because the
// segment sent at step t is the one received at step t-1 (or, for
// Broadcast, at the same step), chunk (t, c) leaves as soon as (t-1, c) has
// been reduced, so sending, receiving and reducing overlap.

type bufID uint8

const (
	bMain bufID = iota // Allreduce/Broadcast buffer, Allgather output
	bIn                // ReduceScatter input
	bWork              // ReduceScatter partial results
	bOut               // ReduceScatter output (holds segment `rank` only)
	nBufs
)

type plan struct {
	call  Call // normalized
	esz   int  // element size (1 for Barrier)
	ce    int  // elements per chunk
	nseg  int
	count int // elements in the segment space
	steps int
	bufs  [nBufs][]byte
	base  [nBufs]int // segment-space byte offset of bufs[i][0]
	// gather: an Allreduce run as an allgather of whole buffers
	// (allreduceTiny); the fingerprint stays the Allreduce call.
	gather bool
}

// step says what a rank does at one step of a plan.
type step struct {
	send, recv int   // segment index, or -1 for none
	dep        bool  // sent chunks wait for matching receive progress
	src        bufID // buffer the sent segment is read from
	dst        bufID // buffer the received segment lands in (copy or reduce result)
	a          bufID // local operand when reducing: dst = a op received
	reduce     bool
	final      bool // apply Avg division after reducing
}

func (p *plan) step(rank, size, t int) step {
	switch p.call.Kind {
	case Allreduce:
		if p.gather {
			return allgatherStep(rank, size, t)
		}
		return allreduceStep(rank, size, t)
	case ReduceScatter:
		return reduceScatterStep(rank, size, t)
	case Allgather:
		return allgatherStep(rank, size, t)
	case Broadcast:
		return broadcastStep(rank, size, p.call.Root)
	case Barrier:
		return barrierStep(t)
	case Shift:
		return shiftStep(rank, size)
	}
	panic("ring: bad kind")
}

// segment returns the element offset and length of segment i.
func (p *plan) segment(i int) (off, n int) {
	q, rem := p.count/p.nseg, p.count%p.nseg
	off = i*q + min(i, rem)
	n = q
	if i < rem {
		n++
	}
	return off, n
}

// bytes returns the bytes of elements [off, off+n) of the segment space in
// buffer id.
func (p *plan) bytes(id bufID, off, n int) []byte {
	s := off*p.esz - p.base[id]
	return p.bufs[id][s : s+n*p.esz]
}

func mod(a, n int) int { return ((a % n) + n) % n }

func numChunks(n, ce int) int {
	if n == 0 {
		return 1 // header-only message
	}
	return (n + ce - 1) / ce
}

// setup fills r.p's common fields and sizes the scratch buffer.
func (r *Ring) setup(c Call, nseg, count, steps int) *plan {
	p := &r.p
	esz := c.DType.Size()
	if esz == 0 {
		esz = 1
	}
	*p = plan{call: c, esz: esz, ce: max(1, r.chunkBytes/esz), nseg: nseg, count: count, steps: steps}
	if c.Kind == Allreduce || c.Kind == ReduceScatter {
		maxSeg := (count + nseg - 1) / nseg
		r.scratch = growAligned(r.scratch, min(p.ce, maxSeg)*esz)
	}
	return p
}

// growAligned returns a buffer of at least n bytes, 8-byte aligned, reusing b
// when it is large enough.
func growAligned(b []byte, n int) []byte {
	if cap(b) >= n {
		return b[:cap(b)]
	}
	w := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), len(w)*8)
}

func (r *Ring) errPrefix(t int) string {
	return fmt.Sprintf("%s #%d step %d", r.p.call.Kind, r.p.call.Seq, t)
}

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

// startPhases begins phase timing for a call of steps steps.
func (r *Ring) startPhases(steps int) {
	if r.phase == nil {
		return
	}
	r.callStart, r.firstRecv = time.Now(), time.Time{}
	if cap(r.stepDone) < steps {
		r.stepDone = make([]time.Time, steps)
	}
	r.stepDone = r.stepDone[:steps]
	clear(r.stepDone)
}

// reportPhases tells Config.Phase how the call just run spent its time.
func (r *Ring) reportPhases() {
	if r.phase == nil {
		return
	}
	c, end := r.p.call, time.Now()
	start := r.callStart
	if !r.firstRecv.IsZero() {
		r.phase(c, "wait for peers", start, r.firstRecv)
		start = r.firstRecv
	}
	switch {
	case c.Kind == Allreduce && !r.p.gather && len(r.stepDone) == 2*(r.size-1) && !r.stepDone[r.size-2].IsZero():
		mid := r.stepDone[r.size-2]
		r.phase(c, "reduce-scatter", start, mid)
		r.phase(c, "allgather", mid, end)
	case c.Kind == Allreduce && r.p.gather:
		r.phase(c, "gather", start, end)
	default:
		r.phase(c, c.Kind.String(), start, end)
	}
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

// recvReduce receives len(dst) bytes from the previous rank and reduces
// them: dst = a op received, straight from a ViewReceiver's spans, else
// through scratch.
func (r *Ring) recvReduce(ctx context.Context, dst, a []byte, final bool) error {
	if r.view != nil {
		r.fold.start(dst, a, final, false, false)
		return r.view.RecvFromView(ctx, r.prev, len(dst), r.foldSpan)
	}
	sc := r.scratch[:len(dst)]
	if err := r.t.RecvPrev(ctx, sc); err != nil {
		return err
	}
	r.reduce(dst, a, sc, final)
	return nil
}

// viewFold reduces one received chunk from the spans a ViewReceiver hands
// over, where they lie (no copy): runs of whole, aligned elements are
// reduced in place; an element split between two spans, or a span not
// aligned for the element type, goes through scratch space.
type viewFold struct {
	r           *Ring
	dst, a      []byte // ring: dst = a op received
	final       bool   // ring: the final reduce-scatter step (Avg divides)
	pair        bool   // a pairwise exchange: dst = dst op received, or received op dst when theirsFirst
	theirsFirst bool
	pos, held   int     // bytes of dst done; bytes of a split element held
	carry       [8]byte // the start of an element split between spans
}

func (f *viewFold) start(dst, a []byte, final, pair, theirsFirst bool) {
	*f = viewFold{r: f.r, dst: dst, a: a, final: final, pair: pair, theirsFirst: theirsFirst}
}

// span folds the next received bytes.
func (f *viewFold) span(span []byte) {
	esz := f.r.p.esz
	if f.held > 0 { // complete the split element
		k := copy(f.carry[f.held:esz], span)
		f.held += k
		span = span[k:]
		if f.held < esz {
			return
		}
		f.apply(f.carry[:esz])
		f.held = 0
	}
	whole := len(span) - len(span)%esz
	if whole > 0 {
		b := span[:whole]
		if !aligned(b, esz) {
			f.r.scratch = growAligned(f.r.scratch, whole)
			b = f.r.scratch[:whole]
			copy(b, span)
		}
		f.apply(b)
	}
	f.held = copy(f.carry[:], span[whole:])
}

// apply reduces b, the received bytes at f.pos, into dst.
func (f *viewFold) apply(b []byte) {
	p, n := f.pos, len(b)
	f.pos += n
	d := f.dst[p : p+n]
	switch {
	case !f.pair:
		f.r.reduce(d, f.a[p:p+n], b, f.final)
	case f.theirsFirst:
		reduceBytes(f.r.p.call.DType, f.r.p.call.Op, d, b, d)
	default:
		reduceBytes(f.r.p.call.DType, f.r.p.call.Op, d, d, b)
	}
}

// reduce computes dst = a op b (then divides by Size on the final Avg step),
// going through aligned scratch space if a user buffer is misaligned.
func (r *Ring) reduce(dst, a, b []byte, final bool) {
	dt, op, esz := r.p.call.DType, r.p.call.Op, r.p.esz
	out := dst
	if !aligned(dst, esz) || !aligned(a, esz) {
		r.tmp = growAligned(r.tmp, len(dst))
		out = r.tmp[:len(dst)]
		copy(out, a)
		a = out
	}
	reduceBytes(dt, op, out, a, b)
	if final && op == Avg {
		divBytes(dt, out, r.size)
	}
	if len(out) > 0 && &out[0] != &dst[0] {
		copy(dst, out)
	}
}
