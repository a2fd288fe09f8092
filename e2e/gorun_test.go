package e2e

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/p2p"
)

// Jobs on this host: gorun -np N starts their ranks, or (torchrunJob) the
// test starts them by hand with torchrun's variables, without gorun.

func TestGorunRunsRanks(t *testing.T) {
	out, errOut, code := run(t, []string{"TESTPROG_MODE=ok", "TESTPROG_ITERS=3", "TESTPROG_SOURCE=gorun"}, gorunBin, "-np", "3", testprogBin)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for r := range 3 {
		if want := fmt.Sprintf("[%d] rank %d of 3 ok (source gorun)", r, r); !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
}

func TestGorunFailsJobWhenRankFails(t *testing.T) {
	start := time.Now()
	out, errOut, code := run(t, []string{"TESTPROG_MODE=fail", "TESTPROG_VICTIM=1"}, gorunBin, "-np", "3", "--timeout", "20s", testprogBin)
	if code == 0 {
		t.Fatalf("gorun exited 0 although rank 1 failed\n%s\n%s", out, errOut)
	}
	for _, want := range []string{"[1] testprog: failing on purpose", "rank 1 (pid", "exit status 7", "(its stderr is above)"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	if n := strings.Count(errOut, "failing on purpose"); n != 1 {
		t.Errorf("the rank's stderr line is printed %d times, want once (not again in the summary):\n%s", n, errOut)
	}
	t.Logf("failed after %v; gorun said:\n%s", time.Since(start).Round(time.Millisecond), errOut)
}

// torchrunJob starts n ranks by hand with torchrun's variables: no gorun,
// rank 0 hosts the rendezvous at MASTER_ADDR:MASTER_PORT.
func torchrunJob(t *testing.T, n int, extra ...string) []*exec.Cmd {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	key := hex.EncodeToString(p2p.NewJobKey())
	cmds := make([]*exec.Cmd, n)
	for r := range n {
		cmd := exec.Command(testprogBin)
		cmd.Env = append(os.Environ(), "RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(n), "LOCAL_RANK="+strconv.Itoa(r),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port), "GORUN_JOB_KEY="+key, "TESTPROG_SOURCE=torchrun")
		cmd.Env = append(cmd.Env, extra...)
		cmd.Stdout, cmd.Stderr = new(bytes.Buffer), new(bytes.Buffer)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[r] = cmd
	}
	t.Cleanup(func() {
		for _, c := range cmds {
			c.Process.Signal(syscall.SIGCONT)
			c.Process.Kill()
			c.Wait()
		}
	})
	return cmds
}

// waitAll waits for the ranks in want and returns each one's exit code and
// output, failing the test if any takes longer than limit.
func waitAll(t *testing.T, cmds []*exec.Cmd, ranks []int, limit time.Duration) (codes []int, outs []string) {
	t.Helper()
	done := make(chan int, len(ranks))
	for _, r := range ranks {
		go func() { cmds[r].Wait(); done <- r }()
	}
	deadline := time.After(limit)
	for range ranks {
		select {
		case <-done:
		case <-deadline:
			t.Fatalf("ranks %v did not all exit within %v", ranks, limit)
		}
	}
	for _, r := range ranks {
		codes = append(codes, cmds[r].ProcessState.ExitCode())
		outs = append(outs, cmds[r].Stdout.(*bytes.Buffer).String()+cmds[r].Stderr.(*bytes.Buffer).String())
	}
	return codes, outs
}

func TestTorchrunEnvironment(t *testing.T) {
	cmds := torchrunJob(t, 3, "TESTPROG_MODE=ok", "TESTPROG_ITERS=2")
	codes, outs := waitAll(t, cmds, []int{0, 1, 2}, 2*time.Minute)
	for r, code := range codes {
		if want := fmt.Sprintf("rank %d of 3 ok (source torchrun)", r); code != 0 || !strings.Contains(outs[r], want) {
			t.Errorf("rank %d: exit %d, output %q; want %q", r, code, outs[r], want)
		}
	}
}

// A rank that exits in the middle of an allreduce turns into an error, on
// every surviving rank, well within the timeout, naming the dead rank.
func TestRankExitsMidAllreduce(t *testing.T) {
	const timeout = 20 * time.Second
	start := time.Now()
	cmds := torchrunJob(t, 3, "TESTPROG_MODE=exit", "TESTPROG_VICTIM=1", "TESTPROG_ITERS=3", "GORUN_TIMEOUT="+timeout.String())
	codes, outs := waitAll(t, cmds, []int{0, 1, 2}, timeout+30*time.Second)
	el := time.Since(start)
	if codes[1] != 3 {
		t.Errorf("victim exit code %d, want 3", codes[1])
	}
	for _, r := range []int{0, 2} {
		if codes[r] != 2 || !strings.Contains(outs[r], "rank 1") {
			t.Errorf("rank %d: exit %d, output %q; want exit 2 and an error naming rank 1", r, codes[r], outs[r])
		}
		t.Logf("rank %d after %v: %s", r, el.Round(time.Millisecond), strings.TrimSpace(outs[r]))
	}
}

// A frozen rank (SIGSTOP) turns into an error on every other rank within the
// collective timeout.
func TestFrozenRankProcess(t *testing.T) {
	const timeout = 4 * time.Second
	cmds := torchrunJob(t, 3, "TESTPROG_MODE=freeze", "TESTPROG_VICTIM=2", "GORUN_TIMEOUT="+timeout.String())
	start := time.Now()
	codes, outs := waitAll(t, cmds, []int{0, 1}, timeout+40*time.Second)
	el := time.Since(start)
	for r, code := range codes {
		if code != 2 || !strings.Contains(outs[r], "rank") {
			t.Errorf("rank %d: exit %d, output %q; want exit 2 with an error naming a rank", r, code, outs[r])
		}
		t.Logf("rank %d after %v: %s", r, el.Round(time.Millisecond), strings.TrimSpace(outs[r]))
	}
}

// gorun --timeline merges the ranks' traces into one valid Chrome trace with
// a track per rank and each collective's phases.
func TestGorunTimeline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.json")
	out, errOut, code := run(t, []string{"TESTPROG_MODE=ok", "TESTPROG_ITERS=2"}, gorunBin, "-np", "3", "--timeline", path, testprogBin)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var events []struct {
		Name string `json:"name"`
		Ph   string `json:"ph"`
		Pid  int    `json:"pid"`
	}
	if err := json.Unmarshal(b, &events); err != nil {
		t.Fatalf("trace is not valid JSON: %v", err)
	}
	seen := map[string]int{}
	for _, e := range events {
		if e.Ph == "X" {
			seen[fmt.Sprint(e.Pid, " ", e.Name)]++
		}
	}
	for r := range 3 {
		for _, name := range []string{"Allreduce", "reduce-scatter", "allgather"} {
			if seen[fmt.Sprint(r, " ", name)] != 2 {
				t.Errorf("rank %d: %d %q events, want 2 (all: %v)", r, seen[fmt.Sprint(r, " ", name)], name, seen)
			}
		}
	}
	if parts, _ := filepath.Glob(path + ".rank*"); len(parts) != 0 {
		t.Errorf("per-rank files left behind: %v", parts)
	}
}
