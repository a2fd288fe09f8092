package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/collective"
)

// BenchmarkElasticStep measures what a commit after every step costs the
// example's training step, at np=4: 4 ranks of this process (StartLocal,
// elastic) train the example's default model (the 784-128-10 MLP, SGD with
// momentum, 64 samples a step, 16 per rank) on the embedded digits, with
// the example's step (stepper.step: forward, backward, the Reducer's
// allreduce, the optimizer) and its elastic state (registerElastic: the
// parameters, the momentum, the counters, the sampler, the epoch sums),
// whose commit the step prepares as the example's does.
//
// In gomaxprocs=per-rank the Go runtime has a P per rank, as the
// example's ranks have one each in a job of processes (Train: GOMAXPROCS
// = cores / ranks on the host, at least 1), the OS sharing the cores
// between them; in gomaxprocs=per-core it has one per core, and the 4
// ranks share them in the runtime too, where a rank polling for a
// message holds a P that another rank's goroutine may wait for.
//
// The steps alternate in blocks of benchBlock: a block that commits after
// every step, then a block that does not commit, the order swapped at
// every pair of blocks. Rank 0 times each block from its first step to its
// last, which for a committing block includes the wait for the slowest
// rank in each commit, as a step of a real job does. It reports the median
// step time of either kind (ns/step-commit, ns/step-none, over the blocks)
// and the overhead, the median over the pairs of blocks of (committing −
// not) / not: a pair runs within a few tens of milliseconds, so a change
// of load on a shared machine hits both of its blocks alike, and a block
// that a burst of load slowed down moves a median but little. It also
// reports the overhead in the CPU time of the process (all 4 ranks),
// %cpu-overhead, which the load of other processes changes less: with 4
// ranks on fewer cores it is most of what the commit costs, the rest being
// the ranks' wait for each other.
//
// The comparison is fair: both kinds run the same code on the same data
// (the steps of a run are drawn in turn from one sampler, and a step of
// the dense model costs the same whatever its samples), interleaved in one
// process; sub-benchmarks would run one kind after the other. A warm-up
// block of each kind is left out. go test's -count repeats the whole; take
// the median over the counts:
//
//	go test -run '^$' -bench ElasticStep -benchtime 2000x -count 10 ./examples/mnist
func BenchmarkElasticStep(b *testing.B) {
	const ranks = 4
	for _, procs := range []struct {
		name string
		n    int
	}{{"per-rank", ranks}, {"per-core", runtime.NumCPU()}} {
		b.Run("gomaxprocs="+procs.name, func(b *testing.B) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs.n))
			benchElasticStep(b, ranks)
		})
	}
}

// benchElasticStep is BenchmarkElasticStep with ranks ranks.
func benchElasticStep(b *testing.B, ranks int) {
	cfg, err := parseFlags([]string{"--progress", "off"})
	if err != nil {
		b.Fatal(err)
	}
	data, _, err := LoadSplits(cfg.Data)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(b.Context(), 10*time.Minute)
	defer cancel()
	job, err := collective.StartLocal(ctx, ranks, collective.WithElastic(0))
	if err != nil {
		b.Fatal(err)
	}
	defer job.Close()
	pairs := max(1, (b.N+2*benchBlock-1)/(2*benchBlock))
	var (
		times  blockTimes
		warm   sync.WaitGroup
		start  = make(chan struct{})
		errs   = make([]error, ranks)
		ranksG sync.WaitGroup
	)
	warm.Add(ranks)
	for r, comm := range job.Comms {
		ranksG.Add(1)
		go func() {
			defer ranksG.Done()
			var t *blockTimes
			if r == 0 {
				t = &times
			}
			// A rank that fails before its warm-up is done must not
			// leave the benchmark waiting for it.
			warmed := sync.OnceFunc(warm.Done)
			defer warmed()
			errs[r] = benchSteps(ctx, cfg, comm, data, pairs, warmed, start, t)
		}()
	}
	warm.Wait()
	b.ResetTimer()
	close(start)
	ranksG.Wait()
	b.StopTimer()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	every, none := median(times.wall[0])/benchBlock, median(times.wall[1])/benchBlock
	b.ReportMetric((every+none)/2, "ns/op")
	b.ReportMetric(every, "ns/step-commit")
	b.ReportMetric(none, "ns/step-none")
	b.ReportMetric(100*pairedOverhead(times.wall), "%overhead")
	b.ReportMetric(100*pairedOverhead(times.cpu), "%cpu-overhead")
}

