package collective

import (
	"context"
	"fmt"
	"math"
	"time"
)

// Load balancing in a Reducer: each rank's share of the global batch
// follows its measured speed, so a rank on a slower or busier host no
// longer sets the pace of every step while the others idle in the
// allreduce (Hivemind sizes its peers' batches the same way; Horovod and
// DDP give every rank the same share).
//
// Each rank times its own compute: from the end of one Step to the moment
// it hands over the last gradient of the next step, less the time it spent
// blocked in collectives meanwhile (a commit, an evaluation's allreduce),
// which measure the other ranks, not this one. Its rate is smoothed over
// the last steps: their samples over their compute time, which counts a
// rank that runs in bursts (a CPU quota that stops it every period) at
// its average speed, where a median of per-step rates would see only its
// bursts. Every Every
// steps the ranks agree on their rates with one small allgather, queued
// behind the step's gradients so that it costs no wait of its own, and
// each rank computes the same new split (PlanShares) from the same
// numbers. The shares change the micro-batches (MicroBatches) and the
// samples each rank takes (Shares, ElasticSampler.NextSplit), never the
// result: every micro-batch's gradient is weighted by its sample count, so
// a step is still the mean over exactly the global batch.

// BalanceOptions turn on load balancing in a Reducer (ReducerOptions.Balance).
// It needs GlobalBatch and LocalBatch, and the loop must feed every rank
// its share of each step's global batch as Shares says (e.g. with
// ElasticSampler.NextSplit), in micro-batches as MicroBatches says; both
// change when the Reducer re-plans, so read them every step.
type BalanceOptions struct {
	// Every is the number of steps between re-plans: at every Every-th
	// Step the ranks agree on their measured rates and re-plan. 0 turns
	// balancing off.
	Every int
	// MinGainPercent is how much shorter, in per cent, a plan must make
	// the step (as the rates predict it) to be adopted in place of the
	// even split; 0 means 10. Ranks of equal speed then keep the even
	// split, and with it the Reducer's even path, bit for bit. Once the
	// split is uneven, a quarter of it (at least 1 %) refines the plan.
	MinGainPercent int
}

// defaultMinGainPercent: below it, a re-plan would chase measurement noise.
const defaultMinGainPercent = 10

// rateWindow is how many steps a rank's rate is smoothed over: enough to
// span a few periods of a CPU quota (100 ms by default) at steps of a few
// milliseconds, few enough to follow a change of load within a re-plan
// or two.
const rateWindow = 32

// BalanceStatus is a Reducer's current split of the global batch.
type BalanceStatus struct {
	// Shares is every rank's share of a step's global batch.
	Shares []int
	// Rates are the ranks' compute rates, in samples per second, as they
	// agreed on them last (0: not measured yet), whether or not that moved
	// the split; nil before the first agreement of this membership epoch.
	Rates []float64
	// Replans counts the splits adopted since the Reducer was made; a
	// membership change, which goes back to the even split, counts too.
	Replans int
}

// balancer is a Reducer's load balancing state.
type balancer struct {
	every, minGain int

	// weights are the agreed rates (thousandths of samples per second)
	// of the current plan, by rank of the current membership epoch; nil:
	// the even split.
	weights []int64
	agreed  []int64 // the rates of the last agreement (the same unit)
	replans int

	// This rank's measurements: the samples and compute time of its last
	// steps (a ring of rateWindow), and the start of its current compute
	// interval (zero: none, after a start or a membership change).
	window      []measure
	nextRate    int
	mark        time.Time
	markBlocked time.Duration

	since  int     // Steps since the last agreement or membership change
	gather []int64 // the agreement in flight (h)
	h      *Handle

	testCompute func(samples int) time.Duration // tests: this rank's compute time for a step, instead of its clock's
}

// measure is one step of this rank: its samples and its compute time.
type measure struct {
	samples int
	compute time.Duration
}

func newBalancer(o BalanceOptions) (*balancer, error) {
	switch {
	case o.Every <= 0:
		return nil, nil
	case o.MinGainPercent < 0 || o.MinGainPercent >= 100:
		return nil, fmt.Errorf("gorun: Reducer: Balance.MinGainPercent %d is not a percentage below 100", o.MinGainPercent)
	}
	g := o.MinGainPercent
	if g == 0 {
		g = defaultMinGainPercent
	}
	return &balancer{every: o.Every, minGain: g}, nil
}

// describe is the balancing part of the Reducer's options, which every
// rank must share (the topology check compares them).
func (b *balancer) describe() string {
	if b == nil {
		return ""
	}
	return fmt.Sprintf(" balance every=%d gain=%d%%", b.every, b.minGain)
}

