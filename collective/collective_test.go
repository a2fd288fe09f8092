package collective

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/gorun/gorun/ring"
)

// newJob starts n ranks in this process, over the real transport, and
// closes them all when the test ends.
func newJob(t testing.TB, n int, opts ...Option) []*Comm {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	j, err := StartLocal(ctx, n, append([]Option{WithTimeout(20 * time.Second), WithLogger(t.Logf)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	return j.Comms
}

// onEach runs f on every rank at once and returns each rank's error.
func onEach(comms []*Comm, f func(c *Comm) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for i, c := range comms {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = f(c) }()
	}
	wg.Wait()
	return errs
}

func mustAll(t *testing.T, errs []error) {
	t.Helper()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// input is rank r's deterministic contribution: small integers (so float
// sums are exact) with sign changes, and values in {1,2,-1} for Prod so
// products stay in range.
func input(r, n int, op Op) []int64 {
	rng := rand.New(rand.NewPCG(uint64(r), uint64(n)))
	out := make([]int64, n)
	for i := range out {
		if op == Prod {
			out[i] = []int64{1, 2, -1}[rng.IntN(3)]
		} else {
			out[i] = int64(rng.IntN(201) - 100)
		}
	}
	return out
}

// reference reduces the int64 inputs of all ranks exactly, in float64 for
// Avg.
func reference(ins [][]int64, op Op) []float64 {
	out := make([]float64, len(ins[0]))
	for i := range out {
		acc := ins[0][i]
		for _, in := range ins[1:] {
			switch op {
			case Sum, Avg:
				acc += in[i]
			case Prod:
				acc *= in[i]
			case Min:
				acc = min(acc, in[i])
			case Max:
				acc = max(acc, in[i])
			}
		}
		out[i] = float64(acc)
		if op == Avg {
			out[i] /= float64(len(ins))
		}
	}
	return out
}

// typed converts int64 values to a buffer of the given dtype.
func typed(dt ring.DType, v []int64) any {
	switch dt {
	case ring.Float32:
		out := make([]float32, len(v))
		for i, x := range v {
			out[i] = float32(x)
		}
		return out
	case ring.Float64:
		out := make([]float64, len(v))
		for i, x := range v {
			out[i] = float64(x)
		}
		return out
	case ring.Int32:
		out := make([]int32, len(v))
		for i, x := range v {
			out[i] = int32(x)
		}
		return out
	default:
		return append([]int64(nil), v...)
	}
}

func at(buf any, i int) float64 {
	switch b := buf.(type) {
	case []float32:
		return float64(b[i])
	case []float64:
		return b[i]
	case []int32:
		return float64(b[i])
	case []int64:
		return float64(b[i])
	}
	panic("unreachable")
}

// check compares a result against the float64 reference; integer Avg
// truncates toward zero.
func check(t *testing.T, label string, dt ring.DType, op Op, got any, want []float64) {
	t.Helper()
	for i, w := range want {
		g := at(got, i)
		if op == Avg && (dt == ring.Int32 || dt == ring.Int64) {
			w = math.Trunc(w)
		}
		if math.Abs(g-w) > 1e-6*math.Max(1, math.Abs(w)) {
			t.Fatalf("%s: element %d = %v, want %v", label, i, g, w)
		}
	}
}

var dtypes = []ring.DType{ring.Float32, ring.Float64, ring.Int32, ring.Int64}
var ops = []Op{Sum, Avg, Min, Max, Prod}

func TestAllreduceEveryDTypeAndOp(t *testing.T) {
	ctx := context.Background()
	for _, n := range []int{1, 2, 3, 4, 7} {
		t.Run(fmt.Sprint("np=", n), func(t *testing.T) {
			comms := newJob(t, n)
			for _, length := range []int{0, 1, max(n-1, 1), 1009, 4099} {
				for _, dt := range dtypes {
					for _, op := range ops {
						ins := make([][]int64, n)
						bufs := make([]any, n)
						for r := range n {
							ins[r] = input(r, length, op)
							bufs[r] = typed(dt, ins[r])
						}
						mustAll(t, onEach(comms, func(c *Comm) error {
							return c.Allreduce(ctx, bufs[c.Rank()], op)
						}))
						want := reference(ins, op)
						for r := range n {
							check(t, fmt.Sprintf("np=%d len=%d %s %s rank %d", n, length, dt, op, r), dt, op, bufs[r], want)
						}
					}
				}
			}
		})
	}
}

// Large buffers cross many chunks and pipeline stages; every rank must end
// with the same bits.
func TestAllreduceLargeIsExactAndIdentical(t *testing.T) {
	ctx := context.Background()
	sizes := []int{1 << 20 / 4, 16 << 20 / 4} // 1 MiB and 16 MiB of float32
	for _, n := range []int{2, 3, 4} {
		comms := newJob(t, n)
		for _, count := range sizes {
			bufs := make([][]float32, n)
			for r := range n {
				rng := rand.New(rand.NewPCG(uint64(r), 7))
				bufs[r] = make([]float32, count)
				for i := range bufs[r] {
					bufs[r][i] = float32(rng.NormFloat64())
				}
			}
			want := make([]float64, count)
			for r := range n {
				for i, x := range bufs[r] {
					want[i] += float64(x)
				}
			}
			mustAll(t, onEach(comms, func(c *Comm) error { return c.Allreduce(ctx, bufs[c.Rank()], Sum) }))
			for i := range count {
				if d := math.Abs(float64(bufs[0][i]) - want[i]); d > 1e-5*math.Max(1, math.Abs(want[i])) {
					t.Fatalf("np=%d count=%d: element %d = %v, want %v", n, count, i, bufs[0][i], want[i])
				}
				for r := 1; r < n; r++ {
					if math.Float32bits(bufs[r][i]) != math.Float32bits(bufs[0][i]) {
						t.Fatalf("np=%d count=%d: rank %d element %d = %v, rank 0 has %v", n, count, r, i, bufs[r][i], bufs[0][i])
					}
				}
			}
		}
	}
}

func TestBroadcastAllgatherReduceScatter(t *testing.T) {
	ctx := context.Background()
	for _, n := range []int{1, 3, 4} {
		comms := newJob(t, n)
		for _, length := range []int{0, 1, 1009} {
			for root := range n {
				bufs := make([][]float64, n)
				for r := range n {
					bufs[r] = make([]float64, length)
					for i := range bufs[r] {
						bufs[r][i] = float64(r*1000000 + i)
					}
				}
				mustAll(t, onEach(comms, func(c *Comm) error { return c.Broadcast(ctx, bufs[c.Rank()], root) }))
				for r := range n {
					for i, v := range bufs[r] {
						if v != float64(root*1000000+i) {
							t.Fatalf("np=%d broadcast root %d: rank %d element %d = %v", n, root, r, i, v)
						}
					}
				}
			}
			outs := make([][]int32, n)
			mustAll(t, onEach(comms, func(c *Comm) error {
				in := make([]int32, length)
				for i := range in {
					in[i] = int32(c.Rank()*100000 + i)
				}
				outs[c.Rank()] = make([]int32, n*length)
				return c.Allgather(ctx, in, outs[c.Rank()])
			}))
			for r := range n {
				for i, v := range outs[r] {
					if want := int32((i/length)*100000 + i%length); v != want {
						t.Fatalf("np=%d allgather: rank %d element %d = %d, want %d", n, r, i, v, want)
					}
				}
			}
			rs := make([][]int64, n)
			mustAll(t, onEach(comms, func(c *Comm) error {
				in := make([]int64, n*length)
				for i := range in {
					in[i] = int64(c.Rank() + i)
				}
				rs[c.Rank()] = make([]int64, length)
				return c.ReduceScatter(ctx, in, rs[c.Rank()], Sum)
			}))
			for r := range n {
				for j, v := range rs[r] {
					i := r*length + j
					want := int64(n*i + n*(n-1)/2)
					if v != want {
						t.Fatalf("np=%d reducescatter: rank %d element %d = %d, want %d", n, r, j, v, want)
					}
				}
			}
		}
		mustAll(t, onEach(comms, func(c *Comm) error { return c.Barrier(ctx) }))
	}
}

func TestTensorDense(t *testing.T) {
	ctx := context.Background()
	comms := newJob(t, 3)
	ts := make([]*tensor.Dense, 3)
	mustAll(t, onEach(comms, func(c *Comm) error {
		r := float32(c.Rank())
		ts[c.Rank()] = tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float32{r, r, r, 1, 2, 3}))
		return c.Allreduce(ctx, ts[c.Rank()], Max)
	}))
	want := []float32{2, 2, 2, 1, 2, 3}
	for r, x := range ts {
		got := x.Data().([]float32)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("rank %d: %v, want %v", r, got, want)
		}
	}
	if err := comms[0].Allreduce(ctx, tensor.New(tensor.WithShape(2), tensor.Of(tensor.Uint16)), Sum); err == nil ||
		!strings.Contains(err.Error(), "not supported") {
		t.Fatalf("uint16 tensor: err = %v, want a 'not supported' error", err)
	}
}

