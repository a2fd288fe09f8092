package ring

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/gorun/gorun/compress"
)

func f32bytes(x []float32) []byte {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 4*len(x))
}

func gaussian(seed uint64, n int) []float32 {
	rng := rand.New(rand.NewPCG(seed, 99))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}

// compressedRun runs one compressed allreduce on every rank and returns the
// per-rank results and stats.
func compressedRun(t *testing.T, rs []*Ring, inputs [][]float32, codec compress.Codec, op Op, fbs []*Feedback) ([][]float32, []CompressionStats) {
	t.Helper()
	n := len(rs)
	out := make([][]float32, n)
	stats := make([]CompressionStats, n)
	mustAll(t, parallel(n, func(i int) error {
		out[i] = append([]float32(nil), inputs[i]...)
		var fb *Feedback
		if fbs != nil {
			fb = fbs[i]
		}
		var err error
		stats[i], err = rs[i].AllreduceCompressed(testCtx(t), Call{Op: op, DType: Float32, Count: len(out[i])}, f32bytes(out[i]), codec, fb)
		return err
	}))
	return out, stats
}

func exactSum(inputs [][]float32) []float64 {
	want := make([]float64, len(inputs[0]))
	for _, in := range inputs {
		for i, v := range in {
			want[i] += float64(v)
		}
	}
	return want
}

func TestCompressedIdenticalOnEveryRank(t *testing.T) {
	for _, name := range []string{"int8", "fp16", "bf16"} {
		codec, _ := compress.ByName(name)
		for _, n := range []int{1, 2, 3, 4, 7} {
			for _, count := range []int{0, 1, n - 1, 1009, 40000} {
				rs, _ := newRings(t, n, 0)
				inputs := make([][]float32, n)
				for i := range inputs {
					inputs[i] = gaussian(uint64(i), count)
				}
				out, _ := compressedRun(t, rs, inputs, codec, Avg, nil)
				want := exactSum(inputs)
				got := make([]float32, count)
				for i := range want {
					want[i] /= float64(n)
				}
				copy(got, out[0])
				for r := 1; r < n; r++ {
					for i := range out[r] {
						if math.Float32bits(out[r][i]) != math.Float32bits(out[0][i]) {
							t.Fatalf("%s np=%d count=%d: rank %d element %d = %v, rank 0 has %v", name, n, count, r, i, out[r][i], out[0][i])
						}
					}
				}
				// A sum of few values may be near zero, where a relative error
				// means little: check accuracy on the long buffers.
				if e := compress.RelRMSE(got, want); count >= 1000 && e > 0.02 {
					t.Fatalf("%s np=%d count=%d: relative error %.4f", name, n, count, e)
				}
			}
		}
	}
}

// The error of one int8 allreduce stays under 1 % and does not grow with
// the number of ranks: every value is encoded at most twice.
func TestCompressedErrorIndependentOfN(t *testing.T) {
	const count = 1 << 16
	errs := map[int]float64{}
	for _, n := range []int{2, 4, 8} {
		rs, _ := newRings(t, n, 0)
		inputs := make([][]float32, n)
		for i := range inputs {
			inputs[i] = gaussian(uint64(100+i), count)
		}
		out, _ := compressedRun(t, rs, inputs, compress.Int8(), Sum, nil)
		errs[n] = compress.RelRMSE(out[0], exactSum(inputs))
		t.Logf("int8 np=%d: relative RMS error %.4f%%", n, 100*errs[n])
		if errs[n] > 0.01 {
			t.Errorf("np=%d: relative RMS error %.4f > 1%%", n, errs[n])
		}
	}
	if errs[8] > 1.5*errs[2] {
		t.Errorf("error grows with N: %.4f at 2 ranks, %.4f at 8", errs[2], errs[8])
	}
}

// Wire bytes, headers included, against the fp32 ring's 2(N-1)/N*S.
func TestCompressedWireBytes(t *testing.T) {
	const n, count = 4, 1 << 20 // 4 MiB of float32; the ratio does not depend on size
	for name, limit := range map[string]float64{"int8": 0.30, "fp16": 0.51, "bf16": 0.51} {
		codec, _ := compress.ByName(name)
		rs, _ := newRings(t, n, 0)
		inputs := make([][]float32, n)
		for i := range inputs {
			inputs[i] = gaussian(uint64(i), count)
		}
		_, stats := compressedRun(t, rs, inputs, codec, Sum, nil)
		fp32 := float64(2*(n-1)) / n * 4 * count
		for i, r := range rs {
			s := r.Stats()
			ratio := float64(s.PayloadBytesSent+s.HeaderBytesSent) / fp32
			if ratio > limit {
				t.Errorf("%s rank %d: wire ratio %.4f > %.2f", name, i, ratio, limit)
			}
			if uint64(stats[i].WireBytes) != s.PayloadBytesSent {
				t.Errorf("%s rank %d: stats say %d wire bytes, ring counted %d", name, i, stats[i].WireBytes, s.PayloadBytesSent)
			}
			if i == 0 {
				t.Logf("%s: wire ratio %.4f (headers included)", name, ratio)
			}
		}
	}
}

