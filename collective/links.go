package collective

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gorun/gorun/compress"
	"github.com/gorun/gorun/ring"
)

// Measuring the links at start, for the allreduce policy of a job across
// hosts (ring.CrossHostPolicy).
//
// Right after the data plane connected every link, and before the first
// collective, ranks probe the links between ring neighbours, in three
// phases, one after the other (rank 0 lets the next begin once every rank
// finished the one before), so that no rank takes part in two probes at
// once: each pair (r, r+1) with r even, then with r odd, then the pair
// (N-1, 0). In a probe the lower end of the pair sends probeRoundTrips
// small messages that the other echoes (α: half the shortest round trip,
// the real data path with its framing, system calls and wake-ups), then
// probeBulkTransfers bulk transfers of probeBulkBytes that the other
// acknowledges one by one (bandwidth: the bytes over the fastest
// transfer's time less one round trip, the first transfer not counted: a
// shaper may let it through in a burst; how far it went beyond the rate is
// the link's burst, ring.LinkCost.Burst). The best times are the link's:
// what the ranks' sharing of cores adds to them is no property of the
// link, varies from moment to moment, and shows in the schedules' timed
// calls (below). Every rank also times its reduction of float32 bytes,
// and, if it compresses, its codec (links_probe.go).
//
// Every rank sends what it measured to rank 0, which takes the median of
// each link class (within a host, between hosts) and of the cores, and
// sends the result, encoded, back to every rank: all ranks then hold the
// same numbers, and derive the same policy from them, while their own
// clocks would have told each a different story.
//
// The links alone miss what a schedule costs the cores: its goroutines'
// start and hand-offs, which ranks sharing a host's cores pay in turn. So
// the ranks then time a few small calls of every schedule the model picks
// from (and of the compressed one), and what each took beyond the model's
// time for it becomes that schedule's per-call overhead
// (ring.Links.CallOverhead), agreed as the rest: rank 0 takes the median
// over the ranks (links_calibrate.go).
//
// The numbers are taken once; the choices they give are then refined from
// the job's own calls, which time the schedules the model ranks close
// (links_refine.go, as Horovod's autotune does). An elastic job measures
// in its first epoch across hosts and hands the numbers on
// (links_elastic.go).

// linkSample is one rank's measurements: its probe of its link to the next
// rank (class -1: none) and its cores.
type linkSample struct {
	class         int   // 0: within a host, 1: between hosts, -1: not measured
	latencyNanos  int64 // half a round trip
	bytesPerSec   int64
	burst         int64 // bytes the first transfer moved beyond the link's rate
	reducePerSec  int64
	codecPerSec   int64 // 0: no codec
	probeDuration int64 // ns the probes took on this rank
}

const linkSampleBytes = 7 * 8

func (s linkSample) encode() []byte {
	b := make([]byte, linkSampleBytes)
	for i, v := range []int64{int64(s.class), s.latencyNanos, s.bytesPerSec, s.reducePerSec, s.codecPerSec, s.probeDuration, s.burst} {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
	}
	return b
}

func decodeLinkSample(b []byte) linkSample {
	v := func(i int) int64 { return int64(binary.LittleEndian.Uint64(b[8*i:])) }
	return linkSample{class: int(v(0)), latencyNanos: v(1), bytesPerSec: v(2), reducePerSec: v(3), codecPerSec: v(4), probeDuration: v(5), burst: v(6)}
}

// AgreedLinks is what the ranks of a job agreed their links and cores
// are, from the measurements at start: the model the allreduce policy
// comes from.
type AgreedLinks struct {
	ring.Links
	// CodecBytesPerSecond is how fast a core codes a compressed
	// allreduce's float32 bytes (0: the Comm does not compress), and
	// CodecOverhead what a compressed call took beyond the model's time.
	CodecBytesPerSecond int64
	CodecOverhead       time.Duration
	// Probed is how many links of each class (within a host, between
	// hosts) were measured; Took the longest time a rank spent measuring
	// (probing the links, and timing the cores and the schedules).
	Probed [2]int
	Took   time.Duration
}

const agreedLinksBytes = 10 * 8 // the last field is the burst between hosts

func (a AgreedLinks) encode() []byte {
	b := make([]byte, agreedLinksBytes)
	for i, v := range []int64{int64(a.Local.Latency), a.Local.BytesPerSecond, int64(a.Cross.Latency), a.Cross.BytesPerSecond,
		a.ReduceBytesPerSecond, a.CodecBytesPerSecond, int64(a.Probed[0]), int64(a.Probed[1]), int64(a.Took), a.Cross.Burst} {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
	}
	return b
}