// Many async collectives in flight at once, of different kinds and sizes,
// each complete with the right result.
func TestConcurrentAsync(t *testing.T) {
	ctx := context.Background()
	const n, calls = 4, 24
	comms := newJob(t, n)
	bufs := make([][][]float32, n)
	mustAll(t, onEach(comms, func(c *Comm) error {
		hs := make([]*Handle, calls)
		bufs[c.Rank()] = make([][]float32, calls)
		for k := range calls {
			b := make([]float32, 1+k*997)
			for i := range b {
				b[i] = float32(c.Rank() + k)
			}
			bufs[c.Rank()][k] = b
			if k%3 == 2 {
				hs[k] = c.BroadcastAsync(ctx, b, k%n, Name(fmt.Sprint("b", k)))
			} else {
				hs[k] = c.AllreduceAsync(ctx, b, Sum, Name(fmt.Sprint("g", k)))
			}
		}
		for k := calls - 1; k >= 0; k-- { // wait out of order on purpose
			if err := hs[k].Wait(ctx); err != nil {
				return err
			}
			if hs[k].Seq() != uint64(k+1) {
				return fmt.Errorf("call %d got sequence %d", k, hs[k].Seq())
			}
		}
		return nil
	}))
	for r := range n {
		for k := range calls {
			want := float32(n*k + n*(n-1)/2)
			if k%3 == 2 {
				want = float32(k%n + k)
			}
			for i, v := range bufs[r][k] {
				if v != want {
					t.Fatalf("rank %d call %d element %d = %v, want %v", r, k, i, v, want)
				}
			}
		}
	}
}