// blockTimes are the wall and CPU times of BenchmarkElasticStep's blocks:
// [0] of the committing ones, [1] of the others, pair by pair.
type blockTimes struct{ wall, cpu [2][]time.Duration }

// pairedOverhead is the median over the pairs of blocks of (committing −
// not) / not.
func pairedOverhead(t [2][]time.Duration) float64 {
	over := make([]float64, len(t[0]))
	for p := range over {
		over[p] = float64(t[0][p]-t[1][p]) / float64(t[1][p])
	}
	return median(over)
}

// processCPU is the CPU time this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func median[T time.Duration | float64](v []T) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (float64(s[n/2-1]) + float64(s[n/2])) / 2
	}
	return float64(s[len(s)/2])
}

// benchBlock is how many steps of one kind BenchmarkElasticStep runs in a
// row: long enough that the commit's wait for a slower rank, which spills
// into the next block's first step, shifts a block's time by little, short
// enough that both kinds see the same load.
const benchBlock = 16

// benchSteps is one rank of BenchmarkElasticStep: a warm-up block of each
// kind, then warmed, then, once start is closed, pairs of blocks; rank 0
// appends the times of each block to times (nil on the other ranks).
func benchSteps(ctx context.Context, cfg *Config, comm *collective.Comm, data *Dataset, pairs int, warmed func(), start <-chan struct{}, times *blockTimes) error {
	model := NewMLP(data.Pixels, cfg.Hidden, 10, rand.New(rand.NewPCG(cfg.Seed, 0)))
	names, params, grads := model.Params()
	plan, err := planBatches(cfg.Batch, cfg.GlobalBatch, cfg.Accumulate, comm.Size())
	if err != nil {
		return err
	}
	red, err := collective.NewReducer(comm, collective.ReducerOptions{BackwardPassesPerStep: plan.K, FusionThreshold: cfg.FusionThreshold})
	if err != nil {
		return err
	}
	for i, name := range names {
		if err := red.Register(name, params[i], grads[i]); err != nil {
			return err
		}
	}
	opt, err := NewOptimizer(cfg.Optimizer, cfg.LR, cfg.Momentum, params)
	if err != nil {
		return err
	}
	gstep, epoch, global, lastSaved := 0, 1, plan.Global, -1
	local := []float64{0, 0, 0}
	sampler := collective.NewElasticSampler(data.Len(), cfg.Seed)
	sampler.NextEpoch()
	st := collective.NewElasticState(comm)
	if err := registerElastic(st, names, params, opt, &local, "step", &gstep, "epoch", &epoch, "global batch", &global,
		"sampler", sampler, "last checkpoint", &lastSaved); err != nil {
		return err
	}
	work := &stepper{model: model, params: params, grads: grads, opt: opt, data: data}
	rank := comm.Rank()
	block := func(ctx context.Context, commit bool) error {
		for range benchBlock {
			if sampler.EpochDone() {
				sampler.NextEpoch()
				epoch++
			}
			batch := sampler.Next(plan.Global, 0, 1)
			micro := func(k int) []int {
				lo, hi := plan.Slot(k, rank)
				return batch[lo:hi]
			}
			var prepare *collective.ElasticState
			if commit {
				prepare = st
			}
			if err := work.step(ctx, red, planBatchesOf(plan, micro), local, nil, prepare); err != nil {
				return err
			}
			gstep++
			if commit {
				if err := st.Commit(ctx); err != nil {
					return err
				}
			}
		}
		return nil
	}
	entered := false
	return collective.RunElastic(ctx, comm, st, func(ctx context.Context) error {
		if entered {
			return errors.New("the job was reset: a rank was lost during the benchmark")
		}
		entered = true
		err := block(ctx, true)
		if err == nil {
			err = block(ctx, false)
		}
		warmed()
		if err != nil {
			return err
		}
		select {
		case <-start:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		for p := range pairs {
			for i := range 2 {
				kind := (p + i) % 2 // 0: commit after every step; the first kind alternates
				t0, cpu0 := time.Now(), processCPU()
				if err := block(ctx, kind == 0); err != nil {
					return err
				}
				if times != nil {
					times.wall[kind] = append(times.wall[kind], time.Since(t0))
					times.cpu[kind] = append(times.cpu[kind], processCPU()-cpu0)
				}
			}
		}
		return nil
	})
}
