package ring

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
)

// hierLayouts are the host layouts the hierarchical tests run on: Config.Hosts
// for each rank. The host ids are arbitrary numbers on purpose.
var hierLayouts = []struct {
	name   string
	hosts  []int
	chosen bool // preferHierarchical should pick it (for large buffers)
}{
	{"2x2", []int{5, 5, 9, 9}, true},
	{"2x3", []int{0, 0, 0, 1, 1, 1}, true},
	{"3x2", []int{2, 2, 1, 1, 0, 0}, true},
	{"interleaved", []int{0, 1, 0, 1}, true}, // host A: ranks 0, 2; host B: 1, 3
	{"4x1", []int{0, 1, 2, 3}, false},
	{"1x4", []int{3, 3, 3, 3}, false},
}

// byteCounter counts the bytes sent from host to host (payload and
// headers separately).
type byteCounter struct {
	mu       sync.Mutex
	hosts    []int
	payload  map[[2]int]int
	headers  map[[2]int]int
	messages int
}

func newByteCounter(hosts []int) *byteCounter {
	return &byteCounter{hosts: hosts, payload: map[[2]int]int{}, headers: map[[2]int]int{}}
}

func (b *byteCounter) add(from, to int, bufs [][]byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := [2]int{b.hosts[from], b.hosts[to]}
	b.headers[k] += len(bufs[0])
	for _, p := range bufs[1:] {
		b.payload[k] += len(p)
	}
	b.messages++
}

// crossPayload is the payload that crossed between different hosts.
func (b *byteCounter) crossPayload() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for k, v := range b.payload {
		if k[0] != k[1] {
			n += v
		}
	}
	return n
}

func (b *byteCounter) get(from, to int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.payload[[2]int{from, to}]
}

func (b *byteCounter) reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	clear(b.payload)
	clear(b.headers)
	b.messages = 0
}

// countingMesh wraps a Mesh and counts what it sends, by (host, host).
type countingMesh struct {
	Mesh
	rank, size int
	c          *byteCounter
}

func (m *countingMesh) SendNext(ctx context.Context, bufs ...[]byte) error {
	m.c.add(m.rank, (m.rank+1)%m.size, bufs)
	return m.Mesh.SendNext(ctx, bufs...)
}

func (m *countingMesh) SendTo(ctx context.Context, rank int, bufs ...[]byte) error {
	m.c.add(m.rank, rank, bufs)
	return m.Mesh.SendTo(ctx, rank, bufs...)
}

// hierPlainTransport hides the Mesh methods.
type hierPlainTransport struct{ Transport }

// newHierRings builds rings with Config.Hosts = hosts over the in-memory
// mesh, counting bytes by host when counter is set.
func newHierRings(tb testing.TB, hosts []int, chunk int, counter *byteCounter) ([]*Ring, []Transport) {
	tb.Helper()
	n := len(hosts)
	ts := NewMemRing(n)
	rs := make([]*Ring, n)
	for i := range rs {
		t := ts[i]
		if counter != nil {
			t = &countingMesh{Mesh: ts[i].(Mesh), rank: i, size: n, c: counter}
		}
		r, err := New(Config{Rank: i, Size: n, ChunkBytes: chunk, Hosts: hosts}, t)
		if err != nil {
			tb.Fatal(err)
		}
		rs[i] = r
	}
	return rs, ts
}

// hierAllreduce runs the hierarchical schedule directly (not through the
// algorithm selection), as Allreduce would.
func hierAllreduce(ctx context.Context, r *Ring, c Call, buf []byte) error {
	c, err := r.begin(Allreduce, c)
	if err != nil {
		return err
	}
	defer r.end()
	return r.allreduceHierarchical(ctx, c, buf)
}

// flatRingAllreduce runs the pipelined ring schedule directly.
func flatRingAllreduce(ctx context.Context, r *Ring, c Call, buf []byte) error {
	c, err := r.begin(Allreduce, c)
	if err != nil {
		return err
	}
	defer r.end()
	p := r.setup(c, r.size, c.Count, 2*(r.size-1))
	p.bufs[bMain] = buf
	return r.run(ctx)
}

