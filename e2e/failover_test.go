package e2e

import (
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv/netns"
)

// Failover: no single process or host may end the job (issue 28). These
// tests select with -run Failover.

// gorun, which hosts the rendezvous, stopped (SIGSTOP, a debugger, a
// swapping host) for less than the heartbeat bound: the ranks' control
// streams stay within their deadline, so nothing happens: no epoch, no
// loss, the uninterrupted run's parameters.
func TestFailoverGorunPausedWithinHeartbeat(t *testing.T) {
	const heartbeat, pause = 4 * time.Second, time.Second
	j := etStart(t, etDefault, append(etElasticFlags, "--heartbeat-timeout", heartbeat.String())...)
	j.pids(4)
	j.waitStep("step 2", time.Minute, func(s etStep) bool { return s.steps >= 2 })
	pid := j.g.cmd.Process.Pid
	etKill(t, pid, syscall.SIGSTOP)
	// The pause is the fault under test, not a wait for anything.
	time.Sleep(pause)
	etKill(t, pid, syscall.SIGCONT)
	j.open()
	j.finish(4)
	if resets := etResetRE.FindAllString(j.out.String(), -1); len(resets) > 0 {
		t.Errorf("the ranks reset after gorun paused %v (heartbeat bound %v): %q", pause, heartbeat, resets)
	}
	if errOut := j.err.String(); strings.Contains(errOut, "membership epoch") || strings.Contains(errOut, " was lost") {
		t.Errorf("gorun's pause changed the membership:\n%s", errOut)
	}
}

// failoverJob starts elastictrain under gorun on host 0 of 3 namespace
// hosts, with the membership on 3 replicas: rank 0 with gorun on host 0,
// ranks 1 and 2 on host 1, rank 3 on host 2. Ranks 1 and 3 host the
// rank replicas (3 and 5); gorun hands the lead to replica 3, rank 1's,
// and failoverJob returns once it has.
func failoverJob(t testing.TB) (*etJob, *netns.Cluster) {
	t.Helper()
	return failoverJobOf(t, etDefault, 3)
}

// failoverJobOf is failoverJob with cfg and --rdzv-replicas replicas (1:
// gorun's rendezvous alone, and no hand-over to wait for).
func failoverJobOf(t testing.TB, cfg etConfig, replicas int) (*etJob, *netns.Cluster) {
	t.Helper()
	c := netns.New(t, 3)
	h0, h1, h2 := c.Hosts[0], c.Hosts[1], c.Hosts[2]
	j := etStartIn(t, c, h0, cfg, "-H", fmt.Sprintf("%s:1,%s:2,%s:1", h0.IP, h1.IP, h2.IP), "--min-np", "1",
		"--blacklist-cooldown", "10m", "--heartbeat-timeout", etHeartbeat.String(), "--grace", "2s",
		"--rdzv-replicas", strconv.Itoa(replicas))
	if replicas > 1 {
		if err := j.err.waitFor("rendezvous: replica 1 hands the lead to replica 3", 1, time.Minute, j.done); err != nil {
			j.fail("%v", err)
		}
	}
	return j, c
}

// The rank whose replica leads the rendezvous group is killed (kill -9):
// another replica leads, the other ranks reconnect to it, and the job
// goes on without that rank and ends with the uninterrupted run's
// parameters.
func TestFailoverLeaderRankKilled(t *testing.T) {
	j, c := failoverJob(t)
	pids := j.pids(4)
	j.waitStep("step 3", time.Minute, func(s etStep) bool { return s.steps >= 3 })
	killed := time.Now()
	etKill(t, pids[1], syscall.SIGKILL)
	resets := j.waitResets(3, 1, time.Minute)
	for _, m := range resets {
		if m[3] != "4" || m[4] != "3" || m[5] != "1" {
			t.Errorf("reset %q: want 4->3 ranks, lost rank 1", m[0])
		}
	}
	took := time.Since(killed)
	j.open()
	j.finish(3)
	noneLeft(t, c)
	checkNewLeader(t, j.err.String())
	t.Logf("rank 1 (the leader's process) killed; the others reset %v later; gorun said:\n%s", took.Round(time.Millisecond), j.err)
}

// The host of the replica that leads goes down (its link cut) with ranks
// 1 and 2: another replica leads, the ranks on the other hosts go on
// without them and end with the uninterrupted run's parameters; the
// cut-off ranks stop by themselves.
func TestFailoverLeaderHostDown(t *testing.T) {
	j, c := failoverJob(t)
	h1 := c.Hosts[1]
	j.pids(4)
	j.waitStep("step 3", time.Minute, func(s etStep) bool { return s.steps >= 3 })
	remote := etRemotePIDs(c, h1, etTrainBin(t))
	if len(remote) != 2 {
		j.fail("%d elastictrain processes on %s, want 2", len(remote), h1.IP)
	}
	cut := time.Now()
	etIP(t, c, h1, "link", "set", "eth0", "down")
	j.waitResets(2, 1, time.Minute)
	took := time.Since(cut)
	j.open()
	j.waitOut("2 final lines", time.Minute, func(out string) bool { return len(etFinalRE.FindAllString(out, -1)) >= 2 })
	for _, pid := range remote {
		j.waitLog(pid, "cut off from the rendezvous", time.Minute)
	}
	etIP(t, c, h1, "link", "set", "eth0", "up")
	j.finish(2)
	noneLeft(t, c)
	checkNewLeader(t, j.err.String())
	t.Logf("host %s (the leader's) cut off; the others reset %v later; gorun said:\n%s", h1.IP, took.Round(time.Millisecond), j.err)
}

