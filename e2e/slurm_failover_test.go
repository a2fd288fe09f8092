package e2e

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv/slurmtest"
)

// An elastic job started by srun itself, on a real Slurm cluster of three
// nodes (slurmctld on node1; the job on node2 and node3, two tasks each).
// Without gorun, the job's membership is a raft group: rank 0 hosts
// replica 1 where the ranks meet, and the two tasks of node3 host the
// others, so node3 holds a majority. node2, rank 0's node, fails (network
// down, every process killed): the group elects a leader on node3, and
// ranks 2 and 3 go on as a job of two, with srun --no-kill keeping the
// step, and end with the uninterrupted run's parameters.
func TestFailoverSlurm(t *testing.T) {
	etTrainBin(t) // built before the cluster starts
	c := slurmtest.New(t, 3)
	cfg := etDefault
	wantParams, wantSamples := etReference(t, cfg)
	j := etNewJob(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	args := append([]string{"-N", "2", "-n", "4", "-w", "node[2-3]", "--no-kill", "--kill-on-bad-exit=0", "--label"}, j.progArgs()...)
	srun := c.Command(ctx, c.Nodes[0], "srun", args...)
	srun.Env = append(srun.Env, "GORUN_JOB_KEY_FILE="+slurmJobKeyFile(t), "GORUN_ELASTIC=1",
		"GORUN_HEARTBEAT_TIMEOUT="+etHeartbeat.String(), "GORUN_TIMEOUT=60s")
	out := newWatchedBuffer()
	srun.Stdout, srun.Stderr = out, out
	if err := srun.Start(); err != nil {
		t.Fatal(err)
	}
	done, exited := make(chan error, 1), make(chan struct{})
	go func() { done <- srun.Wait(); close(exited) }()
	defer func() {
		select {
		case <-exited:
		default:
			srun.Process.Kill()
			<-exited
		}
	}()
	waitOut := func(what string, limit time.Duration, ok func(string) bool) {
		t.Helper()
		deadline := time.After(limit)
		for !ok(out.String()) {
			select {
			case <-out.wrote:
			case <-deadline:
				t.Fatalf("srun's output lacks %s within %v:\n%s\n%s", what, limit, out, c.Logs())
			}
		}
	}
	waitOut("4 ranks started, rank 0 at step 3", time.Minute, func(s string) bool {
		return strings.Count(s, " start pid=") >= 4 && strings.Contains(s, "0: step 0 3 ")
	})
	failed := time.Now()
	c.Fail(t, c.Nodes[1])
	waitOut("2 resets", time.Minute, func(s string) bool { return strings.Count(s, " reset rank=") >= 2 })
	took := time.Since(failed)
	if err := os.WriteFile(j.gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var srunErr error
	select {
	case srunErr = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("srun did not end within 2m of the gate's opening:\n%s\n%s", out, c.Logs())
	}
	text := out.String()
	finals := srunFinalRE.FindAllStringSubmatch(text, -1)
	if len(finals) != 2 {
		t.Errorf("%d final lines, want 2 (ranks 2 and 3 of node3):\n%s", len(finals), text)
	}
	for _, m := range finals {
		if m[2] != wantParams || m[3] != wantSamples {
			t.Errorf("final line %q: want the uninterrupted run's params %s and samples %s", m[0], wantParams, wantSamples)
		}
	}
	if n := strings.Count(text, "size=4->2 lost=[0,1]"); n != 2 {
		t.Errorf("%d reset lines from 4 to 2 ranks, lost 0 and 1; want 2:\n%s", n, text)
	}
	t.Logf("node2 (rank 0's, replica 1's) failed: ranks 2 and 3 reset %v later; srun: %v", took.Round(time.Millisecond), srunErr)
	c.NoneLeft(t, 10*time.Second)
	c.Restore(t, c.Nodes[1])
}

// srunFinalRE is elastictrain's final line as srun --label prints it.
var srunFinalRE = regexp.MustCompile(`(?m)^\d+: final rank=(\S+) params=([0-9a-f]{64}) samples=([\d,]+) dup=(\d+) miss=(\d+)`)