// Error feedback: summing the compressed allreduce of the same vector over
// 200 calls converges to the exact total; without feedback the bias stays.
func TestCompressedErrorFeedback(t *testing.T) {
	const n, count, calls = 3, 5000, 200
	inputs := make([][]float32, n)
	for i := range inputs {
		inputs[i] = gaussian(uint64(7+i), count)
	}
	exact := exactSum(inputs)
	run := func(feedback bool) float64 {
		rs, _ := newRings(t, n, 0)
		var fbs []*Feedback
		if feedback {
			fbs = make([]*Feedback, n)
			for i := range fbs {
				_, own := rs[i].segmentOf(count, i)
				fbs[i] = &Feedback{Contrib: make([]float32, count), Owner: make([]float32, own)}
			}
		}
		total := make([]float64, count)
		for range calls {
			out, _ := compressedRun(t, rs, inputs, compress.Int8(), Sum, fbs)
			for i, v := range out[0] {
				total[i] += float64(v)
			}
		}
		want := make([]float64, count)
		for i := range want {
			want[i] = calls * exact[i]
		}
		var sq, ref float64
		for i := range want {
			sq += (total[i] - want[i]) * (total[i] - want[i])
			ref += want[i] * want[i]
		}
		return math.Sqrt(sq / ref)
	}
	with, without := run(true), run(false)
	t.Logf("relative error of the 200-call total: %.2e with feedback, %.2e without", with, without)
	if with > 1e-3 {
		t.Errorf("with feedback: %.2e > 1e-3", with)
	}
	if without < 3*with {
		t.Errorf("without feedback the bias should stay: %.2e vs %.2e with feedback", without, with)
	}
}

func TestCompressedFP16NeverInf(t *testing.T) {
	const n = 3
	rs, _ := newRings(t, n, 0)
	inputs := make([][]float32, n)
	for i := range inputs {
		inputs[i] = []float32{1e6, -3e5, 1, 70000, 2}
	}
	out, stats := compressedRun(t, rs, inputs, compress.FP16(), Sum, nil)
	for _, v := range out[0] {
		if math.IsInf(float64(v), 0) || math.IsNaN(float64(v)) {
			t.Fatalf("fp16 produced %v: %v", v, out[0])
		}
	}
	clamped := 0
	for _, s := range stats {
		clamped += s.Clamped
	}
	if clamped == 0 {
		t.Fatal("values beyond fp16's range were not reported as clamped")
	}
}

// A rank that calls the uncompressed allreduce while the others compress
// fails with a mismatch naming both calls.
func TestCompressedMismatch(t *testing.T) {
	const n = 3
	rs, _ := newRings(t, n, 0)
	// Without a control path (this is the bare ring) the rank whose peers
	// gave up waits for its context: keep it short.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	errs := parallel(n, func(i int) error {
		buf := make([]float32, 1000)
		c := Call{Seq: 1, Op: Sum, DType: Float32, Count: len(buf)}
		if i == 1 {
			return rs[i].Allreduce(ctx, c, f32bytes(buf))
		}
		_, err := rs[i].AllreduceCompressed(ctx, c, f32bytes(buf), compress.Int8(), nil)
		return err
	})
	var me *MismatchError
	found := false
	for _, err := range errs {
		if errors.As(err, &me) {
			found = true
			t.Log(err)
		}
	}
	if !found {
		t.Fatalf("no rank reported a mismatch: %v", errs)
	}
	if got := fmt.Sprint(me); got == "" {
		t.Fatal("empty message")
	}
}

