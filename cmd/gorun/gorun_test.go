package main

import (
	"bufio"
	"bytes"
	"context"
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

	"github.com/gorun/gorun/internal/bench"
	"github.com/gorun/gorun/p2p"
)

var gorunBin, testprogBin, rankprogBin, elasticprogBin, elastictrainBin string

// TestMain builds gorun and the test rank programs once for every test here.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gorun-test-")
	if err != nil {
		panic(err)
	}
	// Hang dumps of the tests whose calls stall go with the binaries.
	os.Setenv(p2p.EnvHangDir, dir)
	gorunBin, testprogBin, rankprogBin = filepath.Join(dir, "gorun"), filepath.Join(dir, "testprog"), filepath.Join(dir, "rankprog")
	elasticprogBin, elastictrainBin = filepath.Join(dir, "elasticprog"), filepath.Join(dir, "elastictrain")
	for bin, pkg := range map[string]string{gorunBin: ".", testprogBin: "../../internal/testenv/progs/testprog", rankprogBin: "../../internal/testenv/progs/rankprog",
		elasticprogBin: "../../internal/testenv/progs/elasticprog", elastictrainBin: "../../internal/testenv/progs/elastictrain"} {
		args := []string{"build", "-o", bin}
		// rankprog has nothing to race, and starts faster without.
		if raceEnabled && bin != rankprogBin {
			args = append(args, "-race")
		}
		if out, err := exec.Command("go", append(args, pkg)...).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building %s: %v\n%s", pkg, err, out)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// run executes a command with a hard deadline, so a hung job fails the test
// instead of the test binary.
func run(t *testing.T, env []string, name string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %v did not finish in time\nstdout:\n%s\nstderr:\n%s", name, args, o.String(), e.String())
	}
	code = cmd.ProcessState.ExitCode()
	if err != nil && code < 0 {
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

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

func TestGorunBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-np", "0", "true"}, "-np must be at least 1"},
		{[]string{"-np", "2", "-H", "a:b", "true"}, "write host:slots"},
		{[]string{"-np", "4", "-H", "localhost:2", "true"}, "needs 4 slots"},
		{[]string{"-np", "2"}, "gorun: no program to run: write gorun -np N PROGRAM [ARGS...], e.g. gorun -np 4 ./examples/mnist; gorun --help lists gorun's flags"},
		{nil, "gorun: no program to run: write gorun -np N PROGRAM [ARGS...]"},
		{[]string{"-np", "4", "--epochs", "3", "./examples/mnist"}, "gorun: unknown flag --epochs: gorun's own flags come before PROGRAM, the program's after it: gorun -np 4 ./examples/mnist --epochs 3"},
		{[]string{"-np", "2", "-x", "A=1", "--lr=0.1", "--", "./train", "-v"}, "gorun: unknown flag --lr: gorun's own flags come before PROGRAM, the program's after it: gorun -np 2 -x A=1 -- ./train --lr=0.1 -v"},
		{[]string{"--epochs", "3"}, "gorun: unknown flag --epochs: gorun's own flags come before PROGRAM, the program's after it: gorun PROGRAM --epochs 3"},
		{[]string{"-np", "4", "-e", "3", "./x"}, "gorun: unknown flag -e: gorun's own flags come before PROGRAM, the program's after it: gorun -np 4 ./x -e 3"},
		{[]string{"bench", "--op", "alltoall"}, "use allreduce, broadcast"},
		{[]string{"bench", "--sizes", "big"}, "not a positive byte count"},
	} {
		_, errOut, code := run(t, nil, gorunBin, tc.args...)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("gorun %v: exit %d, stderr %q; want an error containing %q", tc.args, code, errOut, tc.want)
		}
	}
}

func TestGorunBuildsGoPackage(t *testing.T) {
	// The binary goes to the build cache: the test's own, not the user's.
	w := newBuildWorld(t)
	out, errOut, code := run(t, append(w.env, "TESTPROG_MODE=ok", "TESTPROG_SOURCE=built"), gorunBin, "-np", "2", "../../internal/testenv/progs/testprog")
	if code != 0 || !strings.Contains(out, "[1] rank 1 of 2 ok (source built)") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}

func TestBenchJSON(t *testing.T) {
	out, errOut, code := run(t, nil, gorunBin, "bench", "-np", "3", "--sizes", "4,1K,1M", "--iters", "5", "--json")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	var got []bench.Result
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var r bench.Result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("line %q is not JSON: %v", sc.Text(), err)
		}
		got = append(got, r)
	}
	if len(got) != 3 {
		t.Fatalf("want 3 results, got %d:\n%s", len(got), out)
	}
	// The algorithms are ring's defaults for 3 ranks on shared memory
	// (ring/policy.go): direct up to 4 KiB, Rabenseifner up to 4 MiB.
	algos := []string{"direct", "direct", "rabenseifner"}
	for i, want := range []int64{4, 1024, 1 << 20} {
		r := got[i]
		if r.Bytes != want || !r.Correct || r.NP != 3 || r.Op != "allreduce" || r.Iters != 5 || r.TimeUS <= 0 || r.BusBWGBps <= 0 {
			t.Errorf("result %d: %+v", i, r)
		}
		if r.Algorithm != algos[i] {
			t.Errorf("result %d (%d bytes): algorithm %q, want %q", i, r.Bytes, r.Algorithm, algos[i])
		}
		if bus := r.AlgBWGBps * 4 / 3; r.BusBWGBps < bus*0.99-0.001 || r.BusBWGBps > bus*1.01+0.001 {
			t.Errorf("busbw %v is not algbw %v * 2(N-1)/N", r.BusBWGBps, r.AlgBWGBps)
		}
	}
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
