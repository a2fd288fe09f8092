package collective

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"
)

// balanceGrad is sample i's gradient, element e: values whose mean over a
// batch a one-process loop computes in float64.
func balanceGrad(i, e int) float64 { return float64(i*13+e) + 0.125*float64(i%5) - 3 }

// balancedStep runs one step of a balancing Reducer on c: this rank's
// share of the global batch whose samples are ids (taken by NextSplit's
// rule: rank r after the shares of the ranks before it), in the
// micro-batches MicroBatches lists, each gradient the mean over its
// samples. It returns the shares, the micro-batches and the result.
func balancedStep(ctx context.Context, c *Comm, red *Reducer, g []float64, ids []int) (shares, plan []int, mean []float64, err error) {
	shares = red.Shares()
	plan = red.MicroBatches()
	lo := 0
	for r := range c.Rank() {
		lo += shares[r]
	}
	for _, m := range plan {
		clear(g)
		for _, i := range ids[lo : lo+m] {
			for e := range g {
				g[e] += balanceGrad(i, e) / float64(m)
			}
		}
		lo += m
		if err := red.Backward(ctx); err != nil {
			return nil, nil, nil, err
		}
	}
	if err := red.Step(ctx); err != nil {
		return nil, nil, nil, err
	}
	return shares, plan, slices.Clone(g), nil
}

// stepSamples are the ids of step s's global batch of n samples.
func stepSamples(s, n int) []int {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = s*n + i
	}
	return ids
}

// wantMean is the mean gradient over ids, as one process computes it.
func wantMean(ids []int, dim int) []float64 {
	out := make([]float64, dim)
	for _, i := range ids {
		for e := range out {
			out[e] += balanceGrad(i, e)
		}
	}
	for e := range out {
		out[e] /= float64(len(ids))
	}
	return out
}

func closeTo(a, b []float64, tol float64) bool {
	for i := range a {
		if math.Abs(a[i]-b[i]) > tol*math.Max(1, math.Abs(b[i])) {
			return false
		}
	}
	return len(a) == len(b)
}

// atRate is a rank's compute time for a step at rate samples per second.
func atRate(rate float64) func(samples int) time.Duration {
	return func(samples int) time.Duration { return time.Duration(float64(samples) / rate * float64(time.Second)) }
}

// A balancing Reducer re-plans from the ranks' rates (here set by the
// test: ranks 2 and 3 at a half and a quarter of the others' speed) at
// every agreement, every rank to the same shares, and every step, before
// and after, leaves on every rank the exact mean over the global batch.
func TestReducerBalanceWeightedMean(t *testing.T) {
	const n, global, dim, steps = 4, 64, 5, 6
	speeds := []float64{1000, 1000, 500, 250}
	comms := memJob(t, n)
	type record struct {
		shares, plan []int
		mean         []float64
	}
	got := make([][]record, n)
	status := make([]BalanceStatus, n)
	errs := onEach(comms, func(c *Comm) error {
		red, err := NewReducer(c, ReducerOptions{GlobalBatch: global, LocalBatch: 8, Balance: BalanceOptions{Every: 2}})
		if err != nil {
			return err
		}
		red.bal.testCompute = atRate(speeds[c.Rank()])
		g := make([]float64, dim)
		if err := red.Register("g", nil, g); err != nil {
			return err
		}
		for s := range steps {
			ids := stepSamples(s, global)
			shares, plan, mean, err := balancedStep(context.Background(), c, red, g, ids)
			if err != nil {
				return fmt.Errorf("step %d: %w", s, err)
			}
			got[c.Rank()] = append(got[c.Rank()], record{shares, plan, mean})
		}
		status[c.Rank()] = red.Balance()
		return nil
	})
	mustAll(t, errs)
	// The first agreement, in the second step (the first has no start to
	// time from), moves the split from the third step on.
	balanced := PlanShares(global, []int64{1e6, 1e6, 5e5, 2.5e5})
	for s := range steps {
		want := []int{16, 16, 16, 16}
		if s >= 2 {
			want = balanced
		}
		var ids []int
		for i := range global {
			ids = append(ids, s*global+i)
		}
		ref := wantMean(ids, dim)
		for r := range n {
			rec := got[r][s]
			if !slices.Equal(rec.shares, want) {
				t.Fatalf("step %d: rank %d has shares %v, want %v", s, r, rec.shares, want)
			}
			sum := 0
			for _, m := range rec.plan {
				if m > 8 {
					t.Errorf("step %d: rank %d has a micro-batch of %d, more than the local batch", s, r, m)
				}
				sum += m
			}
			if sum != want[r] {
				t.Errorf("step %d: rank %d's micro-batches %v hold %d samples, its share is %d", s, r, rec.plan, sum, want[r])
			}
			if !closeTo(rec.mean, ref, 1e-12) {
				t.Errorf("step %d: rank %d: mean %v, want %v", s, r, rec.mean, ref)
			}
		}
	}
	if slices.Equal(balanced, []int{16, 16, 16, 16}) || balanced[3] >= balanced[2] || balanced[2] >= balanced[0] {
		t.Fatalf("the planned split %v does not follow the rates", balanced)
	}
	for r, st := range status {
		if st.Replans != 1 || !slices.Equal(st.Rates, speeds) || !slices.Equal(st.Shares, balanced) {
			t.Errorf("rank %d: Balance() = %+v, want 1 re-plan from rates %v to %v", r, st, speeds, balanced)
		}
	}
}

