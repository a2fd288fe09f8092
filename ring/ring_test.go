package ring

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

var (
	testSizes   = []int{1, 2, 3, 4, 7}
	reduceTypes = []DType{Float32, Float64, Int32, Int64}
	allOps      = []Op{Sum, Avg, Min, Max, Prod}
)

// testCounts covers empty, shorter-than-N, a prime under TinyAllreduceBytes
// (the gather path) and a prime above it (the ring path, uneven segments).
func testCounts(n int) []int { return []int{0, 1, n - 1, 1009, 4099} }

// smallInts returns per-rank integer-valued inputs; products stay exact.
func smallInts(rng *rand.Rand, n, count int, op Op) [][]float64 {
	in := make([][]float64, n)
	for r := range in {
		in[r] = make([]float64, count)
		for i := range in[r] {
			if op == Prod {
				in[r][i] = []float64{-2, -1, 1, 2}[rng.IntN(4)]
			} else {
				in[r][i] = float64(rng.IntN(41) - 20)
			}
		}
	}
	return in
}

func TestAllreduceMatrix(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range testSizes {
		for _, count := range testCounts(n) {
			for _, chunk := range []int{0, 24} {
				rs, _ := newRings(t, n, chunk)
				for _, dt := range reduceTypes {
					for _, op := range allOps {
						name := fmt.Sprintf("N=%d/count=%d/chunk=%d/%s/%s", n, count, chunk, dt, op)
						in := smallInts(rng, n, count, op)
						want := encode(dt, reference(dt, op, in))
						bufs := make([][]byte, n)
						errs := parallel(n, func(i int) error {
							bufs[i] = encode(dt, in[i])
							c := Call{Kind: Allreduce, Seq: 7, Op: op, DType: dt, Count: count, Name: "t"}
							return rs[i].Allreduce(testCtx(t), c, bufs[i])
						})
						for i := range bufs {
							if errs[i] != nil {
								t.Fatalf("%s: rank %d: %v", name, i, errs[i])
							}
							if !bytes.Equal(bufs[i], want) {
								t.Fatalf("%s: rank %d: got %v want %v", name, i, head(decode(dt, bufs[i])), head(decode(dt, want)))
							}
						}
					}
				}
			}
		}
	}
}

func head(v []float64) []float64 { return v[:min(len(v), 16)] }

func TestAllreduceLarge(t *testing.T) {
	const count = 1 << 18 // 1 MiB of float32
	for _, n := range []int{2, 4, 7} {
		rs, _ := newRings(t, n, 0)
		rng := rand.New(rand.NewPCG(3, uint64(n)))
		in := smallInts(rng, n, count, Sum)
		want := encode(Float32, reference(Float32, Sum, in))
		bufs := make([][]byte, n)
		mustAll(t, parallel(n, func(i int) error {
			bufs[i] = encode(Float32, in[i])
			return rs[i].Allreduce(testCtx(t), Call{Op: Sum, DType: Float32, Count: count}, bufs[i])
		}))
		for i := range bufs {
			if !bytes.Equal(bufs[i], want) {
				t.Fatalf("N=%d rank %d: wrong result", n, i)
			}
		}
	}
}

// TestAllreduceMisaligned reduces into a buffer that is not 4-byte aligned
// (exercises the realignment path; -race enables checkptr).
func TestAllreduceMisaligned(t *testing.T) {
	const n, count = 3, 101
	rs, _ := newRings(t, n, 64)
	rng := rand.New(rand.NewPCG(5, 6))
	in := smallInts(rng, n, count, Sum)
	want := encode(Float32, reference(Float32, Sum, in))
	bufs := make([][]byte, n)
	mustAll(t, parallel(n, func(i int) error {
		bufs[i] = append(make([]byte, 1, 1+4*count), encode(Float32, in[i])...)[1:]
		return rs[i].Allreduce(testCtx(t), Call{Op: Sum, DType: Float32, Count: count}, bufs[i])
	}))
	for i := range bufs {
		if !bytes.Equal(bufs[i], want) {
			t.Fatalf("rank %d: wrong result", i)
		}
	}
}

