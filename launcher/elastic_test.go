package launcher

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/p2p"
)

// The cooldown doubles with each failure in a row, up to its cap; a
// failure while the host cools down is the same incident; a host that ran
// for the cap after its cooldown starts again from the base. No clock:
// the times are made up.
func TestCooldownBackoff(t *testing.T) {
	c := newCooldown(10*time.Second, 100*time.Second)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	check := func(now time.Time, wantD time.Duration, wantN int, wantStarted bool) {
		t.Helper()
		d, n, started := c.failed("a", now)
		if d != wantD || n != wantN || started != wantStarted {
			t.Errorf("failed at +%v: cooldown %v, %d in a row, started %v; want %v, %d, %v", now.Sub(t0), d, n, started, wantD, wantN, wantStarted)
		}
	}
	if !c.until("a").IsZero() {
		t.Fatal("a host that never failed is cooling down")
	}
	check(at(0), 10*time.Second, 1, true)
	if u := c.until("a"); !u.Equal(at(10 * time.Second)) {
		t.Errorf("until %v, want +10s", u.Sub(t0))
	}
	// A second rank of the same host dies 2 s later: same incident.
	check(at(2*time.Second), 8*time.Second, 1, false)
	// Failures right after each cooldown: 20, 40, 80, then capped at 100.
	now := at(10 * time.Second)
	for _, want := range []time.Duration{20, 40, 80, 100, 100} {
		check(now, want*time.Second, int(c.hosts["a"].failures)+1, true)
		now = c.until("a")
	}
	if !c.until("b").IsZero() {
		t.Error("host b cools down for host a's failures")
	}
	// Healthy for less than the cap after its cooldown: still in a row.
	check(now.Add(99*time.Second), 100*time.Second, 7, true)
	// Healthy for the cap: forgiven, back to the base.
	check(c.until("a").Add(100*time.Second), 10*time.Second, 1, true)
}

func TestOrdinal(t *testing.T) {
	for n, want := range map[int]string{1: "1st", 2: "2nd", 3: "3rd", 4: "4th", 11: "11th", 12: "12th", 13: "13th", 21: "21st", 102: "102nd"} {
		if got := ordinal(n); got != want {
			t.Errorf("ordinal(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestParseDiscovery(t *testing.T) {
	hosts, err := ParseDiscovery("# hosts\nnode1:4\n\nnode2\n[fd00::1]:2 # v6\nnode1:2\n")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := FormatHosts(hosts), "node1:6,node2:1,[fd00::1]:2"; got != want {
		t.Errorf("hosts %s, want %s", got, want)
	}
	for in, want := range map[string]string{
		"":              "printed no host",
		"# nothing\n\n": "printed no host",
		"a:2\nb:x\n":    `line 2 "b:x": "x" is not a slot count`,
		"a:0":           `"0" is not a slot count`,
		"-a:1":          "starts with '-'",
	} {
		if _, err := ParseDiscovery(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseDiscovery(%q) = %v, want an error containing %q", in, err, want)
		}
	}
}

func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "hosts.sh")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDiscover(t *testing.T) {
	ctx := context.Background()
	hosts, err := Discover(ctx, script(t, "echo a:2; echo b:1\n"), 5*time.Second)
	if err != nil || FormatHosts(hosts) != "a:2,b:1" {
		t.Errorf("Discover = %v, %v", hosts, err)
	}
	_, err = Discover(ctx, script(t, "echo a:2; echo 'no inventory' >&2; exit 3\n"), 5*time.Second)
	if err == nil || err.Error() != "exit status 3: no inventory" {
		t.Errorf("failing script: %v", err)
	}
	// A hung script, and what it started, are killed at the time bound.
	start := time.Now()
	_, err = Discover(ctx, script(t, "sleep 60 & sleep 60\n"), 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "did not finish within 300ms") {
		t.Errorf("hung script: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("hung script returned after %v", d)
	}
}

func TestChangeLine(t *testing.T) {
	host := "nodeA/net:[4026531833]/31992e43-f71a-4d22-905e-4ee387870537"
	c := p2p.Change{Epoch: 3, Size: 3, Took: 212 * time.Millisecond,
		Lost:   []p2p.LostMember{{Member: p2p.Member{Rank: 2, Host: host}, Cause: "disconnected"}},
		Joined: []p2p.Member{{Rank: 2, Host: "nodeB/x/y"}}}
	if got, want := ChangeLine(c), "membership epoch 3: 3 ranks (lost rank 2 on host nodeA: disconnected; joined rank 2 on host nodeB), reset took 212ms"; got != want {
		t.Errorf("ChangeLine = %q\nwant %q", got, want)
	}
	e := &ElasticError{Cause: "job below --min-np 2 for 2s: 1 member left (rank 0 on " + host + ")", NP: 3, Started: 4,
		Lost: []string{"rank 1: killed by signal 9 (SIGKILL)"}}
	if got, want := e.Error(), "the rendezvous aborted the elastic job: job below --min-np 2 for 2s: 1 member left (rank 0 on nodeA) (it started with 3 ranks and 1 joiner); lost: rank 1: killed by signal 9 (SIGKILL)"; got != want {
		t.Errorf("ElasticError = %q\nwant %q", got, want)
	}
}

// A finishing job whose only process left is one the rendezvous lost
// (frozen on another host, say) ends it; a process that may be a rank
// still closing is spared.
func TestEndStragglers(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &rankProc{rank: 3, cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-p.done })
	var logs []string
	e := &elasticRun{job: Job{Grace: time.Second, Logf: func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) }},
		procs: []*rankProc{p}, running: 2, finishing: true}
	e.rdvLost.Store(1)
	e.endStragglers() // 2 running, 1 lost: one of them may be closing
	if len(logs) != 0 || p.frozen.Load() {
		t.Fatalf("ended a process that may be a rank still closing: %q", logs)
	}
	e.running = 1
	e.endStragglers()
	e.stops.Wait()
	select {
	case <-p.done:
	default:
		t.Fatal("the straggler still runs")
	}
	want := fmt.Sprintf("rank 3 (pid %d) still runs after the job finished, and the rendezvous lost 1 member whose process never exited (frozen or cut off): ending it", cmd.Process.Pid)
	if len(logs) != 1 || logs[0] != want {
		t.Errorf("logs %q, want %q", logs, want)
	}
}
