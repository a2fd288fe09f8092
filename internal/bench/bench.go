// Package bench measures gorun's collectives in the style of nccl-tests'
// all_reduce_perf: per size, warm up, time each op, check every result, and
// report bytes, median time per op, algbw and busbw.
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/ring"
)

// Result is one line of the report; the JSON field names are part of
// gorun bench's interface.
type Result struct {
	Op        string  `json:"op"`
	NP        int     `json:"np"`
	Bytes     int64   `json:"bytes"`
	Iters     int     `json:"iters"`
	TimeUS    float64 `json:"time_us"`
	AlgBWGBps float64 `json:"algbw_gbps"`
	BusBWGBps float64 `json:"busbw_gbps"`
	Correct   bool    `json:"correct"`
	// Algorithm is the schedule an allreduce ran at this size, e.g.
	// "recursive-doubling", "rabenseifner", "ring" or "hierarchical" (see
	// GORUN_ALLREDUCE_ALGORITHMS), "int8 (compressed)" with --compression;
	// "-" for one rank and for the other ops.
	Algorithm string `json:"algorithm"`
	// With --compression: the codec, the payload bytes one rank sent per op,
	// their ratio to the uncompressed ring's, and the relative RMS error of
	// the result against the exact sum. A size below the compression
	// threshold travels uncompressed: codec "none", ratio 1, and the note
	// says why ("below threshold 64 KiB").
	Compression     string  `json:"compression,omitempty"`
	CompressionNote string  `json:"compression_note,omitempty"`
	WireBytes       uint64  `json:"wire_bytes,omitempty"`
	WireRatio       float64 `json:"wire_ratio,omitempty"`
	RelError        float64 `json:"rel_error,omitempty"`
}

// Options are the measurement's parameters.
type Options struct {
	Op     string  // allreduce, broadcast, allgather, reducescatter
	Sizes  []int64 // bytes of float32 data (rounded down to whole elements, at least one)
	Iters  int     // timed iterations per size (0 = choose by size)
	Warmup int     // untimed iterations per size
	// Compression names the codec of a compressed allreduce ("" = none);
	// the Comm must have been created WithCompression of it.
	Compression string
}

// humanSize writes whole KiB, MiB and GiB as such: 65536 is "64 KiB".
func humanSize(n int) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// shortSize is the size column, one word so the table splits on blanks:
// "4B", "64KiB", "256MiB".
func shortSize(n int64) string {
	for _, u := range []struct {
		shift int
		unit  string
	}{{30, "GiB"}, {20, "MiB"}, {10, "KiB"}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d%s", n>>u.shift, u.unit)
		}
	}
	return fmt.Sprintf("%dB", n)
}

// defaultTarget is about how long gorun bench times each size unless
// --iters says how many iterations to run. Like the peers' benchmarks
// (../shared/bench, 1 s), it runs small ops thousands of times: a few hundred
// ops of microseconds each would be measured in milliseconds, and one
// scheduler hiccup would move the median.
const defaultTarget = 500 * time.Millisecond

// maxIters bounds the iterations of one size (what the MPI benchmark runs
// at 4 bytes).
const maxIters = 20000

// DefaultSizes is what gorun bench measures unless told otherwise: 4 bytes
// to 256 MiB in powers of 4, from latency-bound to bandwidth-bound, which
// is every range the allreduce picks a different algorithm for.
const DefaultSizes = "4,16,64,256,1K,4K,16K,64K,256K,1M,4M,16M,64M,256M"

// Tolerances: the largest relative RMS error a compressed result may have
// and still count as correct.
var tolerance = map[string]float64{"int8": 0.02, "fp16": 0.002, "bf16": 0.01}

// ParseSizes reads "4,1K,1M,64M" (K, M, G are powers of 1024).
func ParseSizes(s string) ([]int64, error) {
	var out []int64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		mult := int64(1)
		switch strings.ToUpper(f[len(f)-1:]) {
		case "K":
			mult = 1 << 10
		case "M":
			mult = 1 << 20
		case "G":
			mult = 1 << 30
		}
		if mult > 1 {
			f = f[:len(f)-1]
		}
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("size %q is not a positive byte count (write 4, 1K, 1M or 64M)", f)
		}
		out = append(out, n*mult)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no sizes given (write --sizes 4,1M,64M)")
	}
	return out, nil
}

// busFactor converts algorithm bandwidth to bus bandwidth, as nccl-tests
// does, so numbers are comparable across rank counts.
func busFactor(op string, n int) float64 {
	switch op {
	case "allreduce":
		return 2 * float64(n-1) / float64(n)
	case "allgather", "reducescatter":
		return float64(n-1) / float64(n)
	}
	return 1
}

