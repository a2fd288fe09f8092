package main

import (
	"context"
	"fmt"

	"gorgonia.org/tensor"

	"github.com/gorun/gorun/collective"
)

// Local SGD (--sync-every K, K > 1): for links too slow for an allreduce
// of the gradients at every step. Each rank steps on the gradient of its
// own share of the step's global batch, and every K steps the ranks
// average their models (collective.LocalSGD: the mean of the ranks'
// deltas since the last average, applied with --outer-lr, and with
// --outer-momentum as DiLoCo's outer Nesterov step; --compression int8
// sends the deltas in 8 bits with error feedback). Every evaluation,
// checkpoint and end of epoch averages first when it falls between two
// averages, so they always see the one model every rank holds. In an
// elastic job the state is committed at the averages only (--commit-every
// does not apply), and a lost rank sends every rank back to the last
// average: the samples since are handed out again.

// newLocalSGD registers params with a LocalSGD for cfg (their current
// values are the first anchor), and with st (an elastic job's state, or
// nil) what it needs to go on after a reset.
func newLocalSGD(comm *collective.Comm, cfg *Config, names []string, params []*tensor.Dense, st *collective.ElasticState) (*collective.LocalSGD, error) {
	codec := ""
	if cfg.Compression != "none" {
		codec = cfg.Compression
	}
	ls, err := collective.NewLocalSGD(comm, collective.LocalSGDOptions{
		Every: cfg.SyncEvery, OuterLR: cfg.OuterLR, OuterMomentum: cfg.OuterMomentum, Compression: codec})
	if err != nil {
		return nil, err
	}
	for i, p := range params {
		if err := ls.Register(names[i], p); err != nil {
			return nil, err
		}
	}
	if st != nil {
		if err := ls.RegisterElastic(st); err != nil {
			return nil, err
		}
	}
	return ls, nil
}

// localSync tracks whether the ranks hold the same model: after an
// average, until the next local step.
type localSync struct {
	ls     *collective.LocalSGD
	synced bool
}

// step counts a local step (LocalSGD.Step) and reports whether it ended
// with an average.
func (l *localSync) step(ctx context.Context) (bool, error) {
	if l == nil {
		return false, nil
	}
	averaged, err := l.ls.Step(ctx)
	l.synced = averaged
	return averaged, err
}

// sync averages now unless the ranks hold the same model already; every
// rank calls it at the same points (an evaluation, a checkpoint, the end
// of an epoch), and every rank knows whether the last step averaged.
func (l *localSync) sync(ctx context.Context) error {
	if l == nil || l.synced {
		return nil
	}
	if err := l.ls.Sync(ctx); err != nil {
		return err
	}
	l.synced = true
	return nil
}

// checkLocalSGD refuses flags local SGD cannot honour.
func checkLocalSGD(c *Config, plan BatchPlan) error {
	switch {
	case c.SyncEvery <= 1:
		return nil
	case plan.K > 1:
		return fmt.Errorf("--sync-every %d steps each rank on the gradient of its whole share of a step: drop --accumulate and --batch (they make %d micro-batches per step)", c.SyncEvery, plan.K)
	case c.EvalEvery%c.SyncEvery != 0:
		return fmt.Errorf("--eval-every %d is not a multiple of --sync-every %d: evaluate right after the averages", c.EvalEvery, c.SyncEvery)
	}
	return nil
}
