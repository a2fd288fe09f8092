package ringsim

import (
	"context"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/ring"
)

var allAlgorithms = []ring.Algorithm{ring.AlgoRing, ring.AlgoDirect, ring.AlgoRecursiveDoubling,
	ring.AlgoRabenseifner, ring.AlgoScatterGather, ring.AlgoHierarchical}

func simulate(t *testing.T, a Allreduce) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Simulate(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// msgTime is the β term of a message of bytes at bandwidth bits/s, rounded
// as the simulator rounds it: up to a whole picosecond.
func msgTime(bytes int64, bandwidth float64) Time {
	return Time(math.Ceil(float64(bytes) * 8e12 / bandwidth))
}

// TestRingAllreduceIsAlphaBeta: with one rank per host and one chunk per
// step, the ring allreduce takes 2(p-1) steps of α + (n/p + header)·β,
// the textbook 2(p-1)α + 2(p-1)/p·n·β plus the framing, to the picosecond.
func TestRingAllreduceIsAlphaBeta(t *testing.T) {
	for _, c := range []struct {
		p         int
		n         int64
		bandwidth float64
		latency   time.Duration
	}{
		{2, 1 << 10, 10e9, 10 * time.Microsecond},
		{4, 1 << 20, 10e9, 10 * time.Microsecond},  // 256 KiB segments: one chunk, pipelined
		{8, 1 << 18, 100e9, 5 * time.Microsecond},  // 32 KiB segments: sent before received
		{16, 1 << 22, 400e9, 2 * time.Microsecond}, // 256 KiB segments
		{5, 5 << 16, 1e9, 50 * time.Microsecond},   // not a power of two
	} {
		nw := DefaultNetwork(c.bandwidth)
		nw.Latency = c.latency
		res := simulate(t, Allreduce{Layout: Layout{Hosts: c.p, RanksPerHost: 1}, Network: nw, Bytes: c.n, Algorithm: ring.AlgoRing})
		step := timeOf(c.latency) + msgTime(c.n/int64(c.p)+ring.HeaderSize, c.bandwidth)
		want := Time(2*(c.p-1)) * step
		if res.Time != want {
			t.Errorf("ring allreduce of %d bytes on %d hosts at %g bit/s: %v, want 2(p-1)(α + (n/p+header)β) = %v", c.n, c.p, c.bandwidth, res.Time, want)
		}
		if res.Scale != 1 {
			t.Errorf("scale %d, want 1", res.Scale)
		}
	}
}

// TestRabenseifnerIsAlphaBeta: recursive halving then doubling on
// p = 2^k hosts, one chunk per message: 2k rounds of α + (n/2^j + header)·β,
// i.e. 2 log2(p) α + 2(p-1)/p·n·β plus the framing.
func TestRabenseifnerIsAlphaBeta(t *testing.T) {
	const p, n, bandwidth = 8, 1 << 18, 25e9
	nw := DefaultNetwork(bandwidth)
	res := simulate(t, Allreduce{Layout: Layout{Hosts: p, RanksPerHost: 1}, Network: nw, Bytes: n, Algorithm: ring.AlgoRabenseifner})
	var want Time
	for half := int64(n / 2); half >= n/p; half /= 2 {
		want += 2 * (timeOf(nw.Latency) + msgTime(half+ring.HeaderSize, bandwidth))
	}
	if res.Time != want {
		t.Errorf("Rabenseifner allreduce of %d bytes on %d hosts: %v, want %v", n, p, res.Time, want)
	}
}

// TestNICIsShared: two ranks of one host sending to another host at once
// share its NIC (the second message waits for the first), while a message
// between two ranks of one host takes its own link, whatever the NIC does.
func TestNICIsShared(t *testing.T) {
	const b = 1 << 20
	nw := DefaultNetwork(10e9)
	lay := Layout{Hosts: 2, RanksPerHost: 2} // ranks 0, 1 on host 0; 2, 3 on host 1
	e := newEngine(lay, nw, 1)
	payload := make([]byte, b)
	var crossAt [2]Time // ranks 2 and 3: their message from host 0 is in
	var localAt Time    // rank 1: rank 0's message within host 0 is in
	err := exclusive(func() error {
		return e.run(context.Background(), func(ctx context.Context, r int) error {
			tr := &transport{e: e, rank: r}
			buf := make([]byte, b)
			var at *Time
			switch r {
			case 0:
				if err := tr.SendTo(ctx, 2, payload); err != nil {
					return err
				}
				return tr.SendTo(ctx, 1, payload)
			case 1:
				if err := tr.SendTo(ctx, 3, payload); err != nil {
					return err
				}
				if err := tr.RecvFrom(ctx, 0, buf); err != nil {
					return err
				}
				at = &localAt
			default:
				if err := tr.RecvFrom(ctx, r-2, buf); err != nil {
					return err
				}
				at = &crossAt[r-2]
			}
			e.mu.Lock()
			*at = e.now
			e.mu.Unlock()
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	one := msgTime(b, nw.Bandwidth)
	// Rank 0's message has the NIC first (the lower sender), rank 1's after it.
	if want := one + timeOf(nw.Latency); crossAt[0] != want {
		t.Errorf("first message in at %v, want β·b + α = %v", crossAt[0], want)
	}
	if want := 2*one + timeOf(nw.Latency); crossAt[1] != want {
		t.Errorf("second message in at %v, want 2β·b + α = %v: the NIC is shared", crossAt[1], want)
	}
	if want := msgTime(b, nw.LocalBandwidth) + timeOf(nw.LocalLatency); localAt != want {
		t.Errorf("message within the host in at %v, want its own link's %v", localAt, want)
	}
	if e.stats.CrossHostBytes != 2*b || e.stats.WireBytes != 3*b {
		t.Errorf("%d bytes crossed hosts of %d, want %d of %d", e.stats.CrossHostBytes, e.stats.WireBytes, 2*b, 3*b)
	}
}

// TestDeterministic: the same allreduce gives the same time and the same
// counts on every run, for schedules with goroutines of their own
// (pipelined ring, hierarchical, scatter-gather) and contention on the
// NICs.
func TestDeterministic(t *testing.T) {
	for _, a := range []ring.Algorithm{ring.AlgoRing, ring.AlgoHierarchical, ring.AlgoScatterGather, ring.AlgoRabenseifner} {
		s := Allreduce{Layout: Layout{Hosts: 4, RanksPerHost: 4}, Network: DefaultNetwork(10e9), Bytes: 1 << 20, Algorithm: a}
		first := simulate(t, s)
		for range 2 {
			if again := simulate(t, s); again != first {
				t.Fatalf("%s: %+v, then %+v", a, first, again)
			}
		}
	}
}

// TestResultsCorrect runs every algorithm on layouts of several shapes,
// sizes that do and do not divide evenly, and the empty buffer: Simulate
// checks that every rank ends with the sum of all inputs.
func TestResultsCorrect(t *testing.T) {
	for _, lay := range []Layout{{2, 1}, {3, 1}, {2, 2}, {3, 2}, {4, 3}, {1, 4}} {
		for _, n := range []int64{0, 4, 4 * 1001, 1 << 20} {
			for _, a := range allAlgorithms {
				if a == ring.AlgoHierarchical && lay.RanksPerHost == 1 {
					continue
				}
				s := Allreduce{Layout: lay, Network: DefaultNetwork(10e9), Bytes: n, Algorithm: a, ChunkBytes: 64 << 10}
				if _, err := Simulate(context.Background(), s); err != nil {
					t.Errorf("%s on %v, %d bytes: %v", a, lay, n, err)
				}
			}
		}
	}
}

// TestCheckCatchesWrongResults: the check Simulate relies on.
func TestCheckCatchesWrongResults(t *testing.T) {
	bufs := [][]byte{input(0, 10), input(1, 10)}
	for i := range bufs {
		copy(bufs[i], input(0, 10)) // rank 0's input, not the sum
	}
	if err := check(bufs); err == nil || !strings.Contains(err.Error(), "element") {
		t.Fatalf("check of unreduced buffers: %v", err)
	}
}

// TestScaledRunMatchesFull: a run shrunk by the scale sends the same
// messages, each standing for as many bytes, as the full-size run: the
// same time, to the picosecond, where the shrinking changes no choice of
// the schedule (below, its steps stay too large to send before receiving).
func TestScaledRunMatchesFull(t *testing.T) {
	for _, a := range []ring.Algorithm{ring.AlgoRing, ring.AlgoRabenseifner, ring.AlgoHierarchical} {
		s := Allreduce{Layout: Layout{Hosts: 4, RanksPerHost: 2}, Network: DefaultNetwork(25e9), Bytes: 8 << 20, Algorithm: a, Memory: 1 << 30}
		full := simulate(t, s)
		s.Memory = 16 << 20
		scaled := simulate(t, s)
		if full.Scale != 1 || scaled.Scale != 4 {
			t.Fatalf("scales %d and %d, want 1 and 4", full.Scale, scaled.Scale)
		}
		if full.Time != scaled.Time || full.Stats != scaled.Stats {
			t.Errorf("%s: full %v %+v, scaled %v %+v", a, full.Time, full.Stats, scaled.Time, scaled.Stats)
		}
	}
}

// TestPolicyChoice: the simulator reports what ring's own default policy
// picks for the layout, with the links a job across hosts would measure
// on the network: at 1 MiB on 2 hosts × 2 ranks, flat Rabenseifner, which
// the measured runs found faster there than the hierarchical allreduce
// the fixed rules chose; at 64 MiB, hierarchical.
func TestPolicyChoice(t *testing.T) {
	for _, c := range []struct {
		lay   Layout
		bytes int64
		want  ring.Algorithm
	}{
		{Layout{4, 1}, 4 << 10, ring.AlgoRecursiveDoubling},
		{Layout{4, 1}, 1 << 20, ring.AlgoRabenseifner},
		{Layout{4, 1}, 16 << 20, ring.AlgoRing},
		{Layout{2, 2}, 64 << 10, ring.AlgoRabenseifner},
		{Layout{2, 2}, 1 << 20, ring.AlgoRabenseifner},
		{Layout{2, 2}, 64 << 20, ring.AlgoHierarchical},
	} {
		got, err := PolicyChoice(c.lay, DefaultNetwork(10e9), c.bytes)
		if err != nil || got != c.want {
			t.Errorf("%v, %d bytes: %v, %v; want %v", c.lay, c.bytes, got, err, c.want)
		}
		res := simulate(t, Allreduce{Layout: c.lay, Network: DefaultNetwork(10e9), Bytes: c.bytes, Policy: true})
		if res.Algorithm != c.want {
			t.Errorf("%v, %d bytes: ran %v, want %v", c.lay, c.bytes, res.Algorithm, c.want)
		}
	}
}

// TestStuckSchedule: a rank waiting for a message nobody sends ends the
// simulation with an error naming it, instead of hanging.
func TestStuckSchedule(t *testing.T) {
	e := newEngine(Layout{Hosts: 2, RanksPerHost: 1}, DefaultNetwork(10e9), 1)
	err := exclusive(func() error {
		return e.run(context.Background(), func(ctx context.Context, r int) error {
			if r == 1 {
				return (&transport{e: e, rank: 1}).RecvFrom(ctx, 0, make([]byte, 8))
			}
			return nil
		})
	})
	if err == nil || !strings.Contains(err.Error(), "stuck") || !strings.Contains(err.Error(), "rank 1 for 8 bytes from rank 0") {
		t.Fatalf("got %v", err)
	}
}

// TestGOMAXPROCSRestored: a simulation runs with GOMAXPROCS 1 and gives
// the setting back.
func TestGOMAXPROCSRestored(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	simulate(t, Allreduce{Layout: Layout{Hosts: 2, RanksPerHost: 1}, Network: DefaultNetwork(10e9), Bytes: 4})
	if after := runtime.GOMAXPROCS(0); after != before {
		t.Fatalf("GOMAXPROCS %d after a simulation, %d before", after, before)
	}
}

// TestBurst: with a token bucket (Network.Burst), a message within the
// burst of an idle link goes at once; a larger one at the bandwidth for
// the bytes beyond it; and the tokens come back at the bandwidth.
func TestBurst(t *testing.T) {
	const burst = 256 << 10
	nw := DefaultNetwork(1e9)
	nw.Burst = burst
	α := timeOf(nw.Latency)
	for _, c := range []struct {
		sizes []int64 // sent one after the other by rank 0 to rank 1
		want  Time    // when the last is in
	}{
		{[]int64{burst}, α},
		{[]int64{3 * burst}, α + msgTime(2*burst, nw.Bandwidth)},
		{[]int64{burst, burst}, α + msgTime(burst, nw.Bandwidth)},
	} {
		e := newEngine(Layout{Hosts: 2, RanksPerHost: 1}, nw, 1)
		var in Time
		err := exclusive(func() error {
			return e.run(context.Background(), func(ctx context.Context, r int) error {
				tr := &transport{e: e, rank: r}
				for _, n := range c.sizes {
					if r == 0 {
						if err := tr.SendTo(ctx, 1, make([]byte, n)); err != nil {
							return err
						}
					} else if err := tr.RecvFrom(ctx, 0, make([]byte, n)); err != nil {
						return err
					}
				}
				if r == 1 {
					e.mu.Lock()
					in = e.now
					e.mu.Unlock()
				}
				return nil
			})
		})
		if err != nil {
			t.Fatal(err)
		}
		if in != c.want {
			t.Errorf("messages of %v bytes through a %d-byte burst: in at %v, want %v", c.sizes, burst, in, c.want)
		}
	}
}