func TestReduceScatter(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, n := range testSizes {
		for _, per := range []int{0, 1, 3, 1009} {
			count := n * per
			rs, _ := newRings(t, n, 40)
			for _, dt := range reduceTypes {
				for _, op := range allOps {
					in := smallInts(rng, n, count, op)
					want := encode(dt, reference(dt, op, in))
					ins := make([][]byte, n)
					outs := make([][]byte, n)
					mustAll(t, parallel(n, func(i int) error {
						ins[i] = encode(dt, in[i])
						outs[i] = make([]byte, per*dt.Size())
						return rs[i].ReduceScatter(testCtx(t), Call{Kind: ReduceScatter, Op: op, DType: dt, Count: count}, ins[i], outs[i])
					}))
					bs := per * dt.Size()
					for i := range outs {
						if !bytes.Equal(outs[i], want[i*bs:(i+1)*bs]) {
							t.Fatalf("N=%d per=%d %s %s rank %d: got %v want %v", n, per, dt, op, i,
								head(decode(dt, outs[i])), head(decode(dt, want[i*bs:(i+1)*bs])))
						}
						if !bytes.Equal(ins[i], encode(dt, in[i])) {
							t.Fatalf("rank %d: input modified", i)
						}
					}
				}
			}
		}
	}
}

func TestAllgather(t *testing.T) {
	for _, n := range testSizes {
		for _, count := range []int{0, 1, 7, 1009} {
			for _, dt := range []DType{Uint8, Float64, Int32} {
				rs, _ := newRings(t, n, 48)
				ins := make([][]byte, n)
				var want []byte
				for i := range ins {
					ins[i] = make([]byte, count*dt.Size())
					for j := range ins[i] {
						ins[i][j] = byte(i*31 + j)
					}
					want = append(want, ins[i]...)
				}
				outs := make([][]byte, n)
				mustAll(t, parallel(n, func(i int) error {
					outs[i] = make([]byte, n*len(ins[i]))
					return rs[i].Allgather(testCtx(t), Call{DType: dt, Count: count}, ins[i], outs[i])
				}))
				for i := range outs {
					if !bytes.Equal(outs[i], want) {
						t.Fatalf("N=%d count=%d %s rank %d: wrong result", n, count, dt, i)
					}
				}
			}
		}
	}
}

func TestBroadcast(t *testing.T) {
	for _, n := range testSizes {
		for _, count := range []int{0, 1, 1009, 100000} {
			rs, _ := newRings(t, n, 1000)
			for root := 0; root < n; root++ {
				bufs := make([][]byte, n)
				for i := range bufs {
					bufs[i] = make([]byte, count)
					for j := range bufs[i] {
						bufs[i][j] = byte(i + 3*j)
					}
				}
				want := bytes.Clone(bufs[root])
				before := make([]uint64, n)
				for i, r := range rs {
					before[i] = r.Stats().PayloadBytesSent
				}
				mustAll(t, parallel(n, func(i int) error {
					return rs[i].Broadcast(testCtx(t), Call{Kind: Broadcast, Seq: uint64(root), DType: Uint8, Count: count, Root: root}, bufs[i])
				}))
				for i := range bufs {
					if !bytes.Equal(bufs[i], want) {
						t.Fatalf("N=%d count=%d root=%d rank %d: wrong result", n, count, root, i)
					}
				}
				// Every rank but the end of the chain sends the buffer once;
				// a small buffer goes straight from the root to everybody.
				direct := count+numChunks(count, 1000)*HeaderSize <= SmallBytes
				for i, r := range rs {
					want := uint64(count)
					if i == (root+n-1)%n {
						want = 0
					}
					if direct {
						want = 0
						if i == root {
							want = uint64((n - 1) * count)
						}
					}
					if got := r.Stats().PayloadBytesSent - before[i]; got != want {
						t.Fatalf("N=%d count=%d root=%d rank %d sent %d bytes, want %d", n, count, root, i, got, want)
					}
				}
			}
		}
	}
}

