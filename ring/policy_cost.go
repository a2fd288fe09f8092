package ring

import (
	"math"
	"math/bits"
)

// The cost model behind CrossHostPolicy: each allreduce schedule of this
// package priced, message round by message round, on the job's host
// layout with the agreed Links. It is the model of internal/ringsim (one
// NIC per host shared by its ranks, links within a host each on their
// own, a message costing α plus its bytes times β), which checks these
// formulas against its simulation of the real schedules
// (TestCostModelMatchesSimulation), with γ, the cost of reducing a byte,
// added: a schedule that reduces more bytes per rank (recursive doubling's
// whole buffer every round) pays for it.
//
// Where a schedule overlaps its phases chunk by chunk (the pipelined ring,
// the hierarchical schedule, an exchange reducing as it receives), m
// chunks through stages of total times t_i take the slowest stage plus
// the others' share of one chunk: max t + (Σt - max t)/m; with one chunk
// the stages add up.
//
// A schedule that starts goroutines of its own per call (the
// hierarchical and the compressed ones: a sender and a receiver per link)
// pays one local α for each: handing work to another thread and waking
// it up is what a message between two processes of one host costs too.
// What they cost beyond that shows in the calls timed at start
// (Links.CallOverhead); the hierarchical schedule's, over its goroutines,
// is also what a round too large to send before receiving pays for the
// sender goroutine it starts (senderFor): recursive doubling's whole
// buffers above SmallBytes pay it every round.
//
// Times are integers in femtoseconds (a byte at 1 PB/s), with saturating
// arithmetic: every rank computes exactly the same numbers from the same
// Links, whatever its CPU, as CrossHostPolicy promises.

const femtosPerSecond = 1_000_000_000_000_000

// costModel prices allreduces of one job layout.
type costModel struct {
	size        int
	hostOf      []int // host position of every rank
	hostRanks   []int // ranks on every host
	hier        hierLayout
	hierOK      bool     // the hierarchical schedule runs on this layout
	alpha, beta [2]int64 // [within a host, between hosts]: fs, fs per byte
	gamma       int64    // fs per reduced byte
	chunk       int64
	overhead    [maxAlgo + 1]int64 // Links.CallOverhead, fs
	sender      int64              // a sender goroutine's start and hand-offs, fs (senderCost)
	burst       int64              // Links.Cross.Burst
}

const (
	local = 0
	cross = 1
)

func newCostModel(size int, hosts []int, l Links, chunk int) (*costModel, bool) {
	if size < 2 || len(hosts) != size || !crossHost(hosts) || !l.Valid() {
		return nil, false
	}
	if chunk <= 0 {
		chunk = DefaultChunkBytes
	}
	lay, _ := hierLayoutOf(hosts, size, 0)
	m := &costModel{size: size, hostOf: lay.hostOfRank, hostRanks: make([]int, len(lay.members)), chunk: int64(chunk)}
	shared := false
	for g, ranks := range lay.members {
		m.hostRanks[g] = len(ranks)
		shared = shared || len(ranks) > 1
	}
	if shared && !l.Local.Valid() {
		return nil, false
	}
	m.hier, m.hierOK = hierLayoutOf(hosts, size, 0)
	m.hierOK = m.hierOK && m.hier.h >= 2 && m.hier.l >= 2
	for class, c := range [2]LinkCost{l.Local, l.Cross} {
		if c.Valid() {
			m.alpha[class] = mulSat(c.Latency.Nanoseconds(), 1_000_000)
			m.beta[class] = perByte(c.BytesPerSecond)
		}
	}
	m.burst = max(0, l.Cross.Burst)
	m.sender = m.senderCost()
	m.gamma = perByte(l.ReduceBytesPerSecond)
	for a, d := range l.CallOverhead {
		m.overhead[a] = mulSat(max(0, d.Nanoseconds()), 1_000_000)
	}
	return m, true
}

// perByte is the femtoseconds a byte takes at bps bytes a second (at
// least one).
func perByte(bps int64) int64 { return max(1, femtosPerSecond/bps) }

// candidates are the schedules the model picks from, in the order ties go:
// scatter-gather is left out as by the defaults (defaultRules).
var candidates = []Algorithm{AlgoDirect, AlgoRecursiveDoubling, AlgoRabenseifner, AlgoRing, AlgoHierarchical}

// cheapest returns the algorithm with the lowest modelled time for n
// bytes, and that time.
func (m *costModel) cheapest(n int64) (Algorithm, int64) {
	best, bestT := AlgoRing, int64(math.MaxInt64)
	for _, a := range candidates {
		if t, ok := m.time(a, n); ok && t < bestT {
			best, bestT = a, t
		}
	}
	return best, bestT
}

// time is the modelled time of an allreduce of n bytes with a, and false
// if a does not run on this layout.
func (m *costModel) time(a Algorithm, n int64) (int64, bool) {
	t, ok := m.schedule(a, n)
	return addSat(t, m.overhead[a]), ok
}

