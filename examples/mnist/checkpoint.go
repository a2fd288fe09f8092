package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"time"

	"gorgonia.org/tensor"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/collective"
)

// checkpointer saves the training state every --checkpoint-every steps to
// --checkpoint-dir and restores the newest one at start. Without
// --checkpoint-dir it does nothing.
//
// A save is asynchronous by default (SaveAsync): the loop stops only while
// the ranks agree on the step and each copies the bytes it writes aside;
// the files are written in the background while training goes on; once
// every rank's files are durable a Poll starts the commit (the manifest
// and the deletion of old checkpoints), in the background too, and the
// Poll of a later step finds it done. Until then the previous checkpoint
// is the one a restart finds. At most one save is in flight: the next one,
// and the end of training, first wait for it. --checkpoint-sync saves with Save,
// which returns once the checkpoint is committed. In an elastic job a save
// in flight when the job re-forms (a rank lost or joined) is abandoned by
// the Manager, which logs it; the previous checkpoint is kept.
type checkpointer struct {
	every     int
	async     bool
	mgr       *checkpoint.Manager
	state     *checkpoint.State
	out       *output
	global    int // this run's global batch, saved with the state
	saved     int // the global batch the restored checkpoint was trained with; 0 if unknown
	lastSaved int // the step of the newest committed checkpoint; -1 for none

	// What the saves cost this rank's training loop: the saves of each
	// kind and the time it was blocked in Save and in SaveAsync; the Polls
	// that found a save still being written or committed (at most one
	// small allreduce each, which also waits for the slowest rank to get
	// there), and the Polls and Waits that ended one.
	nSync, nAsync, nPolls              int
	inSync, inAsync, inPolls, inCommit time.Duration
}

// progressBlob is this rank's part of the state: the history of finished
// epochs (for the plot and metrics), the running sums of the current one,
// and the global batch, which fixes what a step is.
type progressBlob struct {
	History     []EpochResult `json:"history"`
	Sums        []float64     `json:"sums"`
	GlobalBatch int           `json:"global_batch,omitempty"`
}

func newCheckpointer(comm *collective.Comm, cfg *Config, out *output, global int, names []string, params []*tensor.Dense,
	opt Optimizer, history *[]EpochResult, sums *[]float64) (*checkpointer, error) {
	if cfg.CheckpointDir == "" {
		return &checkpointer{lastSaved: -1}, nil
	}
	if cfg.CheckpointEvery <= 0 {
		return nil, fmt.Errorf("--checkpoint-every %d must be positive", cfg.CheckpointEvery)
	}
	c := &checkpointer{every: cfg.CheckpointEvery, async: !cfg.CheckpointSync, out: out, global: global, lastSaved: -1}
	st := new(checkpoint.State)
	// Replicated state: the same on every rank, saved in shards.
	for i, p := range params {
		st.Tensor(names[i], p)
	}
	onames, obufs := opt.State()
	for i, b := range obufs {
		st.Tensor(onames[i], b)
	}
	// Per-rank state.
	st.Blob("progress", func() ([]byte, error) {
		return json.Marshal(progressBlob{History: *history, Sums: *sums, GlobalBatch: c.global})
	}, func(b []byte) error {
		var p progressBlob
		if err := json.Unmarshal(b, &p); err != nil {
			return err
		}
		if len(p.Sums) != 3 {
			return fmt.Errorf("progress blob holds %d sums, want 3", len(p.Sums))
		}
		*history, *sums, c.saved = p.History, p.Sums, p.GlobalBatch
		return nil
	})
	// For s3:// New checks the bucket and the credentials: its error names
	// the location and says what to fix.
	mgr, err := checkpoint.New(comm, cfg.CheckpointDir)
	if err != nil {
		return nil, fmt.Errorf("--checkpoint-dir: %w", err)
	}
	c.mgr, c.state = mgr, st
	return c, nil
}

