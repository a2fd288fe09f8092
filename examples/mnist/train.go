package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"syscall"
	"time"

	"gorgonia.org/tensor"

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
	// With load balancing: each rank's share of a step at the end of the
	// epoch, and the compute rates (samples/s) the ranks last agreed on.
	Shares       []int     `json:"shares,omitempty"`
	ComputeRates []float64 `json:"compute_rates,omitempty"`
}

// Train runs the whole job on this rank.
func Train(ctx context.Context, cfg *Config) error {
	start := time.Now()
	// The data first: a process that joins a running elastic job is
	// admitted at a commit, and the job waits for it from then on.
	trainSet, testSet, err := LoadSplits(cfg.Data)
	if err != nil {
		return err
	}
	loaded := func(string) (*Dataset, *Dataset, error) { return trainSet, testSet, nil }
	// 1. Join the job. Alone (no gorun) this is a one-rank Comm and the
	// collectives below are no-ops, so the same program runs either way.
	// Under gorun --min-np/--max-np the Comm is elastic (see elastic.go).
	var opts []collective.Option
	if cfg.Timeline != "" {
		opts = append(opts, collective.WithTimelinePath(cfg.Timeline))
	}
	comm, err := collective.Init(ctx, opts...)
	if err != nil {
		return err
	}
	defer comm.Close()
	// SIGTERM: leave at the next commit, handing this rank's state over.
	defer comm.LeaveOnSignal(syscall.SIGTERM)()
	// Share this host's cores between its ranks, as OMP_NUM_THREADS does
	// for PyTorch: gonum's matrix products would otherwise start a worker
	// per core in every rank, and the ranks would fight over the cores.
	if os.Getenv("GOMAXPROCS") == "" && comm.LocalSize() > 1 {
		runtime.GOMAXPROCS(max(1, runtime.NumCPU()/comm.LocalSize()))
	}
	_, err = train(ctx, cfg, comm, start, hooks{load: loaded})
	return err
}

// hooks let the tests run ranks in one process (collective.StartLocal),
// on a part of the data, and watch or crash them. The zero value is what
// the command does.
type hooks struct {
	load           func(dir string) (train, test *Dataset, err error) // nil: LoadSplits
	stdout, stderr io.Writer                                          // nil: os.Stdout, os.Stderr
	// crash makes this rank vanish for --fail-at-step in an elastic job
	// (nil: crashSelf, SIGKILL); it returns the error the loop ends with.
	crash func(comm *collective.Comm) error
	// afterStep runs after each optimizer step (gstep: steps done in the
	// run), before its commit; an error ends the loop.
	afterStep func(comm *collective.Comm, gstep int) error
	// samples is told the samples this rank trained on in each step (its
	// micro-batches, concatenated), once the step's gradients are reduced.
	samples func(comm *collective.Comm, gstep int, idx []int)
}

// runResult is what a rank ends with, for tests.
type runResult struct {
	Hash    string
	History []EpochResult
	Resets  []collective.ElasticEvent
	Steps   int       // optimizer steps per epoch
	Counted []float64 // per epoch: the training samples its summary counted, over all ranks
	Left    bool      // this rank left the elastic job gracefully (SIGTERM) before the end
}

