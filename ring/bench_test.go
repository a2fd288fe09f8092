package ring

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"sync"
	"testing"
	"time"
)

// --- kernels ---------------------------------------------------------------

const kernelBytes = 256 << 10 // one default chunk: L2-resident like in the ring

func benchKernel(b *testing.B, dt DType, op Op) {
	dst := growAligned(nil, kernelBytes)
	src := growAligned(nil, kernelBytes)
	for i := range src {
		src[i] = byte(i % 7) // small values: no denormals/NaNs
	}
	b.SetBytes(kernelBytes)
	b.ResetTimer()
	for range b.N {
		reduceBytes(dt, op, dst, dst, src)
	}
}

// benchGoKernel is benchKernel with the Go kernels only, the baseline for
// the AVX2 assembly that reduceBytes runs where available.
func benchGoKernel(b *testing.B, dt DType, op Op) {
	dst := growAligned(nil, kernelBytes)
	src := growAligned(nil, kernelBytes)
	for i := range src {
		src[i] = byte(i % 7)
	}
	b.SetBytes(kernelBytes)
	b.ResetTimer()
	for range b.N {
		reduceGo(dt, op, dst, dst, src)
	}
}

func BenchmarkReduce(b *testing.B) {
	for _, dt := range reduceTypes {
		for _, op := range []Op{Sum, Prod, Min, Max} {
			b.Run(fmt.Sprintf("%s/%s", dt, op), func(b *testing.B) { benchKernel(b, dt, op) })
		}
	}
}

// naiveSumFloat32 is the straightforward typed loop (same unsafe view).
func naiveSumFloat32(dst, a, b []float32) {
	for i := range dst {
		dst[i] = a[i] + b[i]
	}
}

// BenchmarkReduceNaive compares float32 Sum (reduceBytes, "unrolled") with
// the Go kernels alone (float64 too), a plain typed loop and a portable
// encoding/binary loop (no unsafe).
func BenchmarkReduceNaive(b *testing.B) {
	dst := growAligned(nil, kernelBytes)
	src := growAligned(nil, kernelBytes)
	b.Run("float32/Sum/unrolled", func(b *testing.B) { benchKernel(b, Float32, Sum) })
	b.Run("float32/Sum/goKernel", func(b *testing.B) { benchGoKernel(b, Float32, Sum) })
	b.Run("float64/Sum/goKernel", func(b *testing.B) { benchGoKernel(b, Float64, Sum) })
	b.Run("float32/Sum/loop", func(b *testing.B) {
		b.SetBytes(kernelBytes)
		d, s := view[float32](dst), view[float32](src)
		for range b.N {
			naiveSumFloat32(d, d, s)
		}
	})
	b.Run("float32/Sum/binary", func(b *testing.B) {
		b.SetBytes(kernelBytes)
		le := binary.LittleEndian
		for range b.N {
			for i := 0; i+4 <= len(dst); i += 4 {
				v := math.Float32frombits(le.Uint32(dst[i:])) + math.Float32frombits(le.Uint32(src[i:]))
				le.PutUint32(dst[i:], math.Float32bits(v))
			}
		}
	})
}

// --- allreduce over the in-memory transport ------------------------------

// benchAllreduce runs b.N allreduces of size bytes on n ranks driven by
// long-lived goroutines.
func benchAllreduce(b *testing.B, ts []Transport, size, chunk int) {
	benchAllreducePolicy(b, ts, size, chunk, forced(AlgoRing))
}

