package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/collective"
)

// restoreWith restores rank r's state with m and checks that it is step
// want.
func restoreWith(ctx context.Context, m *Manager, r int, want int64) (*rankState, error) {
	s := newRankState(r)
	step, found, err := m.Restore(ctx, s.st)
	if err != nil {
		return nil, err
	}
	if !found || step != want {
		return nil, fmt.Errorf("rank %d: restore gave step %d (found %v), want %d", r, step, found, want)
	}
	return s, nil
}

// A loop that saves at its top saves again the step Restore returned: the
// committed checkpoint is kept as it is, on every rank, with one log line,
// by Save and by SaveAsync (no flight).
func TestSaveOfCommittedStepIsSkipped(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	comms := newJob(t, 3)
	mustAll(t, save(t, comms, dir, 1, 1, WithKeep(1)))
	mustAll(t, save(t, comms, dir, 2, 2, WithKeep(1)))
	var lb logBuf
	ms := managers(t, comms, dir, WithKeep(1), WithLogger(lb.logf))
	mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
		s, err := restoreWith(ctx, ms[r], r, 2)
		if err != nil {
			return err
		}
		s.fill(9, r)
		if err := ms[r].Save(ctx, 2, s.st); err != nil {
			return err
		}
		if err := ms[r].SaveAsync(ctx, 2, s.st); err != nil {
			return err
		}
		if step, ok := ms[r].InFlight(); ok {
			return fmt.Errorf("rank %d: step %d in flight after a SaveAsync of a committed step", r, step)
		}
		return ms[r].Wait(ctx)
	}))
	want := fmt.Sprintf("checkpoint: step 2 is already committed in %s; not saved again", dir)
	if got := strings.Count(lb.String(), want); got != 6 {
		t.Fatalf("log has %d lines %q (want one per rank and call):\n%s", got, want, lb.String())
	}
	restore(t, comms, dir, 2, 2) // the first save's values, not 9
	// The next step saves normally.
	mustAll(t, save(t, comms, dir, 3, 3, WithKeep(1)))
	restore(t, comms, dir, 3, 3)
}

// A committed step that a restore skipped as unloadable is replaced when
// the job, gone on from an older one, saves that step again: skipping it
// would leave the job unable to save the step at all.
func TestSaveReplacesCommittedStepTheRestoreSkipped(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	comms := newJob(t, 3)
	mustAll(t, save(t, comms, dir, 2, 2))
	mustAll(t, save(t, comms, dir, 4, 4))
	corruptShard(t, dir, 4, 1, "flip")
	var lb logBuf
	ms := managers(t, comms, dir, WithLogger(lb.logf))
	mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
		s, err := restoreWith(ctx, ms[r], r, 2)
		if err != nil {
			return err
		}
		s.fill(5, r)
		return ms[r].Save(ctx, 4, s.st)
	}))
	if want := "checkpoint: step 4 is committed in " + dir + ", but it is not a checkpoint this job restored or saved; replacing it"; !strings.Contains(lb.String(), want) {
		t.Fatalf("log lacks %q:\n%s", want, lb.String())
	}
	restore(t, comms, dir, 4, 5)
}

