package collective

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/gorun/gorun/ring"
)

// The synthetic model: a linear layer pred = W x + bias with outputs out,
// inputs dim, and loss 0.5*|pred - y|^2 averaged over the batch. Sample s is
// generated from s alone, so any partition of the samples over ranks and
// micro-batches sees the same data.
const (
	modelIn  = 37
	modelOut = 3
)

func sample(s int) (x []float64, y []float64) {
	rng := rand.New(rand.NewPCG(uint64(s), 99))
	x = make([]float64, modelIn)
	for i := range x {
		x[i] = rng.Float64()*2 - 1
	}
	y = make([]float64, modelOut)
	for i := range y {
		y[i] = rng.Float64()*2 - 1
	}
	return x, y
}

// initialWeights are the parameters every test starts from.
func initialWeights() ([]float64, []float64) {
	rng := rand.New(rand.NewPCG(7, 7))
	w := make([]float64, modelOut*modelIn)
	for i := range w {
		w[i] = rng.Float64() - 0.5
	}
	b := []float64{0.1, -0.2, 0.3}
	return w, b
}

// gradient returns the mean gradient (dW, dbias) over the given samples.
func gradient(w, b []float64, samples []int) ([]float64, []float64) {
	dw := make([]float64, len(w))
	db := make([]float64, len(b))
	for _, s := range samples {
		x, y := sample(s)
		for o := range modelOut {
			pred := b[o]
			for i := range modelIn {
				pred += w[o*modelIn+i] * x[i]
			}
			e := pred - y[o]
			db[o] += e
			for i := range modelIn {
				dw[o*modelIn+i] += e * x[i]
			}
		}
	}
	for i := range dw {
		dw[i] /= float64(len(samples))
	}
	for i := range db {
		db[i] /= float64(len(samples))
	}
	return dw, db
}

// runAggregation runs one optimizer step of the linear model on every rank:
// k micro-batches of localBatch samples each, and returns rank 0's averaged
// gradients, after checking that all ranks hold the same ones.
func runAggregation(t *testing.T, comms []*Comm, o ReducerOptions, localBatch int, perTensor bool) ([]float32, []float64) {
	t.Helper()
	ctx := context.Background()
	n := len(comms)
	type result struct {
		dw []float32
		db []float64
	}
	res := make([]result, n)
	mustAll(t, onEach(comms, func(c *Comm) error {
		r, err := NewReducer(c, o)
		if err != nil {
			return err
		}
		w64, b := initialWeights()
		w32 := make([]float32, len(w64))
		for i, v := range w64 {
			w32[i] = float32(v)
		}
		W := tensor.New(tensor.WithShape(modelOut, modelIn), tensor.WithBacking(w32))
		dW := tensor.New(tensor.WithShape(modelOut, modelIn), tensor.Of(tensor.Float32))
		db := make([]float64, modelOut)
		// Registered in backward order: bias gradient first, then W, then
		// some padding tensors to get several buckets.
		if err := r.Register("bias", b, db); err != nil {
			return err
		}
		if err := r.Register("W", W, dW); err != nil {
			return err
		}
		pad := make([]float32, 5)
		if err := r.Register("pad", nil, pad); err != nil {
			return err
		}
		k := r.BackwardPassesPerStep()
		for m := range k {
			var idx []int
			for j := range localBatch {
				idx = append(idx, (m*n+c.Rank())*localBatch+j)
			}
			gw, gb := gradient(w64, b, idx)
			dWs := dW.Data().([]float32)
			for i, v := range gw {
				dWs[i] = float32(v)
			}
			copy(db, gb)
			for i := range pad {
				pad[i] = float32(c.Rank())
			}
			if perTensor {
				for _, name := range []string{"bias", "W", "pad"} {
					if err := r.GradReady(ctx, name); err != nil {
						return err
					}
				}
			} else if err := r.Backward(ctx); err != nil {
				return err
			}
		}
		if err := r.Step(ctx); err != nil {
			return err
		}
		want := float32(n-1) / 2 // mean of the ranks
		for _, v := range pad {
			if math.Abs(float64(v-want)) > 1e-6 {
				return fmt.Errorf("rank %d: pad = %v, want %v", c.Rank(), v, want)
			}
		}
		res[c.Rank()] = result{append([]float32(nil), dW.Data().([]float32)...), append([]float64(nil), db...)}
		return nil
	}))
	for rk := 1; rk < n; rk++ {
		for i := range res[0].dw {
			if res[rk].dw[i] != res[0].dw[i] {
				t.Fatalf("rank %d dW[%d] = %v, rank 0 has %v", rk, i, res[rk].dw[i], res[0].dw[i])
			}
		}
	}
	return res[0].dw, res[0].db
}