// Bad input is refused locally, before anything is sent.
func TestBadInputChangesNothing(t *testing.T) {
	ctx := context.Background()
	comms := newJob(t, 2)
	for _, tc := range []struct {
		name string
		call func(c *Comm) error
		want string
	}{
		{"string", func(c *Comm) error { return c.Allreduce(ctx, "x", Sum) }, "buffer type string is not supported"},
		{"bytes", func(c *Comm) error { return c.Allreduce(ctx, []byte{1}, Sum) }, "cannot be reduced"},
		{"root", func(c *Comm) error { return c.Broadcast(ctx, []float32{1}, 5) }, "root 5 is not a rank"},
		{"gather", func(c *Comm) error { return c.Allgather(ctx, []float32{1}, make([]float32, 3)) }, "want Size()*len(in)"},
		{"dtype", func(c *Comm) error { return c.Allgather(ctx, []float32{1}, make([]float64, 2)) }, "use one dtype"},
	} {
		if err := tc.call(comms[0]); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
		}
	}
	// The Comm is still healthy, and sequence numbers were not consumed.
	mustAll(t, onEach(comms, func(c *Comm) error {
		h := c.AllreduceAsync(ctx, []float32{1}, Sum)
		if err := h.Wait(ctx); err != nil {
			return err
		}
		if h.Seq() != 1 {
			return fmt.Errorf("rank %d: first good call has sequence %d", c.Rank(), h.Seq())
		}
		return nil
	}))
}

