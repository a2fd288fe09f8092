package compress

import (
	"math/rand"
	"runtime"
	"testing"
)

func benchCodecs() []Codec { return []Codec{None(), FP16(), BF16(), Int8()} }

// gradients returns n Gaussian values with a spread of magnitudes typical of
// gradients (including fp16 subnormals), deterministic for a given seed.
func gradients(n int, seed int64) []float32 {
	r := rand.New(rand.NewSource(seed))
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * 1e-3)
	}
	return v
}

const benchN = 1 << 20

// measure runs f b.N times and, besides the usual wall-clock MB/s, reports
// cpu-GB/s: input bytes per second of CPU time the benchmark thread got,
// which is the per-core speed even when other jobs share the machine.
func measure(b *testing.B, n int, f func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.SetBytes(int64(4 * n))
	f() // warm up caches and page in buffers
	b.ResetTimer()
	t0 := threadCPU()
	iters := 0
	for b.Loop() {
		f()
		iters++
	}
	if cpu := threadCPU() - t0; cpu > 0 {
		b.ReportMetric(float64(4*n)*float64(iters)/float64(cpu), "cpu-GB/s")
	}
}

// benchPaths runs f as the package runs the codec ("asm": the AVX2/F16C
// kernels, skipped when useAsm is false) and as the portable Go code
// ("go"), so that one run measures the speed-up.
func benchPaths(b *testing.B, f func(b *testing.B, c Codec, p codecPath)) {
	for _, c := range benchCodecs() {
		b.Run(c.Name(), func(b *testing.B) {
			b.Run("asm", func(b *testing.B) {
				if !useAsm {
					b.Skip("no kernels on this build or CPU")
				}
				f(b, c, fastPath(c))
			})
			b.Run("go", func(b *testing.B) { f(b, c, goPath(c)) })
		})
	}
}

func BenchmarkEncode(b *testing.B) {
	src := gradients(benchN, 1)
	benchPaths(b, func(b *testing.B, c Codec, p codecPath) {
		dst := make([]byte, c.EncodedLen(benchN))
		measure(b, benchN, func() { p.enc(dst, src) })
	})
}

// BenchmarkEncodeFeedback is Encode plus the error-feedback residual (none
// has no EncodeFeedback).
func BenchmarkEncodeFeedback(b *testing.B) {
	src := gradients(benchN, 1)
	benchPaths(b, func(b *testing.B, c Codec, p codecPath) {
		if p.encFB == nil {
			b.Skip("not a FeedbackEncoder")
		}
		dst := make([]byte, c.EncodedLen(benchN))
		res := make([]float32, benchN)
		measure(b, benchN, func() { p.encFB(dst, src, res) })
	})
}

func BenchmarkDecode(b *testing.B) {
	src := gradients(benchN, 1)
	benchPaths(b, func(b *testing.B, c Codec, p codecPath) {
		enc := make([]byte, c.EncodedLen(benchN))
		c.Encode(enc, src)
		dst := make([]float32, benchN)
		measure(b, benchN, func() {
			if err := p.dec(dst, enc); err != nil {
				b.Fatal(err)
			}
		})
	})
}

// BenchmarkDecodeAdd decodes and adds into an accumulator, as a reduction
// does; the throughput counts the decoded values (4 bytes each).
func BenchmarkDecodeAdd(b *testing.B) {
	src := gradients(benchN, 1)
	benchPaths(b, func(b *testing.B, c Codec, p codecPath) {
		enc := make([]byte, c.EncodedLen(benchN))
		c.Encode(enc, src)
		dst := gradients(benchN, 2)
		measure(b, benchN, func() {
			if err := p.decAdd(dst, enc); err != nil {
				b.Fatal(err)
			}
		})
	})
}

// BenchmarkEncodeFeedbackAdd adds the error-feedback residual, encodes and
// keeps the new residual in one call (asm and go: benchN values). The
// sub-benchmarks two-pass-16Mi and fused-16Mi compare, in the same run and
// on buffers far larger than the caches, the way the ring's encoder worked
// before, 4096 values at a time (meant = src + res, then EncodeFeedback of
// meant; the package's fastest EncodeFeedback), with one EncodeFeedbackAdd
// per 4096 values. The throughput counts the gradient's bytes.
func BenchmarkEncodeFeedbackAdd(b *testing.B) {
	src := gradients(benchN, 1)
	const bigN, sub = 16 << 20, 4096
	var big, bigRes []float32
	bigBufs := func() ([]float32, []float32) {
		if big == nil {
			big = gradients(bigN, 3)
			bigRes = make([]float32, bigN)
		}
		clear(bigRes)
		return big, bigRes
	}
	for _, c := range benchCodecs() {
		fa, ok := c.(FeedbackAddEncoder)
		if !ok {
			continue // none has no EncodeFeedback
		}
		fe := c.(FeedbackEncoder)
		b.Run(c.Name(), func(b *testing.B) {
			small := func(b *testing.B, p codecPath) {
				dst := make([]byte, c.EncodedLen(benchN))
				res := make([]float32, benchN)
				measure(b, benchN, func() { p.encFBA(dst, src, res) })
			}
			b.Run("asm", func(b *testing.B) {
				if !useAsm {
					b.Skip("no kernels on this build or CPU")
				}
				small(b, fastPath(c))
			})
			b.Run("go", func(b *testing.B) { small(b, goPath(c)) })
			b.Run("two-pass-16Mi", func(b *testing.B) {
				s, res := bigBufs()
				dst := make([]byte, c.EncodedLen(bigN))
				meant := make([]float32, sub)
				measure(b, bigN, func() {
					for lo := 0; lo < bigN; lo += sub {
						m, r := meant, res[lo:lo+sub]
						for i, v := range s[lo : lo+sub] { // ring's addTo
							m[i] = v + r[i]
						}
						fe.EncodeFeedback(dst[c.EncodedLen(lo):c.EncodedLen(lo+sub)], m, r)
					}
				})
			})
			b.Run("fused-16Mi", func(b *testing.B) {
				s, res := bigBufs()
				dst := make([]byte, c.EncodedLen(bigN))
				measure(b, bigN, func() {
					for lo := 0; lo < bigN; lo += sub {
						fa.EncodeFeedbackAdd(dst[c.EncodedLen(lo):c.EncodedLen(lo+sub)], s[lo:lo+sub], res[lo:lo+sub])
					}
				})
			})
		})
	}
}
