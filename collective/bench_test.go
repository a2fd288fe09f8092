package collective

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkAllreduce measures float32 Sum allreduce over the real transport
// with every rank in this process; bytes/s is algorithm bandwidth.
func BenchmarkAllreduce(b *testing.B) {
	ctx := context.Background()
	for _, n := range []int{2, 4} {
		comms := newJob(b, n, WithLogger(func(string, ...any) {}))
		for _, size := range []int{4, 1 << 20, 64 << 20} {
			b.Run(fmt.Sprintf("np=%d/bytes=%d", n, size), func(b *testing.B) {
				bufs := make([][]float32, n)
				for r := range bufs {
					bufs[r] = make([]float32, max(size/4, 1))
				}
				b.SetBytes(int64(size))
				b.ResetTimer()
				for range b.N {
					errs := onEach(comms, func(c *Comm) error { return c.Allreduce(ctx, bufs[c.Rank()], Sum) })
					for _, err := range errs {
						if err != nil {
							b.Fatal(err)
						}
					}
				}
			})
		}
	}
}

// BenchmarkCallOverhead is what every collective costs beside its
// transfers: a 4-byte allreduce on a one-rank job (numbering, the call's
// context and deadline, the stall watch, stats), with a caller's context
// that can be cancelled, as a training loop's usually is.
func BenchmarkCallOverhead(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	comms := newJob(b, 1, WithLogger(func(string, ...any) {}))
	buf := make([]float32, 1)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := comms[0].Allreduce(ctx, buf, Sum); err != nil {
			b.Fatal(err)
		}
	}
}