// schedule is time without the measured call overhead.
func (m *costModel) schedule(a Algorithm, n int64) (int64, bool) {
	var c cost
	switch a {
	case AlgoDirect:
		c = m.direct(n)
	case AlgoRecursiveDoubling:
		c = m.halvingDoubling(n, false)
	case AlgoRabenseifner:
		c = m.halvingDoubling(n, true)
	case AlgoRing:
		c = m.ring(n)
	case AlgoHierarchical:
		if !m.hierOK {
			return 0, false
		}
		c = m.hierarchical(n)
	default:
		return 0, false
	}
	return m.withBurst(c), true
}

// cost is a schedule's (or a round's) time, and the most bytes it moves
// through one NIC in one direction.
type cost struct{ t, load int64 }

func (c cost) then(d cost) cost { return cost{addSat(c.t, d.t), addSat(c.load, d.load)} }

func (c cost) times(k int64) cost { return cost{mulSat(c.t, k), mulSat(c.load, k)} }

// withBurst is c's time when the links between hosts pass a burst of
// bytes at once before they go at their rate (a token bucket, as
// ringsim's Network.Burst, full at the start of the call): the first
// burst bytes through the busiest NIC cost no time. The bytes through a
// NIC are on the schedule's critical path whether its phases overlap or
// not (no stage is shorter than its own bytes), so the saving never
// exceeds them.
func (m *costModel) withBurst(c cost) int64 {
	return max(0, c.t-mulSat(min(c.load, m.burst), m.beta[cross]))
}

// messages is how many chunks carry n bytes (at least one: an empty
// segment still travels as a header).
func (m *costModel) messages(n int64) int64 { return max(1, ceilDiv(n, m.chunk)) }

// round is the time of one round of messages in which rank r sends bytes
// to to[r] (none if to[r] < 0) and the receivers take them: α plus the
// bytes over the slowest link, where a host's ranks share its NIC in
// each direction and a link within a host has its own bandwidth.
func (m *costModel) round(to []int, bytes int64) cost {
	out := make([]int64, len(m.hostRanks))
	in := make([]int64, len(m.hostRanks))
	wire := bytes + m.messages(bytes)*HeaderSize
	var t, busiest int64
	for r, d := range to {
		if d < 0 {
			continue
		}
		g, h := m.hostOf[r], m.hostOf[d]
		if g == h {
			t = max(t, addSat(m.alpha[local], mulSat(wire, m.beta[local])))
			continue
		}
		out[g] = addSat(out[g], wire)
		in[h] = addSat(in[h], wire)
	}
	for g := range out {
		if load := max(out[g], in[g]); load > 0 {
			t = max(t, addSat(m.alpha[cross], mulSat(load, m.beta[cross])))
			busiest = max(busiest, load)
		}
	}
	return cost{t, busiest}
}

// ring: 2(N-1) steps of a segment n/N to the next rank, the N-1 of the
// reduce-scatter reducing it, pipelined chunk by chunk.
func (m *costModel) ring(n int64) cost {
	seg := ceilDiv(n, int64(m.size))
	to := make([]int, m.size)
	for r := range to {
		to[r] = (r + 1) % m.size
	}
	steps := m.round(to, seg).times(int64(2 * (m.size - 1)))
	return cost{addSat(m.senderFor(seg), pipelined(m.messages(seg), steps.t, mulSat(int64(m.size-1), mulSat(seg, m.gamma)))), steps.load}
}

// senderCost is what a goroutine's start and hand-offs cost on the job's
// cores: the hierarchical schedule's measured call overhead
// (Links.CallOverhead) over the goroutines it starts, a sender and a
// receiver per link; 0 where it does not run.
func (m *costModel) senderCost() int64 {
	if !m.hierOK {
		return 0
	}
	return m.overhead[AlgoHierarchical] / (2 * m.hierLinks())
}

// hierLinks is how many links each rank of the hierarchical schedule
// uses: its host's other ranks, and the next and previous hosts.
func (m *costModel) hierLinks() int64 {
	return int64(m.hier.l - 1 + min(2, m.hier.h-1))
}

// senderFor is what a step or round of bytes costs for a sender goroutine
// (none up to SmallBytes, with the header): rounds of an exchange
// schedule too large to send before receiving hand their sends to one,
// as the pipelined ring does once a call.
func (m *costModel) senderFor(bytes int64) int64 {
	if bytes+HeaderSize <= SmallBytes {
		return 0
	}
	return m.sender
}

