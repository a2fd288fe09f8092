package collective

import (
	"fmt"
	"slices"
)

// Micro-batches of a Reducer's step: how many backward passes one
// optimizer step takes on this rank (k), from ReducerOptions' global and
// local batch, evenly or, for an uneven split or an elastic Comm, by each
// rank's Share of the samples; and the re-planning after a membership
// change or a new global batch.

// replan computes this rank's micro-batches for the global batch at the
// Comm's current rank and size: its share of GlobalBatch samples (Share's,
// or the load balancer's) in micro-batches of at most LocalBatch (at least
// one, possibly empty).
func (r *Reducer) replan() {
	g, l := r.opts.GlobalBatch, r.opts.LocalBatch
	size := r.comm.Size()
	r.planEpoch = r.comm.Epoch()
	shares := r.bal.shares(g, size)
	if g%(size*l) == 0 && slices.Equal(shares, evenShares(g, size)) {
		r.k, r.weighted = g/(size*l), false
		r.plan = slices.Repeat([]int{l}, r.k)
		return
	}
	n := shares[r.comm.Rank()]
	r.plan = r.plan[:0]
	for n > l {
		r.plan = append(r.plan, l)
		n -= l
	}
	r.plan = append(r.plan, n)
	r.k, r.weighted = len(r.plan), true
}

// follow re-plans the Reducer after a membership change of an elastic
// Comm: new micro-batches, a new bucket layout and a new topology check, by
// every rank of the new epoch at its first use of the Reducer (a joiner's
// is its first use too). A step under way is dropped: RunElastic runs it
// again.
func (r *Reducer) follow() {
	if !r.comm.Elastic() || r.planEpoch == r.comm.Epoch() {
		return
	}
	if r.bal != nil {
		r.bal.membershipChanged()
	}
	r.relayout()
}

// relayout re-plans the micro-batches and drops the bucket layout, which
// the next Seal makes and checks again on every rank.
func (r *Reducer) relayout() {
	if r.opts.GlobalBatch > 0 && r.opts.LocalBatch > 0 {
		r.replan()
	}
	r.planEpoch = r.comm.Epoch()
	r.sealed, r.sealErr, r.buckets = false, nil, nil
	r.micro, r.handed, r.next = 0, 0, 0
}

// SetGlobalBatch changes the number of samples of the following steps,
// e.g. for the shorter last batch of an epoch (ElasticSampler.BatchLen),
// and re-plans the micro-batches (MicroBatches) with the uneven split. It
// needs GlobalBatch and LocalBatch set and an uneven split allowed
// (UnevenSplit, or an elastic Comm) unless the new batch splits evenly.
// Every rank must call it between the same two steps: the next step lays
// out and checks the buckets again.
func (r *Reducer) SetGlobalBatch(n int) error {
	switch {
	case r.opts.GlobalBatch <= 0 || r.opts.LocalBatch <= 0:
		return fmt.Errorf("gorun: Reducer: SetGlobalBatch(%d) needs ReducerOptions.GlobalBatch and LocalBatch", n)
	case n <= 0:
		return fmt.Errorf("gorun: Reducer: SetGlobalBatch(%d): the batch must hold at least one sample", n)
	case r.micro > 0 || r.handed > 0:
		return fmt.Errorf("gorun: Reducer: SetGlobalBatch(%d) in the middle of a step (after %d micro-batches): call it between steps", n, r.micro)
	}
	if _, err := PassesPerStep(n, r.comm.Size(), r.opts.LocalBatch); err != nil && !r.unevenAllowed() {
		return fmt.Errorf("gorun: Reducer: SetGlobalBatch: %w (or set ReducerOptions.UnevenSplit)", err)
	}
	if n == r.opts.GlobalBatch {
		return nil
	}
	r.opts.GlobalBatch = n
	r.relayout()
	return nil
}

// unevenAllowed reports whether the global batch may be split unevenly:
// UnevenSplit, an elastic Comm (whose size changes), or load balancing.
func (r *Reducer) unevenAllowed() bool {
	return r.opts.UnevenSplit || r.comm.Elastic() || r.bal != nil
}

// MicroBatches lists this rank's micro-batch sizes for one step when
// GlobalBatch and LocalBatch are set: feed micro-batch j exactly that many
// samples (e.g. consecutive slices of the rank's Share of the step's global
// batch, as ElasticSampler.Next returns it). Empty without GlobalBatch. In
// an elastic job it changes with the membership; read it every step.
func (r *Reducer) MicroBatches() []int {
	r.follow()
	return slices.Clone(r.plan)
}

// PassesPerStep returns the number of micro-batches per optimizer step that
// keeps globalBatch samples per step with size ranks of localBatch samples
// each, or an error saying why no whole number does.
func PassesPerStep(globalBatch, size, localBatch int) (int, error) {
	switch {
	case globalBatch <= 0:
		return 0, fmt.Errorf("global batch %d must be positive when a local batch is set", globalBatch)
	case localBatch <= 0:
		return 0, fmt.Errorf("local batch %d must be positive when a global batch is set", localBatch)
	case globalBatch%(size*localBatch) != 0:
		return 0, fmt.Errorf("global batch %d is not divisible by %d ranks × local batch %d (= %d samples per micro-batch step); choose a local batch that divides %d/%d, or another number of ranks",
			globalBatch, size, localBatch, size*localBatch, globalBatch, size)
	}
	return globalBatch / (size * localBatch), nil
}

// BackwardPassesPerStep is k: the number of micro-batches per Step.
// With an uneven split it is this rank's number, which may differ by one
// between ranks.
func (r *Reducer) BackwardPassesPerStep() int {
	r.follow()
	return r.k
}
