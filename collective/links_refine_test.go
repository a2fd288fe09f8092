package collective

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/compress"
	"github.com/gorun/gorun/ring"
)

// testLinks are links of the kind e2e's namespace hosts measure: shared
// memory within a host, TLS over veth between them.
var testLinks = ring.Links{
	Local:                ring.LinkCost{Latency: 10 * time.Microsecond, BytesPerSecond: 4e9},
	Cross:                ring.LinkCost{Latency: 40 * time.Microsecond, BytesPerSecond: 1.5e9},
	ReduceBytesPerSecond: 3e9,
}

// TestSetClass: giving a class of sizes to a schedule changes what the
// rules pick for those sizes only, and neighbours of one schedule merge.
func TestSetClass(t *testing.T) {
	rd, rab, rg, hier := ring.AlgoRecursiveDoubling, ring.AlgoRabenseifner, ring.AlgoRing, ring.AlgoHierarchical
	base := []ring.AllreduceRule{{MaxBytes: 16 << 10, Algo: rd}, {MaxBytes: 4 << 20, Algo: rab}, {MaxBytes: ring.NoLimit, Algo: rg}}
	for _, tc := range []struct {
		upper int
		algo  ring.Algorithm
		want  string
	}{
		{1 << 20, hier, "recursive-doubling:16K,rabenseifner:512K,hierarchical:1M,rabenseifner:4M,ring"},
		{4, ring.AlgoDirect, "direct:4,recursive-doubling:16K,rabenseifner:4M,ring"},
		{32 << 10, rd, "recursive-doubling:32K,rabenseifner:4M,ring"},
		{8 << 20, rab, "recursive-doubling:16K,rabenseifner:8M,ring"},
		{1 << 20, rab, "recursive-doubling:16K,rabenseifner:4M,ring"},
		{1 << 30, hier, "recursive-doubling:16K,rabenseifner:4M,ring:512M,hierarchical:1G,ring"},
	} {
		got := setClass(base, tc.upper, tc.algo)
		if s := (ring.AllreducePolicy{Rules: got}).String(); s != tc.want {
			t.Errorf("class %d to %s: %s, want %s", tc.upper, tc.algo, s, tc.want)
		}
		// Sizes outside the class pick as before; inside it, algo.
		for n := 1; n <= 1<<30; n = n*2 + 1 {
			a, _ := ring.AllreducePolicy{Rules: got}.Pick(n)
			b, _ := ring.AllreducePolicy{Rules: base}.Pick(n)
			if in := classUpper(n) == tc.upper; (in && a != tc.algo) || (!in && a != b) {
				t.Errorf("class %d to %s: %d bytes pick %s (before: %s)", tc.upper, tc.algo, n, a, b)
			}
		}
	}
	for n, want := range map[int]int{0: 4, 1: 4, 4: 4, 5: 8, 8: 8, 1000: 1024, 1 << 20: 1 << 20, 1<<20 + 1: 2 << 20} {
		if got := classUpper(n); got != want {
			t.Errorf("classUpper(%d) = %d, want %d", n, got, want)
		}
	}
}

// fakeModel prices the schedules: times[a], the same at every size.
func fakeModel(times map[ring.Algorithm]time.Duration) func(ring.Algorithm, int64) (time.Duration, bool) {
	return func(a ring.Algorithm, _ int64) (time.Duration, bool) {
		t, ok := times[a]
		return t, ok
	}
}