func TestHierAllreduceMatrix(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, lay := range hierLayouts {
		n := len(lay.hosts)
		for _, count := range []int{0, 1, n - 1, 1009, 4099} {
			for _, chunk := range []int{0, 24} {
				if chunk != 0 && count > 1009 {
					continue // many tiny messages: slow under -race, adds nothing
				}
				rs, _ := newHierRings(t, lay.hosts, chunk, nil)
				for _, dt := range reduceTypes {
					for _, op := range allOps {
						name := fmt.Sprintf("%s/count=%d/chunk=%d/%s/%s", lay.name, count, chunk, dt, op)
						in := smallInts(rng, n, count, op)
						want := encode(dt, reference(dt, op, in))
						bufs := make([][]byte, n)
						errs := parallel(n, func(i int) error {
							bufs[i] = encode(dt, in[i])
							c := Call{Kind: Allreduce, Seq: 3, Op: op, DType: dt, Count: count, Name: "t"}
							return hierAllreduce(testCtx(t), rs[i], c, bufs[i])
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

// hierExpected evaluates the documented reduction order in float32: the
// host folds P_g in local-rank order, then for subsegment k of segment l
// (((P_{k+1} + P_{k+2}) + ...) + P_{k+H-1}) + P_k, then one division for Avg.
func hierExpected(hosts []int, in [][]float32, op Op) []float32 {
	lay, _ := hierLayoutOf(hosts, len(hosts), 0)
	count := len(in[0])
	out := make([]float32, count)
	for l := range lay.l {
		so, sn := Segment(count, lay.l, l)
		for k := range lay.h {
			o, kn := Segment(sn, lay.h, k)
			for e := so + o; e < so+o+kn; e++ {
				p := make([]float32, lay.h)
				for g := range lay.h {
					p[g] = in[lay.members[g][0]][e]
					for j := 1; j < lay.l; j++ {
						p[g] += in[lay.members[g][j]][e]
					}
				}
				acc := p[(k+1)%lay.h]
				for d := 2; d <= lay.h; d++ {
					acc += p[(k+d)%lay.h]
				}
				if op == Avg {
					acc /= float32(len(hosts))
				}
				out[e] = acc
			}
		}
	}
	return out
}

// TestHierBitwiseIdentical uses values whose float sums depend on the
// order: every rank must end with the same bytes, those of the documented
// order, on every run.
func TestHierBitwiseIdentical(t *testing.T) {
	for _, lay := range hierLayouts {
		n := len(lay.hosts)
		for _, op := range []Op{Sum, Avg} {
			const count = 5003
			rng := rand.New(rand.NewPCG(21, uint64(n)))
			in := make([][]float32, n)
			for i := range in {
				in[i] = make([]float32, count)
				for e := range in[i] {
					in[i][e] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(9)-4)))
				}
			}
			want := f32bytes(hierExpected(lay.hosts, in, op))
			rs, _ := newHierRings(t, lay.hosts, 256, nil)
			for run := range 2 {
				bufs := make([][]byte, n)
				mustAll(t, parallel(n, func(i int) error {
					bufs[i] = bytes.Clone(f32bytes(in[i])) // f32bytes is a view
					return hierAllreduce(testCtx(t), rs[i], Call{Seq: uint64(run), Op: op, DType: Float32, Count: count}, bufs[i])
				}))
				for i := range bufs {
					if !bytes.Equal(bufs[i], want) {
						t.Fatalf("%s %s run %d: rank %d differs from the documented reduction order", lay.name, op, run, i)
					}
				}
			}
		}
	}
}

func TestHierMisaligned(t *testing.T) {
	hosts := []int{0, 0, 1, 1}
	const n, count = 4, 1001
	rs, _ := newHierRings(t, hosts, 64, nil)
	rng := rand.New(rand.NewPCG(5, 7))
	in := smallInts(rng, n, count, Avg)
	want := encode(Float64, reference(Float64, Avg, in))
	bufs := make([][]byte, n)
	mustAll(t, parallel(n, func(i int) error {
		bufs[i] = append(make([]byte, 3, 3+8*count), encode(Float64, in[i])...)[3:]
		return hierAllreduce(testCtx(t), rs[i], Call{Op: Avg, DType: Float64, Count: count}, bufs[i])
	}))
	for i := range bufs {
		if !bytes.Equal(bufs[i], want) {
			t.Fatalf("rank %d: wrong result", i)
		}
	}
}

// TestHierCrossHostBytes counts the payload that crosses between hosts:
// hierarchical, each host sends 2(H-1)/H * S to the next host; the flat
// ring 0 -> 1 -> ... -> N-1 carries 2(N-1)/N * S on every link, so the
// links that cross hosts carry that much each.
func TestHierCrossHostBytes(t *testing.T) {
	for _, lay := range hierLayouts {
		if !lay.chosen {
			continue
		}
		n := len(lay.hosts)
		hl, _ := hierLayoutOf(lay.hosts, n, 0)
		hostPos := hl.hostOfRank
		const count = 12 * 1024 // divisible by every N and H*L here
		const S = 4 * count
		counter := newByteCounter(hostPos)
		rs, _ := newHierRings(t, lay.hosts, 0, counter)
		in := smallInts(rand.New(rand.NewPCG(1, 1)), n, count, Sum)
		want := encode(Float32, reference(Float32, Sum, in))
		run := func(f func(context.Context, *Ring, Call, []byte) error) {
			counter.reset()
			bufs := make([][]byte, n)
			mustAll(t, parallel(n, func(i int) error {
				bufs[i] = encode(Float32, in[i])
				return f(testCtx(t), rs[i], Call{Op: Sum, DType: Float32, Count: count}, bufs[i])
			}))
			for i := range bufs {
				if !bytes.Equal(bufs[i], want) {
					t.Fatalf("%s: rank %d: wrong result", lay.name, i)
				}
			}
		}

		run(hierAllreduce)
		H, L := hl.h, hl.l
		perHost := 2 * (H - 1) * S / H
		for g := range H {
			for g2 := range H {
				want := 0
				switch {
				case g2 == mod(g+1, H) && g != g2:
					want = perHost
				case g == g2:
					want = 2 * (L - 1) * S // L ranks, 2(L-1)/L * S each
				}
				if got := counter.get(g, g2); got != want {
					t.Errorf("%s hierarchical: host %d -> host %d: %d payload bytes, want %d", lay.name, g, g2, got, want)
				}
			}
		}
		hier := counter.crossPayload()
		if hier != H*perHost {
			t.Errorf("%s hierarchical: %d bytes crossed hosts, want H * 2(H-1)/H * S = %d", lay.name, hier, H*perHost)
		}

		run(flatRingAllreduce)
		crossing := 0
		for r := range n {
			if hostPos[r] != hostPos[(r+1)%n] {
				crossing++
			}
		}
		flat := counter.crossPayload()
		if want := crossing * 2 * (n - 1) * S / n; flat != want {
			t.Errorf("%s flat ring: %d bytes crossed hosts, want %d links x 2(N-1)/N * S = %d", lay.name, flat, crossing, want)
		}
		t.Logf("%s (H=%d, L=%d), S=%d: bytes crossing hosts: hierarchical %d (%.2f S), flat ring %d (%.2f S, %d crossing links)",
			lay.name, H, L, S, hier, float64(hier)/S, flat, float64(flat)/S, crossing)
		if hier >= flat {
			t.Errorf("%s: hierarchical sends %d bytes across hosts, not fewer than the flat ring's %d", lay.name, hier, flat)
		}
	}
}

func TestHierPrefer(t *testing.T) {
	big := HierarchicalMinBytes
	for _, lay := range append(hierLayouts[:len(hierLayouts):len(hierLayouts)],
		struct {
			name   string
			hosts  []int
			chosen bool
		}{"uneven", []int{0, 0, 0, 1}, false},
		struct {
			name   string
			hosts  []int
			chosen bool
		}{"uneven-2", []int{0, 0, 1, 1, 1, 2}, false},
		struct {
			name   string
			hosts  []int
			chosen bool
		}{"nil", nil, false},
	) {
		n := max(len(lay.hosts), 4)
		ts := NewMemRing(n)
		for i := range n {
			r, err := New(Config{Rank: i, Size: n, Hosts: lay.hosts}, ts[i])
			if err != nil {
				t.Fatal(err)
			}
			if got := r.preferHierarchical(big); got != lay.chosen {
				t.Errorf("%s rank %d: preferHierarchical(%d) = %v, want %v", lay.name, i, big, got, lay.chosen)
			}
			if r.preferHierarchical(big - 1) {
				t.Errorf("%s rank %d: preferHierarchical(%d) = true below HierarchicalMinBytes", lay.name, i, big-1)
			}
			// Not a Mesh: never.
			p, err := New(Config{Rank: i, Size: n, Hosts: lay.hosts}, hierPlainTransport{ts[i]})
			if err != nil {
				t.Fatal(err)
			}
			if p.preferHierarchical(big) {
				t.Errorf("%s rank %d: preferHierarchical over a plain Transport", lay.name, i)
			}
		}
	}
}

func TestHierUnevenRefused(t *testing.T) {
	ts := NewMemRing(3)
	r, err := New(Config{Rank: 0, Size: 3, Hosts: []int{0, 0, 1}}, ts[0])
	if err != nil {
		t.Fatal(err)
	}
	err = hierAllreduce(testCtx(t), r, Call{Op: Sum, DType: Int32, Count: 4}, make([]byte, 16))
	if err == nil || !strings.Contains(err.Error(), "same number of ranks") {
		t.Fatalf("uneven layout: got %v", err)
	}
	p, _ := New(Config{Rank: 0, Size: 4, Hosts: []int{0, 0, 1, 1}}, hierPlainTransport{NewMemRing(4)[0]})
	if err := hierAllreduce(testCtx(t), p, Call{Op: Sum, DType: Int32, Count: 4}, make([]byte, 16)); err == nil || !strings.Contains(err.Error(), "Mesh") {
		t.Fatalf("plain transport: got %v", err)
	}
}

// TestHierMismatch: rank 3 calls another op. Its local peer (rank 2, via
// the intra-host messages) and its cross-host peer (rank 1, via the hello)
// report *MismatchError, and so does rank 3; rank 0, which shares no link
// with rank 3, fails when its context ends (or when its peers give up).
func TestHierMismatch(t *testing.T) {
	for _, count := range []int{0, 2, 4096} {
		rs, _ := newHierRings(t, []int{0, 0, 1, 1}, 0, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		errs := parallel(4, func(i int) error {
			c := Call{Seq: 9, Op: Sum, DType: Float32, Count: count}
			if i == 3 {
				c.Op = Max
			}
			return hierAllreduce(ctx, rs[i], c, make([]byte, 4*count))
		})
		cancel()
		for _, i := range []int{1, 2, 3} {
			var me *MismatchError
			if !errors.As(errs[i], &me) {
				t.Fatalf("count %d: rank %d: got %v, want *MismatchError", count, i, errs[i])
			}
			if me.Local.Algo != AlgoHierarchical || !strings.Contains(errs[i].Error(), "hierarchical") {
				t.Errorf("count %d: rank %d: %v does not name the hierarchical algorithm", count, i, errs[i])
			}
		}
		if errs[0] == nil {
			t.Fatalf("count %d: rank 0 succeeded", count)
		}
	}
}

// TestHierAlgoInFingerprint: a rank running the flat ring against ranks
// running the hierarchical schedule fails with *MismatchError, not garbage.
func TestHierAlgoInFingerprint(t *testing.T) {
	rs, _ := newHierRings(t, []int{0, 0, 1, 1}, 0, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	errs := parallel(4, func(i int) error {
		c := Call{Seq: 1, Op: Sum, DType: Float32, Count: 4096}
		if i == 1 {
			return flatRingAllreduce(ctx, rs[i], c, make([]byte, 4*4096))
		}
		return hierAllreduce(ctx, rs[i], c, make([]byte, 4*4096))
	})
	var me *MismatchError
	if !errors.As(errs[0], &me) && !errors.As(errs[2], &me) && !errors.As(errs[1], &me) {
		t.Fatalf("no *MismatchError: %v", errs)
	}
}

func TestHierEpoch(t *testing.T) {
	hosts := []int{0, 0, 1, 1}
	ts := NewMemRing(4)
	rs := make([]*Ring, 4)
	for i := range rs {
		ep := uint32(4)
		if i == 2 {
			ep = 5
		}
		r, err := New(Config{Rank: i, Size: 4, Hosts: hosts, Epoch: ep, Elastic: true}, ts[i])
		if err != nil {
			t.Fatal(err)
		}
		rs[i] = r
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	errs := parallel(4, func(i int) error {
		return hierAllreduce(ctx, rs[i], Call{Op: Sum, DType: Int64, Count: 100}, make([]byte, 800))
	})
	for _, i := range []int{0, 3} { // rank 2's cross-host peer and local peer
		var ee *EpochError
		if !errors.As(errs[i], &ee) || ee.From != 2 {
			t.Fatalf("rank %d: got %v, want *EpochError from rank 2 (all: %v)", i, errs[i], errs)
		}
	}
}

func TestHierPeerCrash(t *testing.T) {
	rs, ts := newHierRings(t, []int{0, 1, 0, 1}, 4096, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	boom := errors.New("boom")
	const count = 1 << 16
	start := time.Now()
	took := make([]time.Duration, 4)
	errs := parallel(4, func(i int) error {
		if i == 1 {
			ts[1].(*MemTransport).Close(boom)
			return nil
		}
		defer func() { took[i] = time.Since(start) }()
		return hierAllreduce(ctx, rs[i], Call{Op: Sum, DType: Float32, Count: count}, make([]byte, 4*count))
	})
	for _, i := range []int{0, 2, 3} {
		if errs[i] == nil {
			t.Fatalf("rank %d succeeded", i)
		}
	}
	// Rank 3 shares a host with rank 1 and rank 0 is its cross-host peer:
	// both see the broken link at once, naming rank 1, the step and the
	// cause. Rank 2 shares no link with rank 1: it fails when its context
	// ends (a job tears the rest down).
	for _, i := range []int{0, 3} {
		if !errors.Is(errs[i], boom) || !strings.Contains(errs[i].Error(), "rank 1") || !strings.Contains(errs[i].Error(), "step") {
			t.Errorf("rank %d: %v does not name rank 1, the step and the cause", i, errs[i])
		}
		if took[i] > 500*time.Millisecond {
			t.Errorf("rank %d took %v to fail", i, took[i])
		}
	}
	if !errors.Is(errs[2], context.DeadlineExceeded) || !strings.Contains(errs[2].Error(), "hierarchical") || !strings.Contains(errs[2].Error(), "rank") {
		t.Errorf("rank 2: %v, want the deadline and where it waited", errs[2])
	}
}

// TestHierLargeAndPhases checks the phase report and that a buffer of many
// chunks (several per subsegment, pipelined across the phases) is right.
func TestHierLargeAndPhases(t *testing.T) {
	hosts := []int{0, 0, 0, 1, 1, 1}
	n := len(hosts)
	ts := NewMemRing(n)
	var mu sync.Mutex
	phases := map[string]int{}
	rs := make([]*Ring, n)
	for i := range rs {
		r, err := New(Config{Rank: i, Size: n, Hosts: hosts, ChunkBytes: 16 << 10, Phase: func(c Call, ph string, s, e time.Time) {
			mu.Lock()
			phases[ph]++
			mu.Unlock()
			if e.Before(s) {
				t.Errorf("phase %s ends before it starts", ph)
			}
		}}, ts[i])
		if err != nil {
			t.Fatal(err)
		}
		rs[i] = r
	}
	const count = 1<<17 + 7 // subsegments of ~6 chunks
	in := smallInts(rand.New(rand.NewPCG(8, 9)), n, count, Sum)
	want := encode(Int32, reference(Int32, Sum, in))
	bufs := make([][]byte, n)
	mustAll(t, parallel(n, func(i int) error {
		bufs[i] = encode(Int32, in[i])
		return hierAllreduce(testCtx(t), rs[i], Call{Op: Sum, DType: Int32, Count: count}, bufs[i])
	}))
	for i := range bufs {
		if !bytes.Equal(bufs[i], want) {
			t.Fatalf("rank %d: wrong result", i)
		}
	}
	for _, ph := range []string{"host reduce-scatter", "cross-host allreduce", "host allgather"} {
		if phases[ph] != n {
			t.Errorf("phase %q reported %d times, want %d", ph, phases[ph], n)
		}
	}
}

// TestHierThroughAllreduce: Ring.Allreduce picks the hierarchical schedule
// for a large buffer on 2 hosts x 2 ranks (the bytes that cross hosts say
// which schedule ran), the flat one below HierarchicalMinBytes, and the
// forced ring when the policy names it.
func TestHierThroughAllreduce(t *testing.T) {
	hosts := []int{0, 0, 1, 1}
	const n = 4
	for _, tc := range []struct {
		name   string
		count  int
		policy string
		want   Algorithm
	}{
		{"large", HierarchicalMinBytes / 4, "", AlgoHierarchical},
		{"small", HierarchicalMinBytes/4 - 1, "", 0},
		{"forced ring", HierarchicalMinBytes / 4, "ring", AlgoRing},
	} {
		pol, err := ParseAllreducePolicy(tc.policy)
		if err != nil {
			t.Fatal(err)
		}
		counter := newByteCounter(hosts)
		ts := NewMemRing(n)
		rs := make([]*Ring, n)
		for i := range rs {
			r, err := New(Config{Rank: i, Size: n, Hosts: hosts, Allreduce: pol},
				&countingMesh{Mesh: ts[i].(Mesh), rank: i, size: n, c: counter})
			if err != nil {
				t.Fatal(err)
			}
			rs[i] = r
		}
		S := 4 * tc.count
		got := rs[0].AllreduceAlgorithm(S)
		if tc.want != 0 && got != tc.want || tc.want == 0 && got == AlgoHierarchical {
			t.Fatalf("%s: AllreduceAlgorithm(%d) = %s, want %s", tc.name, S, got, tc.want)
		}
		in := smallInts(rand.New(rand.NewPCG(4, 4)), n, tc.count, Avg)
		want := encode(Float32, reference(Float32, Avg, in))
		bufs := make([][]byte, n)
		mustAll(t, parallel(n, func(i int) error {
			bufs[i] = encode(Float32, in[i])
			return rs[i].Allreduce(testCtx(t), Call{Op: Avg, DType: Float32, Count: tc.count}, bufs[i])
		}))
		for i := range bufs {
			if !bytes.Equal(bufs[i], want) {
				t.Fatalf("%s: rank %d: wrong result", tc.name, i)
			}
		}
		cross := counter.crossPayload()
		t.Logf("%s: %s, %d bytes crossed hosts (%.2f S)", tc.name, got, cross, float64(cross)/float64(S))
		switch got {
		case AlgoHierarchical:
			if cross != 2*S { // 2 hosts x 2(H-1)/H * S
				t.Errorf("%s: %d bytes crossed hosts, want %d", tc.name, cross, 2*S)
			}
		case AlgoRing:
			if cross != 3*S { // 2 crossing links x 1.5 S
				t.Errorf("%s: %d bytes crossed hosts, want %d", tc.name, cross, 3*S)
			}
		}
	}
}

// BenchmarkHierMem compares the flat ring with the hierarchical schedule on
// 2 hosts x 2 ranks over the in-memory mesh, where every link is equally
// fast: it shows the schedule's own cost (extra hops, goroutines), not its
// gain, which needs slow links between hosts (e2e's
// BenchmarkHierarchicalSlowLink).
func BenchmarkHierMem(b *testing.B) {
	hosts := []int{0, 0, 1, 1}
	for _, size := range []int{64 << 10, 1 << 20, 16 << 20} {
		for _, algo := range []string{"ring", "hierarchical"} {
			b.Run(fmt.Sprintf("%s/%dK", algo, size>>10), func(b *testing.B) {
				rs, _ := newHierRings(b, hosts, 0, nil)
				f := flatRingAllreduce
				if algo == "hierarchical" {
					f = hierAllreduce
				}
				bufs := make([][]byte, len(hosts))
				for i := range bufs {
					bufs[i] = make([]byte, size)
				}
				b.SetBytes(int64(size))
				ctx := context.Background()
				for i := 0; i < b.N; i++ {
					mustAll(b, parallel(len(hosts), func(r int) error {
						return f(ctx, rs[r], Call{Seq: uint64(i), Op: Sum, DType: Float32, Count: size / 4}, bufs[r])
					}))
				}
			})
		}
	}
}
