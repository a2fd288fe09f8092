package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/collective"
)

// The elastic tests train in one process, with the ranks of a
// collective.StartLocal job, on the first 1,024 embedded digits (16 steps
// of 64 per epoch) and the whole test set, for 3 epochs.
const (
	elasticTrainN = 1024
	elasticEpochs = 3
)

var subset struct {
	once        sync.Once
	train, test *Dataset
	err         error
}

func loadSubset(string) (*Dataset, *Dataset, error) {
	subset.once.Do(func() {
		tr, te, err := LoadSplits("")
		if err != nil {
			subset.err = err
			return
		}
		subset.train = &Dataset{Images: tr.Images[:elasticTrainN*tr.Pixels], Labels: tr.Labels[:elasticTrainN], Pixels: tr.Pixels}
		subset.test = te
	})
	return subset.train, subset.test, subset.err
}

// stepRecord is what one process trained on in one step, and in which
// membership epoch.
type stepRecord struct {
	epoch int
	idx   []int
}

// process is one rank's run.
type process struct {
	res     *runResult
	err     error
	out     bytes.Buffer
	steps   map[int]stepRecord // by step of the run; a step run again replaces its record
	crashed bool
}

var errCrashed = errors.New("crashed by the test")

// runJob trains with n ranks in this process, with flags besides the
// defaults. crashAt > 0 crashes the process that starts as rank crashRank
// (as kill -9 would) after the optimizer update of step crashAt, before
// its commit.
func runJob(t *testing.T, n int, elastic bool, crashRank, crashAt int, flags ...string) []*process {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var opts []collective.Option
	if elastic {
		opts = append(opts, collective.WithElastic(0), collective.WithElasticLimits(2, n))
	}
	job, err := collective.StartLocal(ctx, n, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := job.Close(); err != nil {
			t.Errorf("closing the job: %v", err)
		}
	}()
	cfg, err := parseFlags(append([]string{"--epochs", fmt.Sprint(elasticEpochs), "--progress", "off"}, flags...))
	if err != nil {
		t.Fatal(err)
	}
	procs := make([]*process, n)
	var wg sync.WaitGroup
	for i, comm := range job.Comms {
		p := &process{steps: map[int]stepRecord{}}
		procs[i] = p
		h := hooks{load: loadSubset, stdout: &p.out, stderr: &p.out,
			samples: func(c *collective.Comm, gstep int, idx []int) {
				p.steps[gstep] = stepRecord{c.Epoch(), append([]int(nil), idx...)}
			},
			afterStep: func(c *collective.Comm, gstep int) error {
				if i == crashRank && gstep == crashAt && c.Epoch() == 0 {
					p.crashed = true
					job.Crash(c)
					return errCrashed
				}
				return nil
			},
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.res, p.err = train(ctx, cfg, comm, time.Now(), h)
		}()
	}
	wg.Wait()
	for i, p := range procs {
		if p.crashed {
			if !errors.Is(p.err, errCrashed) {
				t.Errorf("process %d (crashed): %v", i, p.err)
			}
			continue
		}
		if p.err != nil {
			t.Errorf("process %d: %v\n%s", i, p.err, p.out.String())
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	return procs
}

func survivors(procs []*process) []*process {
	var out []*process
	for _, p := range procs {
		if !p.crashed {
			out = append(out, p)
		}
	}
	return out
}

// checkSamplesOnce checks that the steps the job kept used every training
// sample exactly once per epoch: for every step, the records of the
// newest membership epoch that ran it (a step interrupted by a loss is run
// again in the next one).
func checkSamplesOnce(t *testing.T, procs []*process, stepsPerEpoch int) {
	t.Helper()
	uses := make([][]int, elasticEpochs)
	for e := range uses {
		uses[e] = make([]int, elasticTrainN)
	}
	for s := 1; s <= elasticEpochs*stepsPerEpoch; s++ {
		newest := -1
		for _, p := range procs {
			if r, ok := p.steps[s]; ok {
				newest = max(newest, r.epoch)
			}
		}
		if newest < 0 {
			t.Fatalf("no process ran step %d", s)
		}
		for _, p := range procs {
			if r, ok := p.steps[s]; ok && r.epoch == newest {
				for _, i := range r.idx {
					uses[(s-1)/stepsPerEpoch][i]++
				}
			}
		}
	}
	for e, u := range uses {
		for i, n := range u {
			if n != 1 {
				t.Errorf("epoch %d: sample %d used %d times, want once", e+1, i, n)
			}
		}
	}
}

func finalAcc(p *process) float64 { return 100 * p.res.History[len(p.res.History)-1].TestAcc }

// An elastic job of 4 ranks loses rank 2 in the middle of epoch 2 (after
// the update of step 21, before its Commit): the 3 survivors run step 21
// again, sharing its global batch of 64 (21, 21, 22, weighted), and finish;
// or, when every rank's Prepare of that commit had reached the others
// before the loss, they take the commit of step 21 and go on from step 22.
// They end with identical parameters, every epoch used every sample once,
// and the test accuracy is within 0.5 points of the uninterrupted run's.
// An elastic job that loses nobody trains exactly what a fixed-size job
// trains (with even shares: balanced by the ranks' measured speeds, the
// sums would differ in their rounding). The job that loses a rank
// balances, rank 3 computing twice as long: the shares go back to the
// even split after the loss.
func TestElasticLosesARank(t *testing.T) {
	fixed := runJob(t, 4, false, -1, 0, "--balance=false")
	whole := runJob(t, 4, true, -1, 0, "--balance=false")
	if a, b := fixed[0].res.Hash, whole[0].res.Hash; a != b {
		t.Errorf("an elastic job that loses no rank ends with parameters %s, a fixed-size one with %s", b, a)
	}
	for i, p := range whole {
		if p.res.Hash != whole[0].res.Hash || len(p.res.Resets) != 0 {
			t.Errorf("uninterrupted elastic job: process %d ends with %s after %d resets; process 0 with %s", i, p.res.Hash, len(p.res.Resets), whole[0].res.Hash)
		}
	}
	steps := whole[0].res.Steps
	checkSamplesOnce(t, whole, steps)

	const crashAt = 21 // epoch 2, step 5 of 16
	procs := runJob(t, 4, true, 2, crashAt, "--balance-every", "4", "--slow-rank", "3:2")
	alive := survivors(procs)
	if len(alive) != 3 {
		t.Fatalf("%d survivors, want 3", len(alive))
	}
	for i, p := range alive {
		if p.res.Hash != alive[0].res.Hash {
			t.Errorf("survivor %d ends with parameters %s, survivor 0 with %s", i, p.res.Hash, alive[0].res.Hash)
		}
		if len(p.res.Resets) != 1 || p.res.Resets[0].NewSize != 3 || len(p.res.Resets[0].Lost) != 1 || p.res.Resets[0].Lost[0].Rank != 2 {
			t.Errorf("survivor %d: resets %v, want one that lost rank 2 and left 3 ranks", i, p.res.Resets)
		}
		if len(p.res.History) != elasticEpochs || p.res.History[elasticEpochs-1].Ranks != 3 {
			t.Errorf("survivor %d: history of %d epochs, want %d, the last with 3 ranks", i, len(p.res.History), elasticEpochs)
		}
		// The bytes of the epoch of the reset count the rings of both
		// membership epochs (they underflowed to ~1.8e19 when the Comm's
		// counters restarted with the new ring).
		for _, r := range p.res.History {
			if r.WireBytes == 0 || r.WireBytes > whole[0].res.History[r.Epoch-1].WireBytes*2 {
				t.Errorf("survivor %d: epoch %d sent %d bytes on the wire; the uninterrupted job's rank 0 sent %d", i, r.Epoch, r.WireBytes, whole[0].res.History[r.Epoch-1].WireBytes)
			}
		}
	}
	checkSamplesOnce(t, procs, steps)
	// Every epoch's summary counted every sample, that of the loss too:
	// the lost rank's sums were adopted by its buddy.
	for i, p := range alive {
		for e, n := range p.res.Counted {
			if n != elasticTrainN {
				t.Errorf("survivor %d: the train loss and accuracy of epoch %d are over %v samples, want %d", i, e+1, n, elasticTrainN)
			}
		}
	}
	got, want := finalAcc(alive[0]), finalAcc(whole[0])
	t.Logf("test accuracy after %d epochs: %.2f%% uninterrupted, %.2f%% after losing rank 2 at step %d", elasticEpochs, want, got, crashAt)
	if math.Abs(got-want) > 0.5 {
		t.Errorf("test accuracy %.2f%% after the loss, %.2f%% without: more than 0.5 points apart", got, want)
	}
	// Rank 0 says what happened, in one line.
	out := alive[0].out.String()
	t.Logf("rank 0's output:\n%s", out)
	line := regexp.MustCompile(`(?m)^elastic: lost rank 2 \(host [^,]+, [^)]+\) at step (21 \(epoch 2, step 5|22 \(epoch 2, step 6) of 16\); reset took [0-9.]+ s; going on with 3 ranks \(global batch 64: 21, 21, 22\)$`)
	if !line.MatchString(out) {
		t.Errorf("rank 0's output lacks the reset line (want %s)", line)
	}
	if !regexp.MustCompile(`(?m)^balance: shares \d+, \d+, \d+, \d+ \(rank 3 at 0\.\d\dx the fastest\)$`).MatchString(out) {
		t.Errorf("rank 0's output lacks a line of balanced shares, with rank 3 the slowest")
	}
}

// BenchmarkElasticCommit measures a Commit of the example's state (the
// MLP's 101,770 parameters, SGD's velocity, the counters and the sampler,
// and, in "unique", the epoch sums that the buddy rank keeps a copy of) on
// ranks of this process that do nothing else: the cost of the commit
// itself, without the waiting for slower ranks that a training step adds.
func BenchmarkElasticCommit(b *testing.B) {
	for _, n := range []int{2, 4} {
		for _, unique := range []bool{false, true} {
			b.Run(fmt.Sprintf("ranks=%d/unique=%v", n, unique), func(b *testing.B) {
				ctx := context.Background()
				job, err := collective.StartLocal(ctx, n, collective.WithElastic(0))
				if err != nil {
					b.Fatal(err)
				}
				defer job.Close()
				var wg sync.WaitGroup
				errs := make([]error, n)
				b.ResetTimer()
				for r, comm := range job.Comms {
					wg.Add(1)
					go func() {
						defer wg.Done()
						errs[r] = commitLoop(ctx, comm, unique, b.N)
					}()
				}
				wg.Wait()
				for _, err := range errs {
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

func commitLoop(ctx context.Context, comm *collective.Comm, unique bool, n int) error {
	model := NewMLP(28*28, []int{128}, 10, rand.New(rand.NewPCG(1, 0)))
	names, params, _ := model.Params()
	opt, _ := NewOptimizer("sgd", 0.03, 0.9, params)
	st := collective.NewElasticState(comm)
	for i, p := range params {
		if err := st.Register(names[i], p); err != nil {
			return err
		}
	}
	onames, obufs := opt.State()
	for i, buf := range obufs {
		if err := st.Register(onames[i], buf); err != nil {
			return err
		}
	}
	gstep, epoch, global := 0, 1, 64
	sampler := collective.NewElasticSampler(8000, 1)
	if err := st.Register("step", &gstep, "epoch", &epoch, "global batch", &global, "sampler", sampler); err != nil {
		return err
	}
	if unique {
		local := []float64{1, 2, 3}
		if err := st.RegisterUnique("epoch sums", epochSums{&local}); err != nil {
			return err
		}
	}
	return collective.RunElastic(ctx, comm, st, func(ctx context.Context) error {
		for range n {
			gstep++
			if err := st.Commit(ctx); err != nil {
				return err
			}
		}
		return nil
	})
}

// A process joins an elastic job of 2 ranks (from step 5 the ranks take
// 0.1 s per step until it is admitted at a commit): it gets the
// parameters, the optimizer state, the counters and the sampler from a
// live rank, takes part in the checkpoints (every epoch's end, and not
// again at the end of training), and the 3 ranks end with identical
// parameters, every epoch having used every sample once.
func TestElasticJoiner(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	job, err := collective.StartLocal(ctx, 2, collective.WithElastic(0), collective.WithElasticLimits(1, 3))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := job.Close(); err != nil {
			t.Errorf("closing the job: %v", err)
		}
	}()
	dir := t.TempDir()
	cfg, err := parseFlags([]string{"--epochs", fmt.Sprint(elasticEpochs), "--progress", "off", "--checkpoint-dir", dir, "--checkpoint-every", "16"})
	if err != nil {
		t.Fatal(err)
	}
	procs := make([]*process, 3)
	start := func(i int, comm *collective.Comm, wg *sync.WaitGroup) {
		p := &process{steps: map[int]stepRecord{}}
		procs[i] = p
		h := hooks{load: loadSubset, stdout: &p.out, stderr: &p.out,
			samples: func(c *collective.Comm, gstep int, idx []int) {
				p.steps[gstep] = stepRecord{c.Epoch(), append([]int(nil), idx...)}
			},
			afterStep: func(c *collective.Comm, gstep int) error {
				// From step 5 the members wait, before their commit, until
				// they have heard of the joiner (or it is in): the commit
				// then admits it.
				for gstep >= 5 && c.Size() < 3 && c.PendingJoiners() == 0 {
					select {
					case <-ctx.Done():
						return fmt.Errorf("step %d: no joiner announced: %w", gstep, context.Cause(ctx))
					case <-time.After(5 * time.Millisecond): // polling a counter the heartbeats update
					}
				}
				return nil
			},
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.res, p.err = train(ctx, cfg, comm, time.Now(), h)
		}()
	}
	var wg sync.WaitGroup
	for i, comm := range job.Comms {
		start(i, comm, &wg)
	}
	c, err := job.Join(ctx)
	if err != nil {
		t.Fatalf("joiner: %v", err)
	}
	start(2, c, &wg)
	wg.Wait()
	for i, p := range procs {
		if p.err != nil {
			t.Fatalf("process %d: %v\n%s", i, p.err, p.out.String())
		}
		if p.res.Hash != procs[0].res.Hash {
			t.Errorf("process %d ends with parameters %s, process 0 with %s", i, p.res.Hash, procs[0].res.Hash)
		}
	}
	checkSamplesOnce(t, procs, procs[0].res.Steps)
	out := procs[0].out.String()
	t.Logf("rank 0's output:\n%s", out)
	line := regexp.MustCompile(`(?m)^elastic: rank 2 joined at step \d+ \(epoch \d, step \d+ of 16\) and got the parameters from a live rank; reset took [0-9.]+ s; going on with 3 ranks \(global batch 64: 21, 21, 22\)$`)
	if !line.MatchString(out) {
		t.Errorf("rank 0's output lacks the join line (want %s)", line)
	}
	if c.Rank() != 2 || procs[2].out.Len() != 0 {
		t.Errorf("the joiner is rank %d and printed %q; want rank 2, silent", c.Rank(), procs[2].out.String())
	}
}

func TestResetLines(t *testing.T) {
	lost := func(rank int, host, cause string) collective.LostMember {
		var l collective.LostMember
		l.Rank, l.Host, l.Cause = rank, host, cause
		return l
	}
	plan3 := BatchPlan{Global: 64, K: 1, Size: 3}
	for _, c := range []struct {
		ev                          collective.ElasticEvent
		plan                        BatchPlan
		gstep, epoch, steps, epochs int
		want                        []string
	}{
		{collective.ElasticEvent{NewSize: 3, Took: 310 * time.Millisecond, Lost: []collective.LostMember{lost(2, "a/net:[4026531833]/boot", "disconnected")}},
			plan3, 411, 4, 125, 10,
			[]string{"elastic: lost rank 2 (host a, disconnected) at step 412 (epoch 4, step 37 of 125); reset took 0.310 s; going on with 3 ranks (global batch 64: 21, 21, 22)"}},
		{collective.ElasticEvent{NewSize: 2, Took: time.Second, Lost: []collective.LostMember{lost(1, "a", "disconnected"), lost(3, "b", "stopped responding: 3s")}},
			BatchPlan{Global: 64, K: 2, Size: 2}, 500, 4, 125, 10,
			[]string{"elastic: lost ranks 1 (host a, disconnected), 3 (host b, stopped responding: 3s) after step 500, in the evaluation of epoch 4; reset took 1.000 s; going on with 2 ranks (global batch 64: 16+16, 16+16)"}},
		{collective.ElasticEvent{NewSize: 4, Took: 20 * time.Millisecond, Joined: []int{3}},
			BatchPlan{Global: 64, K: 1, Size: 4}, 1250, 11, 125, 10,
			[]string{"elastic: rank 3 joined after the last step (1250), in the final report and got the parameters from a live rank; reset took 0.020 s; going on with 4 ranks (global batch 64: 16, 16, 16, 16)"}},
		{collective.ElasticEvent{NewSize: 3, Lost: []collective.LostMember{lost(0, "a", "disconnected")}, Joined: []int{2}},
			plan3, 0, 1, 125, 10,
			[]string{"elastic: lost rank 0 (host a, disconnected) at step 1 (epoch 1, step 1 of 125)",
				"elastic: rank 2 joined at step 1 (epoch 1, step 1 of 125) and got the parameters from a live rank; reset took 0.000 s; going on with 3 ranks (global batch 64: 21, 21, 22)"}},
	} {
		got := resetLines(c.ev, c.plan.Global, c.plan.Describe(), c.gstep, c.epoch, c.steps, c.epochs)
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("resetLines:\n got %q\nwant %q", got, c.want)
		}
	}
}

// The epoch's sums survive a rank: its buddy adds them to its own, and a
// joiner starts from zero.
func TestEpochSumsAdopt(t *testing.T) {
	a, b := []float64{1.5, 10, 16}, []float64{0.5, 12, 16}
	ba, _ := epochSums{&a}.SaveUnique()
	bb, _ := epochSums{&b}.SaveUnique()
	var got []float64
	if err := (epochSums{&got}).RestoreUnique(ba, [][]byte{bb}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[2 22 32]" {
		t.Errorf("own + adopted = %v, want [2 22 32]", got)
	}
	if err := (epochSums{&got}).RestoreUnique(nil, nil); err != nil || fmt.Sprint(got) != "[0 0 0]" {
		t.Errorf("a joiner's sums: %v, %v; want [0 0 0]", got, err)
	}
	if err := (epochSums{&got}).RestoreUnique([]byte{1, 2}, nil); err == nil {
		t.Error("a truncated blob was accepted")
	}
}

func TestElasticPlan(t *testing.T) {
	for _, c := range []struct {
		batch, accumulate, global, size int
		want                            string
	}{
		{0, 0, 64, 3, "21, 21, 22"},
		{0, 2, 64, 3, "10+10, 11+11, 11+11"},
		{16, 0, 64, 3, "10+10, 11+11, 11+11"}, // at most 16 per micro-batch: 2 of them
		{16, 0, 64, 2, "16+16, 16+16"},
		{0, 0, 64, 4, "16, 16, 16, 16"},
	} {
		p, err := elasticPlan(&Config{Batch: c.batch, Accumulate: c.accumulate}, c.global, c.size)
		if err != nil || p.Describe() != c.want {
			t.Errorf("batch %d, accumulate %d, global %d, %d ranks: %q, %v; want %q", c.batch, c.accumulate, c.global, c.size, p.Describe(), err, c.want)
		}
	}
	if _, err := elasticPlan(&Config{Accumulate: 4}, 8, 3); err == nil {
		t.Error("8 samples over 3 ranks × 4 micro-batches: no error")
	}
}

// A rank lost during the start of an elastic job that resumes from a
// checkpoint: the others restore the checkpoint again with the ranks that
// are left and go on from its step, never from step 0 (and never stop).
// Before, the start's broadcast and restore ran outside RunElastic, so the
// survivors failed; and a member whose Init returned in a later epoch took
// itself for a joiner and skipped the restore.
func TestElasticLossDuringStart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	run := func(n, epochs int, crash bool) []*process {
		job, err := collective.StartLocal(ctx, n, collective.WithElastic(0), collective.WithElasticLimits(2, n))
		if err != nil {
			t.Fatal(err)
		}
		defer job.Close()
		cfg, err := parseFlags([]string{"--epochs", fmt.Sprint(epochs), "--progress", "off", "--checkpoint-dir", dir, "--checkpoint-every", "16"})
		if err != nil {
			t.Fatal(err)
		}
		comms := job.Comms
		if crash {
			job.Crash(comms[n-1]) // lost before it makes any call
			comms = comms[:n-1]
		}
		procs := make([]*process, len(comms))
		var wg sync.WaitGroup
		for i, comm := range comms {
			p := &process{steps: map[int]stepRecord{}}
			procs[i] = p
			h := hooks{load: loadSubset, stdout: &p.out, stderr: &p.out}
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.res, p.err = train(ctx, cfg, comm, time.Now(), h)
			}()
		}
		wg.Wait()
		for i, p := range procs {
			if p.err != nil {
				t.Fatalf("process %d: %v\n%s", i, p.err, p.out.String())
			}
		}
		return procs
	}
	run(3, 1, false) // a checkpoint at step 16, the end of epoch 1
	procs := run(3, 2, true)
	out := procs[0].out.String()
	t.Logf("rank 0's output:\n%s", out)
	if !strings.Contains(out, "at step 16 of 32") {
		t.Errorf("the survivors did not resume from the checkpoint's step 16")
	}
	if !regexp.MustCompile(`(?m)^elastic: lost rank 2 \(host [^,]+, [^)]+\) during the start; restoring the checkpoint again with 2 ranks$`).MatchString(out) {
		t.Errorf("rank 0's output does not say that rank 2 was lost during the start")
	}
	for i, p := range procs {
		h := p.res.History
		if len(h) != 2 || h[1].Ranks != 2 || p.res.Hash != procs[0].res.Hash {
			t.Errorf("process %d: %d epochs (want 2, the second with 2 ranks), parameters %s (process 0: %s)", i, len(h), p.res.Hash, procs[0].res.Hash)
		}
	}
}
