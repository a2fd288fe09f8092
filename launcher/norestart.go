// A failure a restart would meet again: a rank that says so, by its exit
// status, keeps gorun from restarting the job.

package launcher

import (
	"errors"
	"fmt"
	"os/exec"
)

// ExitNoRestart is the exit status by which a rank says that its failure
// would happen again on a restart (its checkpoint storage is full or
// read-only, refuses its credentials, has no bucket: package checkpoint's
// NoRestart and ExitNoRestart, the same number): Run does not restart the
// job whatever Job.MaxRestarts, and says why, quoting the rank's last
// line of stderr. Any other exit status of a failed rank is taken as a
// failure a restart may cure.
const ExitNoRestart = 78

// NoRestartError is the failure of an attempt in which a rank exited with
// ExitNoRestart. Its text is the attempt's error's.
type NoRestartError struct {
	Err    error  // the attempt's error: a *RankError, or an *ElasticError
	Rank   int    // the lowest rank that exited with ExitNoRestart
	Host   string // its host; "" when every rank runs on this host
	Reason string // its last line of stderr
}

func (e *NoRestartError) Error() string { return e.Err.Error() }
func (e *NoRestartError) Unwrap() error { return e.Err }

// why is the line Run logs when it does not restart the job because of e.
func (e *NoRestartError) why(maxRestarts int) string {
	s := fmt.Sprintf("not restarting (--max-restarts %d): rank %d%s exited with status %d, which says a restart would fail the same way", maxRestarts, e.Rank, onHost(e.Host), ExitNoRestart)
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	return s
}

// noRestart returns err, an attempt's failure, as a *NoRestartError when
// one of the attempt's processes exited with ExitNoRestart; else err.
func noRestart(err error, procs []*rankProc) error {
	if err == nil {
		return nil
	}
	var first *rankProc
	for _, p := range procs {
		var ee *exec.ExitError
		if errors.As(p.err, &ee) && ee.ExitCode() == ExitNoRestart && (first == nil || p.rank < first.rank) {
			first = p
		}
	}
	if first == nil {
		return err
	}
	e := &NoRestartError{Err: err, Rank: first.rank, Host: first.host}
	if lines := first.tail.lines(); len(lines) > 0 {
		e.Reason = lines[len(lines)-1]
	}
	return e
}
