package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gorun/gorun/collective"
)

// inflight is an asynchronous save. It is in one of two phases: its files
// are being written (done not yet closed everywhere), then, once the
// written barrier confirmed them, its manifest is being committed by the
// domains' lead ranks (committing; cdone not yet closed everywhere). It is
// over when every rank's commit is done.
type inflight struct {
	p     *plan
	done  chan struct{} // closed when res is final
	res   writeResult
	stall time.Duration

	committing bool
	cdone      chan struct{} // closed when cerr is final (at once on a rank that leads no domain)
	cerr       error
	mstart     time.Time

	// ctx is the background work's: cancelled, with the cause, when a wait
	// for it outlasts the storage deadline (awaitOwn). stuck is this
	// rank's failure when the work did not end even then: its result is
	// never read, and its staging buffer never reused.
	ctx    context.Context
	cancel context.CancelCauseFunc
	stuck  error

	// The Polls of the current phase, and the one that issues the next
	// allreduce (see pollGap); the same on every rank.
	calls, next, gap int
}

// maxPollGap is the most Polls between two allreduces of a phase: a phase
// that lasts many steps (a slow disk, a commit that deletes old
// checkpoints) costs a few collectives, not one per step, and ends at
// most maxPollGap-1 steps late.
const maxPollGap = 8

// due counts a Poll of the phase and reports whether it issues the
// allreduce: the 1st, 2nd, 4th, 8th, then every maxPollGap-th.
func (fl *inflight) due() bool {
	fl.calls++
	if fl.next == 0 {
		fl.next, fl.gap = 1, 1
	}
	if fl.calls < fl.next {
		return false
	}
	fl.next += fl.gap
	fl.gap = min(2*fl.gap, maxPollGap)
	return true
}

// phaseDone is closed when this rank's part of the current phase is done.
func (fl *inflight) phaseDone() chan struct{} {
	if fl.committing {
		return fl.cdone
	}
	return fl.done
}

// busy reports whether this rank still has background work for fl.
func (fl *inflight) busy() bool {
	if fl.stuck != nil {
		return false
	}
	select {
	case <-fl.phaseDone():
		return false
	default:
		return true
	}
}

// written is this rank's writes, once done (busy false).
func (fl *inflight) written() *writeResult {
	if fl.stuck != nil {
		return &writeResult{err: fl.stuck}
	}
	return &fl.res
}

// commitErr is this rank's commit's error, once done (busy false).
func (fl *inflight) commitErr() error {
	if fl.stuck != nil {
		return fl.stuck
	}
	return fl.cerr
}

// SaveAsync starts a barrier checkpoint of st at step and returns as soon
// as the bytes this rank writes are copied aside, so the training loop may
// change st at once. It is collective, like Save: one allgather agrees on
// the step, the layout and free space; then each rank copies its shard (and
// the replicas and blob files it keeps) into a staging buffer that is
// reused from save to save, and writes them to the store in the background.
// The save commits in later Polls (or Wait): once every rank's writes are
// durable, the domains' lead ranks write the manifest in the background,
// and a later Poll finds that done everywhere (the leads then apply
// retention in the background). Until then the previous checkpoint is the
// one a restore finds. The step this Manager restored or committed last is
// not saved again while it is committed (nil, nothing in flight).
//
// At most one save is in flight: SaveAsync first commits the previous one
// (Wait), or with WithSkipIfBusy skips this save on every rank while any
// rank is still writing the previous one. An error of the previous save is
// returned here, as by Poll and Wait, and this save does not start.
func (m *Manager) SaveAsync(ctx context.Context, step int64, st *State) (err error) {
	defer func() { err = m.mark(err) }() // for NoRestart
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
			n += copyPieces(v[n:], c)
		}
		views[f] = v
		off += p.size(f)
	}
	fl := &inflight{p: p, done: make(chan struct{}), stall: time.Since(p.start)}
	// The background writes outlive this call's ctx (a per-step context is
	// common); they issue no collective.
	fl.ctx, fl.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	m.flight = fl
	go func() {
		defer close(fl.done)
		fl.res = m.write(fl.ctx, p, func(f int) [][]byte { return [][]byte{views[f]} })
	}()
	return nil
}

// InFlight reports the step of the asynchronous save in flight on this
// rank (being written or being committed), if any. It issues no
// collective. Every rank of a job gives the same answer at the same call,
// except that after the job re-formed the survivors may still report a
// save that their next Poll, Wait or save abandons, while a joiner reports
// none.
func (m *Manager) InFlight() (step int64, ok bool) {
	if m.flight == nil {
		return 0, false
	}
	return m.flight.p.step, true
}

