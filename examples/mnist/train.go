package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"time"

	"gorgonia.org/tensor"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/compress"
)

// EpochResult is what one epoch measured, summed over all ranks.
type EpochResult struct {
	Epoch        int     `json:"epoch"`
	Loss         float64 `json:"loss"`
	TrainAcc     float64 `json:"train_acc"`
	TestLoss     float64 `json:"test_loss"`
	TestAcc      float64 `json:"test_acc"`
	Seconds      float64 `json:"epoch_seconds"`
	CommSeconds  float64 `json:"comm_seconds"`
	CommShare    float64 `json:"comm_share"`
	SamplesPerS  float64 `json:"samples_per_second"`
	Steps        int     `json:"steps"`
	Ranks        int     `json:"ranks"`
	GlobalBatch  int     `json:"global_batch"`
	Compression  string  `json:"compression"`
	WireBytes    uint64  `json:"wire_bytes_sent_rank0"`
	BytesReduced uint64  `json:"bytes_reduced_rank0"`
}

// Train runs the whole job on this rank.
func Train(ctx context.Context, cfg *Config) error {
	start := time.Now()
	// 1. Join the job. Alone (no gorun) this is a one-rank Comm and the
	// collectives below are no-ops, so the same program runs either way.
	var opts []collective.Option
	if cfg.Timeline != "" {
		opts = append(opts, collective.WithTimelinePath(cfg.Timeline))
	}
	comm, err := collective.Init(ctx, opts...)
	if err != nil {
		return err
	}
	defer comm.Close()
	rank, size := comm.Rank(), comm.Size()
	// Share this host's cores between its ranks, as OMP_NUM_THREADS does
	// for PyTorch: gonum's matrix products would otherwise start a worker
	// per core in every rank, and the ranks would fight over the cores.
	if os.Getenv("GOMAXPROCS") == "" && comm.LocalSize() > 1 {
		runtime.GOMAXPROCS(max(1, runtime.NumCPU()/comm.LocalSize()))
	}
	out := newOutput(cfg, rank, size)
	defer out.stopProgress() // also on errors: they print on a clean line
	// Output paths are checked before any work, so that a typo in --plot
	// fails now rather than after the whole training.
	if err := checkRankPaths(cfg, rank); err != nil {
		return err
	}
	if err := out.openMetrics(); err != nil {
		return err
	}
	plan, err := planBatches(cfg.Batch, cfg.GlobalBatch, cfg.Accumulate, size)
	if err != nil {
		return err
	}

	// 2. Data: every rank loads the (small) files, but trains only on its
	// shard of every global batch.
	train, test, err := LoadSplits(cfg.Data)
	if err != nil {
		return err
	}

	// 3. Model, with the same seed on every rank. Rank 0's weights are
	// broadcast anyway, so that a rank with another seed cannot diverge.
	var model Model
	rng := rand.New(rand.NewPCG(cfg.Seed, 0))
	switch cfg.Model {
	case "mlp":
		model = NewMLP(train.Pixels, cfg.Hidden, 10, rng)
	case "cnn":
		model = NewCNN(28, 28, 5, 8, cfg.Hidden, 10, rng)
		if train.Pixels != 28*28 {
			return fmt.Errorf("--model cnn wants 28×28 images, not %d pixels", train.Pixels)
		}
	default:
		return fmt.Errorf("--model %q: want mlp or cnn", cfg.Model)
	}
	names, params, grads := model.Params()

	// 4. The Reducer averages gradients over ranks and micro-batches.
	ropts := collective.ReducerOptions{BackwardPassesPerStep: plan.K, FusionThreshold: cfg.FusionThreshold}
	if plan.Even() {
		// The Reducer checks the arithmetic too: k = global / (ranks × local).
		ropts.GlobalBatch, ropts.LocalBatch = plan.Global, plan.Global/(plan.K*plan.Size)
	}
	if cfg.Compression != "none" {
		if _, err := compress.ByName(cfg.Compression); err != nil {
			return fmt.Errorf("--compression: %w", err)
		}
		codec := cfg.Compression
		ropts.Compression = func(string, int) string { return codec }
	}
	red, err := collective.NewReducer(comm, ropts)
	if err != nil {
		return err
	}
	for i, name := range names {
		if err := red.Register(name, params[i], grads[i]); err != nil {
			return err
		}
	}
	if err := red.BroadcastParameters(ctx, 0); err != nil {
		return err
	}
	opt, err := NewOptimizer(cfg.Optimizer, cfg.LR, cfg.Momentum, params)
	if err != nil {
		return err
	}

	sh := &Sharder{N: train.Len(), Plan: plan, Rank: rank, Seed: cfg.Seed}
	steps := sh.Steps()
	if steps == 0 {
		return fmt.Errorf("global batch %d is larger than the %d training samples", plan.Global, train.Len())
	}
	out.header(train, test, model, plan, cfg)

	// 5. Resume from the newest checkpoint, if any: parameters, optimizer
	// state, the epoch history and this rank's running sums. The data
	// order is a function of (seed, epoch), so the run continues exactly
	// where it stopped.
	var history []EpochResult
	local := []float64{0, 0, 0} // this epoch's sums over this rank's samples: loss, correct, count
	ck, err := newCheckpointer(comm, cfg, out, plan.Global, names, params, opt, &history, &local)
	if err != nil {
		return err
	}
	gstep, err := ck.restore(ctx, comm)
	if err != nil {
		return err
	}
	if total := cfg.Epochs * steps; gstep >= total {
		out.finishedRun(cfg.CheckpointDir, gstep, total, history)
		if err := out.writeMetrics(history...); err != nil {
			return err
		}
		return out.final(ctx, comm, history, time.Since(start), paramHash(params), false)
	}
	if gstep > 0 {
		out.printf("mnist: resumed from %s at step %d of %d\n", checkpoint.StepDir(cfg.CheckpointDir, int64(gstep)), gstep, cfg.Epochs*steps)
		// Compression's error-feedback residuals are not in the checkpoint.
		red.ResetResiduals()
		if err := out.writeMetrics(history...); err != nil {
			return err
		}
	}

	gradReady := func(names ...string) error {
		for _, name := range names {
			if err := red.GradReady(ctx, name); err != nil {
				return err
			}
		}
		return nil
	}
	xbuf := make([]float32, plan.MaxLocal()*train.Pixels)
	labels := make([]uint8, plan.MaxLocal())
	out.startProgress(cfg.Epochs, steps, plan.Global, gstep)
	for epoch := gstep/steps + 1; epoch <= cfg.Epochs; epoch++ {
		epochStart, stats0 := time.Now(), comm.Stats()
		sh.Epoch(epoch)
		first := gstep % steps // > 0 only when resuming mid-epoch
		for step := first; step < steps; step++ {
			for micro := range plan.K {
				idx := sh.Batch(step, micro)
				// Each layer's gradients go to the Reducer as soon as they
				// are final: on the k-th micro-batch their allreduce starts
				// while the layers below are still in backward.
				loss, correct, err := trainMicroBatch(model, train, idx, plan, xbuf, labels, gradReady)
				if err != nil {
					return err
				}
				local[0] += loss * float64(len(idx))
				local[1] += float64(correct)
				local[2] += float64(len(idx))
			}
			// Wait for the allreduces: grads now hold the average over
			// the global batch, the same on every rank.
			if err := red.Step(ctx); err != nil {
				return err
			}
			opt.Step(params, grads)
			gstep++
			out.prog.stepDone(gstep)
			if step+1 < steps { // the epoch's last step is saved after its summary
				if err := ck.maybeSave(ctx, gstep); err != nil {
					return err
				}
			}
			if err := failAt(cfg, gstep, rank, size); err != nil {
				return err
			}
		}
		sums := slices.Clone(local)
		if err := comm.Allreduce(ctx, sums, collective.Sum); err != nil {
			return err
		}
		testLoss, testAcc, err := evaluate(ctx, comm, model, test)
		if err != nil {
			return err
		}
		// Every rank must hold the same parameters: this compares a
		// checksum of each tensor across ranks and names any that differ.
		if err := red.CheckConsistency(ctx); err != nil {
			return err
		}
		el, st := time.Since(epochStart), comm.Stats()
		r := EpochResult{
			Epoch: epoch, Loss: sums[0] / sums[2], TrainAcc: sums[1] / sums[2],
			TestLoss: testLoss, TestAcc: testAcc,
			Seconds: el.Seconds(), CommSeconds: (st.CommTime - stats0.CommTime).Seconds(),
			SamplesPerS: float64((steps-first)*plan.Global) / el.Seconds(), Steps: steps, Ranks: size, GlobalBatch: plan.Global,
			Compression:  cfg.Compression,
			WireBytes:    st.PayloadBytesSent + st.HeaderBytesSent - stats0.PayloadBytesSent - stats0.HeaderBytesSent,
			BytesReduced: st.Bytes - stats0.Bytes,
		}
		r.CommShare = r.CommSeconds / r.Seconds
		history = append(history, r)
		local = []float64{0, 0, 0}
		if err := out.epoch(r); err != nil {
			return err
		}
		if err := ck.maybeSave(ctx, gstep); err != nil {
			return err
		}
	}
	// The end of training is always saved, whatever --checkpoint-every.
	if err := ck.saveFinal(ctx, gstep); err != nil {
		return err
	}
	out.stopProgress()
	return out.final(ctx, comm, history, time.Since(start), paramHash(params), true)
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

// evaluate computes test loss and accuracy: each rank scores a contiguous
// share of the test set and the sums are allreduced.
func evaluate(ctx context.Context, comm *collective.Comm, m Model, test *Dataset) (loss, acc float64, err error) {
	n, r, s := test.Len(), comm.Rank(), comm.Size()
	lo, hi := n*r/s, n*(r+1)/s
	const chunk = 500
	sums := []float64{0, 0, 0}
	for i := lo; i < hi; i += chunk {
		j := min(i+chunk, hi)
		x := tensor.New(tensor.WithShape(j-i, test.Pixels), tensor.WithBacking(test.Images[i*test.Pixels:j*test.Pixels]))
		l, c, _ := SoftmaxCrossEntropy(m.Forward(x), test.Labels[i:j])
		sums[0] += l * float64(j-i)
		sums[1] += float64(c)
		sums[2] += float64(j - i)
	}
	if err := comm.Allreduce(ctx, sums, collective.Sum); err != nil {
		return 0, 0, err
	}
	return sums[0] / sums[2], sums[1] / sums[2], nil
}

// paramHash is a SHA-256 of all parameters, to compare ranks at the end.
func paramHash(params []*tensor.Dense) string {
	h := sha256.New()
	var b [4]byte
	for _, p := range params {
		for _, v := range f32(p) {
			binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
			h.Write(b[:])
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}
