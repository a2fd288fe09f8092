package e2e

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
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
	j := etNewJob(t, cfg)
	args := append([]string{"-N", "2", "-n", "4", "-w", "node[2-3]", "--no-kill", "--kill-on-bad-exit=0", "--label"}, j.progArgs()...)
	srun := startSrun(t, c, srunElasticEnv(slurmJobKeyFile(t)), args...)
	srun.waitOut("4 ranks started, rank 0 at step 3", time.Minute, func(s string) bool {
		return strings.Count(s, " start pid=") >= 4 && strings.Contains(s, "0: step 0 3 ")
	})
	failed := time.Now()
	c.Fail(t, c.Nodes[1])
	srun.waitOut("2 resets", time.Minute, func(s string) bool { return strings.Count(s, " reset rank=") >= 2 })
	took := time.Since(failed)
	if err := os.WriteFile(j.gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	srunErr := srun.wait(2 * time.Minute)
	text := srun.out.String()
	checkSrunFinals(t, cfg, text, 2) // ranks 2 and 3, of node3
	if n := strings.Count(text, "size=4->2 lost=[0,1]"); n != 2 {
		t.Errorf("%d reset lines from 4 to 2 ranks, lost 0 and 1; want 2:\n%s", n, text)
	}
	t.Logf("node2 (rank 0's, replica 1's) failed: ranks 2 and 3 reset %v later; srun: %v", took.Round(time.Millisecond), srunErr)
	c.NoneLeft(t, 10*time.Second)
	c.Restore(t, c.Nodes[1])
}

// More of an elastic job under srun, on one cluster of three nodes (each
// case ends with nothing of its job left, and every node up):
//
//   - LeaderKilled: kill -9 of rank 0's process, which hosts replica 1 of
//     the rendezvous group, the leader, while its node stays up.
//   - JoinStep: a second srun step in the same allocation adds ranks to
//     the job of the first, after rank 0's node failed, so that the
//     joiners find the group without rank 0.
func TestFailoverSlurmElastic(t *testing.T) {
	etTrainBin(t) // built before the cluster starts
	c := slurmtest.New(t, 3)
	t.Run("LeaderKilled", func(t *testing.T) { testFailoverSlurmLeaderKilled(t, c) })
	t.Run("JoinStep", func(t *testing.T) { testFailoverSlurmJoinStep(t, c) })
}

// srun -N 2 -n 4 on node[2-3] (rank 0 on node2 hosts replica 1, the
// group's leader; node3's two tasks the others; rank 1 a spare): kill -9
// of rank 0's process alone. Its link breaks, the group elects a leader
// on node3, and ranks 1 to 3 go on as a job of three, losing at most the
// step rank 0 had committed alone, and end with the uninterrupted run's
// parameters; srun --no-kill keeps the step.
func testFailoverSlurmLeaderKilled(t *testing.T, c *slurmtest.Cluster) {
	cfg := etDefault
	j := etNewJob(t, cfg)
	args := append([]string{"-N", "2", "-n", "4", "-w", "node[2-3]", "--no-kill", "--kill-on-bad-exit=0", "--label"}, j.progArgs()...)
	srun := startSrun(t, c, srunElasticEnv(slurmJobKeyFile(t)), args...)
	pid := 0
	srun.waitOut("4 ranks started, rank 0 at step 3", time.Minute, func(s string) bool {
		for _, m := range srunStartRE.FindAllStringSubmatch(s, -1) {
			if m[1] == "0" {
				pid, _ = strconv.Atoi(m[2])
			}
		}
		return len(srunStartRE.FindAllStringSubmatch(s, -1)) >= 4 && pid != 0 && strings.Contains(s, "0: step 0 3 ")
	})
	killed := time.Now()
	etKill(t, pid, syscall.SIGKILL)
	resets := srun.waitOut("3 resets", time.Minute, func(s string) bool { return len(srunResetRE.FindAllString(s, -1)) >= 3 })
	took := time.Since(killed)
	// Rank 0's last step line was printed before the kill (later ones
	// come from another task): a reset resumes from that commit, or at
	// worst from the one before.
	last := 0
	for _, m := range srunStepRE.FindAllStringSubmatch(resets, -1) {
		if n, _ := strconv.Atoi(m[3]); m[1] == "0" {
			last = max(last, n)
		}
	}
	for _, m := range srunResetRE.FindAllStringSubmatch(resets, -1) {
		commit, _ := strconv.Atoi(m[5])
		if m[2] != "3" || m[3] != "0" || m[4] != "" {
			t.Errorf("reset %q: want one from 4 to 3 ranks that lost rank 0 alone", m[0])
		}
		if last-commit > 1 {
			t.Errorf("reset %q resumed from commit %d, but rank 0 had committed step %d: %d steps lost, want at most 1", m[0], commit, last, last-commit)
		}
	}
	j.open()
	srunErr := srun.wait(2 * time.Minute)
	text := srun.out.String()
	checkSrunFinals(t, cfg, text, 3)
	if processRunning(pid) {
		t.Errorf("rank 0's process %d still runs after kill -9", pid)
	}
	t.Logf("rank 0's process (pid %d, replica 1, the leader) killed: ranks 1 to 3 reset %v later; srun: %v", pid, took.Round(time.Millisecond), srunErr)
	if t.Failed() || testing.Verbose() {
		t.Logf("srun's output:\n%s", srunLines(text))
	}
	c.NoneLeft(t, 10*time.Second)
}

