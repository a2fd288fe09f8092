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

var meshAlgos = []Algorithm{AlgoDirect, AlgoRecursiveDoubling, AlgoRabenseifner, AlgoScatterGather, AlgoRing}

// forced is the policy that runs a for every size.
func forced(a Algorithm) AllreducePolicy {
	return AllreducePolicy{Rules: []AllreduceRule{{NoLimit, a}}}
}

// plainLinks hides the Mesh methods of a transport.
type plainLinks struct{ t Transport }

func (p plainLinks) SendNext(ctx context.Context, bufs ...[]byte) error {
	return p.t.SendNext(ctx, bufs...)
}
func (p plainLinks) RecvPrev(ctx context.Context, buf []byte) error {
	return p.t.RecvPrev(ctx, buf)
}

// policyRings builds n Rings over an in-memory Mesh (or, with plain, the
// same links seen as a plain Transport) with policy pol(i) for rank i.
func policyRings(tb testing.TB, n, chunk int, plain bool, pol func(i int) AllreducePolicy) ([]*Ring, []Transport) {
	tb.Helper()
	ts := NewMemRing(n)
	rs := make([]*Ring, n)
	for i := range rs {
		var t Transport = ts[i]
		if plain && t != nil {
			t = plainLinks{t}
		}
		r, err := New(Config{Rank: i, Size: n, ChunkBytes: chunk, Allreduce: pol(i)}, t)
		if err != nil {
			tb.Fatal(err)
		}
		rs[i] = r
	}
	return rs, ts
}

// runAllreduce reduces in (per rank) on rs and checks every rank against
// the reference, bitwise.
func runAllreduce(t *testing.T, name string, rs []*Ring, dt DType, op Op, in [][]float64) [][]byte {
	t.Helper()
	n := len(rs)
	count := len(in[0])
	want := encode(dt, reference(dt, op, in))
	bufs := make([][]byte, n)
	errs := parallel(n, func(i int) error {
		bufs[i] = encode(dt, in[i])
		return rs[i].Allreduce(testCtx(t), Call{Seq: 3, Op: op, DType: dt, Count: count}, bufs[i])
	})
	for i := range bufs {
		if errs[i] != nil {
			t.Fatalf("%s: rank %d: %v", name, i, errs[i])
		}
		if !bytes.Equal(bufs[i], want) {
			t.Fatalf("%s: rank %d: got %v want %v", name, i, head(decode(dt, bufs[i])), head(decode(dt, want)))
		}
	}
	return bufs
}

// Every algorithm, forced, against the reference: every op and reducible
// dtype at N = 1..7 with counts 0, 1, N-1, N+1 and primes; small chunks
// (many messages: the pipelined paths) for a few.
func TestAllreduceAlgorithms(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, algo := range meshAlgos {
		for _, n := range []int{1, 2, 3, 4, 5, 7} {
			rs, _ := policyRings(t, n, 0, false, func(int) AllreducePolicy { return forced(algo) })
			small, _ := policyRings(t, n, 40, false, func(int) AllreducePolicy { return forced(algo) })
			for _, count := range []int{0, 1, n - 1, n + 1, 1009} {
				for _, dt := range reduceTypes {
					for _, op := range allOps {
						if count != 1009 && (dt != Int32 || op != Avg) && (dt != Float32 || op != Prod) && (dt != Float64 || op != Min) {
							continue // every op and dtype once; a few for the edge cases
						}
						name := fmt.Sprintf("%s/N=%d/count=%d/%s/%s", algo, n, count, dt, op)
						runAllreduce(t, name, rs, dt, op, smallInts(rng, n, count, op))
					}
				}
			}
			for _, count := range []int{n - 1, 1009} {
				for _, c := range []struct {
					dt DType
					op Op
				}{{Float32, Sum}, {Int64, Avg}} {
					name := fmt.Sprintf("%s/N=%d/count=%d/chunk=40/%s/%s", algo, n, count, c.dt, c.op)
					runAllreduce(t, name, small, c.dt, c.op, smallInts(rng, n, count, c.op))
				}
			}
		}
	}
}