// TestRefinerPlan: a class warms up on the policy's choice, then times
// every candidate in turn, and decides only on a clear gain; its choice
// then holds.
func TestRefinerPlan(t *testing.T) {
	rd, rab, rg, hier, dir := ring.AlgoRecursiveDoubling, ring.AlgoRabenseifner, ring.AlgoRing, ring.AlgoHierarchical, ring.AlgoDirect
	rules := []ring.AllreduceRule{{MaxBytes: 16 << 10, Algo: rd}, {MaxBytes: ring.NoLimit, Algo: rab}}
	runs := []ring.Algorithm{dir, rd, rab, rg, hier}
	model := fakeModel(map[ring.Algorithm]time.Duration{
		rab: 10 * time.Millisecond, hier: 11 * time.Millisecond, rg: 15 * time.Millisecond, rd: 19 * time.Millisecond, dir: 50 * time.Millisecond})

	p := newPolicyRefiner(rules, runs, model)
	const n = 1 << 20
	for i := range refineWarmCalls {
		if a, c, _ := p.next(n); a != rab || c != nil {
			t.Fatalf("warm-up call %d: %s, timed %v; want rabenseifner untimed", i, a, c != nil)
		}
	}
	// The choice first, then the model's closest rivals within 2x, at most
	// 3 in all: hierarchical and ring, not recursive doubling (19 ms,
	// fourth) nor direct (5x).
	want := []ring.Algorithm{rab, hier, rg}
	var medians []int64
	took := map[ring.Algorithm]time.Duration{rab: 10 * time.Millisecond, hier: 8 * time.Millisecond, rg: 20 * time.Millisecond}
	for i := range refineSamples(n) * len(want) {
		a, c, k := p.next(n)
		if c == nil || a != want[i%len(want)] || c.cands[k] != a {
			t.Fatalf("timed call %d: %s (timed %v), want %s", i, a, c != nil, want[i%len(want)])
		}
		if medians != nil {
			t.Fatalf("medians after %d of %d calls", i, refineSamples(n)*len(want))
		}
		medians = c.record(k, took[a]+time.Duration(i)*time.Microsecond)
	}
	if len(medians) != len(want) {
		t.Fatalf("no medians after the last timed call: %v", medians)
	}
	c := p.classes[n]
	// 10 % is not a clear gain: the choice stays.
	if a, changed := p.decide(c, []int64{10e6, 9.2e6, 20e6}); changed || a != rab {
		t.Errorf("8 %% faster: decided %s, changed %v; want rabenseifner kept", a, changed)
	}
	if a, c, _ := p.next(n); a != rab || c != nil {
		t.Errorf("after the decision: %s, timed %v", a, c != nil)
	}
	// Another class, with a clear gain.
	q := newPolicyRefiner(rules, runs, model)
	for range refineWarmCalls + refineSamples(n)*len(want) {
		a, c, k := q.next(4 << 20)
		if c != nil {
			c.record(k, took[a])
		}
	}
	a, changed := q.decide(q.classes[4<<20], []int64{10e6, 8e6, 20e6})
	if !changed || a != hier {
		t.Fatalf("20 %% faster: decided %s, changed %v; want hierarchical", a, changed)
	}
	if got := (ring.AllreducePolicy{Rules: q.rules}).String(); got != "recursive-doubling:16K,rabenseifner:2M,hierarchical:4M,rabenseifner" {
		t.Errorf("rules after the decision: %s", got)
	}
	for _, size := range []int{2<<20 + 1, 4 << 20} {
		if a, c, _ := q.next(size); a != hier || c != nil {
			t.Errorf("%d bytes after the decision: %s, timed %v; want hierarchical untimed", size, a, c != nil)
		}
	}
	if q.changed.Load() != 1 {
		t.Errorf("changed %d classes, want 1", q.changed.Load())
	}

	// A choice without a rival within 2x is not timed; nor is a class
	// above refineMaxBytes.
	lone := newPolicyRefiner(rules, runs, fakeModel(map[ring.Algorithm]time.Duration{rab: time.Millisecond, hier: 3 * time.Millisecond}))
	for i := range refineWarmCalls + 3 {
		if _, c, _ := lone.next(n); c != nil {
			t.Errorf("call %d of a class without rivals is timed", i)
		}
	}
	for i := range refineWarmCalls + 3 {
		if _, c, _ := p.next(512 << 20); c != nil {
			t.Errorf("call %d of 512 MiB is timed", i)
		}
	}
}