// An invalid op (or an unknown codec) is a bad argument like any other: it
// is refused on the calling rank alone, before the call is numbered, and
// the job goes on (it used to take a sequence number and abort every rank
// with "ring: allreduce #1: invalid op 0").
func TestInvalidOpRefusedLocally(t *testing.T) {
	ctx := context.Background()
	comms := newJob(t, 3)
	big := make([]float32, 1<<16) // large enough to be compressed
	for _, tc := range []struct {
		name string
		call func(c *Comm) error
		want string
	}{
		{"Allreduce", func(c *Comm) error { return c.Allreduce(ctx, []float32{1}, Op(0)) }, "gorun: Allreduce: invalid op Op(0)"},
		{"AllreduceAsync", func(c *Comm) error { return c.AllreduceAsync(ctx, []int64{1}, Op(9)).Wait(ctx) }, "gorun: Allreduce: invalid op Op(9)"},
		{"compressed", func(c *Comm) error { return c.Allreduce(ctx, big, Op(0), Compression("int8")) }, "gorun: Allreduce: invalid op Op(0)"},
		{"ReduceScatter", func(c *Comm) error {
			return c.ReduceScatter(ctx, make([]float64, 3), make([]float64, 1), Op(0))
		}, "gorun: ReduceScatter: invalid op Op(0)"},
		{"ReduceScatterAsync", func(c *Comm) error {
			return c.ReduceScatterAsync(ctx, make([]float64, 3), make([]float64, 1), Op(200)).Wait(ctx)
		}, "gorun: ReduceScatter: invalid op Op(200)"},
		{"codec", func(c *Comm) error { return c.Allreduce(ctx, big, Sum, Compression("zip")) }, `unknown codec "zip"`},
	} {
		err := tc.call(comms[1])
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
		if err != nil && strings.Contains(err.Error(), "#") {
			t.Errorf("%s: the refused call was numbered: %v", tc.name, err)
		}
	}
	// Nothing reached the other ranks: all three make their first call,
	// numbered 1 everywhere, and get the right sum.
	mustAll(t, onEach(comms, func(c *Comm) error {
		buf := []float32{float32(c.Rank() + 1), 10}
		h := c.AllreduceAsync(ctx, buf, Sum)
		if err := h.Wait(ctx); err != nil {
			return err
		}
		if h.Seq() != 1 {
			return fmt.Errorf("rank %d: first good call has sequence %d", c.Rank(), h.Seq())
		}
		if buf[0] != 6 || buf[1] != 30 {
			return fmt.Errorf("rank %d: sum %v, want [6 30]", c.Rank(), buf)
		}
		return c.Barrier(ctx)
	}))
	for r, c := range comms {
		if err := c.Err(); err != nil {
			t.Errorf("rank %d: Comm unusable: %v", r, err)
		}
	}
}