// Large buffers take the pipelined paths with the default chunk size, and a
// misaligned buffer is reduced through an aligned copy.
func TestAllreduceAlgorithmsLarge(t *testing.T) {
	const count = 40_003
	rng := rand.New(rand.NewPCG(13, 14))
	for _, algo := range meshAlgos {
		for _, n := range []int{3, 4} {
			rs, _ := policyRings(t, n, 16<<10, false, func(int) AllreducePolicy { return forced(algo) })
			runAllreduce(t, fmt.Sprintf("%s/N=%d", algo, n), rs, Float32, Avg, smallInts(rng, n, count, Avg))
			in := smallInts(rng, n, 101, Sum)
			want := encode(Float32, reference(Float32, Sum, in))
			bufs := make([][]byte, n)
			mustAll(t, parallel(n, func(i int) error {
				bufs[i] = append(make([]byte, 1, 1+4*101), encode(Float32, in[i])...)[1:]
				return rs[i].Allreduce(testCtx(t), Call{Op: Sum, DType: Float32, Count: 101}, bufs[i])
			}))
			for i := range bufs {
				if !bytes.Equal(bufs[i], want) {
					t.Fatalf("%s N=%d misaligned: rank %d wrong", algo, n, i)
				}
			}
		}
	}
}

// Random float data: every rank ends bitwise identical, and runs with
// another chunk size (other pipelining) give the same bytes.
func TestAllreduceAlgorithmsDeterminism(t *testing.T) {
	for _, algo := range meshAlgos {
		for _, n := range []int{3, 5} {
			const count = 20_011
			in := randomInputs(n, count, uint64(n), 99)
			identicalRuns(t, fmt.Sprintf("%s N=%d", algo, n), in, Call{Op: Avg, DType: Float32, Count: count},
				func(chunk int) []*Ring {
					rs, _ := policyRings(t, n, chunk, false, func(int) AllreducePolicy { return forced(algo) })
					return rs
				})
		}
	}
}

// wantPayload is the payload bytes rank sends in an allreduce of count
// float32 values under algo (count divisible by N and by P, so that all
// segments and blocks are equal).
func wantPayload(algo Algorithm, n, rank, count int) int {
	S := 4 * count
	f := foldOf(n)
	folded := rank < 2*f.rem
	switch algo {
	case AlgoDirect:
		return (n - 1) * S
	case AlgoRing, AlgoScatterGather:
		return 2 * (n - 1) * S / n
	case AlgoRecursiveDoubling:
		switch {
		case folded && rank%2 == 0:
			return S
		case folded:
			return f.log*S + S
		}
		return f.log * S
	case AlgoRabenseifner:
		core := 2 * (f.p - 1) * S / f.p
		switch {
		case folded && rank%2 == 0:
			return S
		case folded:
			return core + S
		}
		return core
	}
	panic("no formula")
}

// Each algorithm sends exactly the payload bytes of its formula, and the
// ranks receive all of it.
func TestAlgorithmByteCounting(t *testing.T) {
	for _, algo := range meshAlgos {
		for _, n := range []int{2, 3, 4, 5, 7} {
			for _, per := range []int{0, 8 * 9 * 5 * 7} { // divisible by N and P
				count := per
				for _, chunk := range []int{0, 4096} {
					rs, _ := policyRings(t, n, chunk, false, func(int) AllreducePolicy { return forced(algo) })
					mustAll(t, parallel(n, func(i int) error {
						return rs[i].Allreduce(testCtx(t), Call{Op: Sum, DType: Float32, Count: count}, make([]byte, 4*count))
					}))
					var sent, recv uint64
					for i, r := range rs {
						s := r.Stats()
						if want := wantPayload(algo, n, i, count); s.PayloadBytesSent != uint64(want) {
							t.Errorf("%s N=%d count=%d chunk=%d rank %d: sent %d payload bytes, want %d", algo, n, count, chunk, i, s.PayloadBytesSent, want)
						}
						if s.MessagesSent == 0 || s.HeaderBytesSent != s.MessagesSent*HeaderSize {
							t.Errorf("%s N=%d count=%d rank %d: %d messages, %d header bytes", algo, n, count, i, s.MessagesSent, s.HeaderBytesSent)
						}
						sent += s.PayloadBytesSent
						recv += s.PayloadBytesRecv
					}
					if sent != recv {
						t.Errorf("%s N=%d count=%d: sent %d, received %d", algo, n, count, sent, recv)
					}
				}
			}
		}
	}
}

