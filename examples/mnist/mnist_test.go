package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// The programs the tests below run: gorun and the example, built once.
//
// They are built WITHOUT -race even when the tests run under -race: the
// race detector slows the training loop down ~10×, and the collectives it
// exercises have their own race-enabled tests.
var bins struct {
	once              sync.Once
	dir, gorun, mnist string
	err               error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if bins.dir != "" {
		os.RemoveAll(bins.dir)
	}
	os.Exit(code)
}

func binaries(t *testing.T) (gorun, mnist string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the example")
	}
	bins.once.Do(func() {
		if bins.dir, bins.err = os.MkdirTemp("", "mnist-test-"); bins.err != nil {
			return
		}
		bins.gorun, bins.mnist = filepath.Join(bins.dir, "gorun"), filepath.Join(bins.dir, "mnist")
		for bin, pkg := range map[string]string{bins.gorun: "../../cmd/gorun", bins.mnist: "."} {
			if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
				bins.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
				return
			}
		}
	})
	if bins.err != nil {
		t.Fatal(bins.err)
	}
	return bins.gorun, bins.mnist
}

// runCmd runs a program to the end, with a deadline so that a hung run
// fails the test instead of the test binary. The environment is the
// test's, without GORUN_* (the tests may themselves run under gorun).
func runCmd(t *testing.T, name string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = cleanEnv()
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %v did not finish in time\nstdout:\n%s\nstderr:\n%s", name, args, o.String(), e.String())
	}
	if err != nil && cmd.ProcessState == nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), cmd.ProcessState.ExitCode()
}

func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GORUN_") {
			env = append(env, kv)
		}
	}
	return env
}

var (
	// gorun prefixes lines with the rank, or ranks ("[0-1]") when they
	// print the same line.
	finalAccRe  = regexp.MustCompile(`(?m)^(?:\[[0-9,-]+\] )?final: test accuracy ([0-9.]+)%`)
	finalHashRe = regexp.MustCompile(`(?m)^(?:\[[0-9,-]+\] )?final: parameters sha256 ([0-9a-f]+) \(rank (\d)`)
)

// TestGorunTwoRanks trains one epoch on the embedded digits with
// `gorun -np 2` and checks the test accuracy, that both ranks end with the
// same parameters (each prints a checksum with --verbose), and that the
// default keeps the global batch at 64: 2 ranks × 32, not 2 × 64.
func TestGorunTwoRanks(t *testing.T) {
	gorun, mnist := binaries(t)
	out, errOut, code := runCmd(t, gorun, "-np", "2", mnist, "--epochs", "1", "--verbose", "--progress", "off")
	t.Logf("%s%s", out, errOut)
	if code != 0 {
		t.Fatalf("gorun: exit %d", code)
	}
	if want := "mnist: 2 rank(s) × batch 32 × 1 micro-batch(es) = global batch 64 (default);"; !strings.Contains(out, want) {
		t.Errorf("output lacks %q", want)
	}
	accs := finalAccRe.FindAllStringSubmatch(out, -1)
	hashes := finalHashRe.FindAllStringSubmatch(out, -1)
	if len(accs) == 0 || len(hashes) != 2 {
		t.Fatalf("want a final accuracy, and a checksum from each of 2 ranks, got %d and %d", len(accs), len(hashes))
	}
	for _, a := range accs {
		if acc, _ := strconv.ParseFloat(a[1], 64); acc <= 85 {
			t.Errorf("test accuracy %.2f%% after one epoch, want > 85%%", acc)
		}
	}
	if hashes[0][2] == hashes[1][2] || hashes[0][1] != hashes[1][1] {
		t.Errorf("ranks end with different parameters: rank %s %s vs rank %s %s", hashes[0][2], hashes[0][1], hashes[1][2], hashes[1][1])
	}
}

// Three ranks do not divide the default global batch of 64: they take 22,
// 21 and 21 samples, with gradients weighted by size, and train what one
// rank trains, up to float rounding in the sums.
func TestGorunThreeRanksUnevenBatch(t *testing.T) {
	gorun, mnist := binaries(t)
	one, errOne, code := runCmd(t, mnist, "--epochs", "1", "--progress", "off")
	if code != 0 {
		t.Fatalf("1 rank: exit %d\n%s%s", code, one, errOne)
	}
	three, errThree, code := runCmd(t, gorun, "-np", "3", mnist, "--epochs", "1", "--progress", "off")
	t.Logf("1 rank:\n%s\n3 ranks:\n%s%s", one, three, errThree)
	if code != 0 {
		t.Fatalf("3 ranks: exit %d", code)
	}
	for _, want := range []string{"mnist: 3 rank(s) × batch 21-22 × 1 micro-batch(es) = global batch 64 (default);",
		"the micro-batches of ranks 0..2 hold 21, 21, 22 samples"} {
		if !strings.Contains(three, want) {
			t.Errorf("3-rank output lacks %q", want)
		}
	}
	a1, a3 := finalAccRe.FindStringSubmatch(one), finalAccRe.FindStringSubmatch(three)
	if a1 == nil || a3 == nil {
		t.Fatal("no final accuracy")
	}
	acc1, _ := strconv.ParseFloat(a1[1], 64)
	acc3, _ := strconv.ParseFloat(a3[1], 64)
	if math.Abs(acc1-acc3) > 0.5 {
		t.Errorf("test accuracy after one epoch: %.2f%% on 1 rank, %.2f%% on 3 ranks with the same global batch", acc1, acc3)
	}
}

