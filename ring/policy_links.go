package ring

import (
	"fmt"
	"time"
)

// The allreduce policy of a job that spans hosts, chosen from its links.
//
// A fixed size threshold cannot know the link: whether the hierarchical
// schedule pays for its extra hops, or a codec for its encoding, depends
// on how fast the links between hosts are compared with those within one
// and with a core. So a job across hosts measures its links at start
// (collective: a few round trips and one bulk transfer per link class),
// every rank takes the same agreed numbers (Links), and each derives the
// same policy from them with the α-β(-γ) model of policy_cost.go: for
// every size of a fixed grid, the cheapest of direct, recursive doubling,
// Rabenseifner, the ring and (when the layout allows it) the hierarchical
// schedule, where it beats the measured defaults' choice by a margin. The arithmetic is on integers, so ranks on different machines
// (and CPU architectures) that hold the same Links pick the same
// algorithm: a choice made from local clocks would break the call
// fingerprint (Call.Algo) the first time two ranks disagreed.
//
// On one host the measured defaults (defaultRules) stay: there the costs
// the model leaves out (goroutine hand-offs, sender goroutines, cache
// effects) decide, and they were measured.

// LinkCost is the α-β cost of one class of link: a message of b bytes
// takes Latency + b/BytesPerSecond, the first Burst bytes of a call
// excepted (they go at once: a link shaped by a token bucket, as tc's tbf
// shapes one, passes that much after a pause; 0 for a plain link).
type LinkCost struct {
	Latency        time.Duration
	BytesPerSecond int64
	Burst          int64 // only for links between hosts
}

// Valid reports whether c describes a usable link (positive bandwidth,
// latency not negative).
func (c LinkCost) Valid() bool { return c.Latency >= 0 && c.BytesPerSecond > 0 }

func (c LinkCost) String() string {
	if !c.Valid() {
		return "unmeasured"
	}
	s := fmt.Sprintf("latency %v, %s/s", c.Latency, FormatRate(c.BytesPerSecond))
	if c.Burst > 0 {
		s += fmt.Sprintf(", burst %d bytes", c.Burst)
	}
	return s
}

// Links is the agreed model of a job's links and cores: what every rank
// derives its allreduce policy from (Config.Links). Every rank must hold
// the same Links.
type Links struct {
	// Local is a link between two ranks of one host (shared memory or a
	// unix socket); Cross one between hosts (TCP, TLS). A class no link
	// of the job belongs to is left zero.
	Local, Cross LinkCost
	// ReduceBytesPerSecond is how fast a rank folds received float32
	// bytes into its buffer (γ of the α-β-γ model).
	ReduceBytesPerSecond int64
	// CallOverhead, indexed by Algorithm, is what a call of each schedule
	// took beyond the model's time for it, as timed on the job's ranks
	// at start (its goroutines' start and hand-offs on cores the ranks
	// share, which no link measurement shows); it adds to every size.
	CallOverhead [maxAlgo + 1]time.Duration
}

// Valid reports whether l has what the model needs: the cross-host link
// and the reduction rate (a layout with several ranks per host also needs
// Local; CrossHostPolicy checks that).
func (l Links) Valid() bool { return l.Cross.Valid() && l.ReduceBytesPerSecond > 0 }

func (l Links) String() string {
	return fmt.Sprintf("within a host: %v; between hosts: %v; reduce %s/s", l.Local, l.Cross, FormatRate(l.ReduceBytesPerSecond))
}

// CodecCost is what a compressing codec costs, for CompressionPaysFrom:
// it sends Num/Den of the float32 bytes (EncodedLen over 4 bytes per
// value), and a core encodes and decodes BytesPerSecond float32 bytes a
// second (one encode and one decode of every byte).
type CodecCost struct {
	Num, Den       int64
	BytesPerSecond int64
	// CallOverhead is what a compressed call took beyond the model's
	// time for it (as Links.CallOverhead).
	CallOverhead time.Duration
}

// policyGrid is the sizes the model prices: every power of two from 4
// bytes to 1 GiB. A rule covers the sizes up to its grid point, so a size
// between two points runs what the upper one was priced at.
func policyGrid() []int64 {
	var g []int64
	for n := int64(4); n <= 1<<30; n *= 2 {
		g = append(g, n)
	}
	return g
}

// crossHost reports whether hosts (Config.Hosts) puts the ranks on more
// than one host.
func crossHost(hosts []int) bool {
	return len(hosts) > 1 && !oneHost(hosts)
}

// The model replaces the measured defaults' choice for a size (those of
// one host, defaultRules) only above SmallBytes, and only where it
// predicts a gain beyond its own error, marginNum/marginDen: its numbers
// are a snapshot of links and cores that other work shares, and the same
// schedule timed twice at start differs by up to that much. Up to
// SmallBytes every schedule is a few round trips, and the choice turns on
// the number of hops and on costs no link measurement shows (a fold, a
// goroutine); a round trip between hosts is the noisiest of the numbers
// (on cores that other work shares, the shortest of ten varies
// several-fold from one start to the next), so the model's choice there
// flipped from start to start, while the measured rules were timed on
// those costs. Links far slower to answer than a data centre's (a WAN)
// would want the model there too; that is left for when such links are
// measured.
//
// From largeMarginBytes a call's time is its bytes over the links, whose
// rate the probes' bulk transfers measure to a few per cent, and what
// varies from start to start (round trips, per-call costs) is a small part
// of it: the margin there, largeMarginNum/largeMarginDen, only covers the
// rate's error. The full margin would keep the ring wherever another
// schedule wins by its bytes per NIC alone by 5/4 or a little less, as the
// hierarchical schedule does on 4 hosts × 4 ranks
// (TestCrossHostPolicyFourByFour).
const (
	marginNum, marginDen           = 5, 4
	largeMarginBytes               = 4 << 20
	largeMarginNum, largeMarginDen = 6, 5
)