// Run measures every size on this rank; rank 0 writes the report to w
// (a table, or one JSON object per size).
func Run(ctx context.Context, comm *collective.Comm, o Options, asJSON bool, w io.Writer) error {
	n := comm.Size()
	if o.Compression != "" && o.Op != "allreduce" {
		return fmt.Errorf("--compression applies to allreduce only")
	}
	if comm.Rank() == 0 && !asJSON {
		fmt.Fprintf(w, "# gorun bench: %s, float32 Sum, np=%d", o.Op, n)
		if o.Compression != "" {
			fmt.Fprintf(w, ", compression %s", o.Compression)
		}
		fmt.Fprintln(w)
		writeLinks(w, comm, o)
		fmt.Fprintf(w, "%12s %9s %8s %12s %12s %12s %8s", "bytes", "size", "iters", "time_us", "algbw_GB/s", "busbw_GB/s", "correct")
		if o.Compression != "" {
			fmt.Fprintf(w, " %12s %8s %10s  %s", "wire_bytes", "ratio", "rel_error", "codec")
		} else {
			fmt.Fprintf(w, "  %s", "algorithm")
		}
		fmt.Fprintln(w)
	}
	policy := comm.AllreducePolicy()
	for _, size := range o.Sizes {
		r, err := measure(ctx, comm, o, size)
		if err != nil {
			return err
		}
		if comm.Rank() != 0 {
			continue
		}
		if asJSON {
			b, _ := json.Marshal(r)
			fmt.Fprintln(w, string(b))
		} else {
			fmt.Fprintf(w, "%12d %9s %8d %12.1f %12.4f %12.4f %8v", r.Bytes, shortSize(r.Bytes), r.Iters, r.TimeUS, r.AlgBWGBps, r.BusBWGBps, r.Correct)
			if o.Compression != "" {
				codec := r.Compression
				if r.CompressionNote != "" {
					codec += " (" + r.CompressionNote + ")"
				}
				fmt.Fprintf(w, " %12d %8.4f %10.2e  %s", r.WireBytes, r.WireRatio, r.RelError, codec)
			} else {
				fmt.Fprintf(w, "  %s", r.Algorithm)
			}
			fmt.Fprintln(w)
		}
	}
	if after := comm.AllreducePolicy(); comm.Rank() == 0 && !asJSON && o.Op == "allreduce" && after != policy {
		// The first calls of each size timed the schedules the links'
		// model ranked close (collective's links_refine.go).
		fmt.Fprintf(w, "# allreduce policy after timing the calls: %s\n", after)
	}
	return nil
}

// maxTuningCalls bounds the extra warm-up while the Comm times its
// allreduce schedules (a size class takes at most 2 + 3×16 calls).
const maxTuningCalls = 64

