package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"

	"gorgonia.org/tensor"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/collective"
)

// checkpointer saves the training state every --checkpoint-every steps to
// --checkpoint-dir and restores the newest one at start. Without
// --checkpoint-dir it does nothing.
type checkpointer struct {
	every int
	mgr   *checkpoint.Manager
	state *checkpoint.State
}

// progressBlob is this rank's part of the state: the history of finished
// epochs (for the plot and metrics) and the running sums of the current one.
type progressBlob struct {
	History []EpochResult `json:"history"`
	Sums    []float64     `json:"sums"`
}

func newCheckpointer(ctx context.Context, comm *collective.Comm, cfg *Config, names []string, params []*tensor.Dense,
	opt Optimizer, history *[]EpochResult, sums *[]float64) (*checkpointer, error) {
	if cfg.CheckpointDir == "" {
		return &checkpointer{}, nil
	}
	if cfg.CheckpointEvery <= 0 {
		return nil, fmt.Errorf("--checkpoint-every %d must be positive", cfg.CheckpointEvery)
	}
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
		return json.Marshal(progressBlob{History: *history, Sums: *sums})
	}, func(b []byte) error {
		var p progressBlob
		if err := json.Unmarshal(b, &p); err != nil {
			return err
		}
		if len(p.Sums) != 3 {
			return fmt.Errorf("progress blob holds %d sums, want 3", len(p.Sums))
		}
		*history, *sums = p.History, p.Sums
		return nil
	})
	mgr, err := checkpoint.New(comm, cfg.CheckpointDir)
	if err != nil {
		return nil, err
	}
	return &checkpointer{every: cfg.CheckpointEvery, mgr: mgr, state: st}, nil
}

// restore loads the newest checkpoint and returns its optimizer step (0
// for a fresh start).
func (c *checkpointer) restore(ctx context.Context, out *output) (int, error) {
	if c.mgr == nil {
		return 0, nil
	}
	step, found, err := c.mgr.Restore(ctx, c.state)
	if err != nil {
		return 0, err
	}
	if found {
		out.printf("mnist: resumed from %s at step %d\n", checkpoint.StepDir(c.mgr.Dir(), step), step)
	}
	return int(step), nil
}

// maybeSave saves after every --checkpoint-every optimizer steps.
func (c *checkpointer) maybeSave(ctx context.Context, step int) error {
	if c.mgr == nil || step%c.every != 0 {
		return nil
	}
	return c.mgr.Save(ctx, int64(step), c.state)
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
