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
type checkpointer struct {
	every     int
	mgr       *checkpoint.Manager
	state     *checkpoint.State
	out       *output
	global    int // this run's global batch, saved with the state
	saved     int // the global batch the restored checkpoint was trained with; 0 if unknown
	lastSaved int // the step of the newest checkpoint on disk; -1 for none
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
		return &checkpointer{}, nil
	}
	if cfg.CheckpointEvery <= 0 {
		return nil, fmt.Errorf("--checkpoint-every %d must be positive", cfg.CheckpointEvery)
	}
	c := &checkpointer{every: cfg.CheckpointEvery, out: out, global: global, lastSaved: -1}
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

// maybeSave saves after every --checkpoint-every optimizer steps.
func (c *checkpointer) maybeSave(ctx context.Context, step int) error {
	if c.mgr == nil || step%c.every != 0 {
		return nil
	}
	return c.save(ctx, step)
}

// saveFinal saves the end of training, unless that step is saved already,
// so that a rerun of the finished job finds it complete instead of
// training its last steps again.
func (c *checkpointer) saveFinal(ctx context.Context, step int) error {
	if c.mgr == nil || step == c.lastSaved {
		return nil
	}
	return c.save(ctx, step)
}

// save writes a checkpoint and says so on one line.
func (c *checkpointer) save(ctx context.Context, step int) error {
	if err := c.mgr.Save(ctx, int64(step), c.state); err != nil {
		return err
	}
	c.lastSaved = step
	st := c.mgr.LastSave()
	c.out.printf("checkpoint: step %d saved to %s (%s, %s)\n", step, checkpoint.StepDir(c.mgr.Dir(), int64(step)),
		humanBytes(st.Bytes), st.Total.Round(time.Millisecond))
	return nil
}

// humanBytes is a size in decimal units, as ls -h --si and disk tools say.
func humanBytes(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.1f GB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1f MB", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.0f kB", float64(n)/1e3)
	}
	return fmt.Sprintf("%d B", n)
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
