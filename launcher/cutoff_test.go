package launcher

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/p2p"
)

// A rank's ssh session gives up on a silent host after about the bound
// asked, with the user's own keepalive options first (ssh takes the first
// value it gets); the reachability check has none.
func TestSessionArgsKeepAlive(t *testing.T) {
	for _, c := range []struct {
		silence         time.Duration
		interval, count string
	}{
		{4 * time.Second, "1", "3"},
		{6 * time.Second, "2", "2"},
		{500 * time.Millisecond, "1", "1"},
		{120 * time.Second, "30", "3"},
	} {
		args := SSH{Options: []string{"-o", "ServerAliveInterval=7"}}.sessionArgs("node2", c.silence)
		want := []string{"-o", "ServerAliveInterval=7", "-o", "ServerAliveInterval=" + c.interval, "-o", "ServerAliveCountMax=" + c.count, "--", "node2"}
		if got := args[len(args)-len(want):]; !slices.Equal(got, want) {
			t.Errorf("sessionArgs(%v) ends with %q, want %q", c.silence, got, want)
		}
	}
	if args := (SSH{}).args("node2"); slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "ServerAlive") }) {
		t.Errorf("args %q: keepalives outside a rank's session", args)
	}
}

// remoteExit is a remote rank on host b of an elastic job that the
// rendezvous lost with cause; its ssh exits with status code once exit is
// called.
func remoteExit(t *testing.T, n int, cause string, code string) (p *rankProc, exit func()) {
	cmd := exec.Command("sh", "-c", "exit "+code)
	p = &rankProc{rank: n, cmd: cmd, remote: true, via: "ssh", hostName: "b", done: make(chan struct{}),
		rdvLost: true, rdvLostCause: cause}
	return p, func() { p.err = cmd.Run(); close(p.done) }
}

// A host whose ranks the rendezvous lost for their silence and whose ssh
// sessions got no answer is said to be unreachable once, in one line
// naming them all, and each of its ranks is counted as lost; a rank whose
// ssh failed otherwise, or that the rendezvous lost otherwise, is lost as
// any other.
func TestCutOffHostSaidOnce(t *testing.T) {
	const silence = "stopped responding: no heartbeat within 3s"
	var logs []string
	p0 := sleeper(t, 0)
	p0.hostName = "a"
	p1, exit1 := remoteExit(t, 1, silence, "255")
	p2, exit2 := remoteExit(t, 2, silence, "255")
	p3, exit3 := remoteExit(t, 3, "disconnected", "255")
	e := testRun(&logs, p0, p1, p2, p3)
	e.multi = true
	e.rdvMembers = func() int { return 1 }
	exit1()
	e.exitedRank(p1)
	want := "host b is unreachable: the rendezvous lost its ranks 1 and 2 (" + silence + "), and ssh got no answer from the host either; they were cut off from the job (and stop by themselves if still running); the job goes on without them (1 still running, --min-np 1); check that the host is up and the network between this host and b"
	if len(logs) != 1 || logs[0] != want {
		t.Fatalf("logs %q\nwant %q", logs, want)
	}
	exit2()
	e.exitedRank(p2)
	if len(logs) != 1 {
		t.Errorf("the second rank of the host said again: %q", logs[1:])
	}
	exit3()
	e.exitedRank(p3)
	if len(logs) != 2 || !strings.HasPrefix(logs[1], "rank 3 on host b was lost: exit status 255 (from ssh: the connection failed or was lost)") {
		t.Errorf("a rank that disconnected: logs %q", logs[1:])
	}
	wantLost := []string{"rank 1 on host b: cut off with its host (unreachable)", "rank 2 on host b: cut off with its host (unreachable)",
		"rank 3 on host b: exit status 255 (from ssh: the connection failed or was lost)"}
	if !slices.Equal(e.lost, wantLost) {
		t.Errorf("lost %q\nwant %q", e.lost, wantLost)
	}
	// A new rank on the host, then a new cut: a new incident, said again.
	delete(e.unreachable, "b")
	p4, exit4 := remoteExit(t, 4, silence, "255")
	p4.joiner = true
	e.procs = append(e.procs, p4)
	exit4()
	e.finishing = true
	e.exitedRank(p4)
	want = "host b is unreachable: the rendezvous lost its joiner 4 (" + silence + "), and ssh got no answer from the host either; it was cut off from the job (and stops by itself if still running); check that the host is up and the network between this host and b"
	if len(logs) != 3 || logs[2] != want {
		t.Errorf("logs %q\nwant %q", logs[2:], want)
	}
}

// A finishing job ends a remote process the rendezvous lost without
// saying that it still runs (gorun can not see it): its exit says what it
// was. A session whose stop goes unanswered is killed, and marked so.
func TestEndStragglersRemoteSilently(t *testing.T) {
	var logs []string
	p0 := sleeper(t, 0)
	p1 := sleeper(t, 1)
	p1.remote, p1.via = true, "ssh"
	e := testRun(&logs, p0, p1)
	e.empty = time.NewTimer(time.Hour)
	e.empty.Stop()
	e.rdvMembers = func() int { return 1 }
	e.report(rdvReport{proc: &p2p.ProcEvent{Kind: p2p.ProcLost, Member: p2p.Member{Proc: "1"}, Cause: "stopped responding: no heartbeat within 3s"}})
	e.finishing = true
	e.handleRdv()
	if !p1.frozen.Load() || len(logs) != 0 {
		t.Fatalf("ended %v, logs %q", p1.frozen.Load(), logs)
	}
	e.stops.Wait()
	select {
	case <-p1.done:
	case <-time.After(10 * time.Second):
		t.Fatal("a straggler whose stop went unanswered was not killed")
	}
	if !p1.unanswered.Load() {
		t.Error("the session of a stop nobody answered is not marked so")
	}
	if isDone(p0) {
		t.Error("ended a member")
	}
}
