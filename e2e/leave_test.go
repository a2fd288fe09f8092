package e2e

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
		// Either in the call ("[0] gorun: rank 0: rank 1 closed ...") or,
		// when the news came before the rank entered it, on entering it
		// ("communicator unusable after an earlier failure: rank 1 closed ...").
		want := fmt.Sprintf("rank 1 closed its communicator after call #2 while rank %d was in call #3", r)
		if !strings.Contains(linesOf(errOut, r), want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
	// Its Close names the ranks that reported being behind before its links
	// drained: both, or only one when the other learnt of the departure
	// from the job's abort first.
	if want := "still in call #3 after this rank's last call #2"; !strings.Contains(linesOf(errOut, 1), "[1] gorun: rank 1: close: ") || !strings.Contains(linesOf(errOut, 1), want) {
		t.Errorf("stderr lacks %q", want)
	}
	// gorun's summary names the rank that left first, not only the
	// survivors that failed because of it.
	if want := "gorun: job failed: rank 1 closed its communicator after call #2 while other ranks were still making collective calls"; !strings.Contains(errOut, want) {
		t.Errorf("gorun's summary lacks %q", want)
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

// linesOf returns the lines of out that rank r wrote ("[r] ...").
func linesOf(out string, r int) string {
	var b strings.Builder
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, fmt.Sprintf("[%d] ", r)) {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// Ranks that all close their communicator after the same call and then
// fail (a check after Init, such as a bad --checkpoint-dir) left nobody
// behind: gorun's summary names the failure, not an early Close.
func TestAllCloseThenFailIsNotAnEarlyLeave(t *testing.T) {
	out, errOut, code := run(t, []string{"TESTPROG_MODE=failall", "TESTPROG_ITERS=2"},
		gorunBin, "-np", "3", "--timeout", "1m", testprogBin)
	if code == 0 {
		t.Fatalf("gorun exited 0 although every rank exited 6\nstdout:\n%s\nstderr:\n%s", out, errOut)
	}
	for r := range 3 {
		if want := fmt.Sprintf("testprog: rank %d failing after Close", r); !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
	if strings.Contains(errOut, "closed its communicator") || strings.Contains(errOut, "still making collective calls") {
		t.Errorf("gorun's summary blames an early Close although every rank closed after the same call:\n%s", errOut)
	}
	if !strings.Contains(errOut, "gorun: job failed: rank ") || !strings.Contains(errOut, "exit status 6") {
		t.Errorf("gorun's summary does not name a failed rank and its exit status:\n%s", errOut)
	}
}