// Ranks whose policies pick different algorithms fail with *MismatchError
// naming both algorithms, for empty, tiny and pipelined buffers.
func TestAlgorithmMismatch(t *testing.T) {
	pairs := [][2]Algorithm{
		{AlgoDirect, AlgoScatterGather}, {AlgoRing, AlgoDirect}, {AlgoRecursiveDoubling, AlgoRabenseifner},
		{AlgoScatterGather, AlgoRing}, {AlgoRabenseifner, AlgoDirect},
	}
	for _, pair := range pairs {
		for _, count := range []int{0, 10, 100_000} {
			name := fmt.Sprintf("%s-vs-%s/count=%d", pair[0], pair[1], count)
			rs, ts := policyRings(t, 2, 4096, false, func(i int) AllreducePolicy { return forced(pair[i]) })
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			errs := parallel(2, func(i int) error {
				err := rs[i].Allreduce(ctx, Call{Seq: 4, Op: Sum, DType: Float32, Count: count}, make([]byte, 4*count))
				var me *MismatchError
				if errors.As(err, &me) {
					ts[i].(*MemTransport).Close(err) // release the peer if it waits on us
				}
				return err
			})
			cancel()
			found := false
			for i, err := range errs {
				var me *MismatchError
				if !errors.As(err, &me) || me.LocalRank != i {
					continue // not detected here (maybe the peer's, through the closed link)
				}
				found = true
				if me.LocalRank != i || me.RemoteRank != 1-i || me.Local.Algo != pair[i] || me.Remote.Algo != pair[1-i] {
					t.Errorf("%s: rank %d: bad mismatch %+v", name, i, me)
				}
				for _, a := range pair {
					if a != AlgoRing && !strings.Contains(err.Error(), a.String()) {
						t.Errorf("%s: rank %d: %q does not name %s", name, i, err, a)
					}
				}
			}
			if !found {
				t.Errorf("%s: no rank reported a mismatch: %v", name, errs)
			}
		}
	}
}

func TestParseAllreducePolicy(t *testing.T) {
	for in, want := range map[string]string{
		"":                                     "default",
		" Default ":                            "default",
		"auto":                                 "default",
		"ring":                                 "ring",
		"Scatter-Gather":                       "scatter-gather",
		"direct:4K,scatter-gather:2M,ring":     "direct:4K,scatter-gather:2M,ring",
		"direct:4096, rabenseifner:1MiB, ring": "direct:4K,rabenseifner:1M,ring",
		"direct:100,recursive-doubling:64KB,hierarchical": "direct:100,recursive-doubling:64K,hierarchical",
		"direct:0,ring": "direct:0,ring",
	} {
		p, err := ParseAllreducePolicy(in)
		if err != nil || p.String() != want {
			t.Errorf("ParseAllreducePolicy(%q) = %v, %v; want %s", in, p, err, want)
		}
	}
	for in, frag := range map[string]string{
		"warp":                     `unknown algorithm "warp"`,
		"direct:4K":                "last entry",
		"direct,ring":              "has no size",
		"direct:4K,ring,ring":      "has no size",
		"direct:4Q,ring":           "not a byte count",
		"direct:-1,ring":           "not a byte count",
		"direct:8K,direct:4K,ring": "not above",
		"direct:4K,,ring":          "unknown algorithm",
		"direct:99999999999G,ring": "too large",
	} {
		_, err := ParseAllreducePolicy(in)
		if err == nil || !strings.Contains(err.Error(), frag) {
			t.Errorf("ParseAllreducePolicy(%q): %v, want an error containing %q", in, err, frag)
		}
	}
	if _, err := New(Config{Rank: 0, Size: 1, Allreduce: AllreducePolicy{Rules: []AllreduceRule{{10, AlgoRing}, {5, AlgoDirect}}}}, nil); err == nil {
		t.Error("New accepted rules that do not increase")
	}
}

