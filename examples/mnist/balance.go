package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gorun/gorun/collective"
)

// Load balancing (on by default; --balance=false turns it off): the
// Reducer times every rank's compute and, every --balance-every steps,
// re-plans each rank's share of the global batch by its speed
// (collective.BalanceOptions), so that a rank on a slower or busier host
// takes fewer samples and the others no longer wait for it in every
// allreduce. The loop takes, every step, the shares the Reducer planned
// (Reducer.Shares; from the ElasticSampler with NextSplit in an elastic
// job) in the micro-batches it lists (MicroBatches), and the Reducer
// weights each micro-batch's gradient by its size: a step is still the
// mean over exactly the global batch, so the model is the same up to the
// float rounding of the sums. Ranks of equal speed keep the even split
// (a new split must shorten the step by 10 %), and with it the very
// result of an unbalanced run.

// balancedReducerOptions are the Reducer's options for load balancing a
// global batch: localBatch is the most a rank computes at once, the
// plan's micro-batch at the start of the job (a rank with a larger share
// runs more micro-batches).
func balancedReducerOptions(cfg *Config, global, localBatch int) collective.ReducerOptions {
	return collective.ReducerOptions{
		GlobalBatch: global, LocalBatch: localBatch,
		Balance:         collective.BalanceOptions{Every: cfg.BalanceEvery},
		FusionThreshold: cfg.FusionThreshold,
	}
}

// balancedBatches cuts this rank's part of a step's global batch into the
// micro-batches the Reducer planned (sizes); the Reducer weights them.
func balancedBatches(part []int, sizes []int) (stepBatches, error) {
	b := stepBatches{weight: func(int) float32 { return 1 }}
	lo := 0
	for _, n := range sizes {
		if lo+n > len(part) {
			return b, fmt.Errorf("internal error: micro-batches %v for a share of %d samples", sizes, len(part))
		}
		b.micro = append(b.micro, part[lo:lo+n])
		lo += n
	}
	return b, nil
}

// partOf is rank's part of a step's global batch split by shares: the
// samples after the shares of the ranks before it (as
// ElasticSampler.NextSplit takes it).
func partOf(batch, shares []int, rank int) []int {
	lo := 0
	for _, n := range shares[:rank] {
		lo += n
	}
	return batch[lo : lo+shares[rank]]
}

// describeShares lists shares, e.g. "21, 21, 22".
func describeShares(shares []int) string {
	parts := make([]string, len(shares))
	for i, n := range shares {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ", ")
}

// balanceLine reports a new split, e.g.
//
//	balance: shares 23, 22, 11, 8 (rank 3 at 0.38x the fastest)
func balanceLine(st collective.BalanceStatus) string {
	line := "balance: shares " + describeShares(st.Shares)
	slow, fast := -1, 0.0
	for r, v := range st.Rates {
		fast = max(fast, v)
		if v > 0 && (slow < 0 || v < st.Rates[slow]) {
			slow = r
		}
	}
	if slow >= 0 && fast > 0 {
		line += fmt.Sprintf(" (rank %d at %.2fx the fastest)", slow, st.Rates[slow]/fast)
	}
	return line
}

// slowRank is --slow-rank R:F: rank R computes F times as long.
type slowRank struct {
	rank   int
	factor float64
}

// parseSlowRank reads R:F ("" is none).
func parseSlowRank(s string) (slowRank, error) {
	if s == "" {
		return slowRank{rank: -1, factor: 1}, nil
	}
	r, f, ok := strings.Cut(s, ":")
	rank, err1 := strconv.Atoi(r)
	factor, err2 := strconv.ParseFloat(f, 64)
	if !ok || err1 != nil || err2 != nil || rank < 0 || factor < 1 {
		return slowRank{}, fmt.Errorf("--slow-rank %q: want RANK:FACTOR, e.g. 3:2.0 (rank 3 computes twice as long; the factor at least 1)", s)
	}
	return slowRank{rank, factor}, nil
}

// of is the factor for rank.
func (s slowRank) of(rank int) float64 {
	if rank == s.rank {
		return s.factor
	}
	return 1
}
