package e2e

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv/netns"
)

// A partition between gorun's host and a host with ranks, which stays
// cut off until gorun has exited: gorun's ssh sessions to the cut-off host
// get no answer, and the exit statuses of its ranks never arrive. gorun
// must not wait on them (nor on ssh's own TCP timeouts): it learns within
// a bound set by --heartbeat-timeout that the host is unreachable, says so
// in one line, and ends as soon as the rendezvous' side has.

// stampedLines records each complete line written to it with the time it
// arrived.
type stampedLines struct {
	mu      sync.Mutex
	partial []byte
	lines   []stampedLine
}

type stampedLine struct {
	at   time.Time
	text string
}

func (s *stampedLines) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	s.partial = append(s.partial, p...)
	for {
		i := bytes.IndexByte(s.partial, '\n')
		if i < 0 {
			break
		}
		s.lines = append(s.lines, stampedLine{now, string(s.partial[:i])})
		s.partial = s.partial[i+1:]
	}
	return len(p), nil
}

func (s *stampedLines) all() []stampedLine {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]stampedLine(nil), s.lines...)
}

// since lists the lines with their times from t0.
func (s *stampedLines) since(t0 time.Time) string {
	var b strings.Builder
	for _, l := range s.all() {
		fmt.Fprintf(&b, "%8v  %s\n", l.at.Sub(t0).Round(time.Millisecond), l.text)
	}
	return b.String()
}

// partitionJob starts elastictrain under gorun in host 0 of a new 2-host
// cluster, 1 rank there and 2 on host 1, with gorunArgs; the lines of
// gorun's stdout and stderr are stamped as they arrive.
func partitionJob(t *testing.T, gorunArgs ...string) (j *etJob, c *netns.Cluster, stdout, stderr *stampedLines) {
	t.Helper()
	c = netns.New(t, 2)
	h0, h1 := c.Hosts[0], c.Hosts[1]
	j = etNewJob(t, etDefault)
	full := append([]string{"--ssh-identity-file", c.Key, "-H", fmt.Sprintf("%s:1,%s:2", h0.IP, h1.IP)}, gorunArgs...)
	cmd := c.Command(h0, gorunBin, append(full, j.progArgs()...)...)
	cmd.Env = append(os.Environ(), "GORUN_SSH_OPTS="+c.SSHOpts())
	stdout, stderr = new(stampedLines), new(stampedLines)
	j.cmd = cmd
	j.out, j.err, j.done = newWatchedBuffer(), newWatchedBuffer(), make(chan struct{})
	cmd.Stdout, cmd.Stderr = io.MultiWriter(j.out, stdout), io.MultiWriter(j.err, stderr)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(j.done) }()
	t.Cleanup(j.stop)
	return j, c, stdout, stderr
}

// partition cuts host 0 and host 1 off from each other (blackhole routes
// both ways) and returns when that was done and the function that heals
// the cut (also run by the test's cleanup).
func partition(t *testing.T, c *netns.Cluster) (at time.Time, heal func()) {
	t.Helper()
	h0, h1 := c.Hosts[0], c.Hosts[1]
	routes := [][2]*netns.Host{{h0, h1}, {h1, h0}}
	healed := false
	heal = func() {
		if !healed {
			healed = true
			for _, r := range routes {
				exec.Command("ip", "-n", r[0].NS, "route", "del", "blackhole", r[1].IP+"/32").Run()
			}
		}
	}
	t.Cleanup(heal)
	for _, r := range routes {
		etIP(t, c, r[0], "route", "add", "blackhole", r[1].IP+"/32")
	}
	return time.Now(), heal
}

// waitExit waits for gorun to exit (failing the test after limit) and
// returns its exit code and when it exited.
func (j *etJob) waitExit(limit time.Duration) (int, time.Time) {
	j.t.Helper()
	select {
	case <-j.done:
	case <-time.After(limit):
		j.fail("gorun did not exit within %v", limit)
	}
	return j.cmd.ProcessState.ExitCode(), time.Now()
}

// partitionLines checks what gorun said of the cut-off host: one line
// that it is unreachable, naming both its ranks, before the line that
// closes the job (closing), and no line that a rank there still runs; it
// returns that line (its time zero if there is none).
func partitionLines(t *testing.T, j *etJob, h1 *netns.Host, lines []stampedLine, closing string) stampedLine {
	t.Helper()
	var host stampedLine
	hostAt, closeAt := -1, -1
	for i, l := range lines {
		switch {
		case strings.Contains(l.text, "host "+h1.IP+" is unreachable"):
			if hostAt >= 0 {
				t.Errorf("two lines say host %s is unreachable:\n%s\n%s", h1.IP, host.text, l.text)
			}
			hostAt, host = i, l
		case strings.Contains(l.text, closing):
			closeAt = i
		case strings.Contains(l.text, "still runs"):
			t.Errorf("gorun says a cut-off rank still runs: %q", l.text)
		}
	}
	switch {
	case hostAt < 0:
		t.Errorf("no line says host %s is unreachable", h1.IP)
		return host
	case closeAt < 0:
		t.Errorf("no line says %q", closing)
	case closeAt < hostAt:
		t.Errorf("the line on host %s comes after %q", h1.IP, closing)
	}
	for _, want := range []string{"the rendezvous lost its ranks 1 and 2 (", "ssh got no answer",
		"cut off from the job", "the network between this host and " + h1.IP} {
		if !strings.Contains(host.text, want) {
			t.Errorf("the line on host %s lacks %q: %q", h1.IP, want, host.text)
		}
	}
	return host
}

