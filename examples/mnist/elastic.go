package main

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"gorgonia.org/tensor"

	"github.com/gorun/gorun/collective"
)

// Elastic training (gorun -np 4 --min-np 2 ./examples/mnist): the training
// loop of train.go runs under collective.RunElastic, with an ElasticState
// that holds what a step changes:
//
//   - replicated (the same on every rank): the parameters, the optimizer's
//     moments, the step and epoch counters, the global batch, the
//     ElasticSampler's epoch and cursor, and the step of the newest
//     checkpoint;
//   - rank-unique: this rank's running sums of the epoch's training loss and
//     accuracy (epochSums), which its buddy rank keeps a copy of, so that the
//     epoch's summary still counts the samples of a rank that was lost.
//
// Every optimizer step ends with a Commit, which the step prepares once
// its gradients' allreduce is queued (stepper.step). When a rank is lost,
// the collectives of the survivors fail, RunElastic re-forms the ring with
// the ranks that are left, restores the last commit and calls the loop
// again: the interrupted step is run again by the survivors, which share its
// global batch between them (the OnReset callback in train.go re-plans the
// micro-batches for the new size). The global batch stays the same, so the
// model trains on the same samples per step whatever the number of ranks.

// epochSums is this rank's running sums of the current epoch (loss,
// correct, count): rank-unique state. A rank that adopts the sums of a lost
// predecessor adds them to its own, so that the epoch's train loss and
// accuracy still cover every sample of the committed steps.
type epochSums struct{ local *[]float64 }

func (s epochSums) SaveUnique() ([]byte, error) {
	var b []byte
	for _, v := range *s.local {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	}
	return b, nil
}

func (s epochSums) RestoreUnique(own []byte, adopted [][]byte) error {
	sums := []float64{0, 0, 0} // a joiner starts the epoch with nothing
	for i, b := range append([][]byte{own}, adopted...) {
		if b == nil && i == 0 {
			continue
		}
		if len(b) != 8*len(sums) {
			return fmt.Errorf("epoch sums of %d bytes, want %d", len(b), 8*len(sums))
		}
		for j := range sums {
			sums[j] += math.Float64frombits(binary.LittleEndian.Uint64(b[8*j:]))
		}
	}
	*s.local = sums
	return nil
}

// registerElastic registers with st what the example commits: the
// parameters and the optimizer's buffers, then replicated, name and value
// pairs (the counters and the sampler), as replicated state, and this
// rank's epoch sums (local) as rank-unique state.
func registerElastic(st *collective.ElasticState, names []string, params []*tensor.Dense, opt Optimizer, local *[]float64, replicated ...any) error {
	for i, p := range params {
		if err := st.Register(names[i], p); err != nil {
			return err
		}
	}
	onames, obufs := opt.State()
	for i, b := range obufs {
		if err := st.Register(onames[i], b); err != nil {
			return err
		}
	}
	if err := st.Register(replicated...); err != nil {
		return err
	}
	return st.RegisterUnique("epoch sums", epochSums{local})
}

// elasticPlan is the batch plan after a membership change: the same global
// batch over the new number of ranks, in as many micro-batches per rank as
// before (--accumulate), or, with --batch, in micro-batches of at most
// --batch samples. Slots that the ranks do not divide evenly are weighted
// by their sizes (BatchPlan.Weight), as in a fixed-size job.
func elasticPlan(cfg *Config, global, size int) (BatchPlan, error) {
	k := max(cfg.Accumulate, 1)
	if cfg.Batch > 0 {
		k = (global + size*cfg.Batch - 1) / (size * cfg.Batch)
	}
	if global < k*size {
		return BatchPlan{}, fmt.Errorf("global batch %d is smaller than %d ranks × %d micro-batches: the job cannot go on with %d ranks", global, size, k, size)
	}
	return BatchPlan{Global: global, K: k, Size: size}, nil
}

// seekSampler moves a fresh sampler to step inEpoch of epoch (1-based, as
// the example counts epochs: the sampler's epoch e draws the same
// permutation as Sharder.Epoch(e)).
func seekSampler(s *collective.ElasticSampler, epoch, inEpoch, global int) {
	for s.Epoch() < epoch {
		s.NextEpoch()
	}
	for range inEpoch {
		s.Next(global, 0, 1)
	}
}

