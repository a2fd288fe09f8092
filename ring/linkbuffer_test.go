package ring

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"testing"
)

// bufferedMesh is a MemTransport whose links say they hold buffer bytes
// (LinkBuffers) and that counts the calls that ran goroutines of their own
// (Concurrency).
type bufferedMesh struct {
	*MemTransport
	buffer     int
	concurrent atomic.Int32
}

func (b *bufferedMesh) LinkBuffer(int) int { return b.buffer }

func (b *bufferedMesh) Concurrent(on bool) {
	if on {
		b.concurrent.Add(1)
	}
}

// A step whose message fits half a link's buffer runs send-then-receive on
// the caller's goroutine, ring and exchange schedules alike; a larger one
// keeps its sender goroutine. Results are checked against the reference
// either way.
func TestLinkBufferChoosesSequentialSteps(t *testing.T) {
	const n = 2
	for _, tc := range []struct {
		algo      string
		count     int // float32 elements
		buffer    int
		goroutine bool
	}{
		// Ring at N = 2: a step carries half the buffer (512 KiB of a
		// 1 MiB allreduce) plus headers.
		{"ring", 1 << 18, 0, true},                      // beyond SmallBytes, nothing promised
		{"ring", 1 << 18, 1 << 20, true},                // half of 1 MiB is short of 512 KiB + headers
		{"ring", 1 << 18, 2 << 20, false},               // half of 2 MiB holds it
		{"ring", 1<<18 + 1, 2 << 20, false},             // an odd length too
		{"recursive-doubling", 1 << 17, 2 << 20, false}, // one exchange of 512 KiB
		{"recursive-doubling", 1 << 18, 2 << 20, true},  // of 1 MiB: too much
	} {
		t.Run(fmt.Sprintf("%s/%d/%d", tc.algo, tc.count, tc.buffer), func(t *testing.T) {
			policy, err := ParseAllreducePolicy(tc.algo)
			if err != nil {
				t.Fatal(err)
			}
			ts := NewMemRing(n)
			meshes := make([]*bufferedMesh, n)
			rs := make([]*Ring, n)
			for i := range rs {
				meshes[i] = &bufferedMesh{MemTransport: ts[i].(*MemTransport), buffer: tc.buffer}
				if rs[i], err = New(Config{Rank: i, Size: n, Allreduce: policy}, meshes[i]); err != nil {
					t.Fatal(err)
				}
			}
			in := randomInputs(n, tc.count, 3, uint64(tc.count))
			bufs := make([][]byte, n)
			inputs := make([][]float64, n)
			for i := range bufs {
				bufs[i] = append([]byte(nil), in[i]...)
				inputs[i] = decode(Float32, in[i])
			}
			mustAll(t, parallel(n, func(i int) error {
				return rs[i].Allreduce(testCtx(t), Call{Op: Sum, DType: Float32, Count: tc.count}, bufs[i])
			}))
			want := reference(Float32, Sum, inputs)
			for i := range bufs {
				got := decode(Float32, bufs[i])
				for k := range want {
					if float32(got[k]) != float32(want[k]) {
						t.Fatalf("rank %d element %d: %v, want %v", i, k, got[k], want[k])
					}
				}
			}
			for i, m := range meshes {
				if ran := m.concurrent.Load() > 0; ran != tc.goroutine {
					t.Errorf("rank %d: sender goroutine %v, want %v", i, ran, tc.goroutine)
				}
			}
		})
	}
}

// viewMesh is a MemTransport that hands what it receives to RecvFromView
// in awkward spans: starting one byte off alignment, of lengths 1, 2, 3,
// ... bytes, so that elements straddle spans and spans start misaligned.
type viewMesh struct {
	*MemTransport
	spans atomic.Int64
}

