package main

import (
	"context"

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
}

// step runs one optimizer step of plan with red: micro(k) is this rank's
// samples of micro-batch k. Each layer's gradients go to the Reducer as soon
// as they are final, so on the last micro-batch their allreduce starts while
// the layers below are still in backward; once every allreduce is done the
// gradients are the mean over the global batch, the same on every rank, and
// the optimizer updates the parameters. The step's loss, correct predictions
// and sample count are added to local (loss, correct, count), and seen (if
// not nil) is told each micro-batch's samples. With commit (not nil), the
// step ends with a commit of commit's state: it is prepared once every
// gradient's allreduce is queued (ElasticState.Prepare: it rides behind
// them) and the caller finishes it with Commit.
func (s *stepper) step(ctx context.Context, red *collective.Reducer, plan BatchPlan, micro func(k int) []int, local []float64, seen func(idx []int), commit *collective.ElasticState) error {
	if n := plan.MaxLocal(); len(s.labels) < n {
		s.xbuf, s.labels = make([]float32, n*s.data.Pixels), make([]uint8, n)
	}
	gradReady := func(names ...string) error {
		for _, name := range names {
			if err := red.GradReady(ctx, name); err != nil {
				return err
			}
		}
		return nil
	}
	for k := range plan.K {
		idx := micro(k)
		loss, correct, err := trainMicroBatch(s.model, s.data, idx, plan, s.xbuf, s.labels, gradReady)
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
	// Wait for the allreduces: the gradients now hold the average over the
	// global batch.
	if err := red.Step(ctx); err != nil {
		return err
	}
	s.opt.Step(s.params, s.grads)
	return nil
}

// trainMicroBatch runs forward and backward on the samples idx and hands
// each layer's gradients to the Reducer through gradReady. The gradient of
// the mean loss is scaled by the plan's weight for a micro-batch of this
// size (1 when the global batch splits evenly). It returns the mean loss
// and the number of correct predictions.
func trainMicroBatch(m Model, d *Dataset, idx []int, plan BatchPlan, xbuf []float32, labels []uint8,
	gradReady func(names ...string) error) (loss float64, correct int, err error) {
	n := len(idx)
	x := tensor.New(tensor.WithShape(n, d.Pixels), tensor.WithBacking(xbuf[:n*d.Pixels]))
	gather(d, idx, x, labels[:n])
	loss, correct, dlogits := SoftmaxCrossEntropy(m.Forward(x), labels[:n])
	if w := plan.Weight(n); w != 1 {
		g := f32(dlogits)
		for i := range g {
			g[i] *= w
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