func decodeAgreedLinks(b []byte) AgreedLinks {
	v := func(i int) int64 { return int64(binary.LittleEndian.Uint64(b[8*i:])) }
	var a AgreedLinks
	a.Local = ring.LinkCost{Latency: time.Duration(v(0)), BytesPerSecond: v(1)}
	a.Cross = ring.LinkCost{Latency: time.Duration(v(2)), BytesPerSecond: v(3), Burst: v(9)}
	a.ReduceBytesPerSecond, a.CodecBytesPerSecond = v(4), v(5)
	a.Probed = [2]int{int(v(6)), int(v(7))}
	a.Took = time.Duration(v(8))
	return a
}

func (a AgreedLinks) String() string {
	s := fmt.Sprintf("%d links within hosts: %v; %d between hosts: %v; reduce %s/s", a.Probed[0], a.Local, a.Probed[1], a.Cross, rateString(a.ReduceBytesPerSecond))
	if a.CodecBytesPerSecond > 0 {
		s += fmt.Sprintf("; codec %s/s", rateString(a.CodecBytesPerSecond))
	}
	if o := a.Overheads(); o != "" {
		s += "; per-call overhead " + o
	}
	return s + fmt.Sprintf("; measuring took %v", a.Took.Round(10*time.Microsecond))
}

// Overheads lists the schedules' per-call overheads that are not zero
// (ring.Links.CallOverhead, and the codec's), "" if none is.
func (a AgreedLinks) Overheads() string {
	var parts []string
	for algo, d := range a.CallOverhead {
		if d > 0 {
			parts = append(parts, fmt.Sprintf("%s %v", ring.Algorithm(algo), d.Round(time.Microsecond)))
		}
	}
	if a.CodecOverhead > 0 {
		parts = append(parts, fmt.Sprintf("compressed %v", a.CodecOverhead.Round(time.Microsecond)))
	}
	return strings.Join(parts, ", ")
}

func rateString(bps int64) string {
	if bps >= 1e9 {
		return fmt.Sprintf("%.2f GB", float64(bps)/1e9)
	}
	return fmt.Sprintf("%.1f MB", float64(bps)/1e6)
}

// agreeLinks combines every rank's sample (samples[r] is rank r's) into
// the numbers every rank uses: per class, the median over the links
// probed (see median); for the cores, the median over the ranks. It is a function of
// the samples alone, so every rank given them computes the same result.
func agreeLinks(samples []linkSample) AgreedLinks {
	var a AgreedLinks
	var lat, bw [2][]int64
	var burst []int64
	var red, codec []int64
	for _, s := range samples {
		if s.class == 0 || s.class == 1 {
			lat[s.class] = append(lat[s.class], s.latencyNanos)
			bw[s.class] = append(bw[s.class], s.bytesPerSec)
			if s.class == 1 {
				burst = append(burst, s.burst)
			}
		}
		red = append(red, s.reducePerSec)
		if s.codecPerSec > 0 {
			codec = append(codec, s.codecPerSec)
		}
		a.Took = max(a.Took, time.Duration(s.probeDuration))
	}
	for c := range 2 {
		a.Probed[c] = len(lat[c])
		if len(lat[c]) > 0 {
			cost := ring.LinkCost{Latency: time.Duration(median(lat[c])), BytesPerSecond: median(bw[c])}
			if c == 0 {
				a.Local = cost
			} else {
				cost.Burst = median(burst)
				a.Cross = cost
			}
		}
	}
	a.ReduceBytesPerSecond = median(red)
	if len(codec) == len(samples) {
		a.CodecBytesPerSecond = median(codec)
	}
	return a
}