// train runs the job on comm; Train and the tests call it.
func train(ctx context.Context, cfg *Config, comm *collective.Comm, start time.Time, h hooks) (*runResult, error) {
	rank, size := comm.Rank(), comm.Size()
	// In an elastic job a process started to replace a lost rank (or to
	// grow the job) is admitted at a commit of the running job: it makes
	// none of the collectives of the start below, and gets the whole state
	// from a live rank in RunElastic. (Not "Epoch() > 0": an initial
	// member's Init returns in epoch 1 when a rank died during the start,
	// and it must still restore the checkpoint.)
	elastic := comm.Elastic()
	joiner := elastic && comm.Joiner()
	out := newOutput(cfg, rank, size)
	if h.stdout != nil {
		out.stdout = h.stdout
	}
	if h.stderr != nil {
		out.stderr = h.stderr
	}
	defer out.stopProgress() // also on errors: they print on a clean line
	// Output paths are checked before any work, so that a typo in --plot
	// fails now rather than after the whole training.
	if err := checkRankPaths(cfg, rank); err != nil {
		return nil, err
	}
	if err := out.openMetrics(); err != nil {
		return nil, err
	}
	plan, err := planBatches(cfg.Batch, cfg.GlobalBatch, cfg.Accumulate, size)
	if err != nil {
		return nil, err
	}
	if err := checkLocalSGD(cfg, plan); err != nil {
		return nil, err
	}
	// Local SGD (localsgd.go) averages models, not gradients; otherwise the
	// Reducer averages the gradients, balancing the shares by speed unless
	// --balance=false (balance.go).
	localSGD := cfg.SyncEvery > 1
	balanced := cfg.Balance && !localSGD

	// 2. Data: every rank loads the (small) files (Train did, before it
	// joined), but trains only on its shard of every global batch.
	load := LoadSplits
	if h.load != nil {
		load = h.load
	}
	train, test, err := load(cfg.Data)
	if err != nil {
		return nil, err
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
			return nil, fmt.Errorf("--model cnn wants 28×28 images, not %d pixels", train.Pixels)
		}
	default:
		return nil, fmt.Errorf("--model %q: want mlp or cnn", cfg.Model)
	}
	names, params, grads := model.Params()

	// 4. The Reducer averages gradients over ranks and micro-batches.
	if cfg.Compression != "none" {
		if _, err := compress.ByName(cfg.Compression); err != nil {
			return nil, fmt.Errorf("--compression: %w", err)
		}
	}
	// With load balancing, the most samples a rank computes at once: the
	// plan's micro-batch at the start. Every rank's Reducer must have the
	// same, and a joiner, whose plan is for the size it joins at, takes it
	// from the job's state.
	localBatch := plan.MaxLocal()
	redLocal := localBatch // the local batch red was made with
	newReducer := func(plan BatchPlan) (*collective.Reducer, error) {
		ropts := collective.ReducerOptions{BackwardPassesPerStep: plan.K, FusionThreshold: cfg.FusionThreshold}
		switch {
		case balanced:
			// The Reducer splits the global batch and weights the
			// micro-batches itself, and follows membership changes.
			ropts, redLocal = balancedReducerOptions(cfg, plan.Global, localBatch), localBatch
		case plan.Even() && !elastic:
			// The Reducer checks the arithmetic too: k = global / (ranks × local).
			// (An elastic job's size changes under the Reducer: the plan is
			// the example's, and the Reducer just averages K × Size
			// micro-batches.)
			ropts.GlobalBatch, ropts.LocalBatch = plan.Global, plan.Global/(plan.K*plan.Size)
		}
		if cfg.Compression != "none" {
			codec := cfg.Compression
			ropts.Compression = func(string, int) string { return codec }
		}
		red, err := collective.NewReducer(comm, ropts)
		if err != nil {
			return nil, err
		}
		for i, name := range names {
			if err := red.Register(name, params[i], grads[i]); err != nil {
				return nil, err
			}
		}
		return red, nil
	}
	red, err := newReducer(plan)
	if err != nil {
		return nil, err
	}
	if !elastic {
		if err := red.BroadcastParameters(ctx, 0); err != nil {
			return nil, err
		}
	}
	// (An elastic job's start-up broadcast is RunElastic's first reset,
	// which a lost rank does not stop: it copies the state from rank 0,
	// after the checkpoint restore below, to every rank.)
	opt, err := NewOptimizer(cfg.Optimizer, cfg.LR, cfg.Momentum, params)
	if err != nil {
		return nil, err
	}

	sh := &Sharder{N: train.Len(), Plan: plan, Rank: rank, Seed: cfg.Seed}
	steps := sh.Steps()
	if steps == 0 {
		return nil, fmt.Errorf("global batch %d is larger than the %d training samples", plan.Global, train.Len())
	}
	out.header(train, test, model, plan, cfg)
	switch {
	case localSGD:
		out.printf("mnist: local SGD: each rank steps on its own gradients, and the ranks average their models every %d steps (outer lr %g, momentum %g); --sync-every 1 averages the gradients at every step\n",
			cfg.SyncEvery, cfg.OuterLR, cfg.OuterMomentum)
	case balanced && (size > 1 || elastic):
		out.printf("mnist: load balancing: each rank's share of the global batch follows its measured speed, re-planned every %d steps (--balance=false: even shares)\n", cfg.BalanceEvery)
	}
	if elastic {
		when := "after every step"
		if localSGD {
			when = "at every average"
		}
		out.printf("mnist: elastic job: %d ranks now; the global batch stays %d when ranks are lost or join; the state is committed in memory %s\n",
			size, plan.Global, when)
	}

	// 5. Resume from the newest checkpoint, if any: parameters, optimizer
	// state, the epoch history and this rank's running sums. The data
	// order is a function of (seed, epoch), so the run continues exactly
	// where it stopped.
	var history []EpochResult
	local := []float64{0, 0, 0} // this epoch's sums over this rank's samples: loss, correct, count
	ck, err := newCheckpointer(comm, cfg, out, plan.Global, names, params, opt, &history, &local)
	if err != nil {
		return nil, err
	}
	gstep := 0 // optimizer steps done in the run
	var st *collective.ElasticState
	restore := func(ctx context.Context) (err error) {
		gstep, err = ck.restore(ctx, comm)
		return err
	}
	switch {
	case joiner: // it gets the restored state from a live rank
	case elastic && ck.mgr != nil:
		// Every initial member restores the checkpoint, identically. A
		// member lost meanwhile fails the restore's collectives with a
		// membership change: the others re-form the job and restore
		// again, with the ranks that are left, rather than stop (or start
		// from step 0).
		st = collective.NewElasticState(comm) // the held size is the start's
		rst := collective.NewElasticState(comm)
		rst.OnReset(func(ctx context.Context, ev collective.ElasticEvent) error {
			for _, l := range startLines(ev) {
				out.printf("%s\n", l)
			}
			return nil
		})
		err = collective.RunElastic(ctx, comm, rst, restore)
	default:
		err = restore(ctx)
	}
	if err != nil {
		return nil, err
	}
	if total := cfg.Epochs * steps; gstep >= total {
		out.finishedRun(ck.dir(cfg), gstep, total, history)
		if err := out.writeMetrics(history...); err != nil {
			return nil, err
		}
		hash := paramHash(params)
		return &runResult{Hash: hash, History: history, Steps: steps}, out.final(ctx, comm, history, time.Since(start), hash, false)
	}
	if gstep > 0 {
		out.printf("mnist: resumed from %s at step %d of %d\n", ck.stepLoc(gstep), gstep, cfg.Epochs*steps)
		// Compression's error-feedback residuals are not in the checkpoint.
		red.ResetResiduals()
		if err := out.writeMetrics(history...); err != nil {
			return nil, err
		}
	}

	// 6. An elastic job takes its global batches from an ElasticSampler
	// and commits its state after every step (elastic.go). The sampler's
	// epoch e draws the permutation Sharder.Epoch(e) draws, and a step
	// takes the whole global batch from it and cuts it into the plan's
	// slots as Sharder.Batch does: an elastic job that loses no rank
	// trains exactly as a fixed-size one.
	epoch := gstep/steps + 1 // the epoch under way; its summary is due once its steps are done
	global := plan.Global
	var (
		sampler *collective.ElasticSampler
		lsync   *localSync // local SGD only
		res     = &runResult{Steps: steps}
		// Rank 0's cost of the commits, against that of the steps.
		commits               int
		commitTime, stepsTime time.Duration
	)
	if elastic {
		sampler = collective.NewElasticSampler(train.Len(), cfg.Seed)
		seekSampler(sampler, epoch, gstep%steps, global)
		if st == nil {
			st = collective.NewElasticState(comm)
		}
		// The step of the newest checkpoint is replicated too: whether the
		// end of training is saved again must not depend on when a rank
		// joined.
		if err := registerElastic(st, names, params, opt, &local, "step", &gstep, "epoch", &epoch, "global batch", &global, "sampler", sampler,
			"last checkpoint", &ck.lastSaved, "local batch", &localBatch); err != nil {
			return nil, err
		}
		// After a reset (and on a joiner, once it holds the state): the
		// new rank and size, a plan for them, and one line from rank 0.
		st.OnReset(func(ctx context.Context, ev collective.ElasticEvent) error {
			rank, size = comm.Rank(), comm.Size()
			np, err := elasticPlan(cfg, global, size)
			if err != nil {
				return err
			}
			split := np.Describe()
			switch {
			case balanced:
				// The Reducer re-planned by itself: even shares until
				// the ranks agree on their speeds again. (A joiner's was
				// made for its own plan.)
				if redLocal != localBatch {
					if red, err = newReducer(np); err != nil {
						return err
					}
				}
				split = describeShares(red.Shares())
			case np.K != plan.K:
				if red, err = newReducer(np); err != nil {
					return err
				}
			}
			if lsync != nil {
				lsync.synced = true // LocalSGD's reset re-syncs the ranks from the last average
			}
			plan, steps = np, train.Len()/global
			ck.global = global
			out.setRank(rank, size, gstep)
			for _, l := range resetLines(ev, global, split, gstep, epoch, steps, cfg.Epochs) {
				out.printf("%s\n", l)
			}
			if cfg.Verbose {
				for _, n := range ev.Notes {
					out.printf("elastic: %s\n", n)
				}
			}
			res.Resets = append(res.Resets, ev)
			return nil
		})
	}

	if localSGD {
		// The parameters hold their starting values now (restored, or
		// broadcast at RunElastic's start): the first anchor.
		ls, err := newLocalSGD(comm, cfg, names, params, st)
		if err != nil {
			return nil, err
		}
		lsync = &localSync{ls: ls, synced: true}
	}

	work := &stepper{model: model, params: params, grads: grads, opt: opt, data: train}
	var stepIdx []int
	out.startProgress(cfg.Epochs, steps, plan.Global, gstep)
	var (
		trainStart  time.Time     // the first step of this run
		evalTime    time.Duration // spent in --eval-every's evaluations
		balanceSeen int           // the Reducer's re-plans reported
	)

	// One optimizer step: gstep+1 of the run, step+1 of the epoch.
	trainStep := func(ctx context.Context) error {
		t0 := time.Now()
		if trainStart.IsZero() {
			trainStart = t0
		}
		step := gstep - (epoch-1)*steps
		b, err := stepBatchesOf(plan, step, rank, balanced, localSGD, red, sampler, sh)
		if err != nil {
			return err
		}
		var seen func(idx []int)
		if h.samples != nil {
			stepIdx = stepIdx[:0]
			seen = func(idx []int) { stepIdx = append(stepIdx, idx...) }
		}
		// A commit after this step is prepared within it.
		var commit *collective.ElasticState
		if st != nil && cfg.CommitEvery > 0 && (gstep+1)%cfg.CommitEvery == 0 && !localSGD {
			commit = st
		}
		stepRed := red
		if localSGD {
			stepRed = nil // each rank steps on its own gradients
		}
		work.slow = cfg.SlowRank.of(rank)
		if err := work.step(ctx, stepRed, b, local, seen, commit); err != nil {
			return err
		}
		if _, err := lsync.step(ctx); err != nil {
			return err
		}
		if balanced {
			if bs := red.Balance(); bs.Replans != balanceSeen {
				balanceSeen = bs.Replans
				if bs.Rates != nil {
					out.printf("%s\n", balanceLine(bs))
				}
			}
		}
		if h.samples != nil {
			h.samples(comm, gstep+1, stepIdx)
		}
		gstep++
		out.prog.stepDone(gstep)
		// Commit the asynchronous checkpoint in flight once every rank
		// has written it (one small allreduce while there is one).
		if err := ck.poll(ctx); err != nil {
			return err
		}
		if step+1 < steps { // the epoch's last step is saved after its summary
			if ck.due(gstep) {
				if err := lsync.sync(ctx); err != nil { // a checkpoint of the one model
					return err
				}
			}
			if err := ck.maybeSave(ctx, gstep); err != nil {
				return err
			}
		}
		if err := failAt(cfg, gstep, rank, size); err != nil {
			if !elastic {
				return err
			}
			if comm.Epoch() == 0 { // not again when the survivors run the step again
				fmt.Fprintf(out.stderr, "mnist: --fail-at-step %d: rank %d of this elastic job vanishes as with kill -9; the others go on without it\n", gstep, rank)
				if h.crash == nil {
					crashSelf(comm)
				}
				return h.crash(comm)
			}
		}
		if h.afterStep != nil {
			if err := h.afterStep(comm, gstep); err != nil {
				return err
			}
		}
		if commit != nil || st != nil && lsync != nil && lsync.synced {
			// (Local SGD commits the averaged model only.)
			t1 := time.Now()
			if err := st.Commit(ctx); err != nil {
				return err
			}
			commits++
			commitTime += time.Since(t1)
			stepsTime += t1.Sub(t0)
		}
		if cfg.EvalEvery > 0 && gstep%cfg.EvalEvery == 0 {
			if err := lsync.sync(ctx); err != nil {
				return err
			}
			t1 := time.Now()
			_, acc, err := evaluate(ctx, comm, model, test)
			if err != nil {
				return err
			}
			evalTime += time.Since(t1)
			out.printf("eval: step %d (epoch %d), %.2f s of training, test accuracy %.2f%%\n", gstep, epoch, (time.Since(trainStart) - evalTime).Seconds(), 100*acc)
		}
		return nil
	}

	// The summary of an epoch whose steps are done: the sums over all
	// ranks, the test set, the consistency check, the epoch's line, a
	// checkpoint. In an elastic job a reset in here runs it again (a line
	// may then be printed twice).
	var (
		epochOf    int // the epoch epochStart is for
		epochStart time.Time
		stats0     collective.Stats
		first      int // > 0 only when resuming mid-epoch
	)
	endEpoch := func(ctx context.Context) error {
		if err := lsync.sync(ctx); err != nil { // evaluate and check the one model
			return err
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
		el, cs := time.Since(epochStart), comm.Stats()
		r := EpochResult{
			Epoch: epoch, Loss: sums[0] / sums[2], TrainAcc: sums[1] / sums[2],
			TestLoss: testLoss, TestAcc: testAcc,
			Seconds: el.Seconds(), CommSeconds: (cs.CommTime - stats0.CommTime).Seconds(),
			SamplesPerS: float64((steps-first)*plan.Global) / el.Seconds(), Steps: steps, Ranks: size, GlobalBatch: plan.Global,
			Compression:  cfg.Compression,
			WireBytes:    cs.PayloadBytesSent + cs.HeaderBytesSent - stats0.PayloadBytesSent - stats0.HeaderBytesSent,
			BytesReduced: cs.Bytes - stats0.Bytes,
		}
		r.CommShare = r.CommSeconds / r.Seconds
		if balanced {
			bs := red.Balance()
			r.Shares, r.ComputeRates = bs.Shares, bs.Rates
		}
		if n := steps * plan.Global; elastic && int(sums[2]) != n {
			// Each rank's sums have one copy, on the next rank.
			out.printf("elastic: the training loss and accuracy of epoch %d cover %d of its %d samples: the sums of ranks lost together with the next rank, which kept their copy, are gone (the training itself used every sample)\n",
				epoch, int(sums[2]), n)
		}
		if len(history) > epoch-1 { // a reset made this summary run again
			history = history[:epoch-1]
		}
		history = append(history, r)
		res.Counted = append(res.Counted[:min(len(res.Counted), epoch-1)], sums[2])
		local = []float64{0, 0, 0}
		if err := out.epoch(r); err != nil {
			return err
		}
		if err := ck.maybeSave(ctx, gstep); err != nil {
			return err
		}
		epoch++
		if sampler != nil {
			sampler.NextEpoch()
		}
		if st != nil {
			return st.Commit(ctx)
		}
		return nil
	}

	loop := func(ctx context.Context) error {
		for epoch <= cfg.Epochs {
			if epochOf != epoch {
				epochOf, epochStart, stats0 = epoch, time.Now(), comm.Stats()
				first = gstep - (epoch-1)*steps
				if sampler == nil {
					sh.Epoch(epoch)
				}
			}
			for gstep < epoch*steps {
				if err := trainStep(ctx); err != nil {
					return err
				}
			}
			if err := endEpoch(ctx); err != nil {
				return err
			}
		}
		// The end of training is always saved, whatever --checkpoint-every,
		// and the save in flight is committed first.
		if err := ck.saveFinal(ctx, gstep); err != nil {
			return err
		}
		out.stopProgress()
		ck.report(rank)
		if elastic && commits > 0 {
			// The time in Commit includes waiting for the slowest rank,
			// which the next step's allreduce would wait for otherwise:
			// BenchmarkElasticStep measures what committing costs a step.
			out.printf("final: elastic: %d reset(s); %.2f ms per commit in Commit (waiting for slower ranks included), beside %.1f ms for the rest of a step (rank %d)\n",
				len(res.Resets), ms(commitTime)/float64(commits), ms(stepsTime)/float64(commits), rank)
		}
		res.Hash = paramHash(params)
		return out.final(ctx, comm, history, time.Since(start), res.Hash, true)
	}
	if elastic {
		err = collective.RunElastic(ctx, comm, st, loop)
		if errors.Is(err, collective.ErrLeft) {
			// A graceful leave (SIGTERM): the others went on from this
			// step's commit; this rank is done.
			out.stopProgress()
			var le *collective.LeftError
			errors.As(err, &le)
			fmt.Fprintf(out.stderr, "mnist: rank %d left the job (%s) after step %d; the others go on from there\n", le.Rank, le.Why, gstep)
			err = nil
			res.Left = true
		}
	} else {
		err = loop(ctx)
	}
	res.History, res.Steps = history, steps
	return res, err
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

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
