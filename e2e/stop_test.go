package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A frozen rank (SIGSTOP) keeps SIGTERM pending: gorun wakes it when it
// stops the job, rather than wait --grace to SIGKILL it.
func TestGorunStopsAFrozenRankWithoutWaitingForGrace(t *testing.T) {
	const grace = 90 * time.Second
	start := time.Now()
	out, errOut, code := run(t, []string{"TESTPROG_MODE=freeze", "TESTPROG_VICTIM=2"}, gorunBin,
		"-np", "3", "--timeout", "4s", "--grace", grace.String(), testprogBin)
	took := time.Since(start)
	if code == 0 {
		t.Errorf("exit 0 although rank 2 froze\nstdout:\n%s\nstderr:\n%s", out, errOut)
	}
	if took > grace/2 {
		t.Errorf("gorun took %v with --grace %v: it waited to SIGKILL the frozen rank\nstderr:\n%s", took.Round(time.Millisecond), grace, errOut)
	}
	// The ranks that exit first are the frozen rank's victims; the summary
	// says what the rendezvous saw first.
	if !regexp.MustCompile(`gorun: job failed: rank 2 \(\S+\) stopped responding: no heartbeat within 4s, so the job was aborted; then rank`).MatchString(errOut) {
		t.Errorf("gorun's summary does not name the frozen rank 2 as the cause:\n%s", errOut)
	}
	t.Logf("job with a frozen rank ended after %v (--timeout 4s, --grace %v); gorun said:\n%s", took.Round(time.Millisecond), grace, errOut)
}

// Ctrl-C (or SIGTERM) stops every rank and says so once: no rank is blamed,
// and the abort errors the stop makes the ranks print are not shown (but
// kept in --output-dir).
func TestGorunStoppedByTheUser(t *testing.T) {
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
		env  []string
		prog string
		code int
		want string // gorun's whole stderr, up to where it may vary
		full bool   // want is all of it
	}{
		{"interrupt", syscall.SIGINT, []string{"TESTPROG_MODE=loop"}, testprogBin, 130,
			"gorun: stopped by the user (interrupt); all 4 ranks stopped", false},
		{"SIGTERM", syscall.SIGTERM, []string{"TESTPROG_MODE=loop"}, testprogBin, 143,
			"gorun: stopped: terminated (SIGTERM); all 4 ranks stopped", false},
		{"interrupt, ranks complain", syscall.SIGINT, []string{"RANKPROG_MODE=loop"}, rankprogBin, 130,
			"gorun: stopped by the user (interrupt); all 4 ranks stopped (--verbose shows the 4 stderr lines they wrote while stopping)\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outDir := t.TempDir()
			g := startGorun(t, "", tc.env, "-np", "4", "--output-dir", outDir, tc.prog)
			g.waitOutput(t, "looping", 4, 2*time.Minute)
			g.cmd.Process.Signal(tc.sig)
			code := g.wait(t, time.Minute)
			errOut := g.err.String()
			if code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
			if !strings.HasPrefix(errOut, tc.want) || tc.full && errOut != tc.want || strings.Count(errOut, "\n") != 1 {
				t.Errorf("stderr:\n%s\nwant one line: %q", errOut, tc.want)
			}
			if left := ranksAlive(t, g.cmd.Process.Pid); len(left) > 0 {
				t.Errorf("ranks left running: %v", left)
			}
			if tc.full {
				b, _ := os.ReadFile(filepath.Join(outDir, "rank.2", "stderr"))
				if want := "rank 2: rank 3 aborted: recv from rank 1: terminated signal received\n"; string(b) != want {
					t.Errorf("--output-dir rank.2/stderr = %q, want %q", b, want)
				}
			}
			t.Logf("gorun said: %s", strings.TrimSpace(errOut))
		})
	}
}