// AllreduceAlgorithm follows the policy, falls back to the defaults above
// its last limit, and runs only ring-neighbour schedules on a plain
// Transport.
func TestAllreduceAlgorithmSelection(t *testing.T) {
	pol, err := ParseAllreducePolicy("direct:4K,scatter-gather:2M,ring")
	if err != nil {
		t.Fatal(err)
	}
	for _, plain := range []bool{false, true} {
		rs, _ := policyRings(t, 4, 0, plain, func(int) AllreducePolicy { return pol })
		for bytes, want := range map[int]Algorithm{0: AlgoDirect, 4096: AlgoDirect, 4097: AlgoScatterGather, 2 << 20: AlgoScatterGather, 2<<20 + 1: AlgoRing} {
			if plain && want.needsMesh() {
				want = AlgoRing
			}
			if got := rs[0].AllreduceAlgorithm(bytes); got != want {
				t.Errorf("plain=%v %d bytes: %s, want %s", plain, bytes, got, want)
			}
		}
	}
	// A policy with a limit on its last rule hands larger sizes to the
	// defaults.
	rs, _ := policyRings(t, 4, 0, false, func(int) AllreducePolicy {
		return AllreducePolicy{Rules: []AllreduceRule{{100, AlgoRabenseifner}}}
	})
	if got := rs[0].AllreduceAlgorithm(50); got != AlgoRabenseifner {
		t.Errorf("50 bytes: %s", got)
	}
	if got, want := rs[0].AllreduceAlgorithm(1<<30), rs[0].defaultAlgorithm(1<<30); got != want {
		t.Errorf("1 GiB: %s, want the default %s", got, want)
	}
	// The defaults, over a Mesh and over a plain Transport, at every N.
	for _, n := range []int{2, 3, 4, 5, 8} {
		for _, plain := range []bool{false, true} {
			rs, _ := policyRings(t, n, 0, plain, func(int) AllreducePolicy { return AllreducePolicy{} })
			for _, b := range []int{0, 4, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 1 << 30} {
				want, _ := AllreducePolicy{Rules: defaultRules(n, !plain, false)}.pick(b)
				if plain && want.needsMesh() {
					t.Errorf("N=%d: default for %d bytes on a plain transport is %s", n, b, want)
				}
				if got := rs[0].AllreduceAlgorithm(b); got != want {
					t.Errorf("N=%d plain=%v %d bytes: %s, want %s", n, plain, b, got, want)
				}
			}
		}
	}
}

// The default policy gives correct, identical results across the
// thresholds, over a Mesh and over a plain Transport.
func TestAllreduceDefaultPolicy(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for _, plain := range []bool{false, true} {
		for _, n := range []int{2, 3, 4} {
			rs, _ := policyRings(t, n, 0, plain, func(int) AllreducePolicy { return AllreducePolicy{} })
			for _, count := range []int{0, 1, 1024, 1025, 40_000} {
				name := fmt.Sprintf("plain=%v/N=%d/count=%d/%s", plain, n, count, rs[0].AllreduceAlgorithm(4*count))
				runAllreduce(t, name, rs, Float32, Avg, smallInts(rng, n, count, Avg))
			}
		}
	}
}

// The dissemination barrier (Mesh) and the ring barrier (plain Transport)
// hold every rank until the last one arrives, at every N.
func TestBarrierAlgorithms(t *testing.T) {
	for _, plain := range []bool{false, true} {
		for _, n := range []int{1, 2, 3, 4, 5, 7} {
			rs, _ := policyRings(t, n, 0, plain, func(int) AllreducePolicy { return AllreducePolicy{} })
			for round := range 3 {
				late := round % n
				var arrived [8]time.Time
				left := make([]time.Time, n)
				mustAll(t, parallel(n, func(i int) error {
					if i == late {
						time.Sleep(10 * time.Millisecond)
					}
					arrived[i] = time.Now()
					err := rs[i].Barrier(testCtx(t), Call{Seq: uint64(round)})
					left[i] = time.Now()
					return err
				}))
				for i := range n {
					if left[i].Before(arrived[late]) {
						t.Fatalf("plain=%v N=%d: rank %d left the barrier before rank %d arrived", plain, n, i, late)
					}
				}
			}
			if n > 1 {
				rs[0].Stats()
				msgs := rs[0].Stats().MessagesSent
				want := uint64(3 * (n - 1))
				if !plain {
					want = uint64(3 * ceilLog2(n))
				}
				if msgs != want {
					t.Errorf("plain=%v N=%d: rank 0 sent %d messages in 3 barriers, want %d", plain, n, msgs, want)
				}
			}
		}
	}
	// A rank calling something else is reported.
	rs, _ := policyRings(t, 3, 0, false, func(int) AllreducePolicy { return AllreducePolicy{} })
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	errs := parallel(3, func(i int) error { return rs[i].Barrier(ctx, Call{Seq: uint64(1 + i/2)}) })
	var me *MismatchError
	if !errors.As(errs[0], &me) || me.RemoteRank != 2 || me.Remote.Seq != 2 {
		t.Fatalf("rank 0: got %v, want a mismatch with rank 2", errs[0])
	}
}

func ceilLog2(n int) int {
	k := 0
	for 1<<k < n {
		k++
	}
	return k
}

