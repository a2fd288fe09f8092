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
// (TestCostModelMatchesSimulation where they are exact,
// TestLinksChoiceAtScale on thousands of ranks), with γ, the cost of
// reducing a byte, added: a schedule that reduces more bytes per rank
// (recursive doubling's whole buffer every round) pays for it.
//
// Latency and bytes overlap wherever a NIC has other messages to send
// while one is on its way. A round holds up the next round of the same
// ranks by the longer of one message's α and bytes and its busiest NIC's
// bytes (its period): the ranks sharing a NIC queue their messages there,
// so a stream of rounds keeps it busy and pays α once, after the last
// (cost.lag). The ring's ranks wait only for their predecessor, so its
// latency is that of the hops back around the ring, not the slowest
// link's at every step; the hierarchical schedule's L rings across hosts
// share each NIC as a round's ranks do.
//
// Where a schedule reduces as it receives, chunk by chunk (the pipelined
// ring, an exchange, the direct schedule), m chunks through stages of
// total times t_i take the slowest stage plus the others' share of one
// chunk: max t + (Σt - max t)/m; with one chunk the stages add up.
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

// cost is a schedule's (or a round's) time: t, its rounds' periods added
// up, and lag, how much later than t its last message is in. A round's
// period is how long it holds up the next round of the same ranks: the
// longer of its path (α plus one message over the slowest link) and its
// busiest NIC's time (all the bytes through it). Where several ranks
// share a NIC, their messages queue, and each rank's α passes while the
// NIC sends the others' bytes: a stream of such rounds keeps the NIC busy
// and pays α once, at the end (lag), not per round. load is the most
// bytes the schedule moves through one NIC in one direction.
type cost struct{ t, lag, load int64 }

// then is c followed by d. The lag is that of the last part that moves
// bytes across hosts: a later part within hosts starts that much late.
func (c cost) then(d cost) cost {
	lag := c.lag
	if d.load > 0 {
		lag = d.lag
	}
	return cost{addSat(c.t, d.t), lag, addSat(c.load, d.load)}
}

// total is when c's last message is in.
func (c cost) total() int64 { return addSat(c.t, c.lag) }

// withBurst is c's time when the links between hosts pass a burst of
// bytes at once before they go at their rate (a token bucket, as
// ringsim's Network.Burst, full at the start of the call): the first
// burst bytes through the busiest NIC cost no time. The bytes through a
// NIC are on the schedule's critical path whether its phases overlap or
// not (no stage is shorter than its own bytes), so the saving never
// exceeds them.
func (m *costModel) withBurst(c cost) int64 {
	return max(0, c.total()-mulSat(min(c.load, m.burst), m.beta[cross]))
}

// messages is how many chunks carry n bytes (at least one: an empty
// segment still travels as a header).
func (m *costModel) messages(n int64) int64 { return max(1, ceilDiv(n, m.chunk)) }

// wire is n bytes with the headers of their chunks.
func (m *costModel) wire(n int64) int64 { return addSat(n, mulSat(m.messages(n), HeaderSize)) }

// round is one round of messages in which rank r sends bytes to to[r]
// (none if to[r] < 0) and the receivers wait for all of them before their
// next round, where a host's ranks share its NIC in each direction and a
// link within a host has its own bandwidth. Alone, it takes α plus the
// bytes through its busiest NIC; as its period, the longer of that NIC's
// bytes and one message's α and bytes (cost).
func (m *costModel) round(to []int, bytes int64) cost {
	out := make([]int64, len(m.hostRanks))
	in := make([]int64, len(m.hostRanks))
	wire := m.wire(bytes)
	var path, busiest int64
	for r, d := range to {
		if d < 0 {
			continue
		}
		g, h := m.hostOf[r], m.hostOf[d]
		if g == h {
			path = max(path, addSat(m.alpha[local], mulSat(wire, m.beta[local])))
			continue
		}
		path = max(path, addSat(m.alpha[cross], mulSat(wire, m.beta[cross])))
		out[g] = addSat(out[g], wire)
		in[h] = addSat(in[h], wire)
	}
	for g := range out {
		busiest = max(busiest, out[g], in[g])
	}
	return m.period(path, busiest)
}

