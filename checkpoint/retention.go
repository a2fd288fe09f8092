package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
)

// Step 7 of a save, retention, is housekeeping: a store that does not
// answer while old checkpoints are deleted must cost the training loop
// nothing. So a domain's lead rank runs it in the background once the
// save is committed everywhere, after Save and after the Poll that ends a
// SaveAsync alike, under the storage deadline, and stops at the first
// deletion that fails: the next retention deletes what this one left (it
// works from a fresh listing). A failure is logged once, by the rank that
// ran it, and never returned. The next save or restore cuts short a
// retention still running before it touches the store itself (a deletion
// of a superseded step must not race with a save of the same step); Wait,
// at the end of training, waits for it.

// retention is one background retention on a domain's lead rank.
type retention struct {
	step     int64
	start    time.Time
	cancel   context.CancelCauseFunc
	done     chan struct{} // closed when it is over
	err      error         // an error of the test hook (the process "died"), final once done is closed
	deleting atomic.Bool   // it began deleting
}

// stopGrace is how long a retention, or a save's background work, gets to
// end once cancelled: an S3 request ends at once; a call into a filesystem
// that does not answer (a hung NFS mount) may not end at all, and is then
// given up.
const stopGrace = 5 * time.Second

// cutShort is the cause of a retention that the next save or a restore
// cut short.
type cutShort struct {
	by    string
	after time.Duration
}

func (e *cutShort) Error() string {
	return fmt.Sprintf("cut short by %s after %v", e.by, e.after.Round(time.Millisecond))
}

// startRetention starts step 7 for the committed step in the background on
// a domain's lead rank; it issues no collective.
func (m *Manager) startRetention(ctx context.Context, step int64) {
	rctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	r := &retention{step: step, start: time.Now(), cancel: cancel, done: make(chan struct{})}
	m.retaining = r
	h := testHook
	go func() {
		defer close(r.done)
		dctx, stop := m.storageCtx(rctx)
		defer stop()
		err := m.retain(dctx, step, &r.deleting, h)
		var cut *cutShort
		switch {
		case err == nil:
		case errors.Is(err, errHook):
			r.err = err
		case errors.As(context.Cause(rctx), &cut) && (!r.deleting.Load() || err == context.Cause(rctx)):
			// Cut short while it was still listing, or between two
			// deletions, not while the store kept it waiting (the next
			// save came at once): the next one goes on with it.
		default:
			// The location is said once, before the cause.
			cause := strings.TrimPrefix(causeOf(err, m.dir), m.dir+"/")
			m.logf("checkpoint: retention of step %d at %s: %s; training goes on", step, m.dir, cause)
		}
	}()
}

// stopRetention cuts short this rank's background retention, if any, and
// waits for it to end, before a save (or restore) touches the store. The
// error says that it did not end within stopGrace: the store is not
// answering, and the save must fail rather than race with it. by names
// what cuts it short ("the save of step 30").
func (m *Manager) stopRetention(by string) error {
	r := m.retaining
	if r == nil {
		return nil
	}
	r.cancel(&cutShort{by, time.Since(r.start)})
	t := time.NewTimer(stopGrace)
	defer t.Stop()
	select {
	case <-r.done:
	case <-t.C:
		return fmt.Errorf("%s: the retention of step %d, cut short by %s, did not end within %v: the store is not answering", m.dir, r.step, by, stopGrace)
	}
	m.retaining = nil
	return r.err
}

// waitRetention waits for this rank's background retention, if any (no
// collective): Wait, at the end of training, lets it finish. Its own
// deadline bounds it; a retention stuck beyond it (a filesystem that does
// not answer) is left behind, with a line in the log. Only an error of the
// test hook is returned.
func (m *Manager) waitRetention(ctx context.Context) error {
	r := m.retaining
	if r == nil {
		return nil
	}
	t := time.NewTimer(m.storageDeadline() + stopGrace)
	defer t.Stop()
	select {
	case <-r.done:
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		r.cancel(&deadlineError{m.storageDeadline()})
		m.logf("checkpoint: retention of step %d at %s: still running after the storage deadline (%v): the store is not answering; left behind", r.step, m.dir, m.storageDeadline())
	}
	m.retaining = nil
	return r.err
}

// retain deletes, once step is committed in every domain, the committed
// checkpoints newer than step (superseded: the job went on from an older
// one, after a restore fell back past them), the committed ones beyond the
// newest keep up to step (step itself always kept), and uncommitted steps
// older than the newest kept one. A deletion removes the manifest first,
// so a crash midway leaves an uncommitted step, never a broken committed
// one. Uncommitted steps newer than step are left alone (the next save may
// be writing one). Then it aborts the incomplete uploads (uploads.go) of
// the steps it kept up to step, and those of later steps older than
// WithStaleUploadAge. It stops at the first failure, or when ctx is done,
// with the cause. deleting is set before its first deletion; h is the
// testHook.
func (m *Manager) retain(ctx context.Context, step int64, deleting *atomic.Bool, h func(string, int) error) error {
	entries, err := storeStepsAndUploads(ctx, m.store)
	if err != nil {
		return err
	}
	rank := m.comm.Rank()
	var superseded []int64
	for _, e := range entries {
		if e.Step > step && e.Committed {
			superseded = append(superseded, e.Step)
		}
	}
	if len(superseded) > 0 {
		m.logf("checkpoint: step %d: deleting the committed steps %v in %s: they are newer than step %d, which the job went on from (superseded)", step, superseded, m.dir, step)
	}
	kept := 0
	var stale []Upload // of the steps kept
	for _, e := range entries {
		del := true
		switch {
		case e.Step > step && !e.Committed:
			del = false // not ours to judge
		case e.Step == step:
			kept++
			del = false
		case e.Step < step && e.Committed && kept < m.keep:
			kept++
			del = false
		case e.Step < step && !e.Committed && kept == 0:
			del = false
		}
		if !del {
			for _, u := range e.Uploads {
				if e.Step <= step || time.Since(u.Started) >= m.staleUploads {
					stale = append(stale, u)
				}
			}
			continue
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		deleting.Store(true)
		if err := storeDeleteStep(ctx, m.store, e.Step, func() error { return callHook(h, "retention", rank) }, true); err != nil {
			return err
		}
	}
	if uk, ok := m.store.(uploadKeeper); ok && len(stale) > 0 {
		deleting.Store(true)
		return abortUploads(ctx, uk, stale)
	}
	return nil
}