func measure(ctx context.Context, comm *collective.Comm, o Options, size int64) (Result, error) {
	n, rank := comm.Size(), comm.Rank()
	count := max(int(size/4), 1)
	if o.Op == "allgather" || o.Op == "reducescatter" {
		// As in nccl-tests, the size is the gathered (or scattered) total.
		count = max(count/n, 1)
	}
	warmup := o.Warmup
	if warmup <= 0 {
		warmup = 10
		if size >= 16<<20 {
			warmup = 2
		}
	}
	c := newCase(o.Op, count, n, rank)
	c.codec = o.Compression
	correct := true
	before, _ := comm.CompressionStats()
	sent0 := comm.Stats().PayloadBytesSent
	var worstErr float64
	// one runs iteration i (negative: warm-up) and returns the op's time.
	one := func(i int) (float64, error) {
		c.fill(i)
		// Filling and checking take different times on different ranks; a
		// barrier lines the ranks up so the timed op measures the op alone.
		if err := comm.Barrier(ctx); err != nil {
			return 0, err
		}
		start := time.Now()
		if err := c.run(ctx, comm, i); err != nil {
			return 0, err
		}
		took := time.Since(start).Seconds()
		// A rank that is done must not check its result (a pass over the
		// whole buffer) while others still run the op: on a host whose
		// ranks share cores that would slow the op being timed.
		if err := comm.Barrier(ctx); err != nil {
			return 0, err
		}
		if c.codec != "" {
			// Lossy: correct means within the codec's tolerance.
			e := c.relError(i)
			worstErr = max(worstErr, e)
			if e > tolerance[c.codec] {
				return 0, fmt.Errorf("rank %d: %s allreduce of %d bytes, iteration %d: relative error %.3g exceeds %s's tolerance %g",
					rank, c.codec, size, i, e, c.codec, tolerance[c.codec])
			}
			return took, nil
		}
		if bad := c.check(i); bad != "" {
			correct = false
			return 0, fmt.Errorf("rank %d: %s of %d bytes, iteration %d: %s", rank, o.Op, size, i, bad)
		}
		return took, nil
	}
	warmStart := time.Now()
	for i := -warmup; i < 0; i++ {
		if _, err := one(i); err != nil {
			return Result{}, err
		}
	}
	// A job across hosts times its allreduce schedules on the first calls
	// of a size (collective's links_refine.go); the timed iterations run
	// its settled choice. Every rank sees the same state after the same
	// calls, so all warm up alike; the bound only guards a bug.
	for i := 0; o.Op == "allreduce" && !comm.AllreduceTuned(c.bytes()) && i < maxTuningCalls; i++ {
		if _, err := one(-1); err != nil {
			return Result{}, err
		}
	}
	iters := o.Iters
	if iters <= 0 {
		// As many iterations as fit in defaultTarget, judged by the
		// warm-up's whole iterations (barriers and checks included); the
		// ranks agree on the slowest rank's estimate.
		per := []float64{time.Since(warmStart).Seconds() / float64(warmup)}
		if err := comm.Allreduce(ctx, per, collective.Max, collective.Name("bench-iters")); err != nil {
			return Result{}, err
		}
		iters = int(min(max(defaultTarget.Seconds()/per[0], 5), maxIters))
	}
	times := make([]float64, iters)
	for i := range iters {
		t, err := one(i)
		if err != nil {
			return Result{}, err
		}
		times[i] = t
	}
	after, _ := comm.CompressionStats()
	sent := comm.Stats().PayloadBytesSent - sent0 // barriers send headers only
	// The op takes as long as its slowest rank: reduce the per-iteration
	// times with Max, then take the median.
	if err := comm.Allreduce(ctx, times, collective.Max, collective.Name("bench-times")); err != nil {
		return Result{}, err
	}
	ok := []int32{0}
	if correct {
		ok[0] = 1
	}
	if err := comm.Allreduce(ctx, ok, collective.Min, collective.Name("bench-correct")); err != nil {
		return Result{}, err
	}
	slices.Sort(times)
	med := times[len(times)/2]
	bytes := int64(c.bytes())
	alg := float64(bytes) / med / 1e9
	res := Result{
		Op: o.Op, NP: n, Bytes: bytes, Iters: iters, TimeUS: med * 1e6,
		AlgBWGBps: alg, BusBWGBps: alg * busFactor(o.Op, n), Correct: ok[0] == 1,
	}
	if o.Op == "allreduce" {
		res.Algorithm = comm.AllreduceAlgorithm(c.bytes())
	}
	if res.Algorithm == "" {
		res.Algorithm = "-" // one rank, or an op whose schedule is not reported
	}
	if c.codec != "" {
		res.Compression, res.RelError = c.codec, worstErr
		if calls := after.Calls - before.Calls; calls > 0 {
			res.Algorithm = c.codec + " (compressed)"
			res.WireBytes = (after.WireBytes - before.WireBytes) / calls
			res.WireRatio = float64(after.WireBytes-before.WireBytes) / float64(after.RawBytes-before.RawBytes)
		} else {
			// The Comm sent this size uncompressed: what went on the wire
			// is the plain ring's payload.
			res.Compression, res.WireRatio = "none", 1
			res.WireBytes = sent / uint64(warmup+iters)
			threshold := comm.CompressionThreshold()
			res.CompressionNote = "not compressed by the Comm"
			if c.bytes() < threshold {
				res.CompressionNote = "below threshold " + humanSize(threshold)
			}
		}
	}
	return res, nil
}

// benchCase holds the buffers of one op and knows the exact answer: every
// value is a small integer, so float32 sums are exact and the check is
// equality.
type benchCase struct {
	op          string
	codec       string
	n, rank     int
	in, out     []float32
	root        int
	resultBytes int
}

func newCase(op string, count, n, rank int) *benchCase {
	c := &benchCase{op: op, n: n, rank: rank}
	switch op {
	case "allgather":
		c.in, c.out = make([]float32, count), make([]float32, count*n)
		c.resultBytes = 4 * count * n
	case "reducescatter":
		c.in, c.out = make([]float32, count*n), make([]float32, count)
		c.resultBytes = 4 * count * n
	default:
		c.in = make([]float32, count)
		c.resultBytes = 4 * count
	}
	return c
}

func (c *benchCase) bytes() int { return c.resultBytes }

// value is rank r's element i in iteration it.
func value(r, i, it int) float32 { return float32((r+1)*(((i+it)%13+13)%13) - 6) }

