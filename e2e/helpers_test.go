package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
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

	"github.com/gorun/gorun/internal/testenv/netns"
	"github.com/gorun/gorun/p2p"
)

// The helpers every test file here shares: the binaries (gorun and the rank
// programs), running gorun and waiting for its lines, finding what a job
// left running, and gorun on the namespace hosts of internal/testenv/netns.

// module is the repository's module path: the binaries are built by
// import path, whatever the directory the tests run in.
const module = "github.com/gorun/gorun"

// binDir holds every binary the tests build; TestMain removes it.
var binDir string

// The binaries most tests run, built by TestMain.
var gorunBin, testprogBin, rankprogBin, elasticprogBin, elastictrainBin string

// The rank programs only some tests run, built by the first test that
// needs one.
var (
	ckptprog  = builtOnFirstUse("ckptprog")
	hangprog  = builtOnFirstUse("hangprog")
	slurmprog = builtOnFirstUse("slurmprog")
)

// TestMain builds gorun and the test rank programs once for every test here.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gorun-test-")
	if err != nil {
		panic(err)
	}
	binDir = dir
	// Hang dumps of the tests whose calls stall go with the binaries.
	os.Setenv(p2p.EnvHangDir, dir)
	gorunBin, testprogBin, rankprogBin = filepath.Join(dir, "gorun"), filepath.Join(dir, "testprog"), filepath.Join(dir, "rankprog")
	elasticprogBin, elastictrainBin = filepath.Join(dir, "elasticprog"), filepath.Join(dir, "elastictrain")
	for bin, pkg := range map[string]string{gorunBin: "cmd/gorun", testprogBin: "internal/testenv/progs/testprog", rankprogBin: "internal/testenv/progs/rankprog",
		elasticprogBin: "internal/testenv/progs/elasticprog", elastictrainBin: "internal/testenv/progs/elastictrain"} {
		// rankprog has nothing to race, and starts faster without.
		if err := build(bin, pkg, raceEnabled && bin != rankprogBin); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// build builds pkg, a directory of the module, into bin, with the race
// detector if race.
func build(bin, pkg string, race bool) error {
	args := []string{"build", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	if out, err := exec.Command("go", append(args, module+"/"+pkg)...).CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %v\n%s", pkg, err, out)
	}
	return nil
}

// builtOnFirstUse returns the path of internal/testenv/progs/name, built
// into binDir (race-enabled as the tests are) by its first caller.
func builtOnFirstUse(name string) func(testing.TB) string {
	built := sync.OnceValues(func() (string, error) {
		bin := filepath.Join(binDir, name)
		return bin, build(bin, "internal/testenv/progs/"+name, raceEnabled)
	})
	return func(t testing.TB) string {
		t.Helper()
		bin, err := built()
		if err != nil {
			t.Fatal(err)
		}
		return bin
	}
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

// syncBuf is a bytes.Buffer safe to read while a process writes it.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

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

// mustMatch fails the test, going on, if s has no match for re.
func mustMatch(t *testing.T, re, s string) {
	t.Helper()
	if !regexp.MustCompile(re).MatchString(s) {
		t.Errorf("no match for %s in:\n%s", re, s)
	}
}

// rankFailedRE is gorun's summary of a job that failed because a rank on a
// remote host did.
var rankFailedRE = regexp.MustCompile(`gorun: job failed: rank (\d+) on host (\S+) failed: (.*)`)

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

// processRunning says whether pid exists and is not a zombie.
func processRunning(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

// gorunIn runs gorun inside host h of cluster c with the test's ssh key and
// options; it returns once gorun exits, or fails the test after limit.
func gorunIn(t *testing.T, c *netns.Cluster, h *netns.Host, env []string, limit time.Duration, args ...string) (stdout, stderr string, code int, took time.Duration) {
	t.Helper()
	cmd, o, e := startGorunIn(c, h, env, args...)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return waitGorun(t, cmd, o, e, start, limit)
}

// startGorunIn makes the command of gorun inside host h of cluster c, with
// env passed to every rank (-x); the caller starts it.
func startGorunIn(c *netns.Cluster, h *netns.Host, env []string, args ...string) (*exec.Cmd, *syncBuf, *syncBuf) {
	// Remote ranks see only what -x passes (and GORUN_*), as with mpirun.
	full := []string{"--ssh-identity-file", c.Key}
	for _, e := range env {
		full = append(full, "-x", e)
	}
	cmd := c.Command(h, gorunBin, append(full, args...)...)
	cmd.Env = append(os.Environ(), "GORUN_SSH_OPTS="+c.SSHOpts())
	o, e := new(syncBuf), new(syncBuf)
	cmd.Stdout, cmd.Stderr = o, e
	return cmd, o, e
}

// waitGorun waits for cmd, started at start, to exit and returns its
// output, exit code and run time; after limit it stops it (SIGTERM) and
// fails the test.
func waitGorun(t *testing.T, cmd *exec.Cmd, o, e *syncBuf, start time.Time, limit time.Duration) (string, string, int, time.Duration) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(limit):
		cmd.Process.Signal(syscall.SIGTERM)
		<-done
		t.Fatalf("gorun did not finish within %v\nstdout:\n%s\nstderr:\n%s", limit, o, e)
	}
	return o.String(), e.String(), cmd.ProcessState.ExitCode(), time.Since(start)
}

// noneLeft fails the test if any process other than sshd's listener is left
// in any host of c, or any testprog anywhere, a few seconds after the job.
func noneLeft(t *testing.T, c *netns.Cluster) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var left []string
		for _, h := range c.Hosts {
			for _, pid := range c.PIDs(h) {
				left = append(left, fmt.Sprintf("%s: pid %d %q", h.IP, pid, netns.Cmdline(pid)))
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes left after the job:\n%s", strings.Join(left, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// envOr returns the variable name's value, or def where it is not set (a
// benchmark's knob).
func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// benchRow is one size's line of gorun bench --json.
type benchRow struct {
	Bytes     int64   `json:"bytes"`
	TimeUS    float64 `json:"time_us"`
	Algorithm string  `json:"algorithm"`
	Correct   bool    `json:"correct"`
}

// benchRows reads the --json lines of gorun bench (or bench-worker) output
// out, prefixed or not. It fails b, naming what ran, on a wrong result, on
// a size that ran another algorithm than algo ("": any), or without rows.
func benchRows(b *testing.B, out, what, algo string) []benchRow {
	b.Helper()
	var rs []benchRow
	for _, l := range strings.Split(out, "\n") {
		i := strings.Index(l, "{")
		if i < 0 {
			continue
		}
		var r benchRow
		if err := json.Unmarshal([]byte(l[i:]), &r); err != nil || r.Bytes == 0 {
			continue
		}
		if !r.Correct {
			b.Fatalf("%s: wrong result at %d bytes", what, r.Bytes)
		}
		if algo != "" && r.Algorithm != algo {
			b.Fatalf("%s: GORUN_ALLREDUCE_ALGORITHMS=%s ran %s at %d bytes", what, algo, r.Algorithm, r.Bytes)
		}
		rs = append(rs, r)
	}
	if len(rs) == 0 {
		b.Fatalf("%s: no results in\n%s", what, out)
	}
	return rs
}