// After a restore fell back past an unloadable newer step, the job goes on
// from the older one: committing a step deletes the committed steps newer
// than it (superseded) and never the step itself.
func TestRetentionDeletesSupersededSteps(t *testing.T) {
	dir := t.TempDir()
	comms := newJob(t, 2)
	mustAll(t, save(t, comms, dir, 2, 2))
	mustAll(t, save(t, comms, dir, 4, 4))
	corruptShard(t, dir, 4, 1, "flip")
	restore(t, comms, dir, 2, 2) // falls back past step 4
	var lb logBuf
	mustAll(t, save(t, comms, dir, 3, 3, WithKeep(1), WithLogger(lb.logf)))
	entries, err := listSteps(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Step != 3 || !entries[0].Committed {
		t.Fatalf("after saving step 3 with keep 1: %+v; want step 3 only", entries)
	}
	if !strings.Contains(lb.String(), "deleting the committed steps [4]") {
		t.Fatalf("no log line names the superseded step 4:\n%s", lb.String())
	}
	restore(t, comms, dir, 3, 3)
}

// A blob whose save func fails on rank 1 of 3 fails the save on every
// rank (no hang), naming rank 1, and the cause on rank 1; the next save
// works.
func TestBlobSaveErrorOnOneRankFailsAll(t *testing.T) {
	dir := t.TempDir()
	comms := newJob(t, 3)
	ms := managers(t, comms, dir)
	fail := true
	states := make([]*State, 3)
	for r := range states {
		w := []float32{1, 2, 3}
		states[r] = new(State).Tensor("w", w).Blob("opt", func() ([]byte, error) {
			if r == 1 && fail {
				return nil, errors.New("optimizer state unavailable")
			}
			return []byte{byte(r)}, nil
		}, func([]byte) error { return nil })
	}
	for _, async := range []bool{false, true} {
		errs := onEach(comms, func(r int, c *collective.Comm) error {
			if async {
				if err := ms[r].SaveAsync(context.Background(), 1, states[r]); err != nil {
					return err
				}
				return ms[r].Wait(context.Background())
			}
			return ms[r].Save(context.Background(), 1, states[r])
		})
		for r, err := range errs {
			switch {
			case err == nil:
				t.Fatalf("async %v: rank %d: save returned nil", async, r)
			case r == 1 && !strings.Contains(err.Error(), "rank 1 could not save its state: saving blob \"opt\": optimizer state unavailable"):
				t.Errorf("async %v: rank 1: %v", async, err)
			case r != 1 && !strings.Contains(err.Error(), "rank 1 could not save its state (see its log for the cause)"):
				t.Errorf("async %v: rank %d: %v", async, r, err)
			}
		}
	}
	if committed(dir, 1) {
		t.Fatal("step 1 committed")
	}
	fail = false
	mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
		return ms[r].Save(context.Background(), 1, states[r])
	}))
	if !committed(dir, 1) {
		t.Fatal("step 1 not committed")
	}
}