func (v *viewMesh) RecvFromView(ctx context.Context, rank, n int, use func([]byte)) error {
	b := make([]byte, n+1)[1:] // one receiver per peer may run at once: a buffer each
	if err := v.RecvFrom(ctx, rank, b); err != nil {
		return err
	}
	for l := 1; len(b) > 0; l++ {
		k := min(l, len(b))
		use(b[:k])
		b = b[k:]
		v.spans.Add(1)
	}
	return nil
}

// Reducing straight from a ViewReceiver's spans, however they split the
// elements, gives the bytes the copying path gives, for every type, at odd
// lengths and rank counts, in the ring and in the pairwise exchanges, with
// sequential rounds and (200,003 float64s: rounds beyond half a link's
// buffer) pipelined ones, in small chunks and in chunks larger than a
// link holds.
func TestViewReceiverReducesInPlace(t *testing.T) {
	for _, algo := range []string{"ring", "recursive-doubling", "rabenseifner"} {
		for _, n := range []int{2, 3, 5} {
			for _, dt := range []DType{Float32, Float64, Int32, Int64} {
				testViewReduce(t, algo, n, dt, Avg, 1000+n, 256)
			}
			testViewReduce(t, algo, n, Float64, Sum, 200_003, 256)
			// One chunk larger than a link holds: a sender stays blocked
			// in it until the peer receives, so a receiver that waited
			// for its own send before receiving would deadlock.
			testViewReduce(t, algo, n, Float64, Sum, 200_003, 4<<20)
		}
	}
}

func testViewReduce(t *testing.T, algo string, n int, dt DType, op Op, count, chunk int) {
	t.Helper()
	policy, err := ParseAllreducePolicy(algo)
	if err != nil {
		t.Fatal(err)
	}
	in := randomInputs(n, count, uint64(n), uint64(dt))
	run := func(view bool) [][]byte {
		ts := NewMemRing(n)
		rs := make([]*Ring, n)
		var views []*viewMesh
		for i := range rs {
			var tr Transport = ts[i]
			if view {
				v := &viewMesh{MemTransport: ts[i].(*MemTransport)}
				views = append(views, v)
				tr = v
			}
			r, err := New(Config{Rank: i, Size: n, ChunkBytes: chunk, Allreduce: policy}, tr)
			if err != nil {
				t.Fatal(err)
			}
			rs[i] = r
		}
		bufs := make([][]byte, n)
		for i := range bufs {
			bufs[i] = encode(dt, decode(Float32, in[i]))
		}
		mustAll(t, parallel(n, func(i int) error {
			return rs[i].Allreduce(testCtx(t), Call{Op: op, DType: dt, Count: count}, bufs[i])
		}))
		var spans int64 // a rank that only sends (recursive doubling's extra ranks) has none
		for _, v := range views {
			spans += v.spans.Load()
		}
		// Small calls run sequentially and always fold in place, and so
		// does the ring at any size; a pipelined exchange whose received
		// range is the one it sends copies instead (see recvXfer).
		if view && spans == 0 && (count < 10_000 || algo == "ring") {
			t.Fatalf("%s N=%d: no rank received through RecvFromView", algo, n)
		}
		return bufs
	}
	want, got := run(false), run(true)
	for i := range got {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("%s N=%d %v %v count %d: rank %d's result differs from the copying path's", algo, n, dt, op, count, i)
		}
	}
}

// groupedMesh is a bufferedMesh that says whether its rank runs large
// steps as groups (GroupedSteps).
type groupedMesh struct {
	*bufferedMesh
	grouped bool
}

func (g *groupedMesh) GroupedSteps() bool { return g.grouped }