// Without a terminal, --progress on prints whole progress lines on stderr
// (it used to write the bar's '\r' redraws, which a pipe or a log file
// gets as one huge line at the end), and --progress auto prints none.
func TestProgressWithoutTerminal(t *testing.T) {
	_, mnist := binaries(t)
	_, errOut, code := runCmd(t, mnist, "--epochs", "1", "--progress", "on")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
	if strings.Contains(errOut, "\r") || !strings.HasSuffix(errOut, "\n") || len(lines) != 9 {
		t.Fatalf("want 9 whole lines (one per tenth of the epoch), got %q", errOut)
	}
	for _, l := range lines {
		if !regexp.MustCompile(`^progress: epoch 1/1 step \d+/125, \d+ samples/s, ETA [0-9.]+s$`).MatchString(l) {
			t.Errorf("progress line %q", l)
		}
	}
	_, errOut, code = runCmd(t, mnist, "--epochs", "1")
	if code != 0 || errOut != "" {
		t.Errorf("--progress auto without a terminal: exit %d, stderr %q", code, errOut)
	}
}

// openPTY returns a new pseudo-terminal: the master, which reads what is
// written to the terminal, and the slave, the terminal itself.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		m.Close()
		t.Fatalf("unlocking the pty: %v", e)
	}
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		m.Close()
		t.Fatalf("pty number: %v", e)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		t.Skipf("opening the pty: %v", err)
	}
	return m, s
}

// Under gorun a rank never writes to the terminal behind gorun's back
// (it used to open /dev/tty for its bar, whose fragments then landed in
// front of gorun's lines). gorun here runs with a terminal as its
// controlling terminal but its stderr on a pipe, so it sets no GORUN_TTY:
// --progress on then prints plain lines through gorun, and the terminal
// gets nothing at all.
func TestGorunRankLeavesTerminalAlone(t *testing.T) {
	gorun, mnist := binaries(t)
	master, slave := openPTY(t)
	defer master.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gorun, "-np", "2", mnist, "--epochs", "1", "--progress", "on")
	cmd.Env = cleanEnv()
	var o, e bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, &o, &e
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	// The master reads until every holder of the terminal is gone (EIO).
	var onTerminal bytes.Buffer
	read := make(chan struct{})
	go func() { io.Copy(&onTerminal, master); close(read) }()
	err := cmd.Wait()
	<-read
	t.Logf("stdout:\n%s\nstderr:\n%s", o.String(), e.String())
	if err != nil {
		t.Fatalf("gorun: %v", err)
	}
	if onTerminal.Len() > 0 {
		t.Errorf("the ranks wrote %d bytes to the terminal, bypassing gorun: %q", onTerminal.Len(), onTerminal.String())
	}
	if n := strings.Count(e.String(), "[0] progress: epoch 1/1 step "); n != 9 {
		t.Errorf("%d progress lines from rank 0 through gorun, want 9", n)
	}
}