// shares is the split of a global batch of n samples among size ranks:
// the current plan's, or the even one.
func (b *balancer) shares(n, size int) []int {
	if b == nil || len(b.weights) != size {
		return evenShares(n, size)
	}
	return PlanShares(n, b.weights)
}

// membershipChanged forgets the plan, whose ranks are gone, and the
// measurement under way, which spans the reset: the split is even again
// until the next agreement, Every steps on.
func (b *balancer) membershipChanged() {
	if b.weights != nil {
		b.replans++
	}
	b.weights, b.agreed, b.since, b.h, b.gather, b.mark = nil, nil, 0, nil, nil, time.Time{}
}

// handedOver ends this rank's compute interval of a step of samples
// samples, at the hand-over of its last gradient, and on the step of an
// agreement queues the allgather of the ranks' rates behind the step's
// gradients.
func (b *balancer) handedOver(ctx context.Context, c *Comm, samples int) {
	if !b.mark.IsZero() && samples > 0 {
		compute := time.Since(b.mark) - (c.blockedTime() - b.markBlocked)
		if b.testCompute != nil {
			compute = b.testCompute(samples)
		}
		if compute > 0 {
			m := measure{samples, compute}
			if len(b.window) < rateWindow {
				b.window = append(b.window, m)
			} else {
				b.window[b.nextRate] = m
			}
			b.nextRate = (b.nextRate + 1) % rateWindow
		}
	}
	if b.since+1 < b.every {
		return
	}
	b.gather = make([]int64, c.Size())
	b.h = c.AllgatherAsync(ctx, []int64{b.smoothed()}, b.gather, Name("reducer balance rates"))
}

// smoothed is this rank's rate for the agreement: the samples of its last
// steps over their compute time, in thousandths of samples per second (0:
// none measured).
func (b *balancer) smoothed() int64 {
	var samples int
	var compute time.Duration
	for _, m := range b.window {
		samples += m.samples
		compute += m.compute
	}
	if compute <= 0 {
		return 0
	}
	return int64(math.Min(math.Max(1, 1000*float64(samples)/compute.Seconds()), 1<<50))
}

// stepDone ends a Reducer's Step: on the step of an agreement it collects
// the ranks' rates and adopts the new split when it is worth it, and it
// starts this rank's next compute interval.
func (r *Reducer) balanceStepDone(ctx context.Context) error {
	b := r.bal
	b.since++
	if h := b.h; h != nil {
		b.h = nil
		if err := h.Wait(ctx); err != nil {
			return err
		}
		b.since, b.agreed = 0, b.gather
		g, size := r.opts.GlobalBatch, r.comm.Size()
		planned := PlanShares(g, b.gather)
		gain := b.minGain
		if len(b.weights) == size {
			gain = refineGainPercent(b.minGain)
		}
		if worthReplanning(b.shares(g, size), planned, b.gather, gain) {
			b.weights = b.gather
			b.replans++
			r.applyShares()
		}
		b.gather = nil
	}
	b.mark, b.markBlocked = time.Now(), r.comm.blockedTime()
	return nil
}

// applyShares re-plans this rank's micro-batches for a new split, between
// two steps. The bucket layout changes only when the split moves between
// the even path and the weighted one (or, even, to another number of
// micro-batches); the next use then lays it out and checks it again, on
// every rank alike, since every rank adopted the same split.
func (r *Reducer) applyShares() {
	weighted, k := r.weighted, r.k
	r.replan()
	if r.weighted != weighted || !r.weighted && r.k != k {
		r.sealed, r.sealErr, r.buckets = false, nil, nil
	}
}

// Shares is every rank's share of the next step's global batch, in rank
// order: rank r takes the samples from the sum of the shares before it, as
// ElasticSampler.NextSplit does. Without balancing it is Share's even
// split; with it, the current plan. nil without GlobalBatch. Read it
// every step: it changes with a re-plan and with the membership.
func (r *Reducer) Shares() []int {
	r.follow()
	if r.opts.GlobalBatch <= 0 || r.opts.LocalBatch <= 0 {
		return nil
	}
	return r.bal.shares(r.opts.GlobalBatch, r.comm.Size())
}

// Balance describes the current split of the global batch (see
// BalanceOptions); its Replans tells a loop when to report a new one.
func (r *Reducer) Balance() BalanceStatus {
	r.follow()
	st := BalanceStatus{Shares: r.Shares()}
	if b := r.bal; b != nil {
		st.Replans = b.replans
		if b.agreed != nil {
			st.Rates = make([]float64, len(b.agreed))
			for i, w := range b.agreed {
				st.Rates[i] = float64(w) / 1000
			}
		}
	}
	return st
}