// checkNewLeader checks that gorun says which replica leads once replica 3
// (rank 1's) was lost: its own, or replica 5 (rank 3's).
func checkNewLeader(t *testing.T, errOut string) {
	t.Helper()
	i := strings.Index(errOut, "rendezvous: replica 3 leads the group")
	if i < 0 || !regexp.MustCompile(`rendezvous: replica [15] leads the group`).MatchString(errOut[i:]) {
		t.Errorf("gorun does not say another replica leads after replica 3:\n%s", errOut)
	}
}

// gorun stopped (SIGSTOP) for 5 s, more than twice the heartbeat bound,
// with the membership on 3 replicas: a rank's replica leads, so the ranks'
// control streams do not go through gorun and nothing happens: no epoch,
// no loss, the uninterrupted run's parameters. (With gorun's rendezvous
// alone, every rank would be cut off.)
func TestFailoverGorunPausedBeyondHeartbeat(t *testing.T) {
	const pause = 5 * time.Second
	j, c := failoverJob(t)
	j.pids(4)
	j.waitStep("step 3", time.Minute, func(s etStep) bool { return s.steps >= 3 })
	pid := j.cmd.Process.Pid // ip netns exec runs gorun in its own process
	if cmd := netns.Cmdline(pid); !strings.HasPrefix(cmd, gorunBin) {
		t.Fatalf("pid %d is %q, not gorun", pid, cmd)
	}
	etKill(t, pid, syscall.SIGSTOP)
	// The pause is the fault under test, not a wait for anything.
	time.Sleep(pause)
	etKill(t, pid, syscall.SIGCONT)
	j.open()
	j.finish(4)
	noneLeft(t, c)
	if resets := etResetRE.FindAllString(j.out.String(), -1); len(resets) > 0 {
		t.Errorf("the ranks reset after gorun paused %v (heartbeat bound %v): %q", pause, etHeartbeat, resets)
	}
	if errOut := j.err.String(); strings.Contains(errOut, "membership epoch") || strings.Contains(errOut, " was lost") {
		t.Errorf("gorun's pause changed the membership:\n%s", errOut)
	}
}

// A partition of the group: host 1, with the leading replica (rank 1's)
// and ranks 1 and 2, is cut off from hosts 0 and 2 (blackhole routes both
// ways), which hold gorun's replica and rank 3's: a majority. Exactly one
// side goes on: the majority elects a leader and its ranks (0 and 3) end
// with the uninterrupted run's parameters; the leader cut off with the
// minority steps down, and ranks 1 and 2 stop, cut off, without forming a
// job of their own.
func TestFailoverGroupPartition(t *testing.T) {
	j, c := failoverJob(t)
	h0, h1, h2 := c.Hosts[0], c.Hosts[1], c.Hosts[2]
	j.pids(4)
	j.waitStep("step 3", time.Minute, func(s etStep) bool { return s.steps >= 3 })
	minority := etRemotePIDs(c, h1, etTrainBin(t))
	if len(minority) != 2 {
		j.fail("%d elastictrain processes on %s, want 2", len(minority), h1.IP)
	}
	routes := [][2]*netns.Host{{h1, h0}, {h1, h2}, {h0, h1}, {h2, h1}}
	undone := false
	heal := func() {
		if !undone {
			undone = true
			for _, r := range routes {
				exec.Command("ip", "-n", r[0].NS, "route", "del", "blackhole", r[1].IP+"/32").Run()
			}
		}
	}
	t.Cleanup(heal)
	for _, r := range routes {
		etIP(t, c, r[0], "route", "add", "blackhole", r[1].IP+"/32")
	}
	resets := j.waitResets(2, 1, time.Minute)
	for _, m := range resets {
		if m[4] != "2" || m[5] != "1,2" {
			t.Errorf("reset %q: want 2 ranks left, ranks 1 and 2 lost", m[0])
		}
	}
	j.open()
	j.waitOut("2 final lines", time.Minute, func(out string) bool { return len(etFinalRE.FindAllString(out, -1)) >= 2 })
	for _, pid := range minority {
		j.waitLog(pid, "cut off from the rendezvous", time.Minute)
		if log := j.logOf(pid); strings.Contains(log, "final") || strings.Contains(log, "reset ") {
			t.Errorf("pid %d on the minority side went on in a job of its own:\n%s", pid, log)
		}
		// It stops by itself, though cut off from gorun too.
		for deadline := time.Now().Add(time.Minute); processRunning(pid); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				j.fail("pid %d, cut off, still runs a minute after it said so", pid)
			}
		}
	}
	healed := time.Now()
	heal()
	j.finish(2)
	t.Logf("gorun exited %v after the cut healed; it said:\n%s", time.Since(healed).Round(time.Millisecond), j.err)
	noneLeft(t, c)
	checkNewLeader(t, j.err.String())
}
