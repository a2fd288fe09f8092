package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv/netns"
)

// These tests run gorun -H across "hosts" that are network namespaces with
// their own address and sshd (see internal/testenv/netns). gorun runs in the first
// one; the binaries are at the same path on every host since the namespaces
// share the file system.

func TestMultiHostAllreduce(t *testing.T) {
	c := netns.New(t, 3)
	h0, h1, h2 := c.Hosts[0], c.Hosts[1], c.Hosts[2]
	outDir := t.TempDir()
	stdout, stderr, code, took := gorunIn(t, c, h0,
		[]string{"TESTPROG_MODE=ok", "TESTPROG_ITERS=2", "TESTPROG_SHOWENV=1", "TESTPROG_LINES=20", "TESTPROG_STAMP=1"}, 90*time.Second,
		"-H", fmt.Sprintf("%s:2,%s:2,%s:1", h0.IP, h1.IP, h2.IP), "--verbose", "--output-dir", outDir, "-x", "TESTPROG_SOURCE=multi", testprogBin)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	t.Logf("5 ranks on 3 hosts, command to exit: %v", took.Round(time.Millisecond))
	hostOf := []*netns.Host{h0, h0, h1, h1, h2}
	localRank := []int{0, 1, 0, 1, 0}
	localSize := []int{2, 2, 2, 2, 1}
	for r, h := range hostOf {
		for _, want := range []string{
			fmt.Sprintf("[%s:%d] rank %d of 5 ok (source multi)", h.IP, r, r),
			fmt.Sprintf("[%s:%d] rank %d env local_rank=%d local_size=%d listen_ip=%s restart=0", h.IP, r, r, localRank[r], localSize[r], h.IP),
		} {
			if !strings.Contains(stdout, want) {
				t.Errorf("stdout lacks %q", want)
			}
		}
		b, err := os.ReadFile(filepath.Join(outDir, "rank."+strconv.Itoa(r), "stdout"))
		if err != nil || !strings.Contains(string(b), fmt.Sprintf("rank %d of 5 ok", r)) {
			t.Errorf("--output-dir rank.%d/stdout: %v %q", r, err, b)
		}
	}
	// Long lines arrive whole: each is "line I RRR...R end" of one rank.
	whole := regexp.MustCompile(`^\[[0-9.]+:(\d)\] line \d+ (\d+) end$`)
	n := 0
	for _, l := range strings.Split(stdout, "\n") {
		if strings.Contains(l, " line ") {
			m := whole.FindStringSubmatch(l)
			if m == nil || len(m[2]) != 3000 || strings.Trim(m[2], m[1]) != "" {
				t.Fatalf("line cut or mixed: %.120q...", l)
			}
			n++
		}
	}
	if n != 5*20 {
		t.Errorf("%d long lines, want 100", n)
	}
	for _, want := range []string{"rendezvous and local ranks use " + h0.IP, "all 2 remote hosts reachable", "via tcp-tls"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if t.Failed() {
		t.Logf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
	}
	noneLeft(t, c)
}

// The time from the gorun command to the first finished allreduce of a
// 4-rank job on 2 hosts.
func TestMultiHostLaunchTime(t *testing.T) {
	c := netns.New(t, 2)
	h0, h1 := c.Hosts[0], c.Hosts[1]
	var times []time.Duration
	for range 3 {
		start := time.Now()
		stdout, stderr, code, _ := gorunIn(t, c, h0, []string{"TESTPROG_MODE=ok", "TESTPROG_STAMP=1"}, 60*time.Second,
			"-H", fmt.Sprintf("%s:2,%s:2", h0.IP, h1.IP), testprogBin)
		if code != 0 {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
		}
		var first int64
		for _, m := range regexp.MustCompile(`first allreduce done at (\d+)`).FindAllStringSubmatch(stdout, -1) {
			ns, _ := strconv.ParseInt(m[1], 10, 64)
			if first == 0 || ns < first {
				first = ns
			}
		}
		times = append(times, time.Duration(first-start.UnixNano()))
	}
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	t.Logf("4 ranks on 2 hosts, command to first allreduce: median %v (runs: %v)", times[1].Round(time.Millisecond), times)
	noneLeft(t, c)
}

func TestMultiHostRankKilled(t *testing.T) {
	c := netns.New(t, 2)
	h0, h1 := c.Hosts[0], c.Hosts[1]
	cmd, o, e := startGorunIn(c, h0, []string{"TESTPROG_MODE=loop"}, "-H", fmt.Sprintf("%s:2,%s:2", h0.IP, h1.IP), "--grace", "2s", testprogBin)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for strings.Count(o.String(), "looping") < 4 {
		if time.Since(start) > 60*time.Second {
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
			t.Fatalf("ranks did not start\nstdout:\n%s\nstderr:\n%s", o, e)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Kill one rank on the remote host, as the OOM killer would.
	victim, rank := 0, ""
	for _, pid := range c.PIDs(h1) {
		if strings.HasPrefix(netns.Cmdline(pid), testprogBin) {
			victim, rank = pid, netns.Environ(pid, "GORUN_RANK")
			break
		}
	}
	if victim == 0 {
		t.Fatal("no rank process found on the remote host")
	}
	killed := time.Now()
	syscall.Kill(victim, syscall.SIGKILL)
	stdout, stderr, code, _ := waitGorun(t, cmd, o, e, start, 60*time.Second)
	teardown := time.Since(killed)
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	want := fmt.Sprintf("gorun: job failed: rank %s on host %s failed: exit status 137 (killed by signal 9: killed)", rank, h1.IP)
	if !strings.Contains(stderr, want) {
		t.Errorf("stderr lacks %q\nstdout:\n%s\nstderr:\n%s", want, stdout, stderr)
	}
	t.Logf("killed rank %s (pid %d) on %s; gorun exited %v later; it said:\n%s", rank, victim, h1.IP, teardown.Round(time.Millisecond),
		rankFailedRE.FindString(stderr))
	noneLeft(t, c)
}

func TestMultiHostUnreachable(t *testing.T) {
	c := netns.New(t, 2)
	h0, h1 := c.Hosts[0], c.Hosts[1]
	const ghost = "10.213.0.99" // in the cluster's network, but nobody there
	stdout, stderr, code, took := gorunIn(t, c, h0, []string{"TESTPROG_MODE=ok"}, 60*time.Second,
		"-H", fmt.Sprintf("%s:1,%s:1,%s:1", h0.IP, h1.IP, ghost), "--start-timeout", "5s", testprogBin)
	if code == 0 || strings.Contains(stdout, "rank") || strings.Contains(stderr, "rendezvous") {
		t.Errorf("exit %d; something started?\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for _, want := range []string{"gorun: cannot reach host " + ghost + " over ssh: ", "(nothing was started)"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, "host "+h1.IP) {
		t.Errorf("reachable host %s reported:\n%s", h1.IP, stderr)
	}
	t.Logf("after %v gorun said: %s", took.Round(time.Millisecond), strings.TrimSpace(stderr))
	noneLeft(t, c)
}

func TestMultiHostRestart(t *testing.T) {
	c := netns.New(t, 2)
	h0, h1 := c.Hosts[0], c.Hosts[1]
	stdout, stderr, code, took := gorunIn(t, c, h0, []string{"TESTPROG_MODE=ok", "TESTPROG_FAIL_ONCE=3", "TESTPROG_SHOWENV=1"}, 90*time.Second,
		"-H", fmt.Sprintf("%s:2,%s:2", h0.IP, h1.IP), "--max-restarts", "1", "--network-interface", "10.213.0.0/24", "--verbose", testprogBin)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if want := "rendezvous and local ranks use " + h0.IP + " (--network-interface 10.213.0.0/24)"; !strings.Contains(stderr, want) {
		t.Errorf("stderr lacks %q", want)
	}
	want := fmt.Sprintf("gorun: restart 1 of 1 (GORUN_RESTART_COUNT=1) after failure: rank 3 on host %s failed: exit status 5", h1.IP)
	if !strings.Contains(stderr, want) {
		t.Errorf("stderr lacks %q:\n%s", want, stderr)
	}
	for r := range 4 {
		if !strings.Contains(stdout, fmt.Sprintf(":%d] rank %d of 4 ok", r, r)) || !strings.Contains(stdout, fmt.Sprintf("rank %d env", r)) {
			t.Errorf("rank %d did not finish:\n%s", r, stdout)
		}
	}
	if strings.Contains(stdout, "restart=0") || !strings.Contains(stdout, "restart=1") {
		t.Errorf("want every finished rank at GORUN_RESTART_COUNT=1:\n%s", stdout)
	}
	t.Logf("recovered in %v; gorun said:\n%s", took.Round(time.Millisecond), regexp.MustCompile(`(?m)^gorun: restart.*\n.*$`).FindString(stderr))
	noneLeft(t, c)
}

// The job key is never on a command line on the remote host.
func TestMultiHostKeyNotOnCommandLine(t *testing.T) {
	c := netns.New(t, 2)
	h0, h1 := c.Hosts[0], c.Hosts[1]
	cmd, o, e := startGorunIn(c, h0, []string{"TESTPROG_MODE=loop"}, "-H", fmt.Sprintf("%s:1,%s:1", h0.IP, h1.IP), testprogBin)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for strings.Count(o.String(), "looping") < 2 && time.Since(start) < 60*time.Second {
		time.Sleep(20 * time.Millisecond)
	}
	var key string
	var lines []string
	for _, h := range c.Hosts {
		for _, pid := range c.PIDs(h) {
			if k := netns.Environ(pid, "GORUN_JOB_KEY"); k != "" {
				key = k
			}
			lines = append(lines, netns.Cmdline(pid))
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	stdout, stderr, code, _ := waitGorun(t, cmd, o, e, start, 30*time.Second)
	if key == "" {
		t.Fatalf("no rank with GORUN_JOB_KEY found\nstdout:\n%s\nstderr:\n%s", stdout, stderr)
	}
	for _, l := range lines {
		if strings.Contains(l, key) {
			t.Errorf("job key on a command line: %q", l)
		}
	}
	if code == 0 || !strings.Contains(stderr, "stopped: terminated") {
		t.Errorf("after SIGTERM: exit %d, stderr:\n%s", code, stderr)
	}
	noneLeft(t, c)
}

// gorun killed outright (SIGKILL, no chance to clean up) still leaves no
// rank behind: its ssh clients die with it, and each remote wrapper stops
// its rank when the session's stdin closes.
func TestMultiHostGorunKilled(t *testing.T) {
	c := netns.New(t, 2)
	h0, h1 := c.Hosts[0], c.Hosts[1]
	cmd, o, e := startGorunIn(c, h0, []string{"TESTPROG_MODE=loop"}, "-H", fmt.Sprintf("%s:1,%s:2", h0.IP, h1.IP), "--grace", "1s", "--network-interface", "eth0", testprogBin)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for strings.Count(o.String(), "looping") < 3 {
		if time.Since(start) > 60*time.Second {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("ranks did not start\nstdout:\n%s\nstderr:\n%s", o, e)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cmd.Process.Kill()
	cmd.Wait()
	killed := time.Now()
	noneLeft(t, c)
	t.Logf("every process of the job gone %v after gorun was SIGKILLed", time.Since(killed).Round(time.Millisecond))
}

// TestMultiHostRankSessions: in a job across hosts every rank leads a
// session of its own, the one gorun starts here as the wrappers' on the
// other hosts, so that the kernel's autogroup scheduling shares CPUs alike
// among ranks of hosts that share them (network namespaces, containers of
// one node; launcher.startLocal).
func TestMultiHostRankSessions(t *testing.T) {
	c := netns.New(t, 2)
	h0, h1 := c.Hosts[0], c.Hosts[1]
	stdout, stderr, code, _ := gorunIn(t, c, h0, nil, time.Minute, "-H", fmt.Sprintf("%s:2,%s:1", h0.IP, h1.IP),
		"/bin/sh", "-c", `read -r pid comm state ppid pgrp sid rest < /proc/$$/stat; echo "session $GORUN_RANK $pid $pgrp $sid"`)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	lines := regexp.MustCompile(`session (\d) (\d+) (\d+) (\d+)`).FindAllStringSubmatch(stdout, -1)
	if len(lines) != 3 {
		t.Fatalf("%d ranks reported, want 3:\n%s", len(lines), stdout)
	}
	for _, m := range lines {
		if m[2] != m[3] || m[2] != m[4] {
			t.Errorf("rank %s: process %s, group %s, session %s; want it to lead both", m[1], m[2], m[3], m[4])
		}
	}
	noneLeft(t, c)
}
