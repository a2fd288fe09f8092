package etcdtest

import (
	"context"
	"testing"
	"time"
)

// The cluster starts, keeps a write through the loss of its leader, and
// takes the killed member back.
func TestEtcdClusterLeaderKilledAndRestarted(t *testing.T) {
	c := Start(t)
	cl := c.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cl.Put(ctx, "k", "v1"); err != nil {
		t.Fatal(err)
	}
	pid := c.PID(c.Leader())
	killed := c.KillLeader()
	if c.PID(killed) != 0 || pid == 0 {
		t.Fatalf("member %d (pid %d) still runs after KillLeader", killed, pid)
	}
	// A write in flight when the leader went times out; the cluster
	// takes it again once the other two elected a leader.
	for {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := cl.Put(pctx, "k", "v2")
		pcancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("a write after the leader was killed: %v", err)
		}
	}
	if l := c.Leader(); l == killed {
		t.Fatalf("the killed member %d leads", killed)
	}
	c.Restart(killed)
	r, err := cl.Get(ctx, "k")
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v2" {
		t.Fatalf("get after the restart: %v %v", r, err)
	}
}