// restore loads the newest checkpoint and returns its optimizer step (0
// for a fresh start, as without --checkpoint-dir). A step counts global
// batches, so a checkpoint trained with another global batch cannot
// continue this run: restore then fails on every rank alike (the ranks
// agree on the recorded global batch with an allreduce, since ranks beyond
// the old world size have none).
func (c *checkpointer) restore(ctx context.Context, comm *collective.Comm) (int, error) {
	if c.mgr == nil {
		return 0, nil
	}
	step, found, err := c.mgr.Restore(ctx, c.state)
	if err != nil {
		return 0, err
	}
	if !found {
		return 0, nil
	}
	c.lastSaved = int(step)
	saved := []int64{int64(c.saved)}
	if err := comm.Allreduce(ctx, saved, collective.Max); err != nil {
		return 0, err
	}
	if saved[0] != 0 && int(saved[0]) != c.global {
		return 0, fmt.Errorf("--checkpoint-dir %s holds a run with global batch %d, and this one has global batch %d, so its step %d would mean other samples: continue it with --global-batch %d (the number of ranks may change), or use a new --checkpoint-dir",
			c.mgr.Dir(), saved[0], c.global, step, saved[0])
	}
	return int(step), nil
}

// dir is the checkpoint location as the Manager names it: {host}
// replaced, an s3:// location without its options.
func (c *checkpointer) dir(cfg *Config) string {
	if c.mgr == nil {
		return cfg.CheckpointDir
	}
	return c.mgr.Dir()
}

// stepLoc names the checkpoint of step: its directory or s3:// prefix.
func (c *checkpointer) stepLoc(step int) string { return c.mgr.StepLocation(int64(step)) }

// due reports whether maybeSave saves at step.
func (c *checkpointer) due(step int) bool { return c.mgr != nil && step%c.every == 0 }

// maybeSave saves after every --checkpoint-every optimizer steps.
func (c *checkpointer) maybeSave(ctx context.Context, step int) error {
	if c.mgr == nil || step%c.every != 0 {
		return nil
	}
	return c.save(ctx, step)
}

// poll commits the asynchronous save in flight once every rank has
// written its files, and says so. Every rank calls it once per optimizer
// step; with no save in flight it does nothing (every rank knows).
func (c *checkpointer) poll(ctx context.Context) error {
	if c.mgr == nil {
		return nil
	}
	if step, ok := c.mgr.InFlight(); ok {
		return c.settle(ctx, int(step), c.mgr.Poll)
	}
	return nil
}

// wait commits the asynchronous save in flight, waiting for its writes.
func (c *checkpointer) wait(ctx context.Context) error {
	if c.mgr == nil {
		return nil
	}
	if step, ok := c.mgr.InFlight(); ok {
		return c.settle(ctx, int(step), c.mgr.Wait)
	}
	return nil
}

// settle runs Poll or Wait on the save of step and prints its line once it
// is committed. A failed save's error (the same on every rank) ends the
// run; the previous checkpoint is kept. A save that the re-formed job
// abandoned is neither: the Manager logged it.
func (c *checkpointer) settle(ctx context.Context, step int, pollOrWait func(context.Context) error) error {
	t := time.Now()
	err := pollOrWait(ctx)
	took := time.Since(t)
	if err != nil {
		return err
	}
	if _, ok := c.mgr.InFlight(); ok { // still being written or committed
		c.nPolls++
		c.inPolls += took
		return nil
	}
	c.inCommit += took
	c.committed(step)
	return nil
}

// committed prints the line of the asynchronous save of step once it is
// committed (by a Poll, a Wait, or the SaveAsync that follows it), unless
// it was abandoned.
func (c *checkpointer) committed(step int) {
	st := c.mgr.LastSave()
	if st.Step != int64(step) { // abandoned
		return
	}
	c.lastSaved = step
	c.out.printf("checkpoint: step %d snapshotted in %s (training goes on); committed to %s after %s (%s)\n",
		step, st.Stall.Round(time.Millisecond), c.stepLoc(step), st.Total.Round(time.Millisecond), humanBytes(st.Bytes))
}

