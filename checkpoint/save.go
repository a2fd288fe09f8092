package checkpoint

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/gorun/gorun/collective"
)

// The steps of a save, numbered as in the package documentation: 1 agree
// (agree.go), 2 prepare, 3 write, 4 confirm, 5 commitLead and 6
// shareOutcome (commit.go), and 7 retention (retention.go). Save runs 1 to
// 6 in the foreground; SaveAsync runs 1 and 2, and Poll the rest
// (async.go); both leave 7 to the background.

// Save writes a barrier checkpoint of st at step. Every rank must call it
// with the same step and the same registered state. It returns once the
// checkpoint is committed (its manifest durable) on every rank, or with an
// error on every rank; a failed or interrupted save leaves the previous
// checkpoints as they were. An asynchronous save in flight is committed
// first (Wait), and its error, if any, is returned instead. A step that is
// already committed (saved again after Restore returned it) is not saved
// again: Save logs it and returns nil.
func (m *Manager) Save(ctx context.Context, step int64, st *State) (err error) {
	defer func() { err = m.mark(err) }()    // for NoRestart
	p, err := m.begin(ctx, step, st, false) // steps 1 and 2
	if err != nil || p == nil {
		return err
	}
	// 3. Every rank writes its files straight from the state, under the
	// storage deadline.
	wctx, cancel := m.storageCtx(ctx)
	res := m.write(wctx, p, func(f int) [][]byte { return p.chunks(st, f) })
	cancel()
	return m.finish(ctx, p, &res) // steps 4 to 7
}

// begin runs the steps of a save up to the writes, on every rank, for Save
// and SaveAsync: it makes way for the save (makeWay), finds the storage
// domains, agrees on the save (step 1, agree), shares the blobs with the
// domains that keep copies of them (shareBlobs) and has each domain's
// lowest rank prepare the step (step 2, prepare). It returns a nil plan
// and nil error when the save is skipped (busy, or the step is already
// committed).
func (m *Manager) begin(ctx context.Context, step int64, st *State, async bool) (*plan, error) {
	start := time.Now()
	skip, storeErr, err := m.makeWay(ctx, step, async)
	if err != nil || skip {
		return nil, err
	}
	epoch := m.comm.Epoch()
	dom, err := m.domains(ctx)
	if err != nil {
		return nil, err
	}
	p, err := m.agree(ctx, step, st, dom, async, storeErr)
	if err != nil || p == nil {
		return nil, err
	}
	p.start, p.epoch = start, epoch
	if err := m.shareBlobs(ctx, p, async); err != nil {
		return nil, err
	}
	if err := m.prepare(ctx, p, async); err != nil {
		return nil, err
	}
	return p, nil
}

// makeWay cuts short this rank's retention still running, waits for the
// background work of an abandoned save and commits the save in flight, if
// any, before a new save; for SaveAsync with WithSkipIfBusy the ranks may
// instead agree to skip the new save (skip true) while any rank is still
// busy with the one in flight. storeErr is this rank's store failing to
// end that work within the storage deadline: the agreement fails the save
// on every rank with it (a rank's own error here would leave the others
// waiting for it in the agreement).
func (m *Manager) makeWay(ctx context.Context, step int64, async bool) (skip bool, storeErr, err error) {
	m.dropIfReformed()
	// Local waits first; every rank then takes the same collectives,
	// whatever they came to.
	storeErr = m.stopRetention(fmt.Sprintf("the save of step %d", step))
	if err := m.waitOrphan(ctx); storeErr == nil {
		storeErr = err
	}
	if m.flight == nil {
		return false, storeErr, nil
	}
	if async {
		// Every rank has a save in flight (SaveAsync is collective):
		// agree on whether to skip this one before any rank waits.
		if skip, err := m.agreeBusy(ctx, step); err != nil || skip {
			if skip && storeErr != nil {
				m.logf("checkpoint: rank %d: %v", m.comm.Rank(), storeErr)
			}
			return skip, nil, err
		}
	}
	// The retention of the save committed here is left to this one's.
	if err := m.settle(ctx, false); err != nil {
		return false, nil, err
	}
	if err := m.waitOrphan(ctx); storeErr == nil { // the job may have re-formed meanwhile
		storeErr = err
	}
	return false, storeErr, nil
}

// shareBlobs gives every rank the blobs of the ranks whose files it writes
// in a replica domain: blobs are per rank, so with several storage domains
// they are allgathered. With one domain each rank writes only its own.
func (m *Manager) shareBlobs(ctx context.Context, p *plan, async bool) error {
	if p.dom.h() == 1 {
		return nil
	}
	maxLen := slices.Max(p.blobLen)
	if maxLen == 0 {
		return nil
	}
	rank, n := m.comm.Rank(), p.n
	in := make([]byte, maxLen)
	copy(in, p.blobs[rank])
	out := make([]byte, maxLen*int64(n))
	if err := m.comm.Allgather(ctx, in, out, collective.Name("checkpoint.blobs")); err != nil {
		return failed(p.step, async, fmt.Errorf("sharing the per-rank state with the replica domains: %w", err))
	}
	for r := range n {
		p.blobs[r] = out[int64(r)*maxLen : int64(r)*maxLen+p.blobLen[r]]
	}
	return nil
}

