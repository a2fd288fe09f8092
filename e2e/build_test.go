package e2e

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// tinySource is a rank program with a go.mod of its own and no dependency:
// it says hello, or with TINY_MODE=wait says "ready" and waits to be
// stopped, or with TINY_MODE=chatty prints lines until it is stopped.
const tinySource = `package main

import (
	"fmt"
	"os"
	"time"
)

func main() {
	rank := os.Getenv("GORUN_RANK")
	switch os.Getenv("TINY_MODE") {
	case "wait":
		fmt.Println("rank", rank, "ready")
		select {}
	case "chatty":
		for i := 0; ; i++ {
			fmt.Println("rank", rank, "line", i)
			time.Sleep(time.Millisecond)
		}
	}
	fmt.Println("hello from rank", rank)
}
`

// buildWorld is a package outside any module, with a go.mod of its own,
// and the environment gorun runs in: its own TMPDIR and cache directory
// (Go's compile cache stays the usual one, to keep the build quick).
type buildWorld struct {
	root, pkg, tmp, cache string
	env                   []string
}

func newBuildWorld(t *testing.T) *buildWorld {
	t.Helper()
	gocache, err := exec.Command("go", "env", "GOCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	w := &buildWorld{root: root, pkg: filepath.Join(root, "tiny"), tmp: filepath.Join(root, "tmp"), cache: filepath.Join(root, "cache")}
	for _, d := range []string{w.pkg, w.tmp} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(w.pkg, "go.mod"), []byte("module example.com/tiny\n\ngo 1.22\n"), 0o644)
	os.WriteFile(filepath.Join(w.pkg, "main.go"), []byte(tinySource), 0o644)
	w.env = []string{"TMPDIR=" + w.tmp, "XDG_CACHE_HOME=" + w.cache, "GOCACHE=" + strings.TrimSpace(string(gocache)), "GOWORK=off"}
	return w
}

// gorun runs gorun in dir with the world's environment.
func (w *buildWorld) gorun(t *testing.T, dir string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	g := startGorun(t, dir, w.env, args...)
	code = g.wait(t, 3*time.Minute)
	return g.out.String(), g.err.String(), code
}

// noneLeftIn fails the test if gorun left anything in the world's TMPDIR.
func (w *buildWorld) noneLeftIn(t *testing.T) {
	t.Helper()
	if left, _ := os.ReadDir(w.tmp); len(left) > 0 {
		var names []string
		for _, e := range left {
			names = append(names, e.Name())
		}
		t.Errorf("left in TMPDIR: %v", names)
	}
}