// median is the lower median of v (0 for none): of two links, the
// slower one's bandwidth (a collective waits for its slowest link) and
// the shorter latency (what inflates a round trip is mostly the cores'
// load at the moment, not the link).
func median(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// measureLinks probes this rank's links (see above), times its cores and
// the schedules, and returns what every rank agreed, within ctx. chunk is
// ring.Config.ChunkBytes, codec the Comm's codec (nil: none).
func measureLinks(ctx context.Context, mesh ring.Mesh, rank, size int, hosts []int, chunk int, codec compress.Codec) (AgreedLinks, error) {
	start := time.Now()
	mine := linkSample{class: -1}
	partner, prober := probePartners(rank, size)
	for phase, peer := range partner {
		if phase > 0 {
			// Every probe of the phase before has ended: a bulk transfer
			// still under way would share a NIC, or the cores, with
			// this phase's probes, and they would measure each other.
			if _, err := agreeOnRank0(ctx, mesh, rank, size, []byte{0}, 1, func([][]byte) []byte { return []byte{0} }); err != nil {
				return AgreedLinks{}, fmt.Errorf("between link probes: %w", err)
			}
		}
		if peer < 0 {
			continue
		}
		if !prober[phase] {
			if err := answerProbe(ctx, mesh, peer); err != nil {
				return AgreedLinks{}, fmt.Errorf("measuring the link to rank %d: %w", peer, err)
			}
			continue
		}
		lat, bps, burst, err := probeLink(ctx, mesh, peer)
		if err != nil {
			return AgreedLinks{}, fmt.Errorf("measuring the link to rank %d: %w", peer, err)
		}
		if mine.class < 0 {
			// A rank probes at most two links (the wrap-around pair's
			// lower end is rank N-1, which also probes N-1 -> N only
			// when that exists): the first one stands for it.
			mine.class = 1
			if hosts != nil && hosts[rank] == hosts[peer] {
				mine.class = 0
			}
			mine.latencyNanos, mine.bytesPerSec = lat.Nanoseconds(), bps
			if mine.class == 1 {
				mine.burst = burst
			}
		}
	}
	mine.probeDuration = time.Since(start).Nanoseconds()
	mine.reducePerSec, mine.codecPerSec = timeCores(codec)
	enc, err := agreeOnRank0(ctx, mesh, rank, size, mine.encode(), agreedLinksBytes, func(all [][]byte) []byte {
		samples := make([]linkSample, len(all))
		for r, b := range all {
			samples[r] = decodeLinkSample(b)
		}
		return agreeLinks(samples).encode()
	})
	if err != nil {
		return AgreedLinks{}, fmt.Errorf("agreeing on the links: %w", err)
	}
	agreed := decodeAgreedLinks(enc)
	if _, ok := ring.CrossHostPolicy(size, hosts, agreed.Links, chunk); !ok {
		return agreed, nil
	}
	over, err := timeSchedules(ctx, mesh, rank, size, hosts, chunk, agreed, codec)
	if err != nil {
		return AgreedLinks{}, fmt.Errorf("timing the allreduce schedules: %w", err)
	}
	// Last, how long this rank has been measuring: the longest is what
	// measuring cost the job's start.
	over = append(over, time.Since(start).Nanoseconds())
	enc, err = agreeOnRank0(ctx, mesh, rank, size, encodeInts(over), len(over)*8, func(all [][]byte) []byte {
		agreed := medians(all)
		for _, b := range all {
			agreed[len(agreed)-1] = max(agreed[len(agreed)-1], decodeInts(b)[len(agreed)-1])
		}
		return encodeInts(agreed)
	})
	if err != nil {
		return AgreedLinks{}, fmt.Errorf("agreeing on the schedules' overheads: %w", err)
	}
	agreed.setOverheads(decodeInts(enc))
	return agreed, nil
}

// agreeOnRank0 sends mine to rank 0, which combines every rank's (all[r]
// is rank r's) into want bytes and sends them back to every rank: each
// rank, rank 0 included, returns exactly the bytes the others received.
func agreeOnRank0(ctx context.Context, mesh ring.Mesh, rank, size int, mine []byte, want int, combine func(all [][]byte) []byte) ([]byte, error) {
	if rank != 0 {
		if err := mesh.SendTo(ctx, 0, mine); err != nil {
			return nil, fmt.Errorf("sending to rank 0: %w", err)
		}
		b := make([]byte, want)
		if err := mesh.RecvFrom(ctx, 0, b); err != nil {
			return nil, fmt.Errorf("receiving from rank 0: %w", err)
		}
		return b, nil
	}
	all := make([][]byte, size)
	all[0] = mine
	for r := 1; r < size; r++ {
		all[r] = make([]byte, len(mine))
		if err := mesh.RecvFrom(ctx, r, all[r]); err != nil {
			return nil, fmt.Errorf("receiving from rank %d: %w", r, err)
		}
	}
	out := combine(all)
	for r := 1; r < size; r++ {
		if err := mesh.SendTo(ctx, r, out); err != nil {
			return nil, fmt.Errorf("sending to rank %d: %w", r, err)
		}
	}
	return out, nil
}

// spansHosts reports whether hosts (ring.Config.Hosts) puts the ranks on
// more than one host.
func spansHosts(hosts []int) bool {
	for _, h := range hosts {
		if h != hosts[0] {
			return true
		}
	}
	return false
}

// adoptLinks takes the compression threshold from the links where neither
// an option nor the environment set it: the smallest size from which the
// Comm's codec is modelled to beat the uncompressed allreduce
// (ring.CompressionPaysFrom). Every rank holds the same links, so every
// rank gates its calls alike.
func (s *compressionState) adoptLinks(a AgreedLinks, size int, hosts []int, chunk int) {
	if !s.cfg.byDefault {
		return
	}
	cost, ok := a.codecCost(s.cfg.codec)
	if !ok {
		return
	}
	if from, ok := ring.CompressionPaysFrom(size, hosts, a.Links, chunk, cost); ok {
		s.cfg.threshold = from
	}
}

// Links returns what the ranks measured and agreed their links are, and
// false when they did not measure them (a job on one host, or an elastic
// job's epoch on one host): the allreduce policy and the compression
// threshold then are the measured defaults.
func (c *Comm) Links() (AgreedLinks, bool) {
	l := c.cur().links
	if l == nil {
		return AgreedLinks{}, false
	}
	return *l, true
}

// AllreducePolicy describes the allreduce policy of the current ring: the
// rules GORUN_ALLREDUCE_ALGORITHMS gave, or the ones chosen from the
// measured links, or "default" (the measured defaults); "" while no ring
// exists.
func (c *Comm) AllreducePolicy() string {
	rg := c.cur().ring
	if rg == nil {
		return ""
	}
	if p := rg.AllreducePolicy(); !p.IsDefault() {
		return p.String() + " (" + EnvAllreduceAlgorithms + ")"
	}
	if p, fromLinks := rg.DefaultAllreducePolicy(); fromLinks {
		if r := c.cur().refine; r != nil && r.changed.Load() > 0 {
			classes := "classes"
			if n := r.changed.Load(); n == 1 {
				classes = "class"
			}
			return p.String() + fmt.Sprintf(" (from the links; %d size %s changed by timing their calls)", r.changed.Load(), classes)
		}
		return p.String() + " (from the links)"
	}
	return "default"
}

// policyReport is what --verbose prints on rank 0 when a ring's policy
// comes from links.
func policyReport(rg *ring.Ring, links *AgreedLinks, compression *compressionState) string {
	s := "links: " + links.String() + "; allreduce policy: "
	if p := rg.AllreducePolicy(); !p.IsDefault() {
		s += p.String() + " (" + EnvAllreduceAlgorithms + ")"
	} else {
		p, _ := rg.DefaultAllreducePolicy()
		s += p.String()
	}
	if compression.cfg.codec != nil {
		s += fmt.Sprintf("; %s compression from %s", compression.cfg.codec.Name(), thresholdString(compression.cfg.threshold))
	}
	return s
}

func thresholdString(n int) string {
	if n == ring.NoLimit {
		return "never (not below 1 GiB)"
	}
	return fmt.Sprintf("%d bytes", n)
}

// codecCost is codec as the cost model takes it, and false for no codec
// (or none measured).
func (a AgreedLinks) codecCost(codec compress.Codec) (ring.CodecCost, bool) {
	if codec == nil || codec.Name() == "none" || a.CodecBytesPerSecond <= 0 {
		return ring.CodecCost{}, false
	}
	const values = 1 << 16
	return ring.CodecCost{Num: int64(codec.EncodedLen(values)), Den: 4 * values,
		BytesPerSecond: a.CodecBytesPerSecond, CallOverhead: a.CodecOverhead}, true
}

// medians is the element-wise median of int64 vectors of one length.
func medians(all [][]byte) []int64 {
	out := make([]int64, len(all[0])/8)
	col := make([]int64, len(all))
	for i := range out {
		for r, b := range all {
			col[r] = int64(binary.LittleEndian.Uint64(b[8*i:]))
		}
		out[i] = median(col)
	}
	return out
}

func encodeInts(v []int64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(x))
	}
	return b
}

func decodeInts(b []byte) []int64 {
	v := make([]int64, len(b)/8)
	for i := range v {
		v[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return v
}
