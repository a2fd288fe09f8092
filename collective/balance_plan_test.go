package collective

import (
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"
)

// The planner's shares, against hand-computed splits: proportional to the
// weights, summing to the batch, at least one per rank (rank 0 included
// when it is the slow one), even when nothing is known.
func TestPlanShares(t *testing.T) {
	for _, tc := range []struct {
		n       int
		weights []int64
		want    []int
	}{
		{64, []int64{1000, 1000, 1000, 1000}, []int{16, 16, 16, 16}},
		// Two fast, one at half speed, one at 0.38 of the fastest: 22.2,
		// 22.2, 11.1 and 8.4 samples; the sample left after rounding down
		// goes where it finishes soonest (23/1000 before 9/380).
		{64, []int64{1000, 1000, 500, 380}, []int{23, 22, 11, 8}},
		// Rank 0 is the slow one: it keeps its share of the work.
		{64, []int64{250, 1000, 1000, 1000}, []int{5, 20, 20, 19}},
		// Far slower than the rest: still one sample.
		{64, []int64{1, 1000, 1000, 1000}, []int{1, 21, 21, 21}},
		{10, []int64{1000, 1, 1}, []int{8, 1, 1}},
		// Unknown weights (a joiner) count as the median of the known.
		// (The lower of the two middle ones, 500.)
		{60, []int64{1000, 0, 500}, []int{30, 15, 15}},
		// Nothing known, or fewer samples than ranks: the even split.
		{10, []int64{0, 0, 0}, []int{3, 3, 4}},
		{3, []int64{1000, 1, 1, 1}, []int{0, 1, 1, 1}},
		{1, []int64{5}, []int{1}},
		{7, nil, nil},
	} {
		got := PlanShares(tc.n, tc.weights)
		if !slices.Equal(got, tc.want) {
			t.Errorf("PlanShares(%d, %v) = %v, want %v", tc.n, tc.weights, got, tc.want)
		}
	}
}

// For random weights, the shares sum to the batch, give every rank at
// least one sample, and make the slowest rank's time as short as any split
// of whole samples can (checked against every split, for small batches).
func TestPlanSharesOptimal(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 1))
	for trial := range 300 {
		size := 1 + rng.IntN(4)
		n := size + rng.IntN(12)
		w := make([]int64, size)
		for i := range w {
			w[i] = 1 + rng.Int64N(5000)
		}
		got := PlanShares(n, w)
		sum := 0
		for _, s := range got {
			if s < 1 {
				t.Fatalf("trial %d: PlanShares(%d, %v) = %v: a rank without samples", trial, n, w, got)
			}
			sum += s
		}
		if sum != n {
			t.Fatalf("trial %d: PlanShares(%d, %v) = %v sums to %d", trial, n, w, got, sum)
		}
		best := bestStepTime(n, w)
		if st := stepTime(got, w); st.Cmp(best) != 0 {
			t.Fatalf("trial %d: PlanShares(%d, %v) = %v takes %v, the best split %v", trial, n, w, got, st, best)
		}
	}
}

// bestStepTime is the shortest slowest-rank time of any split of n samples
// with at least one per rank, by trying them all.
func bestStepTime(n int, w []int64) *big.Rat {
	var best *big.Rat
	shares := make([]int, len(w))
	var try func(i, left int)
	try = func(i, left int) {
		if i == len(w)-1 {
			shares[i] = left
			if st := stepTime(shares, w); best == nil || st.Cmp(best) < 0 {
				best = st
			}
			return
		}
		for s := 1; s <= left-(len(w)-1-i); s++ {
			shares[i] = s
			try(i+1, left-s)
		}
	}
	try(0, n)
	return best
}

// The plan is a function of its inputs only: the same weights give the
// same shares however often, and ranks listed in another order get their
// own shares back (up to the ties, which go by rank).
func TestPlanSharesDeterministic(t *testing.T) {
	w := []int64{1234567, 987654, 456789, 1234567, 333}
	first := PlanShares(1000, w)
	for range 100 {
		if got := PlanShares(1000, slices.Clone(w)); !slices.Equal(got, first) {
			t.Fatalf("PlanShares gave %v, then %v", first, got)
		}
	}
	rev := slices.Clone(w)
	slices.Reverse(rev)
	got := PlanShares(1000, rev)
	slices.Reverse(got)
	if got[1] != first[1] || got[2] != first[2] || got[4] != first[4] {
		t.Errorf("reversed ranks: %v, want %v (equal-weight ranks 0 and 3 may swap a sample)", got, first)
	}
}

// After a membership change the plan is made for the new ranks: the lost
// rank's weight is gone, a joiner's is unknown, and the shares still sum to
// the batch with one at least for each.
func TestPlanSharesAfterMembershipChange(t *testing.T) {
	// 64 at 1000, 1000, 1000, 400: 18.8, 18.8, 18.8 and 7.5 samples.
	if got, want := PlanShares(64, []int64{1000, 1000, 1000, 400}), []int{19, 19, 19, 7}; !slices.Equal(got, want) {
		t.Fatalf("before the change: %v, want %v", got, want)
	}
	// Rank 1 lost: ranks 2 and 3 are now 1 and 2.
	if got, want := PlanShares(64, []int64{1000, 1000, 400}), []int{27, 27, 10}; !slices.Equal(got, want) {
		t.Errorf("after a loss: %v, want %v", got, want)
	}
	// A joiner as rank 3 (unknown: the median, 1000).
	if got, want := PlanShares(64, []int64{1000, 1000, 400, 0}), []int{19, 19, 7, 19}; !slices.Equal(got, want) {
		t.Errorf("with a joiner: %v, want %v", got, want)
	}
}

// A re-plan is adopted only when it shortens the step by the minimum gain:
// equal ranks keep the even split, a rank at half speed moves samples.
func TestWorthReplanning(t *testing.T) {
	even := []int{16, 16, 16, 16}
	for _, tc := range []struct {
		weights []int64
		want    bool
	}{
		{[]int64{1000, 1000, 1000, 1000}, false},
		{[]int64{1000, 1030, 980, 1010}, false}, // noise
		{[]int64{1000, 1000, 1000, 850}, false}, // 15 % slower: the step only 9.7 % shorter
		{[]int64{1000, 1000, 1000, 800}, true},  // 20 % slower: the step 15 % shorter
		{[]int64{1000, 1000, 1000, 500}, true},
		{[]int64{0, 0, 0, 0}, false}, // nothing known
	} {
		planned := PlanShares(64, tc.weights)
		if got := worthReplanning(even, planned, tc.weights, 10); got != tc.want {
			t.Errorf("weights %v: planned %v, worth it %v, want %v", tc.weights, planned, got, tc.want)
		}
	}
}
