package ring

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"time"
)

// The Ring: its configuration, its construction and the checks every call
// goes through before it runs. Each collective is a method in a file of its
// own, with its schedule explained at the top (see doc.go); the ring
// collectives run on the pipelined engine (plan.go, engine.go), the Mesh
// schedules on the point-to-point framing of exchange.go.

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
	// Links, if set, is the agreed model of the job's links: where Hosts
	// spans several hosts and the transport is a Mesh, the zero policy is
	// then the one CrossHostPolicy derives from it instead of the
	// measured defaults. Every rank must be given the same Links.
	Links *Links
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
	hosts      []int // Config.Hosts
	// defaults is what the zero policy picks from: defaultRules, or
	// CrossHostPolicy's with linkModel. An atomic pointer: a caller may
	// refine the link model's rules between calls (SetDefaultAllreduce)
	// while others read the policy.
	defaults  atomic.Pointer[[]AllreduceRule]
	linkModel bool        // defaults come from Config.Links (CrossHostPolicy)
	modelled  []Algorithm // ModelCandidates of the layout: what AllreduceWith and SetDefaultAllreduce accept
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
	// Race builds only (engine_race.go): the pipelined run's messages sent.
	racePipelined bool
	raceSentMsgs  atomic.Int64
	raceSentWake  chan struct{} // cap 1
	raceIndex     []int
	sendBufs      [2][]byte // header + payload handed to SendNext (avoids a variadic allocation)
	shdr          [HeaderSize]byte
	rhdr          [HeaderSize]byte
	scratch       []byte // receive buffer for chunks that are reduced
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
	if raceBuild {
		r.raceSentWake = make(chan struct{}, 1)
	}
	defaults := defaultRules(r.size, mesh != nil, oneHost(r.hosts))
	if cfg.Links != nil && mesh != nil {
		if p, ok := CrossHostPolicy(r.size, r.hosts, *cfg.Links, cb); ok {
			defaults, r.linkModel = p.Rules, true
		}
	}
	r.defaults.Store(&defaults)
	r.modelled = ModelCandidates(r.size, r.hosts)
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
