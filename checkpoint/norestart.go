package checkpoint

import (
	"errors"
	"fmt"
	"syscall"
)

// A failure certain to recur: checkpoint storage that is full, read-only,
// refuses this job's writes or credentials, or whose bucket does not
// exist. Restarting the job (gorun --max-restarts) would meet it again, at
// the first save or earlier, so the rank says so instead: NoRestart
// recognises such an error, and the rank exits with ExitNoRestart, by
// which gorun knows not to restart the job.

// ExitNoRestart is the exit status by which a rank tells gorun that its
// failure would happen again on a restart: gorun --max-restarts does not
// restart the job then (launcher.ExitNoRestart, the same number). A rank
// that exits with it should say why in its last line of stderr, which
// gorun quotes.
const ExitNoRestart = 78

// NoRestart reports whether err, from New, Save, SaveAsync, Poll, Wait or
// Restore, is a storage failure that a restart of the job would meet
// again, and says why in a few words: "checkpoint storage at /ckpt is full
// (no space left on device)". A rank that fails with such an error can
// print that and exit with ExitNoRestart:
//
//	if why, ok := checkpoint.NoRestart(err); ok {
//		fmt.Fprintf(os.Stderr, "train: %s; a restart would fail the same way\n", why)
//		os.Exit(checkpoint.ExitNoRestart)
//	}
func NoRestart(err error) (why string, ok bool) {
	var at *recurringAt
	if errors.As(err, &at) {
		return fmt.Sprintf("checkpoint storage at %s %s", at.loc, at.what), true
	}
	if what, ok := recurs(err); ok {
		return "checkpoint storage " + what, true
	}
	return "", false
}

// recurring marks, in an error's chain, a storage failure that a restart
// would meet again; what says what the store is ("is full (...)"). Its
// text is its error's.
type recurring struct {
	what string
	err  error
}

func (e *recurring) Error() string { return e.err.Error() }
func (e *recurring) Unwrap() error { return e.err }

// recurringAt is a recurring failure of the store at loc, as a Manager's
// methods (mark) and New return it. Its text is its error's.
type recurringAt struct {
	loc, what string
	err       error
}

func (e *recurringAt) Error() string { return e.err.Error() }
func (e *recurringAt) Unwrap() error { return e.err }

// recurs says whether err is a storage failure that a restart would meet
// again, and what the store is then.
func recurs(err error) (what string, ok bool) {
	var r *recurring
	var se *s3Error
	switch {
	case err == nil:
		return "", false
	case errors.As(err, &r):
		return r.what, true
	case errors.As(err, &se) && se.recur != "":
		return se.recur, true
	case errors.Is(err, syscall.ENOSPC):
		return "is full (no space left on device)", true
	case errors.Is(err, syscall.EDQUOT):
		return "is over its quota (disk quota exceeded)", true
	case errors.Is(err, syscall.EROFS):
		return "is read-only (read-only file system)", true
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return "refuses this job access (permission denied)", true
	}
	return "", false
}

// markAt returns err marked, when it recurs, as a failure of the store at
// loc, for NoRestart.
func markAt(loc string, err error) error {
	if what, ok := recurs(err); ok {
		return &recurringAt{loc: loc, what: what, err: err}
	}
	return err
}

// mark is markAt for the Manager's store.
func (m *Manager) mark(err error) error { return markAt(m.dir, err) }