func checkLargeBatch(t *testing.T, label string, dw []float32, db []float64, total int) {
	t.Helper()
	w, b := initialWeights()
	all := make([]int, total)
	for i := range all {
		all[i] = i
	}
	ww, wb := gradient(w, b, all)
	for i := range ww {
		if math.Abs(float64(dw[i])-ww[i]) > 1e-5 {
			t.Fatalf("%s: dW[%d] = %v, large batch gives %v", label, i, dw[i], ww[i])
		}
	}
	for i := range wb {
		if math.Abs(db[i]-wb[i]) > 1e-12 {
			t.Fatalf("%s: dbias[%d] = %v, large batch gives %v", label, i, db[i], wb[i])
		}
	}
}

// N ranks × k micro-batches × b samples give the gradient of one process
// on all N·k·b samples, fused or not, handed over one by one or at once.
func TestReducerAggregationEqualsLargeBatch(t *testing.T) {
	comms := newJob(t, 3)
	for _, tc := range []struct {
		k, fusion int
		perTensor bool
	}{{1, 0, false}, {2, 0, true}, {3, 64, false}, {2, -1, true}, {1, -1, true}} {
		label := fmt.Sprintf("np=3 k=%d b=4 fusion=%d", tc.k, tc.fusion)
		dw, db := runAggregation(t, comms, ReducerOptions{BackwardPassesPerStep: tc.k, FusionThreshold: tc.fusion}, 4, tc.perTensor)
		checkLargeBatch(t, label, dw, db, 3*tc.k*4)
	}
}

// The global batch stays fixed when the world size changes: k is derived,
// and an impossible combination is refused with the reason.
func TestReducerGlobalBatchAtAnotherWorldSize(t *testing.T) {
	const global, local = 24, 4
	for _, n := range []int{2, 3} {
		comms := newJob(t, n)
		r, err := NewReducer(comms[0], ReducerOptions{GlobalBatch: global, LocalBatch: local})
		if err != nil {
			t.Fatal(err)
		}
		if want := global / (n * local); r.BackwardPassesPerStep() != want {
			t.Fatalf("np=%d: k = %d, want %d", n, r.BackwardPassesPerStep(), want)
		}
		dw, db := runAggregation(t, comms, ReducerOptions{GlobalBatch: global, LocalBatch: local}, local, false)
		checkLargeBatch(t, fmt.Sprintf("np=%d global=%d", n, global), dw, db, global)

		_, err = NewReducer(comms[0], ReducerOptions{GlobalBatch: 64, LocalBatch: 8 * n / 2})
		if n == 3 {
			if err == nil || !strings.Contains(err.Error(), "global batch 64 is not divisible by 3 ranks × local batch 12") {
				t.Fatalf("np=3: got %v, want a divisibility error", err)
			}
		}
	}
	if _, err := PassesPerStep(64, 3, 8); err == nil || !strings.Contains(err.Error(), "global batch 64 is not divisible by 3 ranks × local batch 8") {
		t.Fatalf("got %v", err)
	}
	if k, err := PassesPerStep(64, 4, 8); k != 2 || err != nil {
		t.Fatalf("PassesPerStep(64, 4, 8) = %d, %v", k, err)
	}
	if _, err := NewReducer(commOfSize(2), ReducerOptions{GlobalBatch: 32, LocalBatch: 8, BackwardPassesPerStep: 3}); err == nil || !strings.Contains(err.Error(), "contradicts") {
		t.Fatalf("got %v", err)
	}
}