// prepare is step 2 of a save: each domain's lowest rank prepares the step
// (prepareLead), and an allreduce orders that before every write and says
// on every rank whether it failed, and where.
func (m *Manager) prepare(ctx context.Context, p *plan, async bool) error {
	rank, step := m.comm.Rank(), p.step
	var prepErr error
	if p.dom.leads(rank) {
		sctx, cancel := m.storageCtx(ctx)
		prepErr = m.prepareLead(sctx, step)
		cancel()
	}
	// Summed: how many failed, and (when one did) which rank, plus one.
	flag := []int64{boolI64(prepErr != nil), 0}
	if prepErr != nil {
		flag[1] = int64(rank) + 1
	}
	loc := m.StepLocation(step)
	if err := m.comm.Allreduce(m.ioCtx(ctx), flag, collective.Sum, collective.Name("checkpoint.prepare")); err != nil {
		if prepErr != nil {
			return failed(step, async, fmt.Errorf("preparing %w", ownFirst(objectErr(loc, prepErr), err)))
		}
		return failed(step, async, fmt.Errorf("preparing %s: %w", loc, err))
	}
	if flag[0] == 0 {
		return nil
	}
	if prepErr == nil {
		if flag[0] == 1 {
			return failed(step, async, fmt.Errorf("preparing %s: rank %d failed (see its log for the cause)", loc, flag[1]-1))
		}
		return failed(step, async, fmt.Errorf("preparing %s: %d ranks failed (see their logs for the cause)", loc, flag[0]))
	}
	m.logf("checkpoint: rank %d: step %d: preparing %v", rank, step, objectErr(loc, prepErr))
	return failed(step, async, fmt.Errorf("preparing %w", objectErr(loc, prepErr)))
}

// prepareLead is step 2 on a domain's lowest rank: it removes a stale,
// uncommitted copy of the step left by an earlier attempt (its manifest
// first, so a crash here leaves nothing that looks committed).
func (m *Manager) prepareLead(ctx context.Context, step int64) error {
	if err := hook("prepare", m.comm.Rank()); err != nil { // an I/O error, not a crash
		return err
	}
	keys, err := m.store.List(ctx, stepKey(step)+"/")
	if err != nil || len(keys) == 0 {
		return err
	}
	m.logf("checkpoint: replacing existing %s", m.StepLocation(step))
	return storeDeleteStep(ctx, m.store, step, nil, true)
}

// wrote is one file a rank wrote.
type wrote struct {
	file int
	size int64
	sum  [32]byte
}

// writeResult is what a rank's writes came to.
type writeResult struct {
	files []wrote
	bytes int64
	dur   time.Duration
	err   error
}

// write is step 3 of a save on one rank: it puts this rank's files of p,
// with data giving each file's bytes, and makes them durable before it
// returns (putHashed, then syncBatch). It issues no collective, so that
// SaveAsync can run it in the background.
func (m *Manager) write(ctx context.Context, p *plan, data func(f int) [][]byte) writeResult {
	start := time.Now()
	rank := m.comm.Rank()
	var res writeResult
	for i, f := range p.mine {
		size, sum, err := putHashed(ctx, m.store, stepKey(p.step)+"/"+p.name(f), data(f))
		if err == nil && i == 0 {
			err = hook("write", rank) // an I/O error, not a crash
		}
		if err != nil {
			res.err = objectErr(m.StepLocation(p.step)+"/"+p.name(f), err)
			break
		}
		res.files = append(res.files, wrote{f, size, sum})
		res.bytes += size
	}
	if res.err == nil && len(p.mine) > 0 {
		if err := syncBatch(m.store, stepKey(p.step)); err != nil {
			res.err = objectErr(m.StepLocation(p.step), err)
		}
	}
	res.dur = time.Since(start)
	if res.err != nil {
		m.logf("checkpoint: rank %d: step %d: %v", rank, p.step, res.err)
	}
	return res
}

// failed is the error of a save that failed with what: "checkpoint: step
// S: what (previous checkpoint kept)", or for an asynchronous save
// "checkpoint: async save of step S: what; previous checkpoint kept".
func failed(step int64, async bool, what error) error {
	if async {
		return fmt.Errorf("checkpoint: async save of step %d: %w; previous checkpoint kept", step, what)
	}
	return fmt.Errorf("checkpoint: step %d: %w (previous checkpoint kept)", step, what)
}

// ownFirst is the error of a rank whose own step of a save failed (own)
// and whose agreement on the outcome failed too (agree): its own cause
// comes first. The agreement often fails only because of it: a rank that
// learned of the failure ends the job, and the abort can reach this rank
// before the agreement's last message, so agree alone would name that rank
// and not the cause. own may be nil.
func ownFirst(own, agree error) error {
	if own == nil {
		return agree
	}
	return fmt.Errorf("%w (and telling the other ranks failed: %v)", own, agree)
}