// A step has fixed costs besides its samples (the optimizer's update, the
// copies), so a rank's measured rate depends on its share: here each step
// takes 2 ms plus 1 ms a sample, rank 3 2 ms a sample. The plan from the
// rates at the even split moves rank 3 from 16 samples to 10 (34 ms a
// step to 22 ms); the rates at those shares then call for one more move,
// which shortens the step by only 4.5 % (to 21 ms, the best whole samples
// allow) and is taken because an uneven split is refined at a quarter of
// the gain that leaving the even split needs.
func TestReducerBalanceRefinesWithFixedCosts(t *testing.T) {
	const n, global, steps = 4, 64, 16
	perSample := []time.Duration{time.Millisecond, time.Millisecond, time.Millisecond, 2 * time.Millisecond}
	stepTime := func(shares []int) time.Duration {
		var slowest time.Duration
		for r, s := range shares {
			slowest = max(slowest, 2*time.Millisecond+time.Duration(s)*perSample[r])
		}
		return slowest
	}
	comms := memJob(t, n)
	final := make([][]int, n)
	errs := onEach(comms, func(c *Comm) error {
		red, err := NewReducer(c, ReducerOptions{GlobalBatch: global, LocalBatch: global, Balance: BalanceOptions{Every: 2}})
		if err != nil {
			return err
		}
		red.bal.testCompute = func(samples int) time.Duration {
			return 2*time.Millisecond + time.Duration(samples)*perSample[c.Rank()]
		}
		g := make([]float64, 2)
		if err := red.Register("g", nil, g); err != nil {
			return err
		}
		for s := range steps {
			ids := stepSamples(s, global)
			if _, _, _, err := balancedStep(context.Background(), c, red, g, ids); err != nil {
				return fmt.Errorf("step %d: %w", s, err)
			}
		}
		final[c.Rank()] = red.Shares()
		return nil
	})
	mustAll(t, errs)
	for r := 1; r < n; r++ {
		if !slices.Equal(final[r], final[0]) {
			t.Fatalf("rank %d ends with shares %v, rank 0 with %v", r, final[r], final[0])
		}
	}
	if got, best := stepTime(final[0]), 21*time.Millisecond; got != best {
		t.Errorf("the ranks end with shares %v, a step of %v; the best split takes %v", final[0], got, best)
	}
}

// Ranks of equal speed keep the even split, and the even path's result
// bit for bit: balancing that finds nothing to balance changes nothing.
func TestReducerBalanceEqualRanksStayEven(t *testing.T) {
	const n, global = 4, 64
	comms := memJob(t, n)
	results := make([][2][]float64, n)
	errs := onEach(comms, func(c *Comm) error {
		for i, bal := range []BalanceOptions{{}, {Every: 1}} {
			red, err := NewReducer(c, ReducerOptions{GlobalBatch: global, LocalBatch: 16, Balance: bal})
			if err != nil {
				return err
			}
			if red.bal != nil {
				red.bal.testCompute = atRate(1000 + float64(c.Rank())) // a few per mille apart
			}
			g := make([]float64, 3)
			if err := red.Register("g", nil, g); err != nil {
				return err
			}
			for s := range 4 {
				ids := stepSamples(s, global)
				shares, _, mean, err := balancedStep(context.Background(), c, red, g, ids)
				if err != nil {
					return err
				}
				if !slices.Equal(shares, []int{16, 16, 16, 16}) {
					return fmt.Errorf("step %d: shares %v", s, shares)
				}
				results[c.Rank()][i] = append(results[c.Rank()][i], mean...)
			}
		}
		return nil
	})
	mustAll(t, errs)
	for r := range n {
		if !slices.Equal(results[r][0], results[r][1]) {
			t.Errorf("rank %d: balanced %v, plain %v", r, results[r][1], results[r][0])
		}
	}
}