// The rendezvous' side has --min-np: it goes on and finishes; gorun exits
// as soon as it has, though the cut-off host never answers again.
func TestElasticPartitionCutOffHostEnds(t *testing.T) {
	const hb, grace = etHeartbeat, 10 * time.Second
	j, c, stdout, stderr := partitionJob(t, "--min-np", "1", "--blacklist-cooldown", "10m",
		"--heartbeat-timeout", hb.String(), "--grace", grace.String())
	h1 := c.Hosts[1]
	j.pids(3)
	j.waitStep("step 3", time.Minute, func(s etStep) bool { return s.steps >= 3 })
	cut := etRemotePIDs(c, h1, etTrainBin(t))
	if len(cut) != 2 {
		j.fail("%d elastictrain processes on %s, want 2", len(cut), h1.IP)
	}
	cutAt, heal := partition(t, c)
	j.waitResets(1, 1, time.Minute)
	// The cut-off ranks end by themselves; the job goes on without them
	// and finishes.
	for _, pid := range cut {
		j.waitLog(pid, "cut off from the rendezvous", time.Minute)
	}
	j.open()
	code, exitAt := j.waitExit(2 * time.Minute)
	out := stdout.all()
	last := out[len(out)-1]
	t.Logf("the cut at 0s; the job's last line at %v, gorun's exit at %v; gorun said:\n%s",
		last.at.Sub(cutAt).Round(time.Millisecond), exitAt.Sub(cutAt).Round(time.Millisecond), stderr.since(cutAt))
	if code != 0 {
		j.fail("gorun exited %d, want 0", code)
	}
	host := partitionLines(t, j, h1, stderr.all(), "elastic job done")
	// ssh gives up on the host within about twice --heartbeat-timeout;
	// --grace is room for a loaded machine.
	if d, bound := host.at.Sub(cutAt), 2*hb+grace; !host.at.IsZero() && d > bound {
		t.Errorf("gorun said host %s was unreachable %v after the cut, more than twice --heartbeat-timeout + --grace (%v)", h1.IP, d.Round(time.Millisecond), bound)
	}
	// Nothing is left to wait for once the job's side is done: gorun never
	// waits out --grace on a host it can not reach.
	if d := exitAt.Sub(last.at); d > grace {
		t.Errorf("gorun exited %v after the job's last line %q, more than --grace %v", d.Round(time.Millisecond), last.text, grace)
	}
	heal()
	cleanedUp(t, c)
}

// cleanedUp fails the test if any process other than sshd's listeners is
// left in the hosts of c a minute after the partition healed: the ranks
// ended by themselves, and sshd's sessions on the cut-off host end once
// TCP's retransmissions get through (seconds apart by then).
func cleanedUp(t *testing.T, c *netns.Cluster) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
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
			t.Fatalf("processes left a minute after the partition healed:\n%s", strings.Join(left, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The rendezvous' side falls below --min-np: the rendezvous aborts the job
// after --elastic-timeout, and gorun says so at once, having said what
// became of the cut-off host.
func TestElasticPartitionBelowMinNP(t *testing.T) {
	const hb, grace, wait = etHeartbeat, 10 * time.Second, 4 * time.Second
	j, c, _, stderr := partitionJob(t, "--min-np", "2", "--elastic-timeout", wait.String(), "--blacklist-cooldown", "10m",
		"--heartbeat-timeout", hb.String(), "--grace", grace.String())
	h1 := c.Hosts[1]
	j.pids(3)
	j.waitStep("step 3", time.Minute, func(s etStep) bool { return s.steps >= 3 })
	cutAt, heal := partition(t, c)
	code, exitAt := j.waitExit(2 * time.Minute)
	t.Logf("the cut at 0s; gorun's exit at %v; it said:\n%s", exitAt.Sub(cutAt).Round(time.Millisecond), stderr.since(cutAt))
	if code == 0 {
		t.Errorf("gorun exited 0, want a failure")
	}
	partitionLines(t, j, h1, stderr.all(), "job failed: the rendezvous aborted the elastic job")
	// The rendezvous loses the cut-off ranks within --heartbeat-timeout,
	// waits --elastic-timeout, and aborts; ssh gives up on the host within
	// about twice --heartbeat-timeout. gorun then waits for nothing it can
	// not reach: --grace is room for a loaded machine.
	if d, bound := exitAt.Sub(cutAt), 2*hb+wait+grace; d > bound {
		t.Errorf("gorun exited %v after the cut, more than twice --heartbeat-timeout + --elastic-timeout + --grace (%v)", d.Round(time.Millisecond), bound)
	}
	heal()
	cleanedUp(t, c)
}
