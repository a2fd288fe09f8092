package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gorun/gorun/collective"
)

// managers makes one Manager per rank in dir.
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

// Poll commits only once every rank's writes are done, and then within
// one call.
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
	mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
		s := newRankState(r)
		s.fill(3, r)
		if err := ms[r].SaveAsync(context.Background(), 3, s.st); err != nil {
			return err
		}
		return ms[r].Wait(context.Background())
	}))
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
