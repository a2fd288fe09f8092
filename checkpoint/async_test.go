package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/collective"
)

// saveAsyncAll has every rank save value v at step with SaveAsync, then
// Wait for the commit.
func saveAsyncAll(comms []*collective.Comm, ms []*Manager, step int64, v float32) []error {
	return onEach(comms, func(r int, c *collective.Comm) error {
		s := newRankState(r)
		s.fill(v, r)
		if err := ms[r].SaveAsync(context.Background(), step, s.st); err != nil {
			return err
		}
		return ms[r].Wait(context.Background())
	})
}

// managers makes one Manager per rank in dir. A retention the test left
// running in the background ends with the test (it must not meet the
// next test's testHook).
func managers(t *testing.T, comms []*collective.Comm, dir string, opts ...Option) []*Manager {
	t.Helper()
	ms := make([]*Manager, len(comms))
	for r, c := range comms {
		m, err := New(c, dir, opts...)
		if err != nil {
			t.Fatal(err)
		}
		ms[r] = m
	}
	t.Cleanup(func() {
		for _, m := range ms {
			m.waitRetention(context.Background())
		}
	})
	return ms
}

func committed(dir string, step int64) bool {
	_, err := os.Stat(filepath.Join(StepDir(dir, step), ManifestName))
	return err == nil
}

// The state changes right after SaveAsync returns; the checkpoint holds
// the values of the call, bit for bit.
func TestSaveAsyncSnapshot(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprint("np", n), func(t *testing.T) {
			dir := t.TempDir()
			comms := newJob(t, n)
			ms := managers(t, comms, dir)
			mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
				ctx := context.Background()
				s := newRankState(r)
				s.fill(1, r)
				if err := ms[r].SaveAsync(ctx, 1, s.st); err != nil {
					return err
				}
				s.fill(99, r) // training goes on
				if err := ms[r].Wait(ctx); err != nil {
					return err
				}
				st := ms[r].LastSave()
				if st.Stall <= 0 || st.Stall > st.Total || st.Written == 0 {
					return fmt.Errorf("rank %d: LastSave %+v", r, st)
				}
				// A second async save reuses the staging buffer.
				if err := ms[r].SaveAsync(ctx, 2, s.st); err != nil {
					return err
				}
				s.fill(100, r)
				return ms[r].Wait(ctx)
			}))
			restore(t, comms, dir, 2, 99)
			// Step 1 holds fill(1), although the state had moved on.
			if err := os.RemoveAll(StepDir(dir, 2)); err != nil {
				t.Fatal(err)
			}
			restore(t, comms, dir, 1, 1)
		})
	}
}

// Poll commits only once every rank's writes are done, and every rank
// ends the save at the same call.
func TestPollCommitsAfterWrites(t *testing.T) {
	dir := t.TempDir()
	comms := newJob(t, 3)
	ms := managers(t, comms, dir)
	release := make(chan struct{})
	var once sync.Once
	testHook = func(p string, rank int) error {
		if p == "write" && rank == 2 {
			<-release // rank 2's disk is slow
		}
		return nil
	}
	defer func() { testHook = nil }()
	states := make([]*rankState, 3)
	mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
		states[r] = newRankState(r)
		states[r].fill(5, r)
		if err := ms[r].SaveAsync(context.Background(), 5, states[r].st); err != nil {
			return err
		}
		for range 3 { // three training steps
			if err := ms[r].Poll(context.Background()); err != nil {
				return err
			}
		}
		return nil
	}))
	if committed(dir, 5) {
		t.Fatal("committed while rank 2 was still writing")
	}
	once.Do(func() { close(release) })
	polls := make([]int, 3)
	mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
		// Every rank polls until the save is committed; the decision is
		// collective, so they stop at the same call.
		for ms[r].flight != nil {
			polls[r]++
			if err := ms[r].Poll(context.Background()); err != nil {
				return err
			}
		}
		return nil
	}))
	if !committed(dir, 5) || polls[0] != polls[1] || polls[1] != polls[2] {
		t.Fatalf("committed %v after polls %v", committed(dir, 5), polls)
	}
	// With no save in flight, Poll issues no collective: one rank alone
	// may call it.
	if err := ms[0].Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	restore(t, comms, dir, 5, 5)
}