// where says which step a reset happened in: the step the job runs again
// (or runs next, after a join), or the part of the run between steps.
func where(gstep, epoch, steps, epochs int) string {
	switch {
	case epoch > epochs:
		return fmt.Sprintf("after the last step (%d), in the final report", gstep)
	case gstep >= epoch*steps:
		return fmt.Sprintf("after step %d, in the evaluation of epoch %d", gstep, epoch)
	}
	return fmt.Sprintf("at step %d (epoch %d, step %d of %d)", gstep+1, epoch, gstep-(epoch-1)*steps+1, steps)
}

// resetLines describe a reset in one line (two when ranks were both lost
// and admitted; ev.Notes are left out), with the split of the global batch
// among the ranks now (BatchPlan.Describe, or the balanced shares), e.g.
//
//	elastic: lost rank 2 (host a, disconnected) at step 412 (epoch 4, step 37 of 125); reset took 0.310 s; going on with 3 ranks (global batch 64: 21, 21, 22)
func resetLines(ev collective.ElasticEvent, global int, split string, gstep, epoch, steps, epochs int) []string {
	at := where(gstep, epoch, steps, epochs)
	tail := fmt.Sprintf("reset took %.3f s; going on with %d ranks (global batch %d: %s)", ev.Took.Seconds(), ev.NewSize, global, split)
	var lines []string
	lost := slices.Clone(ev.Lost)
	slices.SortFunc(lost, func(a, b collective.LostMember) int { return a.Rank - b.Rank })
	// Ranks that left at a commit (SIGTERM) handed everything over there:
	// the job goes on from that commit.
	for _, l := range lost {
		if l.Left {
			host := l.HostLabel()
			lines = append(lines, fmt.Sprintf("elastic: rank %d (host %s) %s at the commit of step %d: no step lost", l.Rank, host, l.Cause, gstep))
		}
	}
	lost = slices.DeleteFunc(lost, func(l collective.LostMember) bool { return l.Left })
	if len(lost) > 0 {
		var who []string
		for _, l := range lost {
			host := l.HostLabel()
			who = append(who, fmt.Sprintf("%d (host %s, %s)", l.Rank, host, l.Cause))
		}
		s := "rank "
		if len(who) > 1 {
			s = "ranks "
		}
		lines = append(lines, fmt.Sprintf("elastic: lost %s%s %s", s, strings.Join(who, ", "), at))
	}
	if len(ev.Joined) > 0 {
		var who []string
		for _, r := range ev.Joined {
			who = append(who, fmt.Sprint(r))
		}
		s := "rank " + who[0] + " joined"
		if len(who) > 1 {
			s = "ranks " + strings.Join(who, ", ") + " joined"
		}
		lines = append(lines, fmt.Sprintf("elastic: %s %s and got the parameters from a live rank", s, at))
	}
	if len(lines) == 0 {
		lines = append(lines, fmt.Sprintf("elastic: the job was re-formed (%d -> %d ranks) %s", ev.OldSize, ev.NewSize, at))
	}
	lines[len(lines)-1] += "; " + tail
	return lines
}

// startLines describe a reset during the start (the checkpoint restore),
// before any step: who was lost and how many ranks go on.
func startLines(ev collective.ElasticEvent) []string {
	var lines []string
	for _, l := range ev.Lost {
		host := l.HostLabel()
		lines = append(lines, fmt.Sprintf("elastic: lost rank %d (host %s, %s) during the start; restoring the checkpoint again with %d ranks", l.Rank, host, l.Cause, ev.NewSize))
	}
	if len(lines) == 0 {
		lines = append(lines, fmt.Sprintf("elastic: the job was re-formed (%d -> %d ranks) during the start; restoring the checkpoint again", ev.OldSize, ev.NewSize))
	}
	return lines
}

// crashSelf is --fail-at-step in an elastic job: the rank vanishes as a
// process killed with kill -9 does (no Close, no exit status to report),
// and the job goes on without it.
func crashSelf(*collective.Comm) {
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	time.Sleep(time.Minute) // the signal is on its way
}
