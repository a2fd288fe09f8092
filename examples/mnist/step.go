package main

import (
	"context"
	"fmt"
	"time"

	"gorgonia.org/tensor"

	"github.com/gorun/gorun/collective"
)

// The work of one optimizer step on this rank, the same in train's loop and
// in BenchmarkElasticStep: forward and backward of the rank's micro-batches,
// the Reducer's allreduce of the gradients, the optimizer's update.

// stepper runs optimizer steps of model on the samples of data.
type stepper struct {
	model         Model
	params, grads []*tensor.Dense // model.Params(), in the Reducer's order
	opt           Optimizer
	data          *Dataset
	xbuf          []float32 // a micro-batch's images and labels, reused from step to step
	labels        []uint8
	// slow > 1 makes this rank compute that many times as long (--slow-rank).
	slow float64
}

// stepBatches are this rank's micro-batches of one optimizer step: their
// samples, and the factor for each one's mean gradient (BatchPlan.Weight
// when the example weights the micro-batches itself; 1 when the Reducer
// weights them by their sizes, or in local SGD).
type stepBatches struct {
	micro  [][]int
	weight func(n int) float32
}

// planBatchesOf are this rank's micro-batches of a step of plan: micro(k)
// is its samples of micro-batch k.
func planBatchesOf(plan BatchPlan, micro func(k int) []int) stepBatches {
	b := stepBatches{weight: plan.Weight}
	for k := range plan.K {
		b.micro = append(b.micro, micro(k))
	}
	return b
}

// stepBatchesOf takes this rank's micro-batches of step (of the epoch)
// from the step's global batch: the ElasticSampler's in an elastic job,
// else the Sharder's. With load balancing, the rank's share is the one the
// Reducer planned (taken by NextSplit from the sampler), in the
// micro-batches it lists, which it weights itself; otherwise it is the
// plan's slots, each micro-batch's gradient weighted by the plan (by 1 in
// local SGD, where each rank steps on the mean over its own samples).
func stepBatchesOf(plan BatchPlan, step, rank int, balanced, localSGD bool, red *collective.Reducer,
	sampler *collective.ElasticSampler, sh *Sharder) (stepBatches, error) {
	if balanced {
		shares := red.Shares()
		var part []int
		if sampler != nil {
			part = sampler.NextSplit(shares, rank)
		} else {
			part = partOf(sh.Global(step), shares, rank)
		}
		if len(part) != shares[rank] {
			return stepBatches{}, fmt.Errorf("internal error: the sampler gave rank %d %d samples, its share is %d", rank, len(part), shares[rank])
		}
		return balancedBatches(part, red.MicroBatches())
	}
	var batch []int // the step's global batch, in an elastic job
	if sampler != nil {
		if batch = sampler.Next(plan.Global, 0, 1); len(batch) != plan.Global {
			return stepBatches{}, fmt.Errorf("internal error: the sampler gave %d samples, want %d", len(batch), plan.Global)
		}
	}
	b := planBatchesOf(plan, func(k int) []int {
		if batch != nil {
			lo, hi := plan.Slot(k, rank)
			return batch[lo:hi]
		}
		return sh.Batch(step, k)
	})
	if localSGD {
		b.weight = func(int) float32 { return 1 }
	}
	return b, nil
}

// step runs one optimizer step with red over this rank's micro-batches b.
// Each layer's gradients go to the Reducer as soon as they are final, so
// on the last micro-batch their allreduce starts while the layers below
// are still in backward; once every allreduce is done the gradients are
// the mean over the global batch, the same on every rank, and the
// optimizer updates the parameters. With red nil (local SGD) the optimizer
// steps on this rank's own gradients. The step's loss, correct predictions
// and sample count are added to local (loss, correct, count), and seen (if
// not nil) is told each micro-batch's samples. With commit (not nil), the
// step ends with a commit of commit's state: it is prepared once every
// gradient's allreduce is queued (ElasticState.Prepare: it rides behind
// them) and the caller finishes it with Commit.
func (s *stepper) step(ctx context.Context, red *collective.Reducer, b stepBatches, local []float64, seen func(idx []int), commit *collective.ElasticState) error {
	n := 0
	for _, idx := range b.micro {
		n = max(n, len(idx))
	}
	if len(s.labels) < n {
		s.xbuf, s.labels = make([]float32, n*s.data.Pixels), make([]uint8, n)
	}
	for _, idx := range b.micro {
		loss, correct, err := trainMicroBatch(s.model, s.data, idx, b.weight(len(idx)), s.xbuf, s.labels, s.handOver(ctx, red))
		if err != nil {
			return err
		}
		local[0] += loss * float64(len(idx))
		local[1] += float64(correct)
		local[2] += float64(len(idx))
		if seen != nil {
			seen(idx)
		}
	}
	if commit != nil {
		if err := commit.Prepare(ctx); err != nil {
			return err
		}
	}
	if red != nil {
		// Wait for the allreduces: the gradients now hold the average over
		// the global batch.
		if err := red.Step(ctx); err != nil {
			return err
		}
	}
	s.opt.Step(s.params, s.grads)
	return nil
}

// handOver is a micro-batch's hand-over of its gradients to red (nothing
// without one). With --slow-rank it holds the last gradient back for
// slow−1 times the micro-batch's compute so far: the rank looks as slow to
// the others, and to its own measurement, as a rank on a host that slow.
func (s *stepper) handOver(ctx context.Context, red *collective.Reducer) func(names ...string) error {
	start, handed := time.Now(), 0
	return func(names ...string) error {
		for _, name := range names {
			if handed++; handed == len(s.params) && s.slow > 1 {
				time.Sleep(time.Duration(float64(time.Since(start)) * (s.slow - 1)))
			}
			if red == nil {
				continue
			}
			if err := red.GradReady(ctx, name); err != nil {
				return err
			}
		}
		return nil
	}
}

// trainMicroBatch runs forward and backward on the samples idx and hands
// each layer's gradients to the Reducer through gradReady. The gradient of
// the mean loss is scaled by weight (see stepBatches). It returns the mean
// loss and the number of correct predictions.
func trainMicroBatch(m Model, d *Dataset, idx []int, weight float32, xbuf []float32, labels []uint8,
	gradReady func(names ...string) error) (loss float64, correct int, err error) {
	n := len(idx)
	x := tensor.New(tensor.WithShape(n, d.Pixels), tensor.WithBacking(xbuf[:n*d.Pixels]))
	gather(d, idx, x, labels[:n])
	loss, correct, dlogits := SoftmaxCrossEntropy(m.Forward(x), labels[:n])
	if weight != 1 {
		g := f32(dlogits)
		for i := range g {
			g[i] *= weight
		}
	}
	return loss, correct, m.Backward(dlogits, gradReady)
}

// gather copies the samples idx into the batch tensor x and labels.
func gather(d *Dataset, idx []int, x *tensor.Dense, labels []uint8) {
	xs, p := f32(x), d.Pixels
	for i, j := range idx {
		copy(xs[i*p:(i+1)*p], d.Images[j*p:(j+1)*p])
		labels[i] = d.Labels[j]
	}
}