// A rank that crashes mid-allreduce: its partners fail with the injected
// error naming it, and nobody waits beyond the context.
func TestAlgorithmPeerCrash(t *testing.T) {
	for _, algo := range meshAlgos {
		const n = 4
		rs, ts := policyRings(t, n, 1024, false, func(int) AllreducePolicy { return forced(algo) })
		crash := errors.New("injected crash")
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		start := time.Now()
		errs := parallel(n, func(i int) error {
			if i == n-1 {
				time.Sleep(10 * time.Millisecond)
				ts[i].(*MemTransport).Close(crash)
				return nil
			}
			return rs[i].Allreduce(ctx, Call{Seq: 9, Op: Sum, DType: Float32, Count: 1 << 18}, make([]byte, 1<<20))
		})
		cancel()
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("%s: took %v", algo, d)
		}
		saw := 0
		for i, err := range errs[:n-1] {
			switch {
			case errors.Is(err, crash):
				saw++
				if !strings.Contains(err.Error(), fmt.Sprintf("rank %d", n-1)) {
					t.Errorf("%s: rank %d: error does not name rank %d: %v", algo, i, n-1, err)
				}
			case !errors.Is(err, context.DeadlineExceeded):
				t.Errorf("%s: rank %d: got %v, want the crash or the deadline", algo, i, err)
			}
		}
		if saw == 0 {
			t.Errorf("%s: no rank saw the crash: %v", algo, errs)
		}
	}
}

// Scatter-gather around the size where it stops running sequentially:
// every rank must make the same choice, or a sequential rank would read a
// pipelined peer's allgather messages where it expects scatter ones.
func TestScatterGatherModeBoundary(t *testing.T) {
	const n, chunk = 3, 64
	ce := chunk / 4
	link := func(count int) int {
		m := (count + n - 1) / n
		return 2 * (4*m + numChunks(m, ce)*HeaderSize)
	}
	edge := 0
	for link(edge) <= SmallBytes {
		edge++
	}
	rs, _ := policyRings(t, n, chunk, false, func(int) AllreducePolicy { return forced(AlgoScatterGather) })
	rng := rand.New(rand.NewPCG(31, 32))
	for count := edge - 4; count <= edge+3; count++ {
		runAllreduce(t, fmt.Sprintf("count=%d (edge %d)", count, edge), rs, Float32, Sum, smallInts(rng, n, count, Sum))
	}
}

// Two ranks of one host run recursive doubling to 512 KiB (their exchange
// fits a shared-memory link), two of two hosts to 16 KiB, and a larger
// ring on one host keeps its rules; both ranks choose alike, and the
// allreduce at the boundary is exact.
func TestDefaultRulesOneHost(t *testing.T) {
	for _, tc := range []struct {
		hosts []int
		limit int
	}{{[]int{0, 0}, 512 << 10}, {[]int{0, 1}, 16 << 10}, {nil, 16 << 10}} {
		ts := NewMemRing(2)
		rs := make([]*Ring, 2)
		for i := range rs {
			r, err := New(Config{Rank: i, Size: 2, Hosts: tc.hosts}, ts[i])
			if err != nil {
				t.Fatal(err)
			}
			rs[i] = r
		}
		for _, b := range []int{tc.limit, tc.limit + 4} {
			want := AlgoRecursiveDoubling
			if b > tc.limit {
				want = AlgoRing
			}
			for i, r := range rs {
				if got := r.AllreduceAlgorithm(b); got != want {
					t.Errorf("hosts %v, rank %d, %d bytes: %s, want %s", tc.hosts, i, b, got, want)
				}
			}
			count := b / 4
			in := make([][]float64, 2)
			for i := range in {
				in[i] = make([]float64, count)
				for k := range in[i] {
					in[i][k] = float64((k*7+i*3)%101 - 50)
				}
			}
			runAllreduce(t, fmt.Sprintf("hosts %v, %d bytes", tc.hosts, b), rs, Float32, Sum, in)
		}
	}
	ts := NewMemRing(4)
	r, err := New(Config{Rank: 0, Size: 4, Hosts: []int{0, 0, 0, 0}}, ts[0])
	if err != nil {
		t.Fatal(err)
	}
	if got := r.AllreduceAlgorithm(64 << 10); got != AlgoRabenseifner {
		t.Errorf("4 ranks of one host, 64 KiB: %s, want rabenseifner", got)
	}
}