func TestBarrier(t *testing.T) {
	for _, n := range testSizes {
		rs, _ := newRings(t, n, 0)
		const delay = 50 * time.Millisecond
		start := time.Now()
		done := make([]time.Duration, n)
		mustAll(t, parallel(n, func(i int) error {
			if i == n-1 {
				time.Sleep(delay)
			}
			err := rs[i].Barrier(testCtx(t), Call{Seq: 1})
			done[i] = time.Since(start)
			return err
		}))
		for i, d := range done {
			if d < delay {
				t.Fatalf("N=%d: rank %d left the barrier after %v, before the last rank entered (%v)", n, i, d, delay)
			}
		}
	}
}

func TestSize1(t *testing.T) {
	r, err := New(Config{Rank: 0, Size: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	buf := encode(Int32, []float64{1, 2, 3})
	for _, op := range allOps {
		if err := r.Allreduce(ctx, Call{Op: op, DType: Int32, Count: 3}, buf); err != nil {
			t.Fatal(err)
		}
	}
	if got := decode(Int32, buf); fmt.Sprint(got) != "[1 2 3]" {
		t.Fatalf("allreduce changed the buffer: %v", got)
	}
	out := make([]byte, len(buf))
	if err := r.ReduceScatter(ctx, Call{Op: Sum, DType: Int32, Count: 3}, buf, out); err != nil || !bytes.Equal(out, buf) {
		t.Fatalf("reducescatter: %v %v", err, out)
	}
	clear(out)
	if err := r.Allgather(ctx, Call{DType: Int32, Count: 3}, buf, out); err != nil || !bytes.Equal(out, buf) {
		t.Fatalf("allgather: %v %v", err, out)
	}
	if err := r.Broadcast(ctx, Call{DType: Int32, Count: 3}, buf); err != nil {
		t.Fatal(err)
	}
	if err := r.Barrier(ctx, Call{}); err != nil {
		t.Fatal(err)
	}
	if s := r.Stats(); s != (Stats{}) {
		t.Fatalf("size 1 sent traffic: %+v", s)
	}
}

// TestByteCounting checks bandwidth optimality of Allreduce: each rank sends
// exactly 2(N-1)/N*S payload bytes when N divides S, and the ranks together
// send 2(N-1)*S otherwise.
func TestByteCounting(t *testing.T) {
	for _, n := range []int{2, 3, 4, 7} {
		for _, count := range []int{n * 1000, 4099, 1009, n - 1, 0} {
			rs, _ := policyRings(t, n, 256, false, func(int) AllreducePolicy {
				return AllreducePolicy{Rules: []AllreduceRule{{TinyAllreduceBytes, AlgoDirect}, {NoLimit, AlgoRing}}}
			})
			S := uint64(count * 4)
			mustAll(t, parallel(n, func(i int) error {
				return rs[i].Allreduce(testCtx(t), Call{Op: Sum, DType: Float32, Count: count}, make([]byte, S))
			}))
			// Below TinyAllreduceBytes whole buffers travel (N-1 hops, each
			// rank sends (N-1)*S); above, the bandwidth-optimal ring.
			tiny := S <= TinyAllreduceBytes
			wantTotal, wantMsgs := 2*uint64(n-1)*S, 2*uint64(n-1)
			if tiny {
				wantTotal, wantMsgs = uint64(n*(n-1))*S, uint64(n-1)
			}
			var total, recv uint64
			for i, r := range rs {
				s := r.Stats()
				if !tiny && count%n == 0 && s.PayloadBytesSent != 2*uint64(n-1)*S/uint64(n) {
					t.Errorf("N=%d count=%d rank %d sent %d payload bytes, want %d", n, count, i, s.PayloadBytesSent, 2*uint64(n-1)*S/uint64(n))
				}
				if tiny && s.PayloadBytesSent != uint64(n-1)*S {
					t.Errorf("N=%d count=%d (tiny) rank %d sent %d payload bytes, want %d", n, count, i, s.PayloadBytesSent, uint64(n-1)*S)
				}
				if s.HeaderBytesSent != s.MessagesSent*HeaderSize {
					t.Errorf("header bytes %d != %d messages * %d", s.HeaderBytesSent, s.MessagesSent, HeaderSize)
				}
				if s.MessagesSent < wantMsgs {
					t.Errorf("rank %d sent %d messages, want >= %d (one per step at least)", i, s.MessagesSent, wantMsgs)
				}
				total += s.PayloadBytesSent
				recv += s.PayloadBytesRecv
			}
			if total != wantTotal || recv != total {
				t.Errorf("N=%d count=%d: total sent %d recv %d, want %d", n, count, total, recv, wantTotal)
			}
		}
	}
}

// TestDeterminism: random (non-integer) float32 data; all ranks must end
// bitwise identical, and a second run, even with another chunk size, must
// give the same bytes.
func TestDeterminism(t *testing.T) {
	for _, n := range []int{3, 4, 7} {
		for _, count := range []int{1009, 1 << 16} {
			in := randomInputs(n, count, uint64(n), uint64(count))
			identicalRuns(t, fmt.Sprintf("N=%d count=%d", n, count), in, Call{Op: Sum, DType: Float32, Count: count},
				func(chunk int) []*Ring { rs, _ := newRings(t, n, chunk); return rs })
		}
	}
}

func TestMismatch(t *testing.T) {
	base := Call{Kind: Allreduce, Seq: 17, Op: Sum, DType: Float32, Count: 1000}
	cases := []struct {
		name   string
		modify func(*Call)
	}{
		{"count", func(c *Call) { c.Count = 999 }},
		{"op", func(c *Call) { c.Op = Max }},
		{"dtype", func(c *Call) { c.DType = Int32 }},
		{"seq", func(c *Call) { c.Seq = 18 }},
		{"count0", func(c *Call) { c.Count = 0 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			const n = 3
			rs, _ := newRings(t, n, 0)
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			errs := parallel(n, func(i int) error {
				c := base
				if i == 1 {
					tc.modify(&c)
				}
				return rs[i].Allreduce(ctx, c, make([]byte, c.Count*c.DType.Size()))
			})
			// Rank 2 receives from rank 1 and must see the mismatch.
			var me *MismatchError
			if !errors.As(errs[2], &me) {
				t.Fatalf("rank 2: got %v, want *MismatchError", errs[2])
			}
			// 4000 bytes: the direct allreduce (the default up to
			// TinyAllreduceBytes), which is part of the fingerprint.
			local, remote := base, base
			tc.modify(&remote)
			local.Algo, remote.Algo = AlgoDirect, AlgoDirect
			if me.LocalRank != 2 || me.RemoteRank != 1 || me.Local != local || me.Remote != remote {
				t.Fatalf("bad mismatch error %+v", me)
			}
			if !errors.As(errs[1], &me) || me.LocalRank != 1 || me.RemoteRank != 0 {
				t.Fatalf("rank 1: got %v, want *MismatchError from rank 0", errs[1])
			}
			if tc.name == "count" {
				want := "allreduce #17: rank 2 called Allreduce(float32[1000], Sum, direct) but rank 1 called Allreduce(float32[999], Sum, direct)"
				if errs[2].Error() != want {
					t.Fatalf("got %q\nwant %q", errs[2], want)
				}
			}
		})
	}
	t.Run("kind", func(t *testing.T) {
		rs, _ := newRings(t, 2, 0)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		errs := parallel(2, func(i int) error {
			if i == 0 {
				return rs[i].Broadcast(ctx, Call{Seq: 3, DType: Uint8, Count: 8}, make([]byte, 8))
			}
			return rs[i].Allgather(ctx, Call{Seq: 3, DType: Uint8, Count: 4}, make([]byte, 4), make([]byte, 8))
		})
		var me *MismatchError
		if !errors.As(errs[1], &me) || me.Remote.Kind != Broadcast {
			t.Fatalf("rank 1: got %v", errs[1])
		}
		want := "allgather #3: rank 1 called Allgather(uint8[4]) but rank 0 called Broadcast(uint8[8], root=0)"
		if errs[1].Error() != want {
			t.Fatalf("got %q\nwant %q", errs[1], want)
		}
	})
}

// TestPeerStops: one rank never joins; the others must fail promptly when
// their context expires, with an error that says where they were waiting.
func TestPeerStops(t *testing.T) {
	const n = 4
	rs, _ := newRings(t, n, 1024)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	errs := parallel(n-1, func(i int) error {
		return rs[i].Allreduce(ctx, Call{Seq: 5, Op: Sum, DType: Float64, Count: 100000}, make([]byte, 800000))
	})
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("took %v", d)
	}
	for i, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "allreduce #5 step ") {
			t.Fatalf("rank %d: got %v", i, err)
		}
		t.Logf("rank %d: %v", i, err)
	}
}