// Fusion changes how many collectives run, not the results.
func TestFusionEqualsUnfused(t *testing.T) {
	ctx := context.Background()
	comms := newJob(t, 3)
	const tensors = 40
	sizes := make([]int, tensors)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range sizes {
		sizes[i] = 1 + rng.IntN(300)
	}
	grads := func(rank int) [][]float32 {
		out := make([][]float32, tensors)
		rng := rand.New(rand.NewPCG(uint64(rank), 5))
		for i, s := range sizes {
			out[i] = make([]float32, s)
			for j := range out[i] {
				out[i][j] = float32(rng.NormFloat64())
			}
		}
		return out
	}
	results := map[int][][]float32{}
	buckets := map[int]int{}
	for _, th := range []int{-1, 1024, 0} {
		res := make([][][]float32, 3)
		mustAll(t, onEach(comms, func(c *Comm) error {
			r, err := NewReducer(c, ReducerOptions{FusionThreshold: th})
			if err != nil {
				return err
			}
			g := grads(c.Rank())
			for i := range g {
				if err := r.Register(fmt.Sprint("g", i), nil, g[i]); err != nil {
					return err
				}
			}
			for step := range 2 {
				g2 := grads(c.Rank())
				for i := range g {
					copy(g[i], g2[i])
				}
				for i := tensors - 1; i >= 0; i-- { // any order of readiness works
					if err := r.GradReady(ctx, fmt.Sprint("g", i)); err != nil {
						return fmt.Errorf("step %d: %w", step, err)
					}
				}
				if err := r.Step(ctx); err != nil {
					return err
				}
			}
			res[c.Rank()] = g
			if c.Rank() == 0 {
				buckets[th] = r.Buckets()
			}
			return nil
		}))
		results[th] = res[0]
	}
	if buckets[-1] != tensors || buckets[0] != 1 || buckets[1024] <= 1 || buckets[1024] >= tensors {
		t.Fatalf("buckets per threshold: %v", buckets)
	}
	// The reference: plain allreduces of the same data.
	ref := make([][][]float32, 3)
	mustAll(t, onEach(comms, func(c *Comm) error {
		g := grads(c.Rank())
		for i := range g {
			if err := c.Allreduce(ctx, g[i], Avg); err != nil {
				return err
			}
		}
		ref[c.Rank()] = g
		return nil
	}))
	want := ref[0]
	for th, got := range results {
		for i := range got {
			for j := range got[i] {
				if d := math.Abs(float64(got[i][j] - want[i][j])); d > 1e-6 {
					t.Fatalf("fusion %d: tensor %d[%d] = %v, want %v", th, i, j, got[i][j], want[i][j])
				}
			}
		}
	}
}