// saveFinal saves the end of training, unless that step is saved already,
// so that a rerun of the finished job finds it complete instead of
// training its last steps again. It first commits the save in flight: the
// run never ends with an uncommitted save. The last save is synchronous
// whatever --checkpoint-sync: the run waits for it anyway. Then it waits
// for the deletion of old checkpoints, which the Manager runs in the
// background.
func (c *checkpointer) saveFinal(ctx context.Context, step int) error {
	if c.mgr == nil {
		return nil
	}
	if err := c.wait(ctx); err != nil {
		return err
	}
	if step != c.lastSaved {
		if err := c.saveSync(ctx, step); err != nil {
			return err
		}
	}
	return c.mgr.Wait(ctx)
}

// save starts an asynchronous save (after committing the previous one),
// or with --checkpoint-sync writes a checkpoint and says so on one line.
func (c *checkpointer) save(ctx context.Context, step int) error {
	if !c.async {
		return c.saveSync(ctx, step)
	}
	// SaveAsync commits the save still in flight itself, without waiting
	// for the deletion of old checkpoints (Wait would: a store that does
	// not answer it would hold up training); its line follows.
	prev, inFlight := c.mgr.InFlight()
	t := time.Now()
	if err := c.mgr.SaveAsync(ctx, int64(step), c.state); err != nil {
		return err
	}
	c.inAsync += time.Since(t)
	c.nAsync++
	if inFlight {
		c.committed(int(prev))
	}
	return nil
}

func (c *checkpointer) saveSync(ctx context.Context, step int) error {
	t := time.Now()
	if err := c.mgr.Save(ctx, int64(step), c.state); err != nil {
		return err
	}
	c.inSync += time.Since(t)
	c.nSync++
	c.lastSaved = step
	st := c.mgr.LastSave()
	c.out.printf("checkpoint: step %d saved to %s (%s, %s)\n", step, c.stepLoc(step),
		humanBytes(st.Bytes), st.Total.Round(time.Millisecond))
	return nil
}

// report is the final line on what the saves cost the training loop.
func (c *checkpointer) report(rank int) {
	n := c.nSync + c.nAsync
	if c.mgr == nil || n == 0 {
		return
	}
	total := c.inSync + c.inAsync + c.inPolls + c.inCommit
	line := fmt.Sprintf("final: checkpoint: %d save(s) blocked training %.1f ms in all, %.1f ms per save", n, ms(total), ms(total)/float64(n))
	if c.nAsync > 0 {
		line += fmt.Sprintf(": %d asynchronous (%.1f ms in SaveAsync, %.1f ms in the %d Polls while one was written, %.1f ms in the Polls and Waits that committed them)",
			c.nAsync, ms(c.inAsync), ms(c.inPolls), c.nPolls, ms(c.inCommit))
		if c.nSync > 0 {
			line += fmt.Sprintf(", %d synchronous at the end (%.1f ms)", c.nSync, ms(c.inSync))
		}
	} else {
		line += ", all synchronous"
	}
	c.out.printf("%s (rank %d)\n", line, rank)
}

// humanBytes writes a size in binary units (812 B, 3.1 KiB, 14.2 MiB,
// 1.50 GiB), as gorun checkpoint ls does, so both name a checkpoint's size
// alike.
func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// exitStatus is the exit status of a run that failed with err:
// checkpoint.ExitNoRestart, after a line that says why, when its checkpoint
// storage failed in a way a restart would meet again (full, read-only,
// refusing the credentials, no bucket), so that gorun --max-restarts does
// not restart the job; else 1.
func exitStatus(err error) int {
	if why, ok := checkpoint.NoRestart(err); ok {
		fmt.Fprintf(os.Stderr, "mnist: %s; a restart would fail the same way\n", why)
		return checkpoint.ExitNoRestart
	}
	return 1
}

// failAt makes the last rank exit at --fail-at-step on the job's first
// launch, to try resuming under gorun --max-restarts.
func failAt(cfg *Config, step, rank, size int) error {
	restarts, _ := strconv.Atoi(os.Getenv(collective.EnvRestartCount)) // unset: 0
	if cfg.FailAtStep > 0 && step == cfg.FailAtStep && rank == size-1 && restarts == 0 {
		return fmt.Errorf("--fail-at-step %d: rank %d fails on purpose (gorun --max-restarts relaunches the job, which resumes from the last checkpoint)", step, rank)
	}
	return nil
}