// A rank told to (GroupedSteps) runs steps larger than the send-first
// bound as groups of chunks, each sent then received on its own
// goroutine (runGrouped), mixed freely with ranks that run the sender
// goroutine: Allreduce (ring), ReduceScatter, Allgather and Shift at
// N = 1 to 7, with steps of several groups, a last group partly filled and
// segments whose chunk counts differ (odd lengths), checked element by
// element.
func TestGroupedSteps(t *testing.T) {
	const chunk = 4000 // bytes: 16 chunks and their headers fit SmallBytes
	policy, err := ParseAllreducePolicy("ring")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 2, 3, 4, 5, 7} {
		for _, mix := range []string{"all grouped", "mixed"} {
			// A step of about 2.5 groups, and one element more than a
			// multiple of n (segments of different lengths).
			count := n*(SmallBytes*5/2/4) + 1
			t.Run(fmt.Sprintf("N=%d/%s", n, mix), func(t *testing.T) {
				ts := NewMemRing(n)
				meshes := make([]*groupedMesh, n)
				rs := make([]*Ring, n)
				for i := range rs {
					meshes[i] = &groupedMesh{bufferedMesh: &bufferedMesh{MemTransport: ts[i].(*MemTransport)}, grouped: mix == "all grouped" || i%2 == 0}
					if rs[i], err = New(Config{Rank: i, Size: n, ChunkBytes: chunk, Allreduce: policy}, meshes[i]); err != nil {
						t.Fatal(err)
					}
				}
				// Allreduce, of integers: exact in any reduction order.
				in := make([][]byte, n)
				inputs := make([][]float64, n)
				bufs := make([][]byte, n)
				for i := range in {
					inputs[i] = make([]float64, count)
					for k := range inputs[i] {
						inputs[i][k] = float64((k*7+i*13)%1000 - 500)
					}
					in[i] = encode(Int32, inputs[i])
					bufs[i] = append([]byte(nil), in[i]...)
				}
				mustAll(t, parallel(n, func(i int) error {
					return rs[i].Allreduce(testCtx(t), Call{Op: Sum, DType: Int32, Count: count}, bufs[i])
				}))
				want := encode(Int32, reference(Int32, Sum, inputs))
				for i := range bufs {
					if !bytes.Equal(bufs[i], want) {
						t.Fatalf("allreduce: rank %d: wrong result", i)
					}
				}
				// ReduceScatter of n*per elements.
				per := count / n
				ins := make([][]byte, n)
				outs := make([][]byte, n)
				inputs = inputs[:0]
				for i := range ins {
					ins[i] = in[i][:4*n*per]
					inputs = append(inputs, decode(Int32, ins[i]))
					outs[i] = make([]byte, 4*per)
				}
				mustAll(t, parallel(n, func(i int) error {
					return rs[i].ReduceScatter(testCtx(t), Call{Op: Sum, DType: Int32, Count: n * per}, ins[i], outs[i])
				}))
				want = encode(Int32, reference(Int32, Sum, inputs))
				for i := range outs {
					if !bytes.Equal(outs[i], want[i*4*per:(i+1)*4*per]) {
						t.Fatalf("reduce-scatter: rank %d: wrong result", i)
					}
				}
				// Allgather of count bytes per rank.
				var all []byte
				for i := range in {
					all = append(all, in[i][:count]...)
				}
				mustAll(t, parallel(n, func(i int) error {
					outs[i] = make([]byte, n*count)
					return rs[i].Allgather(testCtx(t), Call{DType: Uint8, Count: count}, in[i][:count], outs[i])
				}))
				for i := range outs {
					if !bytes.Equal(outs[i], all) {
						t.Fatalf("allgather: rank %d: wrong result", i)
					}
				}
				// Shift of count bytes: one step, rank i's bytes to i+1.
				mustAll(t, parallel(n, func(i int) error {
					outs[i] = make([]byte, count)
					return rs[i].Shift(testCtx(t), Call{DType: Uint8, Count: count}, in[i][:count], outs[i])
				}))
				for i := range outs {
					if !bytes.Equal(outs[i], in[(i+n-1)%n][:count]) {
						t.Fatalf("shift: rank %d did not receive rank %d's bytes", i, (i+n-1)%n)
					}
				}
				for i, m := range meshes {
					if ran := m.concurrent.Load() > 0; ran != (!m.grouped && n > 1) {
						t.Errorf("rank %d (grouped %v): sender goroutine %v", i, m.grouped, ran)
					}
				}
			})
		}
	}
}