func wantHellos(t *testing.T, out, errOut string, code, np int) {
	t.Helper()
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for r := range np {
		if want := "] hello from rank " + string(rune('0'+r)); !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
}

// "gorun -np 2 ." in the package's directory.
func TestGorunBuildsDot(t *testing.T) {
	w := newBuildWorld(t)
	out, errOut, code := w.gorun(t, w.pkg, "-np", "2", ".")
	wantHellos(t, out, errOut, code, 2)
	w.noneLeftIn(t)
}

// A package of this module, named by its directory from the test's.
func TestGorunBuildsGoPackage(t *testing.T) {
	// The binary goes to the build cache: the test's own, not the user's.
	w := newBuildWorld(t)
	out, errOut, code := run(t, append(w.env, "TESTPROG_MODE=ok", "TESTPROG_SOURCE=built"), gorunBin, "-np", "2", "../internal/testenv/progs/testprog")
	if code != 0 || !strings.Contains(out, "[1] rank 1 of 2 ok (source built)") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}

// A package with a go.mod of its own, from a directory outside any module,
// builds in its own directory; gorun says what it does.
func TestGorunBuildsPackageWithItsOwnModule(t *testing.T) {
	w := newBuildWorld(t)
	out, errOut, code := w.gorun(t, w.root, "-np", "2", "./tiny/")
	wantHellos(t, out, errOut, code, 2)
	for _, want := range []string{
		"gorun: building ./tiny/ (go build; the first build fetches modules and compiles, about a minute)\n",
		"gorun: built ./tiny/ in ",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	w.noneLeftIn(t)
}

// The binary is built into the cache once and reused, whichever way the
// package is named; nothing is left in TMPDIR.
func TestGorunReusesTheBuildCache(t *testing.T) {
	w := newBuildWorld(t)
	_, errOut, code := w.gorun(t, w.root, "-np", "1", "./tiny")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	out, errOut, code := w.gorun(t, w.pkg, "-np", "2", ".")
	wantHellos(t, out, errOut, code, 2)
	if !strings.Contains(errOut, "(it was up to date)") {
		t.Errorf("the second run rebuilt the binary:\n%s", errOut)
	}
	bins, _ := filepath.Glob(filepath.Join(w.cache, "gorun", "build", "*", "*"))
	if len(bins) != 1 || filepath.Base(bins[0]) != "tiny" {
		t.Errorf("the cache holds %v, want one binary named tiny", bins)
	}
	w.noneLeftIn(t)
}

// gorun killed outright, ranks running: no build directory is left behind,
// and the ranks die with it.
func TestGorunKilledLeavesNoBuildDirectory(t *testing.T) {
	w := newBuildWorld(t)
	g := startGorun(t, w.root, append(w.env, "TINY_MODE=wait"), "-np", "2", "--start-timeout", "3m", "./tiny")
	g.waitOutput(t, " ready", 2, 2*time.Minute)
	g.cmd.Process.Kill()
	g.wait(t, time.Minute)
	w.noneLeftIn(t)
	deadline := time.Now().Add(10 * time.Second)
	for left := ranksAlive(t, 0); len(left) > 0; left = ranksAlive(t, 0) {
		if time.Now().After(deadline) {
			t.Fatalf("ranks outlived gorun: %v", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Ctrl-C while the package builds: gorun stops go build and the compilers
// it runs, says so, exits 130, and nothing is left in TMPDIR (go build,
// interrupted, leaves its work directory behind: it is not put there).
func TestGorunInterruptedWhileBuilding(t *testing.T) {
	w := newBuildWorld(t)
	compiling := filepath.Join(w.root, "compiling")
	if err := syscall.Mkfifo(compiling, 0o600); err != nil {
		t.Fatal(err)
	}
	// A -toolexec wrapper that says a tool started, then never ends.
	slowtool := filepath.Join(w.root, "slowtool")
	os.WriteFile(slowtool, []byte("#!/bin/sh\necho $$ > "+compiling+"\nexec sleep 600\n"), 0o755)
	g := startGorun(t, w.root, append(w.env, "GOFLAGS=-toolexec="+slowtool), "-np", "2", "./tiny")
	opened := make(chan *os.File, 1)
	go func() {
		f, err := os.Open(compiling) // returns once a tool has started
		if err != nil {
			t.Error(err)
		}
		opened <- f
	}()
	var fifo *os.File
	select {
	case fifo = <-opened:
	case <-g.done:
		t.Fatalf("gorun exited before building\nstderr:\n%s", g.err)
	case <-time.After(2 * time.Minute):
		t.Fatalf("go build never ran a tool\nstderr:\n%s", g.err)
	}
	defer fifo.Close()
	var tool int
	fmt.Fscan(fifo, &tool)
	g.cmd.Process.Signal(syscall.SIGINT)
	if code := g.wait(t, time.Minute); code != 130 {
		t.Errorf("exit %d, want 130", code)
	}
	if want := "gorun: stopped by the user (interrupt) while building ./tiny\n"; !strings.HasSuffix(g.err.String(), want) {
		t.Errorf("stderr:\n%s\nwant it to end with %q", g.err, want)
	}
	w.noneLeftIn(t)
	deadline := time.Now().Add(10 * time.Second)
	for processRunning(tool) {
		if time.Now().After(deadline) {
			syscall.Kill(tool, syscall.SIGKILL)
			t.Fatalf("the compiler go build ran (pid %d) outlived the build", tool)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// gorun ... | head -1: gorun survives its output pipe closing, stops every
// rank, leaves nothing behind, and exits as a program SIGPIPE ended would.
func TestGorunOutputPipeClosed(t *testing.T) {
	w := newBuildWorld(t)
	r, wr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(gorunBin, "-np", "2", "--start-timeout", "3m", "./tiny")
	cmd.Dir = w.root
	cmd.Env = append(append(os.Environ(), w.env...), "TINY_MODE=chatty", marker(t))
	errOut := newWatchedBuffer()
	cmd.Stdout, cmd.Stderr = wr, errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	wr.Close()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	first, err := bufio.NewReader(r).ReadString('\n') // head -1
	r.Close()
	if err != nil && err != io.EOF {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("gorun still running a minute after its output closed\nstderr:\n%s", errOut)
	}
	if code := cmd.ProcessState.ExitCode(); code != 141 {
		t.Errorf("exit %d (%v), want 141 (128+SIGPIPE)", code, cmd.ProcessState)
	}
	if want := "gorun: stopped: standard output was closed (broken pipe); all 2 ranks stopped"; !strings.Contains(errOut.String(), want) {
		t.Errorf("stderr lacks %q:\n%s", want, errOut)
	}
	if left := ranksAlive(t, 0); len(left) > 0 {
		t.Errorf("ranks left running: %v", left)
	}
	w.noneLeftIn(t)
	t.Logf("head -1 read %q; gorun said:\n%s", first, errOut)
}