// An allocation of node[1-3], two tasks each (salloc --no-kill); step 0, srun -N 2 -n 4
// on node[2-3], an elastic job of four whose group has replica 1 (rank 0)
// on node2 and the others on node3. node2 fails: ranks 2 and 3 go on as a
// job of two. Then step 1, srun -N 1 -n 2 on node1 with GORUN_JOIN_STEP=0,
// starts two joiners: they find the group at its port on node3 (the
// replica there redirects them to the leader), are admitted at the next
// commit, and the four end with the uninterrupted run's parameters.
func testFailoverSlurmJoinStep(t *testing.T, c *slurmtest.Cluster) {
	cfg := etDefault
	j := etNewJob(t, cfg)
	alloc := c.Run(t, c.Nodes[0], time.Minute, "salloc", "--no-shell", "--no-kill", "-N", "3", "--ntasks-per-node=2", "-w", "node[1-3]")
	m := sallocGrantedRE.FindStringSubmatch(alloc)
	if m == nil {
		t.Fatalf("salloc said no job id:\n%s", alloc)
	}
	job := m[1]
	t.Cleanup(func() {
		// t.Context is cancelled before the cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Command(ctx, c.Nodes[0], "scancel", job).Run()
	})
	key := slurmJobKeyFile(t)
	args := append([]string{"--jobid=" + job, "-N", "2", "-n", "4", "-w", "node[2-3]", "--no-kill", "--kill-on-bad-exit=0", "--label"}, j.progArgs()...)
	step0 := startSrun(t, c, srunElasticEnv(key), args...)
	step0.waitOut("4 ranks started, rank 0 at step 3", time.Minute, func(s string) bool {
		return len(srunStartRE.FindAllString(s, -1)) >= 4 && strings.Contains(s, "0: step 0 3 ")
	})
	c.Fail(t, c.Nodes[1])
	step0.waitOut("2 resets", time.Minute, func(s string) bool { return strings.Count(s, "size=4->2 lost=[0,1]") >= 2 })

	added := time.Now()
	args = append([]string{"--jobid=" + job, "-N", "1", "-n", "2", "-w", "node1", "--no-kill", "--kill-on-bad-exit=0", "--label"}, j.progArgs()...)
	step1 := startSrun(t, c, append(srunElasticEnv(key), "GORUN_JOIN_STEP=0"), args...)
	step1.waitOut("2 joiners started", time.Minute, func(s string) bool {
		n := 0
		for _, m := range srunStartRE.FindAllStringSubmatch(s, -1) {
			if m[4] == "true" {
				n++
			}
		}
		return n >= 2
	})
	step0.waitOut("2 resets that admitted the joiners", time.Minute, func(s string) bool {
		n := 0
		for _, m := range srunResetRE.FindAllStringSubmatch(s, -1) {
			if m[2] == "4" && m[4] != "" {
				n++
			}
		}
		return n >= 2
	})
	took := time.Since(added)
	j.open()
	err0, err1 := step0.wait(2*time.Minute), step1.wait(2*time.Minute)
	text0, text1 := step0.out.String(), step1.out.String()
	checkSrunFinals(t, cfg, text0, 2) // ranks 2 and 3 of step 0, on node3
	checkSrunFinals(t, cfg, text1, 2) // the joiners, on node1
	if err1 != nil {
		t.Errorf("step 1 (the joiners): %v", err1)
	}
	t.Logf("step 1's two joiners admitted %v after its srun started; step 0's srun: %v", took.Round(time.Millisecond), err0)
	if t.Failed() || testing.Verbose() {
		t.Logf("step 0's output:\n%s\nstep 1's output:\n%s", srunLines(text0), srunLines(text1))
	}

	// Step 0 has ended: a joiner of it finds no group, and says so
	// within its timeout.
	args = append([]string{"--jobid=" + job, "-N", "1", "-n", "1", "-w", "node1", "--kill-on-bad-exit=1"}, j.progArgs()...)
	late := startSrun(t, c, append(srunElasticEnv(key), "GORUN_JOIN_STEP=0", "GORUN_TIMEOUT=3s"), args...)
	errLate := late.wait(time.Minute)
	// The allocation's node list may lack node2 by now (Slurm removed
	// it from the job).
	wantRE := regexp.MustCompile(fmt.Sprintf(`no replica of step 0's rendezvous group answered on node\S+ at port %d \(derived from job %s, step 0\) within \S+: is step 0 of job %s running, with GORUN_ELASTIC=1\?`,
		slurmDerivedPort(t, job, 0), job, job))
	if errLate == nil || !wantRE.MatchString(late.out.String()) {
		t.Errorf("a joiner of step 0 after it ended: srun %v, output:\n%s\nwant a failure matching %s", errLate, late.out, wantRE)
	}
	if testing.Verbose() {
		t.Logf("a joiner of step 0 after it ended:\n%s", late.out)
	}
	c.Run(t, c.Nodes[0], 30*time.Second, "scancel", job)
	c.NoneLeft(t, 10*time.Second)
	c.Restore(t, c.Nodes[1])
}

// slurmDerivedPort is the rendezvous port of step step of job job when
// nothing names one: 20000 + (job mod 1000)*10 + step mod 10.
func slurmDerivedPort(t *testing.T, job string, step int) int {
	t.Helper()
	id, err := strconv.Atoi(job)
	if err != nil {
		t.Fatalf("job id %q: %v", job, err)
	}
	return 20000 + id%1000*10 + step%10
}

// srunLines is srun's output without elastictrain's step lines.
func srunLines(text string) string {
	var keep []string
	for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
		if !srunStepRE.MatchString(l) {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}