func TestReducerMisuse(t *testing.T) {
	ctx := context.Background()
	comms := newJob(t, 1)
	r, err := NewReducer(comms[0], ReducerOptions{BackwardPassesPerStep: 2})
	if err != nil {
		t.Fatal(err)
	}
	a, b := make([]float32, 3), make([]float64, 2)
	if err := r.Register("a", nil, a); err != nil {
		t.Fatal(err)
	}
	if err := r.Register("a", nil, b); err == nil {
		t.Fatal("duplicate name accepted")
	}
	if err := r.Register("i", nil, []int32{1}); err == nil {
		t.Fatal("int32 gradient accepted")
	}
	if err := r.Register("b", make([]float64, 3), b); err == nil {
		t.Fatal("parameter of another length accepted")
	}
	if err := r.Register("b", nil, b); err != nil {
		t.Fatal(err)
	}
	if err := r.GradReady(ctx, "nope"); err == nil {
		t.Fatal("unknown name accepted")
	}
	if err := r.Register("late", nil, make([]float32, 1)); err == nil {
		t.Fatal("Register after Seal accepted")
	}
	if err := r.GradReady(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := r.GradReady(ctx, "a"); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("got %v", err)
	}
	if err := r.Step(ctx); err == nil || !strings.Contains(err.Error(), `Step after 0 of 2 micro-batches; micro-batch 1 still lacks "b"`) {
		t.Fatalf("got %v", err)
	}
	for range 2 {
		if err := r.Backward(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Backward(ctx); err == nil {
		t.Fatal("third micro-batch of k=2 accepted")
	}
	if err := r.Step(ctx); err != nil {
		t.Fatal(err)
	}
	rc, _ := NewReducer(comms[0], ReducerOptions{Compression: func(string, int) string { return "zip" }})
	if err := rc.Register("x", nil, make([]float32, 4)); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Fatalf("unknown codec: got %v", err)
	}
}

// Ranks that registered different tensors get, on every rank, an error
// listing the differences.
func TestReducerTopologyMismatch(t *testing.T) {
	ctx := context.Background()
	comms := newJob(t, 3)
	errs := onEach(comms, func(c *Comm) error {
		r, err := NewReducer(c, ReducerOptions{})
		if err != nil {
			return err
		}
		r.Register("emb", nil, make([]float32, 10))
		shape := []int{4, 5}
		if c.Rank() == 1 {
			shape = []int{5, 4}
		}
		r.Register("fc.w", nil, tensor.New(tensor.WithShape(shape...), tensor.Of(tensor.Float32)))
		r.Register("fc.b", nil, make([]float32, 4))
		if c.Rank() == 2 {
			r.Register("extra", nil, make([]float64, 2))
		}
		return r.Backward(ctx)
	})
	for rk, err := range errs {
		if err == nil {
			t.Fatalf("rank %d: no error", rk)
		}
		msg := err.Error()
		for _, want := range []string{
			`rank 1: tensor #1 is "fc.w" grad float32[5 4] param -; rank 0 has "fc.w" grad float32[4 5] param -`,
			`rank 2: tensor #3 is "extra" grad float64[2] param -; rank 0 registered only 3`,
			`rank 2 registered 4 tensors, rank 0 registered 3`,
		} {
			if !strings.Contains(msg, want) {
				t.Fatalf("rank %d: error %q lacks %q", rk, msg, want)
			}
		}
		if rk == 0 {
			t.Log(msg)
		}
	}
}

// BroadcastParameters makes replicas identical; CheckConsistency names the
// rank and the first tensor that diverged.
func TestReducerConsistency(t *testing.T) {
	ctx := context.Background()
	comms := newJob(t, 3)
	params := make([][]float32, 3)
	errs := onEach(comms, func(c *Comm) error {
		r, err := NewReducer(c, ReducerOptions{})
		if err != nil {
			return err
		}
		w := make([]float32, 8)
		b := tensor.New(tensor.WithShape(2, 2), tensor.Of(tensor.Float64))
		for i := range w {
			w[i] = float32(c.Rank()*100 + i) // replicas start different
		}
		params[c.Rank()] = w
		r.Register("w", w, make([]float32, 8))
		r.Register("b", b, tensor.New(tensor.WithShape(2, 2), tensor.Of(tensor.Float64)))
		if err := r.CheckConsistency(ctx); err == nil {
			return fmt.Errorf("rank %d: replicas differ but CheckConsistency passed", c.Rank())
		}
		if err := r.BroadcastParameters(ctx, 1); err != nil {
			return err
		}
		if err := r.CheckConsistency(ctx); err != nil {
			return err
		}
		if c.Rank() == 2 {
			b.Data().([]float64)[3] = 1e-9
		}
		return r.CheckConsistency(ctx)
	})
	for _, p := range params {
		if p[0] != 100 {
			t.Fatalf("after broadcast from rank 1: %v", p)
		}
	}
	for rk, err := range errs {
		if err == nil {
			t.Fatalf("rank %d: no error", rk)
		}
		msg := err.Error()
		if !strings.Contains(msg, `first differing tensor "b" (#1): ranks 0,1 hash`) || !strings.Contains(msg, `rank 2 hash`) ||
			!strings.Contains(msg, `ranks outside the majority: rank 2 (1 tensors, first "b")`) {
			t.Fatalf("rank %d: %v", rk, err)
		}
		if rk == 0 {
			t.Log(msg)
		}
	}
}

func TestReducerFusionThresholdFromEnvironment(t *testing.T) {
	t.Setenv(EnvFusionThreshold, "4096")
	r, err := NewReducer(commOfSize(1), ReducerOptions{})
	if err != nil || r.FusionThreshold() != 4096 {
		t.Fatalf("threshold %d, %v", r.FusionThreshold(), err)
	}
	if r, _ := NewReducer(commOfSize(1), ReducerOptions{FusionThreshold: 10}); r.FusionThreshold() != 10 {
		t.Fatalf("option did not win over the environment: %d", r.FusionThreshold())
	}
	t.Setenv(EnvFusionThreshold, "")
	if r, _ := NewReducer(commOfSize(1), ReducerOptions{}); r.FusionThreshold() != DefaultFusionThreshold {
		t.Fatalf("default threshold %d", r.FusionThreshold())
	}
	t.Setenv(EnvFusionThreshold, "64MB")
	if _, err := NewReducer(commOfSize(1), ReducerOptions{}); err == nil || !strings.Contains(err.Error(), EnvFusionThreshold) {
		t.Fatalf("got %v", err)
	}
}

// A compression policy applies per gradient: large gradients travel int8
// (with error feedback kept under their bucket's name across steps), small
// ones uncompressed, and the two never share a fusion buffer.
func TestReducerCompressionPerGradient(t *testing.T) {
	ctx := context.Background()
	comms := newJob(t, 3)
	if _, ok := comms[0].node.Transport().(ring.Mesh); !ok {
		t.Log("the libp2p transport is not a ring.Mesh yet: compressed allreduce runs over in-memory transports")
		comms = memJob(t, 3)
	}
	sizes := map[string]int{"big1": 40000, "small": 100, "big2": 30000}
	order := []string{"big1", "small", "big2"}
	fill := func(rank, step int, name string, g []float32) {
		rng := rand.New(rand.NewPCG(uint64(rank*100+step), uint64(len(name)*7+len(g))))
		for i := range g {
			g[i] = float32(rng.NormFloat64())
		}
	}
	got := make([]map[string][]float32, 3)
	var names []string
	mustAll(t, onEach(comms, func(c *Comm) error {
		r, err := NewReducer(c, ReducerOptions{Compression: CompressLarge("int8", 64<<10)})
		if err != nil {
			return err
		}
		g := map[string][]float32{}
		for _, name := range order {
			g[name] = make([]float32, sizes[name])
			if err := r.Register(name, nil, g[name]); err != nil {
				return err
			}
		}
		for step := range 3 {
			for _, name := range order {
				fill(c.Rank(), step, name, g[name])
				if err := r.GradReady(ctx, name); err != nil {
					return err
				}
			}
			if err := r.Step(ctx); err != nil {
				return err
			}
		}
		got[c.Rank()] = g
		if c.Rank() == 0 {
			names = r.BucketNames()
		}
		return nil
	}))
	if strings.Join(names, ",") != "big1,small,big2" {
		t.Fatalf("buckets %q, want one per codec run", names)
	}
	for _, name := range order {
		exact := make([]float64, sizes[name])
		for rank := range 3 {
			g := make([]float32, sizes[name])
			fill(rank, 2, name, g)
			for i, v := range g {
				exact[i] += float64(v) / 3
			}
		}
		e := relRMSE(got[0][name], exact)
		if name == "small" && e > 1e-6 || e > 0.02 {
			t.Fatalf("%s: relative RMS error %.5f", name, e)
		}
		t.Logf("%s: relative RMS error %.5f", name, e)
	}
	_, per := comms[0].CompressionStats()
	if per["big1"].Calls != 3 || per["big2"].Calls != 3 || per["small"].Calls != 0 || per["big1"].Ratio() > 0.3 {
		t.Fatalf("per-tensor compression stats: %+v", per)
	}
}

func relRMSE(got []float32, want []float64) float64 {
	var num, den float64
	for i, w := range want {
		d := float64(got[i]) - w
		num += d * d
		den += w * w
	}
	return math.Sqrt(num / den)
}

// commOfSize is a Comm that only knows its size, for option checks.
func commOfSize(n int) *Comm {
	c := &Comm{}
	c.view.Store(&commView{size: n, ctx: context.Background()})
	return c
}

// memJob builds n Comms over in-memory transports (ring.NewMemRing), for
// features the libp2p transport lacks.
func memJob(t testing.TB, n int) []*Comm {
	ts := ring.NewMemRing(n)
	comms := make([]*Comm, n)
	for r := range n {
		c := &Comm{localRank: r, localSize: n, timeout: 20 * time.Second, logf: t.Logf, warnf: t.Logf,
			queue: make(chan *Handle, 1024), stopped: make(chan struct{}), drained: make(chan struct{}, 1), stallThreshold: -1}
		c.life, c.cancel = context.WithCancelCause(context.Background())
		var err error
		if c.compression, err = newCompressionState(compressionConfig{}, func(string) string { return "" }); err != nil {
			t.Fatal(err)
		}
		rg, err := ring.New(ring.Config{Rank: r, Size: n}, ts[r])
		if err != nil {
			t.Fatal(err)
		}
		c.view.Store(&commView{rank: r, size: n, ring: rg, ctx: context.Background()})
		go c.worker()
		comms[r] = c
	}
	t.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	return comms
}

// A global batch smaller than Size (a short last batch): the ranks with an
// empty share still take part, and their gradient buffers, whatever they
// hold (a mean over 0 samples is 0/0 = NaN in most frameworks), count as
// zeros: every rank ends with the mean over the samples that exist.
func TestReducerEmptyShare(t *testing.T) {
	const n, local = 3, 2
	comms := memJob(t, n)
	sampleGrad := func(i, e int) float64 { return float64(i*5+e) + 0.5 }
	steps := []int{6, 2, 1, 5} // shares (2,2,2), (0,1,1), (0,0,1), (1,2,2)
	got := make([][][]float64, len(steps))
	for s := range got {
		got[s] = make([][]float64, n)
	}
	errs := onEach(comms, func(c *Comm) error {
		red, err := NewReducer(c, ReducerOptions{GlobalBatch: steps[0], LocalBatch: local, UnevenSplit: true})
		if err != nil {
			return err
		}
		gw, gb := make([]float32, 3), make([]float64, 2)
		if err := red.Register("w", nil, gw); err != nil {
			return err
		}
		if err := red.Register("b", nil, gb); err != nil {
			return err
		}
		for s, global := range steps {
			if err := red.SetGlobalBatch(global); err != nil {
				return err
			}
			lo, _ := Share(global, c.Rank(), c.Size())
			for _, m := range red.MicroBatches() {
				var mean [5]float64
				for e := range mean {
					mean[e] = math.NaN() // what 0/0 gives when m == 0
					if m > 0 {
						mean[e] = 0
					}
				}
				for i := lo; i < lo+m; i++ {
					for e := range mean {
						mean[e] += sampleGrad(i, e) / float64(m)
					}
				}
				lo += m
				for e := range gw {
					gw[e] = float32(mean[e])
				}
				copy(gb, mean[3:])
				if err := red.Backward(context.Background()); err != nil {
					return err
				}
			}
			if err := red.Step(context.Background()); err != nil {
				return err
			}
			for _, x := range gw {
				got[s][c.Rank()] = append(got[s][c.Rank()], float64(x))
			}
			got[s][c.Rank()] = append(got[s][c.Rank()], gb...)
		}
		return nil
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", i, err)
		}
	}
	for s, global := range steps {
		var want [5]float64
		for i := range global {
			for e := range want {
				want[e] += sampleGrad(i, e) / float64(global)
			}
		}
		for r := range n {
			for e := range want {
				tol := 1e-12
				if e < 3 {
					tol = 1e-5 * math.Abs(want[e]) // float32
				}
				if d := got[s][r][e] - want[e]; !(math.Abs(d) <= tol) {
					t.Fatalf("global batch %d: rank %d: mean %v, want %v", global, r, got[s][r], want)
				}
			}
		}
	}
}