func (c *benchCase) fill(it int) {
	for i := range c.in {
		c.in[i] = value(c.rank, i, it)
	}
	c.root = ((it % c.n) + c.n) % c.n
}

func (c *benchCase) run(ctx context.Context, comm *collective.Comm, it int) error {
	switch c.op {
	case "allreduce":
		if c.codec != "" {
			return comm.Allreduce(ctx, c.in, collective.Sum, collective.Name("bench"), collective.Compression(c.codec))
		}
		return comm.Allreduce(ctx, c.in, collective.Sum)
	case "broadcast":
		return comm.Broadcast(ctx, c.in, c.root)
	case "allgather":
		return comm.Allgather(ctx, c.in, c.out)
	case "reducescatter":
		return comm.ReduceScatter(ctx, c.in, c.out, collective.Sum)
	}
	return fmt.Errorf("unknown op %q: use allreduce, broadcast, allgather or reducescatter", c.op)
}

// check compares the result with the exact answer. Values repeat with
// period 13 in the element index, so the expected sums are a 13-entry table.
func (c *benchCase) check(it int) string {
	var sums [13]float32
	for k := range sums {
		for r := range c.n {
			sums[k] += value(r, k, it)
		}
	}
	sum := func(i int) float32 { return sums[i%13] }
	var got []float32
	var want func(i int) float32
	switch c.op {
	case "allreduce":
		got, want = c.in, sum
	case "broadcast":
		got, want = c.in, func(i int) float32 { return value(c.root, i, it) }
	case "allgather":
		per := len(c.in)
		got, want = c.out, func(i int) float32 { return value(i/per, i%per, it) }
	case "reducescatter":
		off := c.rank * len(c.out)
		got, want = c.out, func(i int) float32 { return sum(off + i) }
	}
	for i, v := range got {
		if w := want(i); v != w {
			return fmt.Sprintf("element %d = %v, want %v", i, v, w)
		}
	}
	return ""
}

// relError is the relative RMS error of an allreduce result against the
// exact sum.
func (c *benchCase) relError(it int) float64 {
	var sums [13]float64
	for k := range sums {
		for r := range c.n {
			sums[k] += float64(value(r, k, it))
		}
	}
	var sq, ref float64
	for i, v := range c.in {
		w := sums[i%13]
		sq += (float64(v) - w) * (float64(v) - w)
		ref += w * w
	}
	if ref == 0 {
		return math.Sqrt(sq)
	}
	return math.Sqrt(sq / ref)
}

// writeLinks writes, as comment lines above the table, what the ranks
// measured their links to be and the allreduce policy and compression
// threshold they chose from them (a job on one host does not measure
// them, and runs the measured defaults).
func writeLinks(w io.Writer, comm *collective.Comm, o Options) {
	if comm.Size() < 2 {
		return
	}
	if l, ok := comm.Links(); ok {
		if l.Probed[0] > 0 {
			fmt.Fprintf(w, "# links within hosts: latency %v, %s/s (%d measured)\n", l.Local.Latency.Round(100*time.Nanosecond), ring.FormatRate(l.Local.BytesPerSecond), l.Probed[0])
		}
		fmt.Fprintf(w, "# links between hosts: latency %v, %s/s", l.Cross.Latency.Round(100*time.Nanosecond), ring.FormatRate(l.Cross.BytesPerSecond))
		if l.Cross.Burst > 0 {
			fmt.Fprintf(w, ", burst %.0f KB", float64(l.Cross.Burst)/1e3)
		}
		fmt.Fprintf(w, " (%d measured)\n", l.Probed[1])
		fmt.Fprintf(w, "# reduce %s/s per core", ring.FormatRate(l.ReduceBytesPerSecond))
		if l.CodecBytesPerSecond > 0 {
			fmt.Fprintf(w, ", %s coding %s/s", o.Compression, ring.FormatRate(l.CodecBytesPerSecond))
		}
		fmt.Fprintf(w, "; measuring took %v\n", l.Took.Round(10*time.Microsecond))
		if o := l.Overheads(); o != "" {
			fmt.Fprintf(w, "# per-call overhead beyond the links: %s\n", o)
		}
	} else {
		fmt.Fprintf(w, "# links: one host, not measured\n")
	}
	if o.Op == "allreduce" {
		fmt.Fprintf(w, "# allreduce policy: %s\n", comm.AllreducePolicy())
		if o.Compression != "" {
			fmt.Fprintf(w, "# %s compression from %s\n", o.Compression, thresholdSize(comm.CompressionThreshold()))
		}
	}
}

func thresholdSize(n int) string {
	if n == ring.NoLimit {
		return "no size up to 1 GiB"
	}
	return humanSize(n)
}