// A rank that closes its Comm after call #2 while the others go on to call
// #3 fails them at once (not after a grace second with "recv from rank 1:
// EOF"), naming it and both calls, whether they were already in the call
// (rank 2) or enter it later (rank 0); its own Close names them.
func TestLeaveEarlyFailsOthers(t *testing.T) {
	ctx := context.Background()
	comms := newJob(t, 3, WithTimeout(time.Minute))
	for range 2 {
		mustAll(t, onEach(comms, func(c *Comm) error { return c.Allreduce(ctx, make([]float32, 1000), Sum) }))
	}
	start := time.Now()
	call3 := func(c *Comm) error { return c.Allreduce(ctx, make([]float32, 1000), Sum) }
	rank2 := make(chan error, 1)
	go func() { rank2 <- call3(comms[2]) }()
	closed := make(chan error, 1)
	go func() { closed <- comms[1].Close() }()
	errs := map[int]error{2: <-rank2}
	errs[0] = call3(comms[0])
	closeErr := <-closed
	el := time.Since(start)
	for r, err := range errs {
		var left *PeerLeftError
		want := fmt.Sprintf("gorun: rank %d: rank 1 closed its communicator after call #2 while rank %d was in call #3", r, r)
		if !errors.As(err, &left) || left.Rank != 1 || !strings.Contains(fmt.Sprint(err), want) {
			t.Errorf("rank %d: %v; want a *PeerLeftError saying %q", r, err, want)
		}
		t.Logf("rank %d: %v", r, err)
	}
	var early *EarlyCloseError
	want := "gorun: rank 1: close: rank 0 and rank 2 were still in call #3 after this rank's last call #2; every rank must make the same collective calls before Close"
	if !errors.As(closeErr, &early) || fmt.Sprint(closeErr) != want {
		t.Errorf("rank 1: Close: %v; want %q", closeErr, want)
	}
	t.Logf("rank 1: Close: %v", closeErr)
	if el > 20*time.Second {
		t.Errorf("the departure took %v to surface; the timeout is 1m", el)
	}
	if err := comms[0].Allreduce(ctx, []float32{1}, Sum); err == nil || !strings.Contains(err.Error(), "rank 1 closed its communicator") {
		t.Errorf("rank 0: call after the failure: %v", err)
	}
}

// Closing every rank after the same last call is clean and quick.
func TestCloseAfterSameCallIsClean(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	j, err := StartLocal(ctx, 4, WithTimeout(time.Minute), WithLogger(t.Logf))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		mustAll(t, onEach(j.Comms, func(c *Comm) error { return c.Allreduce(ctx, make([]float32, 1<<16), Sum) }))
	}
	start := time.Now()
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	el := time.Since(start)
	t.Logf("4 ranks and the rendezvous closed in %v", el)
	if el > 10*time.Second {
		t.Errorf("closing took %v", el)
	}
}

// Disagreement is an error on every rank, naming both calls, and leaves the
// Comm unusable with a clear error.
func TestMismatchFailsEveryRank(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		call func(c *Comm) error
		want string
	}{
		{"length", func(c *Comm) error {
			return c.Allreduce(ctx, make([]float32, 1000-min(c.Rank(), 1)), Sum)
		}, "called Allreduce(float32[%d], Sum) but rank %d called Allreduce(float32[%d], Sum)"},
		{"op", func(c *Comm) error {
			return c.Allreduce(ctx, make([]float32, 10), []Op{Sum, Max, Sum}[c.Rank()])
		}, "called Allreduce(float32[10], %s) but rank %d called Allreduce(float32[10], %s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms := newJob(t, 3, WithTimeout(10*time.Second))
			start := time.Now()
			errs := onEach(comms, tc.call)
			for r, err := range errs {
				if err == nil {
					t.Fatalf("rank %d: no error", r)
				}
				if !strings.Contains(err.Error(), "called Allreduce(") || !strings.Contains(err.Error(), "but rank") {
					t.Errorf("rank %d: error does not name both calls: %v", r, err)
				}
				t.Logf("rank %d: %v", r, err)
			}
			if el := time.Since(start); el >= 10*time.Second {
				t.Errorf("mismatch took %v to surface, the timeout is 10s", el)
			}
			err := comms[0].Allreduce(ctx, []float32{1}, Sum)
			if err == nil || !strings.Contains(err.Error(), "unusable after an earlier failure") {
				t.Errorf("call after failure: %v", err)
			}
		})
	}
}