// A background write error is logged at once and returned by the next
// Poll on every rank; the previous checkpoint stays restorable.
func TestSaveAsyncWriteErrorOnPoll(t *testing.T) {
	dir := t.TempDir()
	comms := newJob(t, 3)
	var lb logBuf
	ms := managers(t, comms, dir, WithLogger(lb.logf))
	mustAll(t, save(t, comms, dir, 1, 1))
	testHook = func(p string, rank int) error {
		if p == "write" && rank == 1 {
			return errors.New("input/output error")
		}
		return nil
	}
	errs := onEach(comms, func(r int, c *collective.Comm) error {
		s := newRankState(r)
		s.fill(2, r)
		if err := ms[r].SaveAsync(context.Background(), 2, s.st); err != nil {
			return fmt.Errorf("SaveAsync: %w", err)
		}
		for ms[r].flight != nil {
			if err := ms[r].Poll(context.Background()); err != nil {
				return err
			}
		}
		return nil
	})
	testHook = nil
	for r, err := range errs {
		want := "ranks [1] could not write their shards"
		if r == 1 {
			want = "input/output error"
		}
		if err == nil || !strings.HasPrefix(err.Error(), "checkpoint: async save of step 2:") || !strings.Contains(err.Error(), want) ||
			!strings.HasSuffix(err.Error(), "previous checkpoint kept") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	t.Log(errs[1])
	if !strings.Contains(lb.String(), "rank 1: step 2: "+StepDir(dir, 2)+"/") {
		t.Errorf("log:\n%s", lb.String())
	}
	if committed(dir, 2) {
		t.Fatal("a failed save committed")
	}
	restore(t, comms, dir, 1, 1)
	// The managers go on: the next save works.
	mustAll(t, saveAsyncAll(comms, ms, 3, 3))
	restore(t, comms, dir, 3, 3)
}

// WithSkipIfBusy skips a save on every rank while any rank still writes
// the previous one; without it SaveAsync waits and commits the previous.
func TestSaveAsyncSkipIfBusy(t *testing.T) {
	dir := t.TempDir()
	comms := newJob(t, 2)
	var lb logBuf
	ms := managers(t, comms, dir, WithSkipIfBusy(), WithLogger(lb.logf))
	release := make(chan struct{})
	testHook = func(p string, rank int) error {
		if p == "write" && rank == 0 {
			<-release
		}
		return nil
	}
	defer func() { testHook = nil }()
	states := make([]*rankState, 2)
	mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
		states[r] = newRankState(r)
		states[r].fill(1, r)
		if err := ms[r].SaveAsync(context.Background(), 1, states[r].st); err != nil {
			return err
		}
		states[r].fill(2, r)
		return ms[r].SaveAsync(context.Background(), 2, states[r].st) // rank 0 is still writing step 1
	}))
	if got := strings.Count(lb.String(), "checkpoint: step 2: skipped: the save of step 1 is still being written (WithSkipIfBusy)"); got != 2 {
		t.Fatalf("%d skip messages:\n%s", got, lb.String())
	}
	close(release)
	mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
		states[r].fill(3, r)
		// Step 1's writes may or may not be done everywhere: SaveAsync
		// skips or commits step 1 first, the same way on every rank.
		if err := ms[r].Wait(context.Background()); err != nil {
			return err
		}
		if err := ms[r].SaveAsync(context.Background(), 3, states[r].st); err != nil {
			return err
		}
		return ms[r].Wait(context.Background())
	}))
	if !committed(dir, 1) || committed(dir, 2) || !committed(dir, 3) {
		t.Fatalf("steps committed: 1 %v 2 %v 3 %v", committed(dir, 1), committed(dir, 2), committed(dir, 3))
	}
	restore(t, comms, dir, 3, 3)
	// Without the option, a second SaveAsync commits the first.
	ms = managers(t, comms, dir)
	mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
		states[r].fill(4, r)
		if err := ms[r].SaveAsync(context.Background(), 4, states[r].st); err != nil {
			return err
		}
		states[r].fill(5, r)
		if err := ms[r].SaveAsync(context.Background(), 5, states[r].st); err != nil {
			return err
		}
		if !committed(dir, 4) {
			return fmt.Errorf("rank %d: step 4 not committed by the next SaveAsync", r)
		}
		// Save waits for the save in flight too.
		states[r].fill(6, r)
		return ms[r].Save(context.Background(), 6, states[r].st)
	}))
	if !committed(dir, 5) {
		t.Fatal("step 5 not committed by Save")
	}
	restore(t, comms, dir, 6, 6)
}