// Poll advances the asynchronous save in flight. It is collective and
// cheap: with no save in flight it does nothing (every rank knows,
// SaveAsync being collective); with one it does one small allreduce of
// whether this rank's background work is done. While the files are being
// written it returns nil until every rank has written its own; then it
// runs the written barrier (one small allgather of the files' sizes and
// sha256) and starts the commit in the background: each domain's lead rank
// writes the manifest. A later Poll that finds the commit done on every
// rank ends the save (LastSave then describes it), and each lead rank
// starts retention in the background.
// Call it once per training step, on every rank (the Polls of a phase are
// counted: the allreduce is issued by the 1st, 2nd, 4th and 8th, then
// every 8th, so that a phase that lasts many steps costs few collectives).
// It returns the save's error, on every rank, when it fails.
//
// When the job re-formed (an elastic Comm whose membership epoch changed)
// since the save began, Poll abandons it without a collective, with one
// line in the log: the previous checkpoint is kept.
func (m *Manager) Poll(ctx context.Context) error {
	return m.mark(m.poll(ctx, false, true))
}

// poll is Poll; force issues the allreduce whatever the count (Wait, on
// every rank). retain starts retention once the save is committed (not
// when the next save commits it: that save's retention covers this one).
func (m *Manager) poll(ctx context.Context, force, retain bool) error {
	m.dropIfReformed()
	fl := m.flight
	if fl == nil {
		return nil
	}
	if !fl.due() && !force {
		return nil
	}
	p := fl.p
	// Whether this rank's part is done, and (committing) whether its
	// commit failed and which rank it is: summed, count and rank+1 name
	// the failed rank when there is one.
	busy := fl.busy()
	flags := []int64{boolI64(busy), 0, 0}
	if fl.committing && !busy && fl.commitErr() != nil {
		if errors.Is(fl.commitErr(), errHook) {
			m.flight = nil // the process is gone, as in Save
			return fl.commitErr()
		}
		flags[1], flags[2] = 1, int64(m.comm.Rank())+1
	}
	name := "checkpoint.poll"
	if fl.committing {
		name = "checkpoint.poll.commit"
	}
	actx := ctx
	if force {
		// Wait: the other ranks may still be writing.
		actx = m.ioCtx(ctx)
	}
	if err := m.comm.Allreduce(actx, flags, collective.Sum, collective.Name(name)); err != nil {
		return err // the job's failure, not the save's: it stays in flight
	}
	if flags[0] != 0 {
		return nil
	}
	if !fl.committing {
		man, err := m.confirm(ctx, p, fl.written(), true)
		if err != nil {
			m.flight = nil
			return err
		}
		fl.committing, fl.cdone, fl.mstart = true, make(chan struct{}), time.Now()
		fl.calls, fl.next, fl.gap = 0, 0, 0
		if !p.dom.leads(m.comm.Rank()) {
			close(fl.cdone)
			return nil
		}
		go func() {
			defer close(fl.cdone)
			fl.cerr = m.commitLead(fl.ctx, man)
		}()
		return nil
	}
	m.flight = nil
	if flags[1] != 0 {
		first := -1
		if flags[1] == 1 {
			first = int(flags[2]) - 1
		}
		// Which leads failed, to say where the step is committed anyway
		// (every rank comes here together: the sum is the same).
		where := ""
		if p.dom.h() > 1 {
			all := make([]byte, p.n)
			if err := m.comm.Allgather(m.ioCtx(ctx), []byte{byte(boolU64(fl.commitErr() != nil))}, all, collective.Name("checkpoint.commit.failed")); err == nil {
				failedRanks := make([]bool, p.n)
				for r, f := range all {
					failedRanks[r] = f != 0
				}
				where = m.committedElsewhere(p, failedRanks)
			}
		}
		if err := fl.commitErr(); err != nil {
			return failed(p.step, true, fmt.Errorf("%w%s", err, where))
		}
		return failed(p.step, true, fmt.Errorf("%w%s", m.commitFailure(p, nil, int(flags[1]), first), where))
	}
	// Committed in every domain: the leads apply retention in the
	// background (no collective, retention.go).
	fl.cancel(nil)
	if retain && p.dom.leads(m.comm.Rank()) {
		m.startRetention(ctx, p.step)
	}
	m.good = p.step
	m.last = SaveStats{Step: p.step, Bytes: p.need, Written: fl.res.bytes, Write: fl.res.dur, Total: time.Since(p.start),
		Manifest: time.Since(fl.mstart), Stall: fl.stall}
	return nil
}