// A rank that never makes the call (a frozen or stuck goroutine) turns into
// an error on every waiting rank within the timeout.
func TestFrozenRankTimesOut(t *testing.T) {
	ctx := context.Background()
	const timeout = 2 * time.Second
	comms := newJob(t, 3, WithTimeout(timeout))
	start := time.Now()
	errs := onEach(comms[:2], func(c *Comm) error { return c.Allreduce(ctx, make([]float32, 100), Sum) })
	el := time.Since(start)
	for r, err := range errs {
		if err == nil {
			t.Fatalf("rank %d: no error", r)
		}
		if !strings.Contains(err.Error(), "rank") {
			t.Errorf("rank %d: error names no rank: %v", r, err)
		}
		t.Logf("rank %d after %v: %v", r, el.Round(time.Millisecond), err)
	}
	if el > timeout+5*time.Second {
		t.Errorf("ranks waited %v, timeout is %v", el, timeout)
	}
	// The frozen rank learns of the abort too: its next call fails at once.
	<-comms[2].life.Done()
	if err := comms[2].Allreduce(ctx, make([]float32, 100), Sum); err == nil {
		t.Fatal("rank 2: call after the job was aborted succeeded")
	}
}

func TestEnvironmentContract(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	key := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		name string
		vars map[string]string
		want launchEnv
		err  string
	}{
		{"none", map[string]string{}, launchEnv{localRank: -1, localSize: -1}, ""},
		{"gorun", map[string]string{EnvRank: "2", EnvSize: "4", EnvLocalRank: "0", EnvLocalSize: "2", EnvRendezvous: "10.0.0.1:5000", EnvJobKey: key},
			launchEnv{source: "gorun", rank: 2, size: 4, localRank: 0, localSize: 2, rendezvous: "10.0.0.1:5000", localSizeKnown: true}, ""},
		{"torchrun", map[string]string{"RANK": "1", "WORLD_SIZE": "3", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", EnvJobKey: key},
			launchEnv{source: "torchrun", rank: 1, size: 3, localRank: 1, localSize: 1, rendezvous: "127.0.0.1:29500", hostRendezvous: true}, ""},
		{"mpirun", map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", EnvRendezvousAddr: "h:1", EnvJobKey: key},
			launchEnv{source: "mpirun", rank: 0, size: 2, localRank: 0, localSize: 1, rendezvous: "h:1", hostRendezvous: true}, ""},
		{"slurm", map[string]string{"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", EnvRendezvousAddr: "h:1", EnvJobKey: key},
			launchEnv{source: "slurm", rank: 3, size: 4, localRank: 1, localSize: 1, rendezvous: "h:1", hostRendezvous: true}, ""},
		{"no key", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}, launchEnv{}, "no job key"},
		{"no rendezvous", map[string]string{"RANK": "0", "WORLD_SIZE": "2", EnvJobKey: key}, launchEnv{}, "no rendezvous address"},
		{"bad rank", map[string]string{EnvRank: "4", EnvSize: "4"}, launchEnv{}, "rank 4 is not within a job of size 4"},
		{"not a number", map[string]string{EnvRank: "x", EnvSize: "4"}, launchEnv{}, "not an integer"},
		{"short key", map[string]string{EnvRank: "0", EnvSize: "2", EnvRendezvous: "a:1", EnvJobKey: "abcd"}, launchEnv{}, "at least 32 hex digits"},
	} {
		got, err := readEnv(env(tc.vars))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: err = %v, want %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		got.jobKey = nil
		if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", tc.want) {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
	for in, want := range map[string]time.Duration{"90": 90 * time.Second, "1.5": 1500 * time.Millisecond, "2m": 2 * time.Minute} {
		if got, err := parseTimeout(in); err != nil || got != want {
			t.Errorf("parseTimeout(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"0", "-3", "soon"} {
		if _, err := parseTimeout(in); err == nil {
			t.Errorf("parseTimeout(%q) accepted", in)
		}
	}
}

// StartLocal refuses a job without ranks, and a bad option fails every
// rank's Init and leaves nothing running.
func TestStartLocalErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := StartLocal(ctx, 0); err == nil || !strings.Contains(err.Error(), "at least one rank") {
		t.Fatalf("StartLocal(0): %v", err)
	}
	_, err := StartLocal(ctx, 2, WithDataPlane("carrier-pigeon"))
	if err == nil || !strings.Contains(err.Error(), "carrier-pigeon") {
		t.Fatalf("bad data plane: %v", err)
	}
	t.Log(err)
}

// TestWithCallTimeout: a call made with WithCallTimeout waits for a rank
// that arrives after the collective timeout; the same call without it fails
// naming the timeout. The late rank is held back by a channel the test
// closes only after the others' plain call has failed, so the first part
// cannot pass by luck.
func TestWithCallTimeout(t *testing.T) {
	// The collective timeout also bounds each step of joining the job: at
	// 300 ms the ranks' libp2p dial to the rendezvous timed out on a CI
	// machine busy with other packages' -race tests.
	const bound = time.Second
	comms := newJob(t, 3, WithTimeout(bound))
	late := make(chan struct{})
	errs := onEach(comms, func(c *Comm) error {
		buf := []int64{int64(c.Rank() + 1)}
		ctx := WithCallTimeout(context.Background(), time.Minute)
		if c.Rank() == 2 {
			<-late
		} else if c.Rank() == 0 {
			// Rank 0 releases rank 2 once it has itself waited longer
			// than the collective timeout inside the long call.
			go func() { time.Sleep(3 * bound); close(late) }()
		}
		if err := c.Allreduce(ctx, buf, Sum); err != nil {
			return err
		}
		if buf[0] != 6 {
			return fmt.Errorf("rank %d: sum %d, want 6", c.Rank(), buf[0])
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	// Without it, the same late arrival fails the call on the waiting ranks.
	comms = newJob(t, 2, WithTimeout(bound))
	release := make(chan struct{})
	errs = onEach(comms, func(c *Comm) error {
		buf := []int64{1}
		if c.Rank() == 1 {
			<-release
			return nil
		}
		defer close(release)
		return c.Allreduce(context.Background(), buf, Sum)
	})
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "collective timeout (set by WithTimeout or GORUN_TIMEOUT)") {
		t.Fatalf("rank 0: %v, want the collective timeout", errs[0])
	}
}

// TestAbortEndsRunningCall: when the job is aborted (the Comm's life ends,
// as on an abort from another rank), a collective that is running, here
// waiting for a rank that never calls it over links that stay up, ends at
// once with the abort's cause rather than at its timeout.
func TestAbortEndsRunningCall(t *testing.T) {
	comms := newJob(t, 2, WithTimeout(10*time.Minute))
	c := comms[0]
	res := make(chan error, 1)
	go func() { res <- c.Allreduce(context.Background(), []float32{1, 2, 3}, Sum) }()
	guard := time.After(30 * time.Second) // against a hang only: the timeout is 10 minutes
	running := func() bool {
		c.callMu.Lock()
		defer c.callMu.Unlock()
		return c.callCancel != nil
	}
	for !running() {
		select {
		case err := <-res:
			t.Fatalf("the allreduce ended before rank 1 called it: %v", err)
		case <-guard:
			t.Fatal("the allreduce never started")
		default:
			runtime.Gosched()
		}
	}
	abort := errors.New("test: the job was aborted")
	c.cancel(abort)
	select {
	case err := <-res:
		if !errors.Is(err, abort) {
			t.Fatalf("allreduce: %v, want the abort's cause", err)
		}
	case <-guard:
		t.Fatal("the running allreduce did not end when the job was aborted")
	}
}