// A state smaller than the rank count (one float32 over five ranks), odd
// counts, and replicas in three domains, asynchronously.
func TestSaveAsyncTinyStateAndDomains(t *testing.T) {
	t.Run("tiny", func(t *testing.T) {
		dir := t.TempDir()
		comms := newJob(t, 5)
		ms := managers(t, comms, dir)
		mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
			w := []float32{1.25}
			st := new(State).Tensor("w", w)
			if err := ms[r].SaveAsync(context.Background(), 1, st); err != nil {
				return err
			}
			w[0] = 7
			if err := ms[r].Wait(context.Background()); err != nil {
				return err
			}
			step, found, err := ms[r].Restore(context.Background(), st)
			if err != nil || !found || step != 1 || w[0] != 1.25 {
				return fmt.Errorf("rank %d: step %d found %v err %v w %v", r, step, found, err, w)
			}
			return nil
		}))
	})
	t.Run("domains", func(t *testing.T) {
		dirs, hosts := hostDirs(t, 0, 1, 2)
		comms := newJob(t, 3)
		mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
			m, err := New(c, dirs[r], WithReplicas(1))
			if err != nil {
				return err
			}
			s := newRankState(r)
			s.fill(8, r)
			if err := m.SaveAsync(context.Background(), 8, s.st); err != nil {
				return err
			}
			s.fill(9, r)
			return m.Wait(context.Background())
		}))
		for d, h := range hosts {
			checkHolds(t, h, 8, d, (d+2)%3)
		}
		os.RemoveAll(hosts[0])
		restoreDirs(t, comms, dirs, 8, 8, WithReplicas(1))
		checkHolds(t, hosts[0], 8, 0, 2)
	})
}