// With the real clock: a rank that computes longer (it sleeps) gets fewer
// samples, and the time the others spend blocked in a collective waiting
// for it does not count as their compute (else every rank would look as
// slow as the slowest, and nothing would move).
func TestReducerBalanceMeasuresCompute(t *testing.T) {
	const n, global = 4, 64
	comms := memJob(t, n)
	final := make([][]int, n)
	errs := onEach(comms, func(c *Comm) error {
		ctx := context.Background()
		red, err := NewReducer(c, ReducerOptions{GlobalBatch: global, LocalBatch: global, Balance: BalanceOptions{Every: 4}})
		if err != nil {
			return err
		}
		g := make([]float64, 3)
		if err := red.Register("g", nil, g); err != nil {
			return err
		}
		for s := range 24 {
			// An evaluation between the steps: the others wait in it for
			// rank 3, which computes 20 ms per step before it.
			if c.Rank() == 3 {
				time.Sleep(20 * time.Millisecond)
			}
			if err := c.Barrier(ctx); err != nil {
				return err
			}
			ids := stepSamples(s, global)
			shares, _, _, err := balancedStep(ctx, c, red, g, ids)
			if err != nil {
				return err
			}
			final[c.Rank()] = shares
		}
		return nil
	})
	mustAll(t, errs)
	for r := range n {
		if !slices.Equal(final[r], final[0]) {
			t.Fatalf("ranks disagree: rank %d has %v, rank 0 %v", r, final[r], final[0])
		}
	}
	if s := final[0]; s[3] >= 16 || s[3] < 1 || s[0]+s[1]+s[2]+s[3] != global {
		t.Fatalf("shares %v: want fewer than 16 samples, at least 1, for the slow rank 3, and 64 in all", s)
	}
}

// NextSplit hands out every sample of an epoch once, whatever the shares
// and however often they and the number of ranks change, the short last
// batch included.
func TestElasticSamplerNextSplitExactlyOnce(t *testing.T) {
	const n = 207 // the last batch: 7 samples
	s := NewElasticSampler(n, 3)
	seen := make([]int, n)
	splits := [][]int{{5, 3, 1, 1}, {2, 2, 2, 4}, {7, 2, 1}, {1, 9}, {3, 3, 4}, {10}}
	for step := 0; !s.EpochDone(); step++ {
		shares := splits[step%len(splits)]
		total := 0
		for _, x := range shares {
			total += x
		}
		if b := s.BatchLen(total); b < total {
			// The last batch: re-planned for what is left, as a Reducer
			// does after SetGlobalBatch.
			shares = PlanShares(b, []int64{1000, 500, 250}[:min(3, b)])
		}
		cursor := s.Cursor()
		var next ElasticSampler
		for r := range shares {
			cp := *s
			part := cp.NextSplit(shares, r)
			if len(part) != shares[r] {
				t.Fatalf("step %d: rank %d got %d samples, its share is %d", step, r, len(part), shares[r])
			}
			for _, i := range part {
				seen[i]++
			}
			next = cp
		}
		if next.Cursor() != min(cursor+10, n) {
			t.Fatalf("step %d: cursor %d after a step from %d", step, next.Cursor(), cursor)
		}
		*s = next
	}
	for i, c := range seen {
		if c != 1 {
			t.Fatalf("sample %d used %d times", i, c)
		}
	}
	// The same batch as Next's when the shares are Share's.
	a, b := NewElasticSampler(n, 3), NewElasticSampler(n, 3)
	for r := range 3 {
		ca, cb := *a, *b
		if x, y := ca.Next(64, r, 3), cb.NextSplit(evenShares(64, 3), r); !slices.Equal(x, y) {
			t.Fatalf("rank %d: Next %v, NextSplit %v", r, x, y)
		}
	}
	if s.NextSplit([]int{1, 2}, 0) != nil {
		t.Fatal("NextSplit after the end of the epoch returned samples")
	}
}