// Every save says so on one line (an asynchronous one once it is
// committed), the end of training is saved whatever --checkpoint-every,
// and a rerun of the finished job says it is complete, trains nothing,
// exits 0 and reports the same parameters. More --epochs continue it, and
// --metrics then holds every epoch of the run.
func TestCheckpointLinesAndFinishedRun(t *testing.T) {
	_, mnist := binaries(t)
	dir := filepath.Join(t.TempDir(), "ckpt")
	metrics := filepath.Join(t.TempDir(), "metrics.jsonl")
	args := []string{"--epochs", "1", "--checkpoint-dir", dir, "--checkpoint-every", "50", "--progress", "off"}
	first, errOut, code := runCmd(t, mnist, args...)
	t.Logf("first run:\n%s%s", first, errOut)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, step := range []int{50, 100} {
		if re := asyncLineRe(dir, step); !re.MatchString(first) {
			t.Errorf("no line for the asynchronous checkpoint of step %d (%s)", step, re)
		}
	}
	// The end of training (not a multiple of 50) is saved synchronously.
	if re := syncLineRe(dir, 125); !re.MatchString(first) {
		t.Errorf("no line for the final checkpoint of step 125 (%s)", re)
	}
	if !regexp.MustCompile(`(?m)^final: checkpoint: 3 save\(s\) blocked training [0-9.]+ ms in all, [0-9.]+ ms per save: 2 asynchronous \([0-9.]+ ms in SaveAsync, [0-9.]+ ms in the \d+ Polls while one was written, [0-9.]+ ms in the Polls and Waits that committed them\), 1 synchronous at the end \([0-9.]+ ms\) \(rank 0\)$`).MatchString(first) {
		t.Errorf("no final line on what the checkpoints cost")
	}
	again, errOut, code := runCmd(t, mnist, args...)
	t.Logf("rerun:\n%s%s", again, errOut)
	if code != 0 {
		t.Fatalf("rerun of a finished job: exit %d", code)
	}
	acc := finalAccRe.FindStringSubmatch(first)
	if acc == nil {
		t.Fatal("no final accuracy in the first run")
	}
	want := fmt.Sprintf("mnist: %s holds a checkpoint of the finished run (step 125 of 125, test accuracy %s%%); nothing to train. Use a new --checkpoint-dir or more --epochs to continue", dir, acc[1])
	if !strings.Contains(again, want) {
		t.Errorf("rerun lacks %q", want)
	}
	if strings.Contains(again, "epoch 1/1 ") || strings.Contains(again, "checkpoint: step") {
		t.Errorf("the rerun trained or saved again")
	}
	if h1, h2 := finalHashRe.FindStringSubmatch(first), finalHashRe.FindStringSubmatch(again); h1 == nil || h2 == nil || h1[1] != h2[1] {
		t.Errorf("final checksums %v and %v", h1, h2)
	}

	more, errOut, code := runCmd(t, mnist, "--epochs", "2", "--checkpoint-dir", dir, "--checkpoint-every", "50", "--progress", "off", "--metrics", metrics)
	t.Logf("two epochs:\n%s%s", more, errOut)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(more, "mnist: resumed from "+filepath.Join(dir, "step-000000000125")+" at step 125 of 250") ||
		strings.Contains(more, "epoch 1/2 ") || !strings.Contains(more, "epoch 2/2 ") || !asyncLineRe(dir, 250).MatchString(more) {
		t.Errorf("--epochs 2 did not continue the run from step 125 to 250")
	}
	data, err := os.ReadFile(metrics)
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(string(data)), "\n"); len(lines) != 2 ||
		!strings.HasPrefix(lines[0], `{"epoch":1,`) || !strings.HasPrefix(lines[1], `{"epoch":2,`) {
		t.Errorf("--metrics of the resumed run:\n%s", data)
	}
}

// A checkpoint of another global batch cannot continue a run: its steps
// would mean other samples.
func TestCheckpointOfAnotherGlobalBatch(t *testing.T) {
	_, mnist := binaries(t)
	dir := t.TempDir()
	if out, errOut, code := runCmd(t, mnist, "--epochs", "1", "--checkpoint-dir", dir, "--progress", "off"); code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code := runCmd(t, mnist, "--epochs", "2", "--global-batch", "128", "--checkpoint-dir", dir, "--progress", "off")
	want := "holds a run with global batch 64, and this one has global batch 128"
	if code == 0 || !strings.Contains(errOut, want) || strings.Contains(out, "epoch ") {
		t.Errorf("exit %d; want an error containing %q before training\n%s%s", code, want, out, errOut)
	}
}

// Output paths are checked before training: a bad one fails at once with
// the flag and the path, instead of after the whole run.
func TestPathsCheckedBeforeTraining(t *testing.T) {
	_, mnist := binaries(t)
	tmp := t.TempDir()
	file := filepath.Join(tmp, "a-file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(tmp, "missing", "dir")
	// {host} in --checkpoint-dir is this host's name (GORUN_HOST is unset).
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, host), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ flag, path, want string }{
		{"--plot", filepath.Join(missing, "curves.png"), "directory " + missing + " does not exist"},
		{"--plot", tmp, "is a directory"},
		{"--metrics", filepath.Join(missing, "m.jsonl"), "no such file or directory"},
		{"--checkpoint-dir", file, "is a file, not a directory"},
		{"--checkpoint-dir", filepath.Join(tmp, "{host}"), "(" + filepath.Join(tmp, host) + " on this host) is a file, not a directory"},
		{"--cpuprofile", filepath.Join(missing, "cpu.prof"), "does not exist"},
		{"--timeline", filepath.Join(missing, "trace.json"), "does not exist"},
	} {
		out, errOut, code := runCmd(t, mnist, "--epochs", "1", "--progress", "off", tc.flag, tc.path)
		if code == 0 || !strings.Contains(errOut, tc.flag+" "+tc.path) || !strings.Contains(errOut, tc.want) || strings.Contains(out, "epoch 1/1") {
			t.Errorf("%s %s: exit %d, stderr %q, stdout:\n%s\nwant a failure before training naming the flag, the path and %q",
				tc.flag, tc.path, code, errOut, out, tc.want)
		}
	}
}