// Wait waits until this rank's part of the asynchronous save in flight is
// done (its writes, then its commit), polling as it goes, until the save is
// committed or failed, and then for this rank's retention in the
// background, if it leads a domain. It is collective; call it at the end
// of training. Save, SaveAsync and Restore commit the save in flight
// themselves, and cut short a retention still running instead of waiting
// for it. Its allreduces are bounded by the storage deadline plus the
// collective timeout, its wait for this rank's part by the storage
// deadline (WithIOTimeout): then the part is cancelled and fails the save,
// on every rank, with a storage error that names the location.
func (m *Manager) Wait(ctx context.Context) error {
	err := m.settle(ctx, true)
	if rerr := m.waitRetention(ctx); err == nil {
		err = rerr
	}
	return m.mark(err)
}

// settle is Wait without the wait for retention: it ends the save in
// flight, if any, on every rank. retain starts the retention of the save
// it commits.
func (m *Manager) settle(ctx context.Context, retain bool) error {
	m.dropIfReformed()
	for m.flight != nil {
		if err := m.awaitOwn(ctx, m.flight); err != nil {
			return err
		}
		if err := m.poll(ctx, true, retain); err != nil {
			return err
		}
	}
	return nil
}

// awaitOwn waits until this rank's part of fl's phase is done, at most the
// storage deadline: then the part is cancelled with a deadlineError, which
// is its failure (or, when it does not end within stopGrace, fl.stuck).
// Only ctx's end is an error.
func (m *Manager) awaitOwn(ctx context.Context, fl *inflight) error {
	done := fl.phaseDone()
	t := time.NewTimer(m.storageDeadline())
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	}
	why := &deadlineError{m.storageDeadline()}
	fl.cancel(why)
	t.Reset(stopGrace)
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		// A call into a store that does not answer and cannot be
		// interrupted: its part fails without its result, and the staging
		// buffer it may still read from is not reused.
		fl.stuck = objectErr(m.StepLocation(fl.p.step), fmt.Errorf("%v; the write did not end when cancelled", why))
		m.stage = nil
		m.logf("checkpoint: rank %d: step %d: %v", m.comm.Rank(), fl.p.step, fl.stuck)
	}
	return nil
}

// dropIfReformed abandons the save in flight when the job re-formed since
// it began (an elastic Comm's membership epoch changed): the plan is for
// members that are no longer the job, and a joiner has no save in flight,
// so no collective about it can be issued. Every member sees the same
// epoch at the same call, so they all agree. The save's background work
// goes on; the next save or restore waits for it (waitOrphan).
func (m *Manager) dropIfReformed() {
	fl := m.flight
	if fl == nil {
		return
	}
	epoch, n := m.comm.Epoch(), m.comm.Size()
	if epoch == fl.p.epoch {
		return
	}
	m.flight, m.orphan = nil, fl
	if fl.committing {
		m.logf("checkpoint: async save of step %d abandoned: the job re-formed (epoch %d→%d, %d→%d ranks) while its manifest was being written; it is committed only where that write completed, elsewhere the previous checkpoint is kept",
			fl.p.step, fl.p.epoch, epoch, fl.p.n, n)
		return
	}
	m.logf("checkpoint: async save of step %d abandoned: the job re-formed (epoch %d→%d, %d→%d ranks) before it was committed; the previous checkpoint is kept",
		fl.p.step, fl.p.epoch, epoch, fl.p.n, n)
}

// waitOrphan waits for the background work of an abandoned save, so that
// it neither writes from the staging buffer that the next save reuses nor
// races with the next save's prepare, retention or restore; at most the
// storage deadline, after which the work is cancelled and the error says
// that the store does not answer.
func (m *Manager) waitOrphan(ctx context.Context) error {
	fl := m.orphan
	if fl == nil {
		return nil
	}
	t := time.NewTimer(m.storageDeadline())
	defer t.Stop()
	for _, ch := range []chan struct{}{fl.done, fl.cdone} {
		if ch == nil {
			continue
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			fl.cancel(&deadlineError{m.storageDeadline()})
			return fmt.Errorf("%s: the abandoned save of step %d is still being written: %v", m.StepLocation(fl.p.step), fl.p.step, &deadlineError{m.storageDeadline()})
		}
	}
	m.orphan = nil
	return nil
}
