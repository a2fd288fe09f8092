package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// watchedBuffer collects a process's output and says when it grows.
type watchedBuffer struct {
	syncBuf
	wrote chan struct{}
}

func newWatchedBuffer() *watchedBuffer { return &watchedBuffer{wrote: make(chan struct{}, 1)} }

func (w *watchedBuffer) Write(p []byte) (int, error) {
	n, err := w.syncBuf.Write(p)
	select {
	case w.wrote <- struct{}{}:
	default:
	}
	return n, err
}

// waitFor waits until w holds n copies of want; it fails after limit or
// once exited is closed (the writer is gone) and says why.
func (w *watchedBuffer) waitFor(want string, n int, limit time.Duration, exited <-chan struct{}) error {
	deadline := time.After(limit)
	for strings.Count(w.String(), want) < n {
		select {
		case <-w.wrote:
		case <-exited:
			if strings.Count(w.String(), want) < n {
				return fmt.Errorf("exited before printing %d× %q; got:\n%s", n, want, w.String())
			}
		case <-deadline:
			return fmt.Errorf("no %d× %q within %v; got:\n%s", n, want, limit, w.String())
		}
	}
	return nil
}

// gorunProc is a gorun started in the background.
type gorunProc struct {
	cmd      *exec.Cmd
	out, err *watchedBuffer
	done     chan struct{}
}

// startGorun starts gorun with env added to the test's environment and a
// marker variable that lets ranksAlive find its ranks; it is killed at the
// end of the test if still running.
func startGorun(t *testing.T, dir string, env []string, args ...string) *gorunProc {
	t.Helper()
	g := &gorunProc{cmd: exec.Command(gorunBin, args...), out: newWatchedBuffer(), err: newWatchedBuffer(), done: make(chan struct{})}
	g.cmd.Dir = dir
	g.cmd.Env = append(append(os.Environ(), env...), marker(t))
	g.cmd.Stdout, g.cmd.Stderr = g.out, g.err
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { g.cmd.Wait(); close(g.done) }()
	t.Cleanup(func() {
		g.cmd.Process.Kill()
		<-g.done
	})
	return g
}

// wait waits for gorun to exit and returns its exit code (-1 if a signal
// ended it).
func (g *gorunProc) wait(t *testing.T, limit time.Duration) int {
	t.Helper()
	select {
	case <-g.done:
	case <-time.After(limit):
		t.Fatalf("gorun did not exit within %v\nstdout:\n%s\nstderr:\n%s", limit, g.out, g.err)
	}
	return g.cmd.ProcessState.ExitCode()
}

// waitOutput waits until gorun printed n copies of want on stdout.
func (g *gorunProc) waitOutput(t *testing.T, want string, n int, limit time.Duration) {
	t.Helper()
	if err := g.out.waitFor(want, n, limit, g.done); err != nil {
		t.Fatalf("gorun stdout: %v\nstderr:\n%s", err, g.err)
	}
}

// marker is an environment variable unique to the test, inherited by the
// ranks gorun starts.
func marker(t *testing.T) string {
	return "GORUN_TEST_MARKER=" + strings.ReplaceAll(t.Name(), "/", "_") + "-" + strconv.Itoa(os.Getpid())
}

// ranksAlive lists the processes (other than zombies) whose environment
// holds the test's marker, that is every rank gorun started.
func ranksAlive(t *testing.T, self int) []string {
	t.Helper()
	want := []byte(marker(t) + "\x00")
	var out []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, _ := strconv.Atoi(filepath.Base(d))
		if pid == self || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(d + "/environ")
		if err != nil || !bytes.Contains(env, want) {
			continue
		}
		if !processRunning(pid) {
			continue
		}
		cmdline, _ := os.ReadFile(d + "/cmdline")
		out = append(out, fmt.Sprintf("pid %d: %s", pid, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
	}
	return out
}

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