// halvingDoubling: recursive doubling (whole buffers every round) or
// Rabenseifner (halves, then doubling back), on the power-of-two core of
// the ranks with the fold in and out around it (fold in exchange.go).
func (m *costModel) halvingDoubling(n int64, halving bool) cost {
	f := foldOf(m.size)
	var t cost
	if f.rem > 0 {
		in, out := make([]int, m.size), make([]int, m.size)
		for r := range in {
			in[r], out[r] = -1, -1
		}
		for i := range f.rem {
			in[2*i], out[2*i+1] = 2*i+1, 2*i
		}
		t = t.then(m.exchange(in, n, true)).then(m.exchange(out, n, false))
	}
	to := make([]int, m.size)
	for k := range f.log {
		for r := range to {
			to[r] = -1
		}
		for q := range f.p {
			to[f.rank(q)] = f.rank(q ^ 1<<k)
		}
		b := n
		if halving {
			b = ceilDiv(n, int64(2)<<k)
			// The allgather sends the same sizes back, in reverse order,
			// without reducing.
			t = t.then(m.round(to, b)).then(cost{t: m.senderFor(b)})
		}
		t = t.then(m.exchange(to, b, true))
	}
	return t
}

// exchange is a round of an exchange schedule: bytes from r to to[r],
// reduced as they arrive if reduce.
func (m *costModel) exchange(to []int, bytes int64, reduce bool) cost {
	xfer := m.round(to, bytes)
	xfer.t = addSat(xfer.t, m.senderFor(bytes))
	if !reduce {
		return xfer
	}
	return cost{pipelined(m.messages(bytes), xfer.t, mulSat(bytes, m.gamma)), xfer.load}
}

// direct: every rank sends its whole buffer to every other one, and folds
// the N buffers as they come.
func (m *costModel) direct(n int64) cost {
	xfer := m.allToAll(n)
	return cost{addSat(m.senderFor(n), pipelined(m.messages(n), xfer.t, mulSat(int64(m.size-1), mulSat(n, m.gamma)))), xfer.load}
}

// allToAll is a round in which every rank sends bytes to every other one.
func (m *costModel) allToAll(bytes int64) cost {
	wire := bytes + m.messages(bytes)*HeaderSize
	var c cost
	for _, l := range m.hostRanks {
		if l > 1 {
			c.t = max(c.t, addSat(m.alpha[local], mulSat(wire, m.beta[local])))
		}
		load := mulSat(int64(l*(m.size-l)), wire)
		c.t = max(c.t, addSat(m.alpha[cross], mulSat(load, m.beta[cross])))
		c.load = max(c.load, load)
	}
	return c
}

// hierarchical (hierarchical.go), H hosts of L ranks: segments of n/L to
// the other local ranks (a), a ring of subsegments n/(LH) across hosts
// whose L rings share each NIC (b), the segments back (c); four dependent
// hops of latency, the phases overlapping chunk by chunk.
func (m *costModel) hierarchical(n int64) cost {
	h, l := int64(m.hier.h), int64(m.hier.l)
	seg := ceilDiv(n, l)
	sub := ceilDiv(seg, h)
	msgs := m.messages(sub)
	wire := func(b int64) int64 { return b + m.messages(b)*HeaderSize }
	latency := addSat(2*m.alpha[local], mulSat(2*(h-1), m.alpha[cross]))
	latency = addSat(latency, m.handOffs(2*m.hierLinks()))
	a := mulSat(mulSat(h, wire(sub)), m.beta[local])
	load := mulSat(2*(h-1)*l, wire(sub))
	b := mulSat(load, m.beta[cross])
	red := mulSat((l-1)*seg+(h-1)*sub, m.gamma)
	return cost{addSat(latency, pipelined(msgs, a, b, a, red)), load}
}

// compressed (compressed.go): every rank sends its encoded share of each
// segment to the segment's owner, the owners send the encoded sums back,
// the coding overlapping the transfers chunk by chunk.
func (m *costModel) compressed(n int64, c CodecCost) int64 {
	seg := ceilDiv(n, int64(m.size))
	share := ceilDiv(mulSat(seg, c.Num), c.Den)
	xfer := m.allToAll(share)
	code := mulSat(n, perByte(c.BytesPerSecond))
	red := mulSat(seg, mulSat(int64(m.size-1), m.gamma))
	goroutines := 2*int64(m.size-1) + 1 // a sender and a receiver per peer, the encoder
	fixed := addSat(m.handOffs(goroutines), mulSat(max(0, c.CallOverhead.Nanoseconds()), 1_000_000))
	// The shares and the sums both leave through every NIC: one stage.
	both := xfer.times(2)
	return m.withBurst(cost{addSat(fixed, pipelined(m.messages(seg), both.t, addSat(code, red))), both.load})
}

// handOffs is what starting and waking n goroutines of a schedule costs.
func (m *costModel) handOffs(n int64) int64 { return mulSat(n, m.alpha[local]) }

// pipelined is the time of stages overlapping chunk by chunk over m
// chunks: the slowest stage plus the others' share of one chunk.
func pipelined(m int64, stages ...int64) int64 {
	var sum, slowest int64
	for _, s := range stages {
		sum = addSat(sum, s)
		slowest = max(slowest, s)
	}
	return addSat(slowest, (sum-slowest)/max(1, m))
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// mulSat and addSat are a*b and a+b for non-negative operands, held at
// math.MaxInt64 instead of wrapping.
func mulSat(a, b int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(lo)
}

func addSat(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxInt64
}
