package collective

import (
	"context"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gorun/gorun/compress"
)

// Over the real transport: every rank ends with the same bits, close to the
// exact sum, and the wire carried about a quarter of the bytes.
func TestCompressedAllreduceOverLibp2p(t *testing.T) {
	ctx := context.Background()
	const count = 100003
	for _, n := range []int{2, 3, 4, 7} {
		// Small chunks at odd rank counts: every segment travels as several
		// pipelined chunks over the real links.
		chunk := 0
		if n%2 == 1 {
			chunk = 16 << 10
		}
		comms := newJob(t, n, WithCompression(compress.Int8()), WithChunkBytes(chunk))
		bufs := make([][]float32, n)
		exact := make([]float64, count)
		for r := range n {
			rng := rand.New(rand.NewPCG(uint64(r), 3))
			bufs[r] = make([]float32, count)
			for i := range bufs[r] {
				bufs[r][i] = float32(rng.NormFloat64())
				exact[i] += float64(bufs[r][i]) / float64(n)
			}
		}
		mustAll(t, onEach(comms, func(c *Comm) error { return c.Allreduce(ctx, bufs[c.Rank()], Avg, Name("w")) }))
		for r := 1; r < n; r++ {
			for i := range bufs[r] {
				if math.Float32bits(bufs[r][i]) != math.Float32bits(bufs[0][i]) {
					t.Fatalf("np=%d: rank %d element %d = %v, rank 0 has %v", n, r, i, bufs[r][i], bufs[0][i])
				}
			}
		}
		if e := compress.RelRMSE(bufs[0], exact); e > 0.01 {
			t.Fatalf("np=%d: relative RMS error %.4f > 1%%", n, e)
		}
		total, per := comms[0].CompressionStats()
		if total.Calls != 1 || per["w"].Calls != 1 || total.Ratio() > 0.30 || total.RelRMSE <= 0 {
			t.Fatalf("np=%d: stats %+v, per tensor %+v", n, total, per)
		}
		t.Logf("np=%d chunk=%dB: wire ratio %.4f, share error %.4f%%", n, chunk, total.Ratio(), 100*total.RelRMSE)
	}
}

// Small buffers, other dtypes and other ops are not compressed: their
// results are exact.
func TestCompressionGating(t *testing.T) {
	ctx := context.Background()
	comms := newJob(t, 3, WithCompression(compress.Int8()))
	small := make([][]float32, 3)
	ints := make([][]int32, 3)
	maxes := make([][]float32, 3)
	mustAll(t, onEach(comms, func(c *Comm) error {
		r := c.Rank()
		small[r] = []float32{0.1 * float32(r+1), 1}
		ints[r] = make([]int32, 1<<16)
		maxes[r] = make([]float32, 1<<16)
		for i := range ints[r] {
			ints[r][i] = int32(r)
			maxes[r][i] = float32(r) + 0.123
		}
		if err := c.Allreduce(ctx, small[r], Sum); err != nil {
			return err
		}
		if err := c.Allreduce(ctx, ints[r], Sum); err != nil {
			return err
		}
		return c.Allreduce(ctx, maxes[r], Max)
	}))
	if small[0][0] != float32(0.1)+float32(0.2)+float32(0.3) && math.Abs(float64(small[0][0])-0.6) > 1e-6 {
		t.Errorf("small buffer: %v", small[0])
	}
	if ints[0][100] != 3 || maxes[0][100] != 2.123 {
		t.Errorf("int sum %d, max %v: not exact", ints[0][100], maxes[0][100])
	}
	if total, _ := comms[0].CompressionStats(); total.Calls != 0 {
		t.Errorf("%d calls were compressed, want none", total.Calls)
	}
}

// Ranks that disagree on compression fail, naming both calls.
func TestCompressionMismatch(t *testing.T) {
	ctx := context.Background()
	comms := newJob(t, 3)
	errs := onEach(comms, func(c *Comm) error {
		buf := make([]float32, 1<<16)
		if c.Rank() == 1 {
			return c.Allreduce(ctx, buf, Sum, Compression("int8"))
		}
		return c.Allreduce(ctx, buf, Sum)
	})
	for r, err := range errs {
		if err == nil {
			t.Fatalf("rank %d: no error", r)
		}
	}
	joined := errs[0].Error() + errs[1].Error() + errs[2].Error()
	if !strings.Contains(joined, "Sum, int8)") {
		t.Errorf("errors do not name the compressed call: %v", errs)
	}
}

// The threshold comes from WithCompressionThreshold, else
// GORUN_COMPRESSION_THRESHOLD, else the default; a bad value names the
// variable. (gorun bench reports the Comm's threshold: it must be this one.)
func TestCompressionThresholdFromEnvironment(t *testing.T) {
	for env, want := range map[string]int{"": DefaultCompressionThreshold, "1024": 1024, "0": 0} {
		s, err := newCompressionState(compressionConfig{}, only(EnvCompressionThreshold, env))
		if err != nil || s.cfg.threshold != want {
			t.Errorf("GORUN_COMPRESSION_THRESHOLD=%q: %v, %v; want %d", env, s, err, want)
		}
	}
	if _, err := newCompressionState(compressionConfig{}, only(EnvCompressionThreshold, "64K")); err == nil || !strings.Contains(err.Error(), EnvCompressionThreshold) {
		t.Errorf("64K: error %v, want one naming %s", err, EnvCompressionThreshold)
	}
	s, err := newCompressionState(compressionConfig{threshold: 5, set: true}, only(EnvCompressionThreshold, "1024"))
	if err != nil || s.cfg.threshold != 5 {
		t.Errorf("WithCompressionThreshold(5) with the variable set: %v, %v; want 5", s, err)
	}
}

// only is an environment that holds name=value and nothing else.
func only(name, value string) func(string) string {
	return func(k string) string {
		if k == name {
			return value
		}
		return ""
	}
}
