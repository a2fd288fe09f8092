package launcher

import (
	"testing"

	"github.com/gorun/gorun/p2p"
)

// A rank that stopped responding is the culprit, named with its host
// before the rank that exited first because of it.
func TestLostRankLeadsTheError(t *testing.T) {
	procs := []*rankProc{{rank: 0, host: "node1"}, {rank: 1, host: "node1"}, {rank: 2, host: "node2"}}
	cause := "rank 2 (/ip4/10.0.0.2/tcp/4000) stopped responding: no heartbeat within 5s"
	abort := p2p.Abort{Cause: cause, Unresponsive: true, Rank: 2, Addr: "/ip4/10.0.0.2/tcp/4000", Why: "no heartbeat within 5s"}
	lost := lostRank(abort, procs)
	if want := "rank 2 on host node2 (/ip4/10.0.0.2/tcp/4000) stopped responding: no heartbeat within 5s"; lost != want {
		t.Fatalf("lostRank = %q, want %q", lost, want)
	}
	if got := lostRank(p2p.Abort{Cause: "rank 1 aborted: bad input"}, procs); got != "" {
		t.Fatalf("lostRank of another cause = %q, want \"\"", got)
	}
	if got := lostRank(p2p.Abort{}, procs); got != "" {
		t.Fatalf("lostRank with no abort = %q, want \"\"", got)
	}
	if got := lostRank(abort, []*rankProc{{rank: 2}}); got != cause {
		t.Fatalf("lostRank on one host = %q, want the cause as it is", got)
	}
	e := &RankError{Rank: 1, Host: "node1", Status: "exit status 2", JobCause: cause, Lost: lost}
	want := "rank 2 on host node2 (/ip4/10.0.0.2/tcp/4000) stopped responding: no heartbeat within 5s, so the job was aborted; then rank 1 on host node1 failed: exit status 2"
	if e.Error() != want {
		t.Fatalf("error:\n%s\nwant:\n%s", e.Error(), want)
	}
}