// In an elastic job, a balancing Reducer goes back to the even split for
// the ranks left after a loss, re-plans from their rates at the next
// agreement, and every step, before and after, is the exact mean over its
// global batch, whose samples the sampler hands out once per epoch.
func TestReducerBalanceAfterMembershipChange(t *testing.T) {
	const global, dim = 48, 4
	tj := startToyJob(t, 4, 1, 1, 1)
	ctx := tj.ctx
	// The speed of each member by its starting rank: the one lost is
	// rank 1, so the slow one becomes rank 2 of 3.
	speeds := []float64{1000, 1000, 1000, 300}
	reds := make([]*Reducer, 4)
	grads := make([][]float64, 4)
	samplers := make([]*ElasticSampler, 4)
	for i, c := range tj.j.Comms {
		var err error
		if reds[i], err = NewReducer(c, ReducerOptions{GlobalBatch: global, LocalBatch: 10, Balance: BalanceOptions{Every: 2}}); err != nil {
			t.Fatal(err)
		}
		reds[i].bal.testCompute = atRate(speeds[i])
		grads[i] = make([]float64, dim)
		if err := reds[i].Register("g", nil, grads[i]); err != nil {
			t.Fatal(err)
		}
		samplers[i] = NewElasticSampler(10*global, 5)
	}
	var mu sync.Mutex
	used := map[int]int{}
	type stepKey struct{ epoch, step int }
	shares := map[stepKey][][]int{}
	means := map[stepKey][][]float64{}
	batches := map[stepKey][]int{}
	// run steps [from, to) on member i (its Comm c).
	run := func(i int, c *Comm, from, to int) error {
		red, s := reds[i], samplers[i]
		for step := from; step < to; step++ {
			sh := red.Shares()
			if st := red.Balance(); step == 4 && (st.Rates != nil || st.Replans != 2) {
				// The plan of the 4 ranks is gone with the change (a
				// joiner in the lost rank's place must not inherit its
				// rate): even, a second change of the split.
				return fmt.Errorf("after the change: %+v, want the even split without rates, after 2 re-plans", st)
			}
			whole := *s
			batch := whole.NextSplit([]int{global}, 0) // the step's global batch, for the reference
			mine := s.NextSplit(sh, c.Rank())
			_, plan, mean, err := balancedStep(ctx, c, red, grads[i], batchWithPart(batch, sh, c.Rank(), mine))
			if err != nil {
				return err
			}
			if sum := sumInts(plan); sum != len(mine) {
				return fmt.Errorf("step %d: micro-batches %v for a part of %d samples", step, plan, len(mine))
			}
			k := stepKey{c.Epoch(), step}
			mu.Lock()
			shares[k] = append(shares[k], sh)
			means[k] = append(means[k], mean)
			batches[k] = batch
			for _, j := range mine {
				used[j]++
			}
			mu.Unlock()
		}
		return nil
	}
	mustAll(t, onEach(tj.j.Comms, func(c *Comm) error { return run(c.Rank(), c, 0, 4) }))
	tj.j.Crash(tj.j.Comms[1])
	survivors := []int{0, 2, 3}
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for k, i := range survivors {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := tj.j.Comms[i]
			if err := c.Barrier(ctx); !isMembershipChange(err) {
				errs[k] = fmt.Errorf("barrier after a crash: %v, want a membership change", err)
				return
			}
			if _, _, err := c.reconfigure(ctx); err != nil {
				errs[k] = err
				return
			}
			errs[k] = run(i, c, 4, 10)
		}()
	}
	wg.Wait()
	mustAll(t, errs)

	before := PlanShares(global, []int64{1e6, 1e6, 1e6, 3e5})
	after := PlanShares(global, []int64{1e6, 1e6, 3e5})
	for step := range 10 {
		epoch, want := 0, []int{12, 12, 12, 12}
		switch {
		case step >= 2 && step < 4:
			want = before
		case step >= 4:
			epoch, want = 1, []int{16, 16, 16}
			if step >= 6 {
				want = after
			}
		}
		k := stepKey{epoch, step}
		if len(shares[k]) != len(want) {
			t.Fatalf("step %d: %d ranks took part, want %d", step, len(shares[k]), len(want))
		}
		ref := wantMean(batches[k], dim)
		for r := range shares[k] {
			if !slices.Equal(shares[k][r], want) {
				t.Fatalf("step %d: shares %v, want %v", step, shares[k][r], want)
			}
			if !closeTo(means[k][r], ref, 1e-12) {
				t.Errorf("step %d: mean %v, want %v", step, means[k][r], ref)
			}
		}
	}
	if slices.Equal(after, []int{16, 16, 16}) || slices.Equal(before, []int{12, 12, 12, 12}) {
		t.Fatalf("the plans %v and %v do not follow the rates", before, after)
	}
	if len(used) != 10*global {
		t.Fatalf("%d samples used, want %d", len(used), 10*global)
	}
	for j, c := range used {
		if c != 1 {
			t.Fatalf("sample %d used %d times", j, c)
		}
	}
}

// batchWithPart is the ids balancedStep takes this rank's part from: the
// step's batch, whose part for rank under shares must be mine.
func batchWithPart(batch, shares []int, rank int, mine []int) []int {
	lo := sumInts(shares[:rank])
	if !slices.Equal(batch[lo:lo+shares[rank]], mine) {
		panic("NextSplit's part is not the batch's slice")
	}
	return batch
}

func sumInts(v []int) int {
	s := 0
	for _, x := range v {
		s += x
	}
	return s
}