// The commit of an asynchronous save (manifest, retention) runs in the
// background: while retention is held on rank 0, Poll keeps returning nil
// at once on every rank, the save stays in flight, and the next Poll after
// it is released ends it.
func TestPollCommitsInBackground(t *testing.T) {
	dir := t.TempDir()
	comms := newJob(t, 3)
	mustAll(t, save(t, comms, dir, 1, 1, WithKeep(1)))
	ms := managers(t, comms, dir, WithKeep(1))
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	testHook = func(p string, rank int) error {
		if p == "retention" && rank == 0 {
			once.Do(func() { close(held) })
			<-release
		}
		return nil
	}
	defer func() { testHook = nil }()
	mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
		ctx := context.Background()
		s := newRankState(r)
		s.fill(2, r)
		if err := ms[r].SaveAsync(ctx, 2, s.st); err != nil {
			return err
		}
		s.fill(50, r)
		// Polls until the commit is confirmed everywhere: rank 0 then
		// applies retention in the background, off the training path.
		for ms[r].flight != nil {
			if err := ms[r].Poll(ctx); err != nil {
				return err
			}
		}
		if r == 0 {
			<-held // rank 0 is deleting step 1, and stays there
		}
		for range 5 { // training goes on
			if err := ms[r].Poll(ctx); err != nil {
				return err
			}
		}
		if step, ok := ms[r].InFlight(); ok || ms[r].LastSave().Step != 2 {
			return fmt.Errorf("rank %d: in flight %d %v, LastSave %+v during retention; want none in flight, step 2 saved", r, step, ok, ms[r].LastSave())
		}
		return nil
	}))
	// Retention removed step 1's manifest first, and holds there.
	if _, err := os.Stat(StepDir(dir, 1)); !committed(dir, 2) || committed(dir, 1) || err != nil {
		t.Fatalf("during retention: step 2 committed %v, step 1 committed %v, step 1's directory: %v", committed(dir, 2), committed(dir, 1), err)
	}
	close(release)
	mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
		if err := ms[r].Wait(context.Background()); err != nil {
			return err
		}
		if _, ok := ms[r].InFlight(); ok || ms[r].LastSave().Step != 2 || ms[r].LastSave().Stall <= 0 {
			return fmt.Errorf("rank %d: after Wait: LastSave %+v", r, ms[r].LastSave())
		}
		return nil
	}))
	if _, err := os.Stat(StepDir(dir, 1)); !os.IsNotExist(err) {
		t.Fatalf("retention left step 1: %v", err)
	}
	restore(t, comms, dir, 2, 2)
}

// A manifest that rank 0 cannot write in the background fails the save on
// every rank, from the Poll that finds the commit done, with the same
// wording as every failed asynchronous save; the next save works.
func TestSaveAsyncManifestErrorOnPoll(t *testing.T) {
	dir := t.TempDir()
	comms := newJob(t, 3)
	mustAll(t, save(t, comms, dir, 1, 1))
	var lb logBuf
	ms := managers(t, comms, dir, WithLogger(lb.logf))
	man := filepath.Join(StepDir(dir, 2), ManifestName)
	testHook = func(p string, rank int) error {
		if p == "manifest" && rank == 0 {
			// A non-empty directory where the manifest goes: its
			// rename fails.
			return os.MkdirAll(filepath.Join(man, "x"), 0o755)
		}
		return nil
	}
	defer func() { testHook = nil }()
	polls := make([]int, 3)
	errs := onEach(comms, func(r int, c *collective.Comm) error {
		s := newRankState(r)
		s.fill(2, r)
		if err := ms[r].SaveAsync(context.Background(), 2, s.st); err != nil {
			return fmt.Errorf("SaveAsync: %w", err)
		}
		for ms[r].flight != nil {
			polls[r]++
			if err := ms[r].Poll(context.Background()); err != nil {
				return err
			}
		}
		return nil
	})
	testHook = nil
	for r, err := range errs {
		want := "checkpoint: async save of step 2: " + man + " could not be written by rank 0 (see its log for the cause); previous checkpoint kept"
		if r == 0 {
			want = "checkpoint: async save of step 2: " + man + ": rename: file exists; previous checkpoint kept"
		}
		if err == nil || err.Error() != want {
			t.Errorf("rank %d: %v\nwant %s", r, err, want)
		}
	}
	if polls[0] != polls[1] || polls[1] != polls[2] {
		t.Errorf("the ranks failed at polls %v", polls)
	}
	if !strings.Contains(lb.String(), "checkpoint: rank 0: step 2: committing the manifest: "+man+": rename: file exists") {
		t.Errorf("log:\n%s", lb.String())
	}
	if err := os.RemoveAll(man); err != nil {
		t.Fatal(err)
	}
	restore(t, comms, dir, 1, 1)
	mustAll(t, saveAsyncAll(comms, ms, 3, 3))
	restore(t, comms, dir, 3, 3)
}