// period is a round or step whose path is path and whose busiest NIC
// carries load bytes (cost): the NIC's last message is in α after it is
// through, which the period covers as far as path exceeds the NIC's time.
func (m *costModel) period(path, load int64) cost {
	busy := mulSat(load, m.beta[cross])
	p := max(path, busy)
	var lag int64
	if load > 0 {
		lag = max(0, addSat(m.alpha[cross], busy)-p)
	}
	return cost{p, lag, load}
}

// ring: 2(N-1) steps of a segment n/N to the next rank, the N-1 of the
// reduce-scatter reducing it, pipelined chunk by chunk. A rank waits only
// for its predecessor, so the steps' path runs back around the ring, a
// hop of α and a chunk over each link: the slowest 2(N-1) hops in a row,
// not the slowest link's every step, with the last step's other chunks
// after its first. The busiest link within a host and the busiest NIC
// each carry a segment a step; once one of them is the bound, the chunks
// keep it busy and the last one is in its α later.
func (m *costModel) ring(n int64) cost {
	seg := ceilDiv(n, int64(m.size))
	wire, chunk := m.wire(seg), m.wire(min(seg, m.chunk))
	hops := make([]int64, m.size)
	out := make([]int64, len(m.hostRanks)) // bytes a step through each host's NIC
	var busy [2]int64                      // a step's time through the busiest link within a host, and NIC
	var slowest, load int64                // β of the slowest link used; the busiest NIC's bytes a step
	for r := range hops {
		g := m.hostOf[r]
		class, through := local, wire
		if g != m.hostOf[(r+1)%m.size] {
			out[g] = addSat(out[g], wire)
			class, through, load = cross, out[g], max(load, out[g])
		}
		hops[r] = addSat(m.alpha[class], mulSat(chunk, m.beta[class]))
		busy[class] = max(busy[class], mulSat(through, m.beta[class]))
		slowest = max(slowest, m.beta[class])
	}
	steps := int64(2 * (m.size - 1))
	net := addSat(slowestHops(hops, int(steps)), mulSat(wire-chunk, slowest))
	for class, b := range busy {
		if b > 0 {
			net = max(net, addSat(mulSat(steps, b), m.alpha[class]))
		}
	}
	t := pipelined(m.messages(seg), net, mulSat(int64(m.size-1), mulSat(seg, m.gamma)))
	return cost{t: addSat(m.senderFor(seg), t), load: mulSat(steps, load)}
}