// The pipelined schedule gives the same bytes whatever the chunk size:
// chunks are whole int8 blocks and the owner sums in a fixed order, so
// cutting a segment into 1, 2 or hundreds of chunks must not change a bit,
// of the result or of the residuals, on any rank.
func TestCompressedChunkingDoesNotChangeResults(t *testing.T) {
	for _, name := range []string{"int8", "fp16", "bf16"} {
		codec, _ := compress.ByName(name)
		for _, n := range []int{2, 3, 4, 7} {
			const count = 50021 // odd: segments of different lengths and a short last chunk
			inputs := make([][]float32, n)
			for i := range inputs {
				inputs[i] = gaussian(uint64(100*n+i), count)
			}
			var ref [][]float32
			var refFB []*Feedback
			for _, chunk := range []int{0, 4096, 256} { // 64Ki, 1024 and 64 values per chunk
				rs, _ := newRings(t, n, chunk)
				fbs := make([]*Feedback, n)
				for i := range fbs {
					_, own := Segment(count, n, i)
					fbs[i] = &Feedback{Contrib: make([]float32, count), Owner: make([]float32, own)}
				}
				var out [][]float32
				for range 2 { // the second call uses the residuals of the first
					out, _ = compressedRun(t, rs, inputs, codec, Avg, fbs)
				}
				if ref == nil {
					ref, refFB = out, fbs
					want := exactSum(inputs)
					for i := range want {
						want[i] /= float64(n)
					}
					if e := compress.RelRMSE(out[0], want); e > 0.02 {
						t.Fatalf("%s np=%d: relative error %.4f", name, n, e)
					}
					continue
				}
				for r := range n {
					if i := firstDiff(out[r], ref[0]); i >= 0 {
						t.Fatalf("%s np=%d chunk=%dB: rank %d element %d = %v, want %v", name, n, chunk, r, i, out[r][i], ref[0][i])
					}
					if i := firstDiff(fbs[r].Contrib, refFB[r].Contrib); i >= 0 {
						t.Fatalf("%s np=%d chunk=%dB: rank %d contribution residual %d differs", name, n, chunk, r, i)
					}
					if i := firstDiff(fbs[r].Owner, refFB[r].Owner); i >= 0 {
						t.Fatalf("%s np=%d chunk=%dB: rank %d owner residual %d differs", name, n, chunk, r, i)
					}
				}
			}
		}
	}
}

// firstDiff returns the first index where a and b differ bitwise, or -1.
func firstDiff(a, b []float32) int {
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

// A rank whose links break fails the compressed allreduce on every other
// rank with the root cause, naming the rank, instead of hanging.
func TestCompressedPeerCrash(t *testing.T) {
	const n, count = 4, 1 << 16
	rs, ts := newRings(t, n, 1024) // many small chunks in flight
	crash := errors.New("injected crash")
	ts[2].(*MemTransport).Close(crash)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := parallel(n, func(i int) error {
		if i == 2 {
			return nil
		}
		buf := gaussian(uint64(i), count)
		_, err := rs[i].AllreduceCompressed(ctx, Call{Seq: 4, Op: Sum, DType: Float32, Count: count}, f32bytes(buf), compress.Int8(), nil)
		return err
	})
	for i, err := range errs {
		if i == 2 {
			continue
		}
		if !errors.Is(err, crash) || !strings.Contains(err.Error(), "rank 2") {
			t.Fatalf("rank %d: got %v, want the injected crash naming rank 2", i, err)
		}
		t.Logf("rank %d: %v", i, err)
	}
	if ctx.Err() != nil {
		t.Fatal("the ranks only stopped at the test's deadline")
	}
}

// plainCodec hides a codec's one-pass operations (EncodeFeedbackAdd,
// DecodeAdd), as a codec written by a user may lack them.
type plainCodec struct{ compress.Codec }

// A codec without the one-pass operations takes the separate
// encode/decode path, which must give the same bytes: results and both
// residuals bitwise equal on every rank.
func TestCompressedPlainCodecMatchesOnePass(t *testing.T) {
	const n, count = 3, 30011
	for _, name := range []string{"int8", "fp16", "bf16"} {
		codec, _ := compress.ByName(name)
		inputs := make([][]float32, n)
		for i := range inputs {
			inputs[i] = gaussian(uint64(40+i), count)
		}
		run := func(c compress.Codec) ([][]float32, []*Feedback) {
			rs, _ := newRings(t, n, 4096)
			fbs := make([]*Feedback, n)
			for i := range fbs {
				_, own := Segment(count, n, i)
				fbs[i] = &Feedback{Contrib: make([]float32, count), Owner: make([]float32, own)}
			}
			var out [][]float32
			for range 2 {
				out, _ = compressedRun(t, rs, inputs, c, Avg, fbs)
			}
			return out, fbs
		}
		want, wantFB := run(codec)
		got, gotFB := run(plainCodec{codec})
		for r := range n {
			if i := firstDiff(got[r], want[r]); i >= 0 {
				t.Fatalf("%s rank %d: element %d = %v, one-pass path gave %v", name, r, i, got[r][i], want[r][i])
			}
			if i := firstDiff(gotFB[r].Contrib, wantFB[r].Contrib); i >= 0 {
				t.Fatalf("%s rank %d: contribution residual %d differs", name, r, i)
			}
			if i := firstDiff(gotFB[r].Owner, wantFB[r].Owner); i >= 0 {
				t.Fatalf("%s rank %d: owner residual %d differs", name, r, i)
			}
		}
	}
}