// TestPeerCrash breaks one rank's links mid-collective: its neighbours must
// fail fast with the injected error (the root cause, not "context canceled"),
// and the call on the rank whose sender failed must also stop its receiver.
func TestPeerCrash(t *testing.T) {
	const n = 3
	rs, ts := policyRings(t, n, 1024, false, func(int) AllreducePolicy { return forced(AlgoRing) })
	crash := errors.New("injected crash")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	errs := parallel(n, func(i int) error {
		if i == 2 {
			time.Sleep(20 * time.Millisecond)
			ts[2].(*MemTransport).Close(crash)
			return nil
		}
		return rs[i].Allreduce(ctx, Call{Seq: 9, Op: Sum, DType: Float32, Count: 1 << 20}, make([]byte, 4<<20))
	})
	// Rank 0 receives from rank 2, rank 1 sends to rank 2: both see the crash.
	for i := 0; i < 2; i++ {
		if !errors.Is(errs[i], crash) {
			t.Fatalf("rank %d: got %v, want the injected crash", i, errs[i])
		}
		t.Logf("rank %d: %v", i, errs[i])
	}
	if !strings.Contains(errs[0].Error(), "recv from rank 2") || !strings.Contains(errs[1].Error(), "send to rank 2") {
		t.Fatalf("errors do not name the peer: %v / %v", errs[0], errs[1])
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("took %v", d)
	}
}