// An elastic job loses a rank between SaveAsync and its commit: the
// survivors' first Poll after the job re-formed abandons the save without
// a collective (one line each), a new save on the new membership commits,
// and Restore returns it bit for bit.
func TestSaveAsyncAbandonedWhenJobReforms(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	j, err := collective.StartLocal(ctx, 3, collective.WithTimeout(30*time.Second), collective.WithLogger(t.Logf), collective.WithElastic(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	dir := t.TempDir()
	var lb logBuf
	errCrashed := errors.New("crashed")
	// Rank 2 crashes once every rank's SaveAsync returned: a crash while a
	// rank is still in the save's preparing collective fails that save
	// there instead of leaving it in flight.
	var saved sync.WaitGroup
	saved.Add(3)
	errs := onEach(j.Comms, func(r int, c *collective.Comm) error {
		m, err := New(c, dir, WithLogger(lb.logf))
		if err != nil {
			return err
		}
		var counter int
		est := collective.NewElasticState(c)
		if err := est.Register("counter", &counter); err != nil {
			return err
		}
		return collective.RunElastic(ctx, c, est, func(ctx context.Context) error {
			rank := c.Rank()
			s := newRankState(rank)
			if c.Epoch() == 0 {
				s.fill(1, rank)
				if err := m.Save(ctx, 1, s.st); err != nil {
					return err
				}
				s.fill(2, rank)
				err := m.SaveAsync(ctx, 2, s.st)
				saved.Done()
				if err != nil {
					return err
				}
				if rank == 2 {
					saved.Wait()
					<-m.flight.done // its files are written, none is committed
					j.Crash(c)
					return errCrashed
				}
				for { // until the collective fails for the lost rank
					if err := m.Poll(ctx); err != nil {
						return err
					}
				}
			}
			if step, ok := m.InFlight(); !ok || step != 2 {
				return fmt.Errorf("rank %d after the reset: in flight %d %v, want step 2", rank, step, ok)
			}
			if err := m.Poll(ctx); err != nil {
				return fmt.Errorf("rank %d: Poll after the reset: %w", rank, err)
			}
			if _, ok := m.InFlight(); ok {
				return fmt.Errorf("rank %d: the save of step 2 is still in flight after the reset", rank)
			}
			s.fill(3, rank)
			if err := m.SaveAsync(ctx, 3, s.st); err != nil {
				return err
			}
			s.fill(99, rank)
			if err := m.Wait(ctx); err != nil {
				return err
			}
			if st := m.LastSave(); st.Step != 3 {
				return fmt.Errorf("rank %d: LastSave %+v, want step 3", rank, st)
			}
			got := newRankState(rank)
			step, found, err := m.Restore(ctx, got.st)
			if err != nil || !found || step != 3 {
				return fmt.Errorf("rank %d: Restore: step %d found %v err %v", rank, step, found, err)
			}
			return got.check(3, rank)
		})
	})
	for r, err := range errs {
		if r == 2 {
			if !errors.Is(err, errCrashed) {
				t.Errorf("rank 2: %v", err)
			}
			continue
		}
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	re := regexp.MustCompile(`(?m)^checkpoint: async save of step 2 abandoned: the job re-formed \(epoch 0→\d+, 3→2 ranks\) before it was committed; the previous checkpoint is kept$`)
	if got := len(re.FindAllString(lb.String(), -1)); got != 2 {
		t.Errorf("%d abandon lines, want one per survivor:\n%s", got, lb.String())
	}
	if committed(dir, 2) || !committed(dir, 3) {
		t.Errorf("committed: step 2 %v, step 3 %v", committed(dir, 2), committed(dir, 3))
	}
}

// The Polls of a phase issue their allreduce at the 1st, 2nd, 4th and 8th
// call, then every maxPollGap-th; a new phase starts over.
func TestPollGap(t *testing.T) {
	var fl inflight
	var due []int
	for i := 1; i <= 40; i++ {
		if fl.due() {
			due = append(due, i)
		}
	}
	if want := []int{1, 2, 4, 8, 16, 24, 32, 40}; !slices.Equal(due, want) {
		t.Errorf("due at %v, want %v", due, want)
	}
}