// clearlyFaster reports whether t beats the default's time td for n bytes
// by the model's margin.
func clearlyFaster(t, td, n int64) bool {
	if n >= largeMarginBytes {
		return mulSat(t, largeMarginNum)/largeMarginDen < td
	}
	return mulSat(t, marginNum)/marginDen < td
}

// CrossHostPolicy returns the allreduce policy the model picks for a job
// of size ranks on the host layout hosts (Config.Hosts) over a Mesh, with
// links l and ChunkBytes chunk (0: DefaultChunkBytes), and false where the
// model does not apply: one host, or l lacking a class the layout uses. The
// same inputs give the same policy on every machine.
func CrossHostPolicy(size int, hosts []int, l Links, chunk int) (AllreducePolicy, bool) {
	m, ok := newCostModel(size, hosts, l, chunk)
	if !ok {
		return AllreducePolicy{}, false
	}
	var rules []AllreduceRule
	grid := policyGrid()
	fixed := AllreducePolicy{Rules: defaultRules(size, true, false)}
	for i, n := range grid {
		a, _ := fixed.pick(int(n))
		if n > SmallBytes {
			best, t := m.cheapest(n)
			if td, ok := m.time(a, n); !ok || clearlyFaster(t, td, n) {
				a = best
			}
		}
		max := int(n)
		if i == len(grid)-1 {
			max = NoLimit
		}
		if k := len(rules); k > 0 && rules[k-1].Algo == a {
			rules[k-1].MaxBytes = max
			continue
		}
		rules = append(rules, AllreduceRule{MaxBytes: max, Algo: a})
	}
	return AllreducePolicy{Rules: rules}, true
}

// CompressionPaysFrom returns the smallest size of the grid from which a
// compressed allreduce with codec c is cheaper than the policy's choice at
// every larger size, by the same model as CrossHostPolicy, and false where
// the model does not apply. It returns NoLimit when compression never pays
// up to 1 GiB.
func CompressionPaysFrom(size int, hosts []int, l Links, chunk int, c CodecCost) (int, bool) {
	m, ok := newCostModel(size, hosts, l, chunk)
	if !ok || c.Num <= 0 || c.Den <= 0 || c.BytesPerSecond <= 0 {
		return 0, false
	}
	from := NoLimit
	grid := policyGrid()
	for i := len(grid) - 1; i >= 0; i-- {
		_, plain := m.cheapest(grid[i])
		if m.compressed(grid[i], c) >= plain {
			break
		}
		from = int(grid[i])
	}
	return from, true
}

// FormatRate writes a byte rate in decimal units, as link speeds go
// ("415.6 MB"; the caller adds "/s").
func FormatRate(bps int64) string {
	switch {
	case bps >= 1e9:
		return fmt.Sprintf("%.2f GB", float64(bps)/1e9)
	case bps >= 1e6:
		return fmt.Sprintf("%.1f MB", float64(bps)/1e6)
	}
	return fmt.Sprintf("%d B", bps)
}

// AllreduceCost is the model's time for an allreduce of bytes with a, on
// the layout and links CrossHostPolicy takes, and false where the model
// does not apply or a does not run on the layout (internal/ringsim checks
// it against its simulation of the schedules).
func AllreduceCost(a Algorithm, bytes int64, size int, hosts []int, l Links, chunk int) (time.Duration, bool) {
	m, ok := newCostModel(size, hosts, l, chunk)
	if !ok {
		return 0, false
	}
	t, ok := m.time(a, bytes)
	return time.Duration(t / 1_000_000), ok
}

// CompressedCost is the model's time for an allreduce of bytes compressed
// with codec c, as CompressionPaysFrom prices it, and false where the
// model does not apply.
func CompressedCost(bytes int64, size int, hosts []int, l Links, chunk int, c CodecCost) (time.Duration, bool) {
	m, ok := newCostModel(size, hosts, l, chunk)
	if !ok || c.Num <= 0 || c.Den <= 0 || c.BytesPerSecond <= 0 {
		return 0, false
	}
	return time.Duration(m.compressed(bytes, c) / 1_000_000), true
}

// ModelCandidates returns the schedules CrossHostPolicy picks from on the
// layout hosts of size ranks.
func ModelCandidates(size int, hosts []int) []Algorithm {
	var out []Algorithm
	for _, a := range candidates {
		if a == AlgoHierarchical {
			lay, ok := hierLayoutOf(hosts, size, 0)
			if len(hosts) != size || !ok || lay.h < 2 || lay.l < 2 {
				continue
			}
		}
		out = append(out, a)
	}
	return out
}