func TestValidation(t *testing.T) {
	ts := NewMemRing(2)
	for _, cfg := range []Config{{Rank: 0, Size: 0}, {Rank: 2, Size: 2}, {Rank: -1, Size: 2}, {Rank: 0, Size: 2, ChunkBytes: -1}} {
		if _, err := New(cfg, ts[0]); err == nil {
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
	if _, err := New(Config{Rank: 0, Size: 2}, nil); err == nil {
		t.Error("nil transport accepted")
	}
	r, err := New(Config{Rank: 0, Size: 2}, ts[0])
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	bad := []struct {
		name string
		err  error
	}{
		{"short buffer", r.Allreduce(ctx, Call{Op: Sum, DType: Float32, Count: 4}, make([]byte, 15))},
		{"uint8 reduce", r.Allreduce(ctx, Call{Op: Sum, DType: Uint8, Count: 4}, make([]byte, 4))},
		{"no op", r.Allreduce(ctx, Call{DType: Float32, Count: 4}, make([]byte, 16))},
		{"no dtype", r.Broadcast(ctx, Call{Count: 4}, make([]byte, 16))},
		{"wrong kind", r.Allreduce(ctx, Call{Kind: Broadcast, Op: Sum, DType: Float32, Count: 4}, make([]byte, 16))},
		{"bad root", r.Broadcast(ctx, Call{DType: Uint8, Count: 4, Root: 2}, make([]byte, 4))},
		{"negative count", r.Broadcast(ctx, Call{DType: Uint8, Count: -1}, nil)},
		{"rs not multiple", r.ReduceScatter(ctx, Call{Op: Sum, DType: Int32, Count: 3}, make([]byte, 12), make([]byte, 6))},
		{"rs out size", r.ReduceScatter(ctx, Call{Op: Sum, DType: Int32, Count: 4}, make([]byte, 16), make([]byte, 4))},
		{"ag out size", r.Allgather(ctx, Call{DType: Int32, Count: 4}, make([]byte, 16), make([]byte, 16))},
	}
	for _, b := range bad {
		if b.err == nil {
			t.Errorf("%s: accepted", b.name)
		} else if !strings.HasPrefix(b.err.Error(), "ring: ") {
			t.Errorf("%s: error without prefix: %v", b.name, b.err)
		}
	}
	if s := r.Stats(); s != (Stats{}) {
		t.Fatalf("invalid calls sent traffic: %+v", s)
	}
}

func TestConcurrentCallRejected(t *testing.T) {
	rs, _ := newRings(t, 2, 0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- rs[0].Barrier(ctx, Call{Seq: 1}) }() // blocks: rank 1 never joins
	for !rs[0].busy.Load() {
		time.Sleep(time.Millisecond)
	}
	if err := rs[0].Barrier(ctx, Call{Seq: 2}); err == nil || !strings.Contains(err.Error(), "serialized") {
		t.Errorf("concurrent call: got %v", err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("got %v", err)
	}
}

// TestProtocolErrors feeds hand-made headers to a rank and checks that
// inconsistencies are reported, naming the sender, before any payload read.
func TestProtocolErrors(t *testing.T) {
	call := Call{Kind: Broadcast, Seq: 4, DType: Float32, Count: 2, Root: 1}
	good := Header{Kind: Broadcast, DType: Float32, Seq: 4, Count: 2, Root: 1, Sender: 1, Length: 8}
	cases := []struct {
		name string
		mod  func(b []byte, h *Header)
		want string
	}{
		{"magic", func(b []byte, h *Header) {
			if b != nil {
				b[0] = 'X'
			}
		}, "bad header magic"},
		{"version", func(b []byte, h *Header) {
			if b != nil {
				b[4] = 9
			}
		}, "unsupported header version"},
		{"sender", func(b []byte, h *Header) { h.Sender = 3 }, "claims to come from rank 3"},
		{"step", func(b []byte, h *Header) { h.Step = 1 }, "protocol error: got step 1"},
		{"length", func(b []byte, h *Header) { h.Length = 4 }, "length 4"},
		{"offset", func(b []byte, h *Header) { h.Offset = 1 }, "offset 1"},
		{"root", func(b []byte, h *Header) { h.Root = 0 }, "but rank 1 called Broadcast(float32[2], root=0)"},
	}
	for _, tc := range cases {
		h := good
		msg := make([]byte, HeaderSize)
		tc.mod(nil, &h)
		EncodeHeader(msg, &h)
		tc.mod(msg, &h)
		ft := &fakeTransport{in: append(msg, make([]byte, 8)...)}
		r, _ := New(Config{Rank: 0, Size: 2}, ft)
		err := r.Broadcast(context.Background(), Call{Kind: Broadcast, Seq: call.Seq, DType: Float32, Count: 2, Root: 1}, make([]byte, 8))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
			continue
		}
		if tc.name != "root" && !strings.Contains(err.Error(), "recv from rank 1") {
			t.Errorf("%s: error does not name the sender: %v", tc.name, err)
		}
		if ft.read != HeaderSize {
			t.Errorf("%s: read %d bytes, payload read before header check", tc.name, ft.read)
		}
	}
}

type fakeTransport struct {
	in   []byte
	read int
}

func (f *fakeTransport) SendNext(ctx context.Context, bufs ...[]byte) error { return nil }
func (f *fakeTransport) RecvPrev(ctx context.Context, buf []byte) error {
	if len(f.in) < len(buf) {
		return errors.New("fake: eof")
	}
	copy(buf, f.in)
	f.in = f.in[len(buf):]
	f.read += len(buf)
	return nil
}

// TestSteadyStateAllocs: allocations per collective are a small constant
// (context, goroutine) independent of the number of chunks, i.e. zero per
// chunk. All ranks are driven by long-lived workers so the harness itself
// does not allocate.
func TestSteadyStateAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip()
	}
	const n = 3
	measure := func(count, chunk int) float64 {
		rs, _ := policyRings(t, n, chunk, false, func(int) AllreducePolicy { return forced(AlgoRing) })
		bufs := make([][]byte, n)
		for i := range bufs {
			bufs[i] = make([]byte, count*4)
		}
		start := make([]chan struct{}, n)
		done := make(chan error, n)
		for i := 1; i < n; i++ {
			start[i] = make(chan struct{})
			go func() {
				for range start[i] {
					done <- rs[i].Allreduce(context.Background(), Call{Op: Sum, DType: Float32, Count: count}, bufs[i])
				}
			}()
		}
		defer func() {
			for i := 1; i < n; i++ {
				close(start[i])
			}
		}()
		ctx := context.Background()
		return testing.AllocsPerRun(20, func() {
			for i := 1; i < n; i++ {
				start[i] <- struct{}{}
			}
			if err := rs[0].Allreduce(ctx, Call{Op: Sum, DType: Float32, Count: count}, bufs[0]); err != nil {
				t.Fatal(err)
			}
			for i := 1; i < n; i++ {
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	// Chunks of 64 bytes; segments above SmallBytes take the pipelined path
	// whose fixed cost (a goroutine, a context) is what we compare against.
	segs := SmallBytes/64 + 1
	one := measure(3*16*segs, 64*16) // segs chunks per segment
	many := measure(3*16*segs, 64)   // 16x as many chunks
	small := measure(3*16, 64)       // sequential path: no goroutine at all
	t.Logf("allocs per %d-rank allreduce: %d chunks/segment %.1f, %d chunks/segment %.1f, small %.1f", n, segs, one, 16*segs, many, small)
	if many > one+2 || many > 8*n || small > 1 {
		t.Fatalf("allocations grow with chunks: %v -> %v", one, many)
	}
}

func TestStringers(t *testing.T) {
	cases := map[string]fmt.Stringer{
		"Allreduce(float32[1000], Sum)":            Call{Kind: Allreduce, Op: Sum, DType: Float32, Count: 1000},
		"Broadcast(float32[8], root=0)":            Call{Kind: Broadcast, DType: Float32, Count: 8},
		"ReduceScatter(int64[4], Avg, name=\"g\")": Call{Kind: ReduceScatter, Op: Avg, DType: Int64, Count: 4, Name: "g"},
		"Allgather(uint8[3])":                      Call{Kind: Allgather, DType: Uint8, Count: 3},
		"Barrier()":                                Call{Kind: Barrier},
		"float64":                                  Float64,
		"Prod":                                     Prod,
		"reducescatter":                            ReduceScatter,
	}
	for want, s := range cases {
		if got := s.String(); got != want {
			t.Errorf("got %q want %q", got, want)
		}
	}
	if ReduceScatter.Name() != "ReduceScatter" || Float64.Size() != 8 || Uint8.Size() != 1 {
		t.Error("Name/Size")
	}
}