// slowestHops is the largest sum of k consecutive hops around the ring
// whose hop from rank r is hops[r].
func slowestHops(hops []int64, k int) int64 {
	var circle int64
	for _, h := range hops {
		circle = addSat(circle, h)
	}
	if circle == math.MaxInt64 {
		return circle // saturated; below, no window sums to more than circle
	}
	laps, rest := k/len(hops), k%len(hops)
	var window int64
	for _, h := range hops[:rest] {
		window += h
	}
	best := window
	for i := range hops {
		window += hops[(i+rest)%len(hops)] - hops[i]
		best = max(best, window)
	}
	return addSat(mulSat(int64(laps), circle), best)
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
// the ranks with the fold in and out around it (fold in exchange.go),
// round after round in the order they run.
func (m *costModel) halvingDoubling(n int64, halving bool) cost {
	f := foldOf(m.size)
	var t cost
	var in, out []int
	if f.rem > 0 {
		in, out = make([]int, m.size), make([]int, m.size)
		for r := range in {
			in[r], out[r] = -1, -1
		}
		for i := range f.rem {
			in[2*i], out[2*i+1] = 2*i+1, 2*i
		}
		t = t.then(m.exchange(in, n, true))
	}
	partners := func(k int) []int {
		to := make([]int, m.size)
		for r := range to {
			to[r] = -1
		}
		for q := range f.p {
			to[f.rank(q)] = f.rank(q ^ 1<<k)
		}
		return to
	}
	bytes := func(k int) int64 {
		if halving {
			return ceilDiv(n, int64(2)<<k)
		}
		return n
	}
	for k := range f.log {
		t = t.then(m.exchange(partners(k), bytes(k), true))
	}
	if halving {
		// The allgather sends the same sizes back, in reverse order,
		// without reducing.
		for k := f.log - 1; k >= 0; k-- {
			t = t.then(m.exchange(partners(k), bytes(k), false))
		}
	}
	if f.rem > 0 {
		t = t.then(m.exchange(out, n, false))
	}
	return t
}

// exchange is a round of an exchange schedule: bytes from r to to[r],
// reduced as they arrive if reduce.
func (m *costModel) exchange(to []int, bytes int64, reduce bool) cost {
	xfer := m.round(to, bytes)
	xfer.t = addSat(xfer.t, m.senderFor(bytes))
	if reduce {
		xfer.t = pipelined(m.messages(bytes), xfer.t, mulSat(bytes, m.gamma))
	}
	return xfer
}

// direct: every rank sends its whole buffer to every other one, and folds
// the N buffers as they come.
func (m *costModel) direct(n int64) cost {
	xfer := m.allToAll(n)
	t := pipelined(m.messages(n), xfer.total(), mulSat(int64(m.size-1), mulSat(n, m.gamma)))
	return cost{t: addSat(m.senderFor(n), t), load: xfer.load}
}

// allToAll is a round in which every rank sends bytes to every other one.
func (m *costModel) allToAll(bytes int64) cost {
	wire := m.wire(bytes)
	var path, load int64
	for _, l := range m.hostRanks {
		if l > 1 {
			path = max(path, addSat(m.alpha[local], mulSat(wire, m.beta[local])))
		}
		if l < m.size {
			path = max(path, addSat(m.alpha[cross], mulSat(wire, m.beta[cross])))
		}
		load = max(load, mulSat(int64(l*(m.size-l)), wire))
	}
	return m.period(path, load)
}

// hierarchical (hierarchical.go), H hosts of L ranks: segments of n/L to
// the other local ranks (a), a ring of subsegments n/(LH) across hosts
// whose L rings share each NIC (b), the final subsegments back to the
// other local ranks (c), the phases overlapping chunk by chunk. Its time
// is the longest of three bounds:
//   - the cross-host ring: a first chunk in through (a), 2(H-1) steps,
//     each the longer of one chunk's α and bytes across and the L
//     subsegments through the NIC, and a last chunk out through (c);
//   - the links within the host, which carry (a) and then (c), 2H
//     subsegments one after the other, and between them one chunk across;
//   - the reduction, of the L-1 copies of the segment and the H-1
//     subsegments received across, before the allgather half of (b).
func (m *costModel) hierarchical(n int64) cost {
	h, l := int64(m.hier.h), int64(m.hier.l)
	seg := ceilDiv(n, l)
	sub := ceilDiv(seg, h)
	wire, chunk := m.wire(sub), m.wire(min(sub, m.chunk))
	hop := func(class int) int64 { return addSat(m.alpha[class], mulSat(chunk, m.beta[class])) }
	ends := mulSat(2, hop(local)) // the first chunk folded in (a), the last sent in (c)
	steps := 2 * (h - 1)
	step := m.period(hop(cross), mulSat(l, wire))
	c := cost{t: addSat(ends, mulSat(steps, step.t)), lag: step.lag, load: mulSat(steps*l, wire)}
	within := addSat(mulSat(2, m.alpha[local]), addSat(mulSat(mulSat(2*h, wire), m.beta[local]), hop(cross)))
	reduced := addSat(mulSat(l-1, seg), mulSat(h-1, sub))
	reduce := addSat(addSat(ends, mulSat(reduced, m.gamma)), mulSat(h-1, step.t))
	if slower := max(within, reduce); slower > c.total() {
		c.t, c.lag = slower, 0
	}
	c.t = addSat(c.t, m.handOffs(2*m.hierLinks()))
	return c
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
	both := cost{t: mulSat(xfer.total(), 2), load: mulSat(xfer.load, 2)}
	return m.withBurst(cost{t: addSat(fixed, pipelined(m.messages(seg), both.t, addSat(code, red))), load: both.load})
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