// Replication settings that differ between ranks fail the save on every
// rank, naming the ranks and the values.
func TestSettingsDisagreementFails(t *testing.T) {
	dirs, _ := hostDirs(t, 0, 0, 1, 1)
	comms := newJob(t, 4)
	errs := onEach(comms, func(r int, c *collective.Comm) error {
		m, err := New(c, dirs[r], WithReplicas(r%2))
		if err != nil {
			return err
		}
		return m.Save(context.Background(), 1, newRankState(r).st)
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "ranks disagree on the number of replicas (WithReplicas, GORUN_CHECKPOINT_REPLICAS): ranks [0 2]: 0, ranks [1 3]: 1") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	dir := t.TempDir()
	errs = onEach(comms, func(r int, c *collective.Comm) error {
		opts := []Option{}
		if r == 3 {
			opts = append(opts, WithDiskMargin(5))
		}
		m, err := New(c, dir, opts...)
		if err != nil {
			return err
		}
		return m.Save(context.Background(), 1, newRankState(r).st)
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "ranks disagree on the disk margin (WithDiskMargin): ranks [0 1 2]: -1 bytes (-1: the default), ranks [3]: 5 bytes") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	// WithSkipIfBusy on some ranks only: a SaveAsync with a save in flight.
	errs = onEach(comms, func(r int, c *collective.Comm) error {
		opts := []Option{}
		if r == 0 {
			opts = append(opts, WithSkipIfBusy())
		}
		m, err := New(c, dir, opts...)
		if err != nil {
			return err
		}
		s := newRankState(r)
		if err := m.SaveAsync(context.Background(), 1, s.st); err != nil {
			return err
		}
		err = m.SaveAsync(context.Background(), 2, s.st)
		if werr := m.Wait(context.Background()); werr != nil && err == nil {
			err = werr
		}
		return err
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "ranks disagree on WithSkipIfBusy: ranks [0] skip a save while the previous one is busy, ranks [1 2 3] wait for it") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// failManifest is a Store whose manifest writes fail.
type failManifest struct{ Store }

func (s failManifest) Put(ctx context.Context, key string, data ...[]byte) error {
	if strings.HasSuffix(key, "/"+ManifestName) {
		return errors.New("injected manifest failure")
	}
	return s.Store.Put(ctx, key, data...)
}

// A commit that fails in one domain fails the save on every rank, and the
// error says where the step is committed nevertheless; no domain applies
// retention, so the older checkpoints stay everywhere.
func TestPartialCommitKeepsOlderAndSaysWhere(t *testing.T) {
	for _, async := range []bool{false, true} {
		t.Run(fmt.Sprint("async=", async), func(t *testing.T) {
			dirs, hosts := hostDirs(t, 0, 0, 1, 1)
			comms := newJob(t, 4)
			ms := make([]*Manager, 4)
			for r := range ms {
				m, err := New(comms[r], dirs[r], WithKeep(1), WithReplicas(1))
				if err != nil {
					t.Fatal(err)
				}
				ms[r] = m
			}
			mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
				s := newRankState(r)
				s.fill(1, r)
				return ms[r].Save(context.Background(), 1, s.st)
			}))
			// Domain 1's lead (rank 2) cannot write the manifest: its
			// store is swapped, on its own goroutine, once its shards are
			// written.
			testHook = func(p string, rank int) error {
				if p == "after-shard" && rank == 2 {
					if _, ok := ms[2].store.(DirStore); ok {
						ms[2].store = failManifest{ms[2].store}
					}
				}
				return nil
			}
			defer func() { testHook = nil }()
			errs := onEach(comms, func(r int, c *collective.Comm) error {
				s := newRankState(r)
				s.fill(2, r)
				if async {
					if err := ms[r].SaveAsync(context.Background(), 2, s.st); err != nil {
						return err
					}
					return ms[r].Wait(context.Background())
				}
				return ms[r].Save(context.Background(), 2, s.st)
			})
			for r, err := range errs {
				if err == nil || !strings.Contains(err.Error(), "the step is nevertheless committed in the checkpoint directory "+dirLabel(hosts[0])+", where a restore may load it") {
					t.Errorf("rank %d: %v", r, err)
				}
			}
			for h, dir := range hosts {
				if !committed(dir, 1) {
					t.Errorf("host %d: step 1 was deleted", h)
				}
				if committed(dir, 2) != (h == 0) {
					t.Errorf("host %d: step 2 committed %v", h, committed(dir, 2))
				}
			}
		})
	}
}

// A rank whose writes outlast the collective timeout is slow, not dead:
// the written barrier is bounded by WithIOTimeout (default 30 minutes);
// WithIOTimeout(0) leaves the collective timeout, which then ends the
// save.
func TestSlowWriterBoundedByIOTimeout(t *testing.T) {
	job := func() []*collective.Comm {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		j, err := collective.StartLocal(ctx, 2, collective.WithTimeout(300*time.Millisecond), collective.WithLogger(t.Logf))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { j.Close() })
		return j.Comms
	}
	testHook = func(p string, rank int) error {
		if p == "write" && rank == 1 {
			time.Sleep(time.Second) // a slow upload, not a synchronisation
		}
		return nil
	}
	defer func() { testHook = nil }()
	dir := t.TempDir()
	mustAll(t, save(t, job(), dir, 1, 1))
	if !committed(dir, 1) {
		t.Fatal("step 1 not committed")
	}
	errs := save(t, job(), dir, 2, 2, WithIOTimeout(0))
	if errs[0] == nil {
		t.Fatal("rank 0 waited for the slow writer beyond the collective timeout with WithIOTimeout(0)")
	}
	t.Logf("WithIOTimeout(0): rank 0: %v", errs[0])
}
