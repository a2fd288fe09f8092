package main

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// A rank that closes its Comm and exits 0 after ITERS-1 allreduces, while
// the others make ITERS, fails them at once with an error that names it
// and both calls (not, after a second, "recv from rank 1: EOF"), far
// below the collective timeout; its own Close says whom it left behind.
func TestLeaveEarlyNamesRankAndCalls(t *testing.T) {
	const timeout = time.Minute
	start := time.Now()
	out, errOut, code := run(t, []string{"TESTPROG_MODE=leave", "TESTPROG_VICTIM=1", "TESTPROG_ITERS=3"},
		gorunBin, "-np", "3", "--timeout", timeout.String(), testprogBin)
	el := time.Since(start)
	if code == 0 {
		t.Fatalf("gorun exited 0 although ranks 0 and 2 could not finish\nstdout:\n%s\nstderr:\n%s", out, errOut)
	}
	if !strings.Contains(out, "[1] rank 1 closed after 2 allreduces") {
		t.Errorf("stdout lacks rank 1's departure:\n%s", out)
	}
	for _, r := range []int{0, 2} {
		want := fmt.Sprintf("[%d] gorun: rank %d: rank 1 closed its communicator after call #2 while rank %d was in call #3", r, r, r)
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
	if want := "[1] gorun: rank 1: close: rank 0 and rank 2 were still in call #3 after this rank's last call #2"; !strings.Contains(errOut, want) {
		t.Errorf("stderr lacks %q", want)
	}
	if strings.Contains(errOut, "EOF") {
		t.Errorf("stderr reports a bare EOF")
	}
	// Startup, three allreduces of 4 MiB and the failure: seconds, not the
	// minute of the timeout.
	if el > timeout/3 {
		t.Errorf("gorun took %v; the timeout is %v", el, timeout)
	}
	t.Logf("gorun exited %d after %v; stderr:\n%s", code, el.Round(time.Millisecond), errOut)
}