// runRefined runs calls allreduces of n float32 on every rank of a
// memory mesh laid out on hosts, each through refinedAllreduce with the
// timings slow gives (slow(rank, algo)), and checks every result against
// the sum computed here; it returns each rank's refiner and ring.
func runRefined(t *testing.T, hosts []int, n, calls int, slow func(rank int, a ring.Algorithm) time.Duration) ([]*policyRefiner, []*ring.Ring) {
	t.Helper()
	size := len(hosts)
	ts := ring.NewMemRing(size)
	refs := make([]*policyRefiner, size)
	rings := make([]*ring.Ring, size)
	views := make([]*commView, size)
	comm := &Comm{logf: func(format string, args ...any) { t.Logf(format, args...) }}
	for r := range size {
		links := testLinks
		rg, err := ring.New(ring.Config{Rank: r, Size: size, Hosts: hosts, Links: &links}, ts[r])
		if err != nil {
			t.Fatal(err)
		}
		p, fromLinks := rg.DefaultAllreducePolicy()
		if !fromLinks {
			t.Fatalf("hosts %v: the ring's policy is not the links'", hosts)
		}
		refs[r] = newPolicyRefiner(p.Rules, ring.ModelCandidates(size, hosts), func(a ring.Algorithm, b int64) (time.Duration, bool) {
			return ring.AllreduceCost(a, b, size, hosts, links, 0)
		})
		refs[r].measured = func(a ring.Algorithm, _ time.Time) time.Duration { return slow(r, a) }
		rings[r] = rg
		views[r] = &commView{rank: r, size: size, ring: rg, refine: refs[r], ctx: context.Background()}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	errs := onEveryRank(size, func(r int) error {
		buf := make([]float32, n)
		for call := range calls {
			for i := range buf {
				buf[i] = float32((i*7+r+call)%13) - 6
			}
			rc := ring.Call{Kind: ring.Allreduce, Seq: uint64(call + 1), Op: ring.Sum, DType: ring.Float32, Count: n}
			v, err := viewOf(buf)
			if err == nil {
				err = comm.refinedAllreduce(ctx, views[r], rc, v.bytes)
			}
			if err != nil {
				return fmt.Errorf("call %d: %w", call, err)
			}
			for i, got := range buf {
				var want float32
				for q := range size {
					want += float32((i*7+q+call)%13) - 6
				}
				if got != want {
					return fmt.Errorf("call %d: element %d is %v, want %v", call, i, got, want)
				}
			}
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("hosts %v: rank %d: %v", hosts, r, err)
		}
	}
	return refs, rings
}

// rivalClass returns a size whose class the refiner times on hosts with
// testLinks, and its candidates.
func rivalClass(t *testing.T, hosts []int) (int, []ring.Algorithm) {
	t.Helper()
	size := len(hosts)
	links := testLinks
	p, _ := ring.CrossHostPolicy(size, hosts, links, 0)
	for n := 64 << 10; n <= 16<<20; n *= 2 {
		ref := newPolicyRefiner(p.Rules, ring.ModelCandidates(size, hosts), func(a ring.Algorithm, b int64) (time.Duration, bool) {
			return ring.AllreduceCost(a, b, size, hosts, links, 0)
		})
		if c := ref.newClass(n); !c.done {
			return n, c.cands
		}
	}
	t.Fatalf("hosts %v: no class from 64 KiB to 16 MiB has a rival within %dx", hosts, refineSpread)
	return 0, nil
}

// TestRefinedAllreduceAgrees: ranks whose own clocks disagree about the
// schedules still decide alike, from the slowest rank's times: a rival
// that one rank finds slow keeps the choice on every rank, and one that
// is faster everywhere takes the class on every rank. Every result is
// checked, during the timed calls and after.
func TestRefinedAllreduceAgrees(t *testing.T) {
	for _, hosts := range [][]int{{0, 0, 1, 1}, {0, 1, 2}, {0, 0, 0, 1, 1, 1}} {
		bytes, cands := rivalClass(t, hosts)
		n := bytes / 4
		rival := cands[len(cands)-1]
		calls := refineWarmCalls + refineSamples(bytes)*len(cands) + 2
		// The rival is twice as fast on every rank but the last, where it
		// is three times as slow: the slowest rank's time keeps the choice.
		refs, rings := runRefined(t, hosts, n, calls, func(r int, a ring.Algorithm) time.Duration {
			switch {
			case a != rival:
				return 10 * time.Millisecond
			case r == len(hosts)-1:
				return 30 * time.Millisecond
			}
			return 5 * time.Millisecond
		})
		for r, rg := range rings {
			if got := rg.AllreduceAlgorithm(bytes); got != cands[0] {
				t.Errorf("hosts %v: rank %d runs %s at %d bytes after the timing, want %s kept", hosts, r, got, bytes, cands[0])
			}
			if !refs[r].classes[classUpper(bytes)].done || refs[r].changed.Load() != 0 {
				t.Errorf("hosts %v: rank %d: class not decided, or changed", hosts, r)
			}
		}
		// Faster everywhere (by different amounts): every rank switches.
		refs, rings = runRefined(t, hosts, n, calls, func(r int, a ring.Algorithm) time.Duration {
			if a == rival {
				return time.Duration(4+r/2) * time.Millisecond
			}
			return 10 * time.Millisecond
		})
		want, _ := rings[0].DefaultAllreducePolicy()
		for r, rg := range rings {
			got, _ := rg.DefaultAllreducePolicy()
			if a := rg.AllreduceAlgorithm(bytes); a != rival || got.String() != want.String() {
				t.Errorf("hosts %v: rank %d runs %s at %d bytes, policy %v; want %s, %v", hosts, r, a, bytes, got, rival, want)
			}
			if refs[r].changed.Load() != 1 || !slices.Equal(refs[r].rules, want.Rules) {
				t.Errorf("hosts %v: rank %d: refiner rules %v, ring's %v", hosts, r, refs[r].rules, want)
			}
		}
	}
}

// TestEpochLinksHandedOn: in an elastic epoch, ranks that never measured
// (joiners) get the links a member holds, overheads included, without
// measuring; with none held, all measure and agree.
func TestEpochLinksHandedOn(t *testing.T) {
	hosts := []int{0, 0, 1, 1, 1}
	size := len(hosts)
	held := AgreedLinks{Links: testLinks, CodecBytesPerSecond: 2e9, CodecOverhead: 7 * time.Microsecond, Probed: [2]int{2, 3}, Took: 5 * time.Millisecond}
	held.CallOverhead[ring.AlgoHierarchical] = 90 * time.Microsecond
	if got, ok := decodeOffer(held.encodeOffer()); !ok || got != held {
		t.Fatalf("offer decoded %+v, %v; sent %+v", got, ok, held)
	}
	if _, ok := decodeOffer(make([]byte, epochLinksBytes)); ok {
		t.Fatalf("an empty offer decodes as links")
	}
	// Links without a link within a host cannot serve a layout with
	// several ranks per host: rank 1's are skipped for rank 3's.
	crossOnly := held
	crossOnly.Local = ring.LinkCost{}
	for _, tc := range []struct {
		name    string
		holders map[int]AgreedLinks
		want    *AgreedLinks // nil: measured
	}{
		{"held by rank 3", map[int]AgreedLinks{1: crossOnly, 3: held}, &held},
		{"held by none", nil, nil},
	} {
		ts := ring.NewMemRing(size)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		got := make([]AgreedLinks, size)
		errs := onEveryRank(size, func(r int) (err error) {
			c := &Comm{}
			c.compression, _ = newCompressionState(compressionConfig{codec: compress.Int8()}, func(string) string { return "" })
			if l, ok := tc.holders[r]; ok {
				c.links = &l
			}
			got[r], err = c.epochLinks(ctx, ts[r].(ring.Mesh), r, size, hosts)
			return err
		})
		cancel()
		for r := range size {
			if errs[r] != nil {
				t.Fatalf("%s: rank %d: %v", tc.name, r, errs[r])
			}
			if got[r] != got[0] {
				t.Errorf("%s: rank %d holds %v, rank 0 %v", tc.name, r, got[r], got[0])
			}
		}
		if tc.want != nil && got[0] != *tc.want {
			t.Errorf("%s: agreed %+v, want %+v", tc.name, got[0], *tc.want)
		}
		if tc.want == nil && (got[0].Probed[0] == 0 || got[0].Probed[1] == 0) {
			t.Errorf("%s: measured %v: a class of links is missing", tc.name, got[0])
		}
	}
}

// TestAgreeAutotune: ranks that differ on GORUN_AUTOTUNE all fail, naming
// the variable; ranks that agree go on.
func TestAgreeAutotune(t *testing.T) {
	for _, tc := range []struct {
		on      []bool
		wantErr bool
	}{
		{[]bool{true, true, true}, false},
		{[]bool{false, false, false}, false},
		{[]bool{false, false, true}, true},
		{[]bool{true, false, false}, true},
	} {
		size := len(tc.on)
		ts := ring.NewMemRing(size)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		errs := onEveryRank(size, func(r int) error {
			return agreeAutotune(ctx, ts[r].(ring.Mesh), r, size, tc.on[r])
		})
		cancel()
		for r, err := range errs {
			switch {
			case tc.wantErr && (err == nil || !strings.Contains(err.Error(), EnvAutotune+" differs between the ranks")):
				t.Errorf("%v: rank %d: %v, want the variable named", tc.on, r, err)
			case !tc.wantErr && err != nil:
				t.Errorf("%v: rank %d: %v", tc.on, r, err)
			}
		}
	}
}
