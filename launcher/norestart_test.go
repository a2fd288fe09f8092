package launcher

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// exitWith is the error of a process that exited with code.
func exitWith(t *testing.T, code string) error {
	t.Helper()
	err := exec.Command("sh", "-c", "exit "+code).Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("sh -c 'exit %s': %v", code, err)
	}
	return err
}

// An attempt in which a rank exited with ExitNoRestart is a
// *NoRestartError naming the lowest such rank and its last stderr line;
// one in which none did is its own error.
func TestNoRestartNamesTheRank(t *testing.T) {
	proc := func(rank int, err error, lines ...string) *rankProc {
		p := &rankProc{rank: rank, err: err, tail: &tail{max: 20}}
		for _, l := range lines {
			p.tail.add(l)
		}
		return p
	}
	failure := &RankError{Rank: 0, Status: "exit status 1"}
	procs := []*rankProc{
		proc(0, exitWith(t, "1"), "train: ranks [2] could not write their shards"),
		proc(2, exitWith(t, "78"), "train: checkpoint: step 5: write: no space left on device", "train: checkpoint storage at /ckpt is full (no space left on device); a restart would fail the same way"),
		proc(1, exitWith(t, "78"), "train: checkpoint storage at /ckpt is full; a restart would fail the same way"),
		proc(3, nil),
	}
	var nr *NoRestartError
	err := noRestart(failure, procs)
	if !errors.As(err, &nr) || nr.Rank != 1 || nr.Reason != "train: checkpoint storage at /ckpt is full; a restart would fail the same way" {
		t.Fatalf("noRestart: %#v", err)
	}
	var re *RankError
	if !errors.As(err, &re) || err.Error() != failure.Error() {
		t.Errorf("the NoRestartError does not read as, or unwrap to, the attempt's error: %v", err)
	}
	if why := nr.why(2); !strings.HasPrefix(why, "not restarting (--max-restarts 2): rank 1 exited with status 78, which says a restart would fail the same way: train: ") {
		t.Errorf("why: %s", why)
	}
	if err := noRestart(failure, procs[:1]); err != error(failure) {
		t.Errorf("without a rank that exited 78: %v", err)
	}
	if err := noRestart(nil, procs); err != nil {
		t.Errorf("a successful attempt: %v", err)
	}
}