// benchAllreducePolicy is benchAllreduce with an allreduce policy.
func benchAllreducePolicy(b *testing.B, ts []Transport, size, chunk int, pol AllreducePolicy) {
	n := len(ts)
	rs := make([]*Ring, n)
	bufs := make([][]byte, n)
	for i := range rs {
		var err error
		if rs[i], err = New(Config{Rank: i, Size: n, ChunkBytes: chunk, Allreduce: pol}, ts[i]); err != nil {
			b.Fatal(err)
		}
		bufs[i] = growAligned(nil, size)[:size]
		for j, f := 0, view[float32](bufs[i]); j < len(f); j++ {
			f[j] = 1 // faults the pages in before timing; no denormals
		}
	}
	c := Call{Op: Sum, DType: Float32, Count: size / 4}
	ctx := context.Background()
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for i := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range b.N {
				if err := rs[i].Allreduce(ctx, c, bufs[i]); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func BenchmarkAllreduce(b *testing.B) {
	b.Run("N=4/4B", func(b *testing.B) { benchAllreduce(b, NewMemRing(4), 4, 0) })
	for _, size := range []int{1 << 20, 64 << 20} {
		b.Run(fmt.Sprintf("N=4/%dMiB", size>>20), func(b *testing.B) {
			benchAllreduce(b, NewMemRing(4), size, 0)
		})
	}
}

// BenchmarkAllreduceAlgorithms times every allreduce algorithm (and the
// default policy) over the in-memory Mesh at N = 2 and 4, for the sizes
// the default policy's thresholds sit between. Run it with a short
// -benchtime (e.g. -benchtime=20x): the large sizes take a while.
func BenchmarkAllreduceAlgorithms(b *testing.B) {
	for _, n := range []int{2, 4} {
		for _, size := range []int{4, 1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20} {
			for i := 0; i <= len(meshAlgos); i++ {
				name, pol := "default", AllreducePolicy{}
				if i < len(meshAlgos) {
					name, pol = meshAlgos[i].String(), forced(meshAlgos[i])
				}
				b.Run(fmt.Sprintf("N=%d/%s/%s", n, formatBytes(size), name), func(b *testing.B) {
					benchAllreducePolicy(b, NewMemRing(n), size, 0, pol)
				})
			}
		}
	}
}

// BenchmarkChunk sweeps ChunkBytes (used to choose DefaultChunkBytes).
func BenchmarkChunk(b *testing.B) {
	for _, tr := range []string{"mem", "tcp"} {
		for _, size := range []int{4 << 20, 32 << 20} {
			for _, chunk := range []int{16 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 4 << 20} {
				b.Run(fmt.Sprintf("%s/N=4/%dMiB/chunk=%dKiB", tr, size>>20, chunk>>10), func(b *testing.B) {
					var ts []Transport
					if tr == "mem" {
						ts = NewMemRing(4)
					} else {
						ts = newTCPRing(b, 4)
					}
					benchAllreduce(b, ts, size, chunk)
				})
			}
		}
	}
}

// BenchmarkAllreduceTCP runs the default configuration over loopback TCP.
func BenchmarkAllreduceTCP(b *testing.B) {
	for _, size := range []int{1 << 20, 64 << 20} {
		b.Run(fmt.Sprintf("N=4/%dMiB", size>>20), func(b *testing.B) {
			benchAllreduce(b, newTCPRing(b, 4), size, 0)
		})
	}
}

// --- a minimal loopback TCP transport for benchmarks ------------------------

type tcpTransport struct {
	next, prev net.Conn
}

func (t *tcpTransport) SendNext(ctx context.Context, bufs ...[]byte) error {
	if d, ok := ctx.Deadline(); ok {
		t.next.SetWriteDeadline(d)
	}
	nb := net.Buffers(bufs)
	_, err := nb.WriteTo(t.next)
	return err
}

func (t *tcpTransport) RecvPrev(ctx context.Context, buf []byte) error {
	if d, ok := ctx.Deadline(); ok {
		t.prev.SetReadDeadline(d)
	}
	for len(buf) > 0 {
		k, err := t.prev.Read(buf)
		if err != nil {
			return err
		}
		buf = buf[k:]
	}
	return nil
}

func newTCPRing(tb testing.TB, n int) []Transport {
	ts := make([]*tcpTransport, n)
	lns := make([]net.Listener, n)
	for i := range ts {
		ts[i] = &tcpTransport{}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		lns[i] = ln
	}
	for i := range ts {
		c, err := net.DialTimeout("tcp", lns[(i+1)%n].Addr().String(), time.Second)
		if err != nil {
			tb.Fatal(err)
		}
		ts[i].next = c
		a, err := lns[(i+1)%n].Accept()
		if err != nil {
			tb.Fatal(err)
		}
		ts[(i+1)%n].prev = a
	}
	out := make([]Transport, n)
	for i := range ts {
		lns[i].Close()
		out[i] = ts[i]
		tb.Cleanup(func() { ts[i].next.Close(); ts[i].prev.Close() })
	}
	return out
}
