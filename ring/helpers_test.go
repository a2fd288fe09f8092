package ring

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// newRings builds n Rings over an in-memory ring.
func newRings(tb testing.TB, n, chunk int) ([]*Ring, []Transport) {
	tb.Helper()
	ts := NewMemRing(n)
	rs := make([]*Ring, n)
	for i := range rs {
		r, err := New(Config{Rank: i, Size: n, ChunkBytes: chunk}, ts[i])
		if err != nil {
			tb.Fatal(err)
		}
		rs[i] = r
	}
	return rs, ts
}

// parallel runs f for every rank concurrently and returns the errors.
func parallel(n int, f func(i int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(i)
		}()
	}
	wg.Wait()
	return errs
}

func mustAll(tb testing.TB, errs []error) {
	tb.Helper()
	for i, err := range errs {
		if err != nil {
			tb.Fatalf("rank %d: %v", i, err)
		}
	}
}

func testCtx(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

// encode/decode elements through encoding/binary, independently of the
// unsafe views used by the kernels.
func encode(dt DType, vals []float64) []byte {
	b := make([]byte, len(vals)*dt.Size())
	le := binary.LittleEndian
	for i, v := range vals {
		switch dt {
		case Float32:
			le.PutUint32(b[4*i:], math.Float32bits(float32(v)))
		case Float64:
			le.PutUint64(b[8*i:], math.Float64bits(v))
		case Int32:
			le.PutUint32(b[4*i:], uint32(int32(v)))
		case Int64:
			le.PutUint64(b[8*i:], uint64(int64(v)))
		case Uint8:
			b[i] = uint8(v)
		}
	}
	return b
}

func decode(dt DType, b []byte) []float64 {
	n := len(b) / dt.Size()
	out := make([]float64, n)
	le := binary.LittleEndian
	for i := range out {
		switch dt {
		case Float32:
			out[i] = float64(math.Float32frombits(le.Uint32(b[4*i:])))
		case Float64:
			out[i] = math.Float64frombits(le.Uint64(b[8*i:]))
		case Int32:
			out[i] = float64(int32(le.Uint32(b[4*i:])))
		case Int64:
			out[i] = float64(int64(le.Uint64(b[8*i:])))
		case Uint8:
			out[i] = float64(b[i])
		}
	}
	return out
}

// reference reduces per-rank integer-valued inputs exactly (all values are
// small integers, so float64 arithmetic is exact) and applies the dtype's
// Avg semantics.
func reference(dt DType, op Op, inputs [][]float64) []float64 {
	n := len(inputs)
	out := make([]float64, len(inputs[0]))
	for i := range out {
		acc := inputs[0][i]
		for r := 1; r < n; r++ {
			v := inputs[r][i]
			switch op {
			case Sum, Avg:
				acc += v
			case Prod:
				acc *= v
			case Min:
				acc = math.Min(acc, v)
			case Max:
				acc = math.Max(acc, v)
			}
		}
		if op == Avg {
			switch dt {
			case Float32:
				acc = float64(float32(acc) / float32(n))
			case Float64:
				acc /= float64(n)
			default:
				acc = float64(int64(acc) / int64(n)) // truncation toward zero
			}
		}
		out[i] = acc
	}
	return out
}

// randomInputs returns n buffers of count random (non-integer) float32
// values, so that the order of additions shows in the result's bits.
func randomInputs(n, count int, seed1, seed2 uint64) [][]byte {
	rng := rand.New(rand.NewPCG(seed1, seed2))
	in := make([][]byte, n)
	for i := range in {
		v := make([]float64, count)
		for j := range v {
			v[j] = rng.NormFloat64() * 1e3
		}
		in[i] = encode(Float32, v)
	}
	return in
}

// identicalRuns runs the allreduce c of in (one buffer per rank) three
// times, on rings mk makes with chunk sizes 0, 4096 and 0 (other
// pipelining), and fails unless every rank of every run ends with the same
// bytes.
func identicalRuns(t *testing.T, what string, in [][]byte, c Call, mk func(chunk int) []*Ring) {
	t.Helper()
	n := len(in)
	var first []byte
	for run, chunk := range []int{0, 4096, 0} {
		rs := mk(chunk)
		bufs := make([][]byte, n)
		mustAll(t, parallel(n, func(i int) error {
			bufs[i] = bytes.Clone(in[i])
			return rs[i].Allreduce(testCtx(t), c, bufs[i])
		}))
		for i := 1; i < n; i++ {
			if !bytes.Equal(bufs[i], bufs[0]) {
				t.Fatalf("%s run %d: rank %d differs from rank 0", what, run, i)
			}
		}
		if first == nil {
			first = bufs[0]
		} else if !bytes.Equal(first, bufs[0]) {
			t.Fatalf("%s: run %d differs from run 0", what, run)
		}
	}
}
