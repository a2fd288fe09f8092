package ring

import (
	"fmt"
	"sync"
	"testing"

	"github.com/gorun/gorun/compress"
)

// BenchmarkCompressedAllreduce: 4 ranks over the in-memory mesh, so the
// figure is the CPU cost of encoding, reducing and decoding.
func BenchmarkCompressedAllreduce(b *testing.B) {
	const n, count = 4, 16 << 20 // 64 MiB of float32
	for _, name := range []string{"none", "fp16", "int8"} {
		b.Run(fmt.Sprintf("N=%d/64MiB/%s", n, name), func(b *testing.B) {
			codec, _ := compress.ByName(name)
			rs, _ := newRings(b, n, 0)
			bufs := make([][]float32, n)
			fbs := make([]*Feedback, n)
			for i := range bufs {
				bufs[i] = gaussian(uint64(i), count)
				_, own := Segment(count, n, i)
				fbs[i] = &Feedback{Contrib: make([]float32, count), Owner: make([]float32, own)}
			}
			b.SetBytes(4 * count)
			b.ResetTimer()
			for range b.N {
				var wg sync.WaitGroup
				for i := range rs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if _, err := rs[i].AllreduceCompressed(testCtx(b), Call{Op: Sum, DType: Float32, Count: count}, f32bytes(bufs[i]), codec, fbs[i]); err != nil {
							b.Error(err)
						}
					}()
				}
				wg.Wait()
			}
		})
	}
}
