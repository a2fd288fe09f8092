package checkpoint

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"syscall"
	"testing"

	"github.com/gorun/gorun/collective"
)

// errStore is a Store whose Puts fail with err.
type errStore struct {
	Store
	err error
}

func (s errStore) Put(context.Context, string, ...[]byte) error { return s.err }

// NoRestart recognises the storage failures a restart would meet again (a
// full disk seen by the free-space check or by a write, a read-only one,
// refused access) on every rank that has them, with the location, and
// not the others.
func TestNoRestartRecognisesRecurringFailures(t *testing.T) {
	dir := t.TempDir()
	comms := newJob(t, 2)
	ms := managers(t, comms, dir)
	saveAll := func(step int64) []error {
		return onEach(comms, func(r int, c *collective.Comm) error {
			s := newRankState(r)
			s.fill(float32(step), r)
			return ms[r].Save(context.Background(), step, s.st)
		})
	}
	old := freeSpace
	t.Cleanup(func() { freeSpace = old })
	freeSpace = func(string) (uint64, error) { return 4096, nil }
	for r, err := range saveAll(1) {
		why, ok := NoRestart(err)
		if want := "checkpoint storage at " + dir + " is full (not enough free space for a checkpoint)"; !ok || why != want {
			t.Errorf("rank %d, free-space check: NoRestart(%v) = %q, %v; want %q", r, err, why, ok, want)
		}
	}
	freeSpace = old
	for _, c := range []struct {
		errno syscall.Errno
		what  string
	}{{syscall.ENOSPC, "is full (no space left on device)"}, {syscall.EROFS, "is read-only (read-only file system)"}, {syscall.EACCES, "refuses this job access (permission denied)"}} {
		ms[1].store = errStore{DirStore(dir), &fs.PathError{Op: "write", Path: dir + "/x", Err: c.errno}}
		errs := saveAll(2)
		ms[1].store = DirStore(dir)
		if why, ok := NoRestart(errs[1]); !ok || why != "checkpoint storage at "+dir+" "+c.what {
			t.Errorf("%v on rank 1: NoRestart(%v) = %q, %v", c.errno, errs[1], why, ok)
		}
		// Rank 0 knows only that rank 1 failed: gorun learns it from rank 1.
		if _, ok := NoRestart(errs[0]); ok || errs[0] == nil {
			t.Errorf("%v on rank 1: NoRestart on rank 0 (%v): %v", c.errno, errs[0], ok)
		}
	}
	ms[1].store = errStore{DirStore(dir), errors.New("input/output error")}
	errs := saveAll(3)
	ms[1].store = DirStore(dir)
	if _, ok := NoRestart(errs[1]); ok || errs[1] == nil || !strings.Contains(errs[1].Error(), "input/output error") {
		t.Errorf("an I/O error: NoRestart(%v) = %v, want false", errs[1], ok)
	}
	if _, ok := NoRestart(nil); ok {
		t.Error("NoRestart(nil)")
	}
}
