package collective

import (
	"math/big"
	"math/bits"
	"slices"
)

// Load balancing, the plan: how many samples of a global batch each rank
// takes, given the ranks' throughputs. Every rank computes the plan itself
// from the same agreed inputs (an allgather of the throughputs), so the
// plan must come out the same on every rank, bit for bit, whatever its CPU:
// it uses integers only (floating-point rounding, and the fusing of a
// multiply and an add that some CPUs do, could differ between hosts), and
// breaks every tie by rank.

// PlanShares splits a global batch of n samples among len(weights) ranks
// in proportion to their weights (throughputs, in any common unit: the
// Reducer uses samples per second of compute, in thousandths), so that the
// slowest rank's time, share/weight, is as short as whole samples allow.
// Each rank gets at least one sample, rank 0 too, however slow, so that
// every rank's measurement goes on; when n is smaller than the number of
// ranks that cannot be, and the split is Share's. A weight ≤ 0 is unknown
// (a rank that joined and has not measured yet) and counts as the median
// of the known ones; with none known the split is Share's. The shares are
// contiguous parts of the batch in rank order, as Share's are.
func PlanShares(n int, weights []int64) []int {
	size := len(weights)
	if size == 0 {
		return nil
	}
	w := knownWeights(weights)
	if n < size || w == nil {
		return evenShares(n, size)
	}
	var total uint64
	for _, x := range w {
		total += uint64(x)
	}
	// Start from the proportional shares rounded down (at least one), then
	// move single samples: off the rank that would take longest while it
	// holds more than one, onto the rank that would finish soonest with
	// one more. Rounding down loses less than a sample per rank and the
	// floor of one adds less than one, so each loop runs at most size
	// times.
	shares := make([]int, size)
	sum := 0
	for i, x := range w {
		hi, lo := bits.Mul64(uint64(n), uint64(x))
		q, _ := bits.Div64(hi, lo, total) // n·x/total < n: no overflow
		shares[i] = max(1, int(q))
		sum += shares[i]
	}
	for sum > n {
		worst := -1
		for i := range shares {
			// Ties go to the highest rank, so rank 0 keeps its samples
			// longest: any fixed order would do, as long as it is fixed.
			if shares[i] > 1 && (worst < 0 || !fracLess(shares[i], w[i], shares[worst], w[worst])) {
				worst = i
			}
		}
		shares[worst]--
		sum--
	}
	for sum < n {
		best := 0
		for i := 1; i < size; i++ {
			if fracLess(shares[i]+1, w[i], shares[best]+1, w[best]) {
				best = i
			}
		}
		shares[best]++
		sum++
	}
	return shares
}

// knownWeights returns weights with the unknown ones (≤ 0) replaced by the
// median of the known ones (the lower of the two middle ones), or nil when
// none is known.
func knownWeights(weights []int64) []int64 {
	var known []int64
	for _, x := range weights {
		if x > 0 {
			known = append(known, x)
		}
	}
	if len(known) == 0 {
		return nil
	}
	slices.Sort(known)
	med := known[(len(known)-1)/2]
	out := slices.Clone(weights)
	for i, x := range out {
		if x <= 0 {
			out[i] = med
		}
	}
	return out
}

// evenShares is Share's split of n samples among size ranks.
func evenShares(n, size int) []int {
	out := make([]int, size)
	for r := range size {
		lo, hi := Share(n, r, size)
		out[r] = hi - lo
	}
	return out
}

// fracLess reports a/x < b/y for positive weights x and y, exactly.
func fracLess(a int, x int64, b int, y int64) bool {
	h1, l1 := bits.Mul64(uint64(a), uint64(y))
	h2, l2 := bits.Mul64(uint64(b), uint64(x))
	return h1 < h2 || h1 == h2 && l1 < l2
}

// stepTime is the time a step with these shares takes at these weights:
// the slowest rank's share/weight, exactly. Unknown weights count as in
// PlanShares; nil when none is known.
func stepTime(shares []int, weights []int64) *big.Rat {
	w := knownWeights(weights)
	if w == nil || len(shares) != len(w) {
		return nil
	}
	slow := 0
	for i := 1; i < len(w); i++ {
		if fracLess(shares[slow], w[slow], shares[i], w[i]) {
			slow = i
		}
	}
	return big.NewRat(int64(shares[slow]), w[slow])
}

// worthReplanning reports whether the shares planned from the weights are
// worth moving to from the current ones: the step they predict is at
// least gainPercent per cent shorter. Without it, measurements that
// wobble by a few per cent would move samples back and forth at every
// re-plan; with it, ranks of equal speed keep the even split. Exact, like
// PlanShares: every rank decides alike.
func worthReplanning(current, planned []int, weights []int64, gainPercent int) bool {
	if slices.Equal(current, planned) {
		return false
	}
	cur, next := stepTime(current, weights), stepTime(planned, weights)
	if cur == nil || next == nil {
		return next != nil
	}
	// next ≤ cur·(100−gain)/100
	bound := new(big.Rat).Mul(cur, big.NewRat(int64(100-gainPercent), 100))
	return next.Cmp(bound) <= 0
}

// refineGainPercent is the gain a new plan needs when the current one is
// already uneven: a fraction of the gain that leaving the even split
// needs. Leaving the even split changes the Reducer's path (and the
// rounding of its sums), so it waits for a clear gain; moving samples
// between uneven shares changes only the micro-batches' sizes, and a rate
// measured at the new shares, with their per-step fixed costs, is what
// brings the plan to where the ranks really finish together, a few per
// cent at a time.
func refineGainPercent(minGainPercent int) int {
	return max(1, minGainPercent/4)
}
