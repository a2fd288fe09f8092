package checkpoint

import (
	"context"
	"time"

	"github.com/gorun/gorun/collective"
)

// inflight is an asynchronous save whose files are being written.
type inflight struct {
	p     *plan
	done  chan struct{} // closed when res is final
	res   writeResult
	stall time.Duration
}

// SaveAsync starts a barrier checkpoint of st at step and returns as soon
// as the bytes this rank writes are copied aside, so the training loop may
// change st at once. It is collective, like Save: one allgather agrees on
// the step, the layout and free space; then each rank copies its shard (and
// the replicas and blob files it keeps) into a staging buffer that is
// reused from save to save, and writes them to the store in the background.
// The save commits (manifest, retention) in a later Poll or Wait, once every
// rank's writes are durable; until then the previous checkpoint is the one
// a restore finds.
//
// At most one save is in flight: SaveAsync first commits the previous one
// (Wait), or with WithSkipIfBusy skips this save on every rank while any
// rank is still writing the previous one. An error of the previous save is
// returned here, as by Poll and Wait, and this save does not start.
func (m *Manager) SaveAsync(ctx context.Context, step int64, st *State) error {
	p, err := m.begin(ctx, step, st, true)
	if err != nil || p == nil {
		return err
	}
	// Snapshot only what this rank writes, in one reused buffer.
	var size int64
	for _, f := range p.mine {
		size += p.size(f)
	}
	if int64(cap(m.stage)) < size {
		m.stage = make([]byte, size)
	}
	stage := m.stage[:size]
	views := make(map[int][]byte, len(p.mine))
	var off int64
	for _, f := range p.mine {
		v := stage[off : off+p.size(f)]
		n := 0
		for _, c := range p.chunks(st, f) {
			n += copy(v[n:], c)
		}
		views[f] = v
		off += p.size(f)
	}
	fl := &inflight{p: p, done: make(chan struct{}), stall: time.Since(p.start)}
	m.flight = fl
	// The background writes outlive this call's ctx (a per-step context is
	// common); they issue no collective.
	wctx := context.WithoutCancel(ctx)
	go func() {
		defer close(fl.done)
		fl.res = m.write(wctx, p, func(f int) [][]byte { return [][]byte{views[f]} })
	}()
	return nil
}

// Poll commits the asynchronous save in flight once every rank has written
// its files. It is collective and cheap: with no save in flight it does
// nothing (every rank knows, SaveAsync being collective); with one it does
// one small allreduce, and when every rank has finished it runs the commit
// of Save (the written barrier, the manifest, retention). Call it once per
// training step. It returns the save's error, on every rank, when it fails.
func (m *Manager) Poll(ctx context.Context) error {
	fl := m.flight
	if fl == nil {
		return nil
	}
	fin := []int64{0}
	select {
	case <-fl.done:
		fin[0] = 1
	default:
	}
	if err := m.comm.Allreduce(ctx, fin, collective.Min, collective.Name("checkpoint.poll")); err != nil {
		return err
	}
	if fin[0] == 0 {
		return nil
	}
	m.flight = nil
	return m.finish(ctx, fl.p, &fl.res, true, fl.stall)
}

// Wait waits until this rank's writes of the asynchronous save in flight
// are done, then commits it like Poll. It is collective; call it at the end
// of training. Save, SaveAsync and Restore call it themselves.
func (m *Manager) Wait(ctx context.Context) error {
	for m.flight != nil {
		select {
		case <-m.flight.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		if err := m.Poll(ctx); err != nil {
			return err
		}
	}
	return nil
}
