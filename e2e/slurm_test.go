package e2e

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv/netns"
	"github.com/gorun/gorun/internal/testenv/slurmtest"
	"github.com/gorun/gorun/p2p"
)

// These tests run jobs on a real Slurm cluster of two nodes, node1 and
// node2 (see internal/testenv/slurmtest), with two CPUs each: srun starting the
// ranks itself, and gorun inside an sbatch allocation starting them with
// srun. Binaries are at the same path on every node (the nodes share the
// file system).

// slurmJobKeyFile writes a fresh job key, hex, to a file only its owner can
// read, as a user of srun would.
func slurmJobKeyFile(t *testing.T) string {
	t.Helper()
	name := filepath.Join(t.TempDir(), "job.key")
	if err := os.WriteFile(name, []byte(hex.EncodeToString(p2p.NewJobKey())+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return name
}

// TestSlurm runs its cases one after the other on one cluster (each ends
// checking that nothing of its job is left), which saves starting one per
// case.
func TestSlurm(t *testing.T) {
	slurmprog(t) // built before the cluster starts
	c := slurmtest.New(t, 2)
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *slurmtest.Cluster)
	}{
		{"SrunAllreduce", testSlurmSrunAllreduce},
		{"SrunRankKilled", testSlurmSrunRankKilled},
		{"SbatchGorun", testSlurmSbatchGorun},
		{"SbatchGorunRankKilled", testSlurmSbatchGorunRankKilled},
		{"SbatchGorunStopped", testSlurmSbatchGorunStopped},
		{"SbatchGorunKilled", testSlurmSbatchGorunKilled},
		{"NodeFailed", testSlurmNodeFailed},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, c) })
	}
}

// The node of each rank of a 4-rank job on node[1-2]: Slurm's block
// distribution, as gorun's fill-in-order placement.
func slurmNodeOf(rank int) string { return fmt.Sprintf("node%d", rank/2+1) }

// srun -N 2 -n 4 starts the ranks itself: each learns its identity from
// Slurm's variables, rank 0 hosts the rendezvous on the first node of the
// compressed SLURM_STEP_NODELIST, the job key comes from a 0600 file, and
// the allreduce is correct on every rank.
func testSlurmSrunAllreduce(t *testing.T, c *slurmtest.Cluster) {
	prog := slurmprog(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := c.Command(ctx, c.Nodes[0], "srun", "-N", "2", "-n", "4", "-w", "node[1-2]", "--kill-on-bad-exit=1", prog)
	cmd.Env = append(cmd.Env, "GORUN_JOB_KEY_FILE="+slurmJobKeyFile(t), "SLURMPROG_ITERS=3")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("srun: %v after %v\n%s\n%s", err, time.Since(start).Round(time.Millisecond), out, c.Logs())
	}
	t.Logf("srun -N 2 -n 4: %v", time.Since(start).Round(time.Millisecond))
	for r := range 4 {
		for _, want := range []string{
			fmt.Sprintf("rank %d of 4 local %d of 2 on %s (SLURM_PROCID=%d SLURM_NODEID=%d SLURM_STEP_ID=0)", r, r%2, slurmNodeOf(r), r, r/2),
			fmt.Sprintf("rank %d of 4 ok", r),
		} {
			if !strings.Contains(string(out), want+"\n") {
				t.Errorf("srun's output lacks %q", want)
			}
		}
	}
	if t.Failed() {
		t.Logf("srun's output:\n%s", out)
	}
	c.NoneLeft(t, 10*time.Second)
}

// slurmBatch submits a script running gorun with args inside a 2-node,
// 4-task allocation and returns the job id and the file its output goes to.
func slurmBatch(t *testing.T, c *slurmtest.Cluster, args ...string) (id, output string) {
	t.Helper()
	return slurmBatchScript(t, c, "exec "+gorunCommandLine(args...)+"\n")
}

// gorunCommandLine is gorun with args, quoted for sh.
func gorunCommandLine(args ...string) string {
	quoted := []string{gorunBin}
	for _, a := range args {
		quoted = append(quoted, "'"+strings.ReplaceAll(a, "'", `'\''`)+"'")
	}
	return strings.Join(quoted, " ")
}

// slurmBatchScript submits the sh script body inside a 2-node, 4-task
// allocation and returns the job id and the file its output goes to.
func slurmBatchScript(t *testing.T, c *slurmtest.Cluster, body string) (id, output string) {
	t.Helper()
	return slurmBatchOpts(t, c, nil, body)
}

// slurmBatchOpts is slurmBatchScript with more sbatch options.
func slurmBatchOpts(t *testing.T, c *slurmtest.Cluster, opts []string, body string) (id, output string) {
	t.Helper()
	dir := t.TempDir()
	script, output := filepath.Join(dir, "job.sh"), filepath.Join(dir, "job.out")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--parsable", "-N", "2", "-n", "4", "-w", "node[1-2]", "--output", output, "--chdir", dir}, opts...)
	out := c.Run(t, c.Nodes[0], 30*time.Second, "sbatch", append(args, script)...)
	id, _, _ = strings.Cut(strings.TrimSpace(out), ";")
	if !regexp.MustCompile(`^\d+$`).MatchString(id) {
		t.Fatalf("sbatch printed %q, not a job id", out)
	}
	return id, output
}

// gorun inside an sbatch allocation takes its hosts and slots from it and
// starts the ranks on the other node with srun; output is prefixed as with
// ssh, and the job completes with a correct allreduce on all 4 ranks.
func testSlurmSbatchGorun(t *testing.T, c *slurmtest.Cluster) {
	prog := slurmprog(t)
	start := time.Now()
	id, output := slurmBatch(t, c, "-np", "4", "--verbose", "-x", "SLURMPROG_ITERS=3", prog)
	state, exit := c.WaitJob(t, id, 60*time.Second)
	text, _ := os.ReadFile(output)
	t.Logf("sbatch job %s: %s, exit %s, after %v", id, state, exit, time.Since(start).Round(time.Millisecond))
	if state != "COMPLETED" || exit != "0:0" {
		t.Fatalf("job %s ended %s, exit code %s; its output:\n%s\n%s", id, state, exit, text, c.Logs())
	}
	// Ranks 0 and 1 run on the batch host, node1, as gorun's children;
	// ranks 2 and 3 each in a job step of their own on node2 (step 0 was
	// gorun's reachability check), by srun: the nodes' sshd does not know
	// gorun's key.
	steps := map[string]bool{}
	for r := range 4 {
		node := slurmNodeOf(r)
		identity := regexp.MustCompile(fmt.Sprintf(`(?m)^\[%s:%d\] rank %d of 4 local %d of 2 on %s \(SLURM_PROCID=0 SLURM_NODEID=0 SLURM_STEP_ID=(\d*)\)$`, node, r, r, r%2, node))
		m := identity.FindStringSubmatch(string(text))
		switch {
		case m == nil:
			t.Errorf("job output lacks rank %d's identity (%s)", r, identity)
		case r < 2 && m[1] != "":
			t.Errorf("rank %d on the batch host ran in job step %s, want none", r, m[1])
		case r >= 2 && (m[1] == "" || m[1] == "0" || steps[m[1]]):
			t.Errorf("rank %d on node2 ran in job step %q, want a step of its own after the check's step 0", r, m[1])
		}
		if m != nil {
			steps[m[1]] = true
		}
		if want := fmt.Sprintf("[%s:%d] rank %d of 4 ok", node, r, r); !strings.Contains(string(text), want) {
			t.Errorf("job output lacks %q", want)
		}
	}
	for _, want := range []string{"all 1 remote hosts reachable", "rendezvous and local ranks use 10.213.0.1 (the address host node2 sees our srun connection come from)",
		"gorun: rendezvous: rank 3 registered from /ip4/10.213.0.2/"} {
		if !strings.Contains(string(text), want) {
			t.Errorf("job output lacks %q", want)
		}
	}
	if strings.Contains(string(text), "srun:") {
		t.Errorf("srun's own messages in the job output")
	}
	if t.Failed() {
		t.Logf("job output:\n%s", text)
	}
	c.NoneLeft(t, 10*time.Second)

	// A host outside the allocation, with --launcher srun: named with
	// srun's own words before anything starts.
	id, output = slurmBatch(t, c, "--launcher", "srun", "-H", "node1:2,node9:2", prog)
	state, exit = c.WaitJob(t, id, 60*time.Second)
	text, _ = os.ReadFile(output)
	unreachable := regexp.MustCompile(`(?m)^gorun: cannot reach host node9 over srun: srun: error: .+ \(nothing was started\)$`)
	if exit != "1:0" || !unreachable.Match(text) || strings.Contains(string(text), "rank") {
		t.Errorf("job %s with host node9 ended %s, exit code %s; want 1:0 and a line matching %s, and no rank started; its output:\n%s", id, state, exit, unreachable, text)
	}
	t.Logf("gorun --launcher srun -H node1:2,node9:2 said: %s", unreachable.Find(text))
	c.NoneLeft(t, 10*time.Second)
}

// slurmVictim waits until output (read by read) shows n ranks looping, then
// finds the rank process on node and returns its pid and rank, the rank
// read from the variable rankVar of its environment.
func slurmVictim(t *testing.T, c *slurmtest.Cluster, nd *slurmtest.Node, prog, rankVar string, n int, read func() string) (int, string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for strings.Count(read(), "looping") < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d ranks did not start looping within 60s; output:\n%s\n%s", n, read(), c.Logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, pid := range c.Net.PIDs(nd.Host) {
		if strings.HasPrefix(netns.Cmdline(pid), prog) {
			return pid, netns.Environ(pid, rankVar)
		}
	}
	t.Fatalf("no rank process found on %s", nd.Name)
	return 0, ""
}

// A rank killed on node2 (SIGKILL, as the OOM killer would) while gorun
// runs the job inside an sbatch allocation: gorun stops the others and
// fails the job with its usual message naming the rank and its host, and
// nothing of the job is left on any node.
func testSlurmSbatchGorunRankKilled(t *testing.T, c *slurmtest.Cluster) {
	prog := slurmprog(t)
	id, output := slurmBatch(t, c, "-np", "4", "--grace", "2s", "-x", "SLURMPROG_LOOP=1", prog)
	read := func() string { b, _ := os.ReadFile(output); return string(b) }
	victim, rank := slurmVictim(t, c, c.Nodes[1], prog, "GORUN_RANK", 4, read)
	killed := time.Now()
	syscall.Kill(victim, syscall.SIGKILL)
	state, exit := c.WaitJob(t, id, 60*time.Second)
	took := time.Since(killed)
	text := read()
	want := fmt.Sprintf("gorun: job failed: rank %s on host node2 failed: exit status 137 (killed by signal 9: killed)", rank)
	if state != "FAILED" || exit != "1:0" || !strings.Contains(text, want) || strings.Contains(text, "srun:") {
		t.Errorf("job %s ended %s, exit code %s; want FAILED, 1:0 and %q (and no srun: line) in its output:\n%s", id, state, exit, want, text)
	}
	t.Logf("killed rank %s (pid %d) on node2; the job ended %v later; gorun said:\n%s", rank, victim, took.Round(time.Millisecond), rankFailedRE.FindString(text))
	c.NoneLeft(t, 10*time.Second)
}

// gorun stopped by a signal inside the allocation (scancel --batch, as a
// job's time limit would) stops its ranks, those started by srun on node2
// included, the usual way, and nothing of the job is left on any node.
func testSlurmSbatchGorunStopped(t *testing.T, c *slurmtest.Cluster) {
	prog := slurmprog(t)
	id, output := slurmBatch(t, c, "-np", "4", "--grace", "2s", "-x", "SLURMPROG_LOOP=1", prog)
	read := func() string { b, _ := os.ReadFile(output); return string(b) }
	slurmVictim(t, c, c.Nodes[1], prog, "GORUN_RANK", 4, read) // wait for every rank to loop
	stopped := time.Now()
	c.Run(t, c.Nodes[0], 10*time.Second, "scancel", "--batch", "--signal=TERM", id)
	state, exit := c.WaitJob(t, id, 60*time.Second)
	took := time.Since(stopped)
	text := read()
	want := "gorun: stopped: terminated (SIGTERM); all 4 ranks stopped"
	if exit != "143:0" || !strings.Contains(text, want) {
		t.Errorf("job %s ended %s, exit code %s; want 143:0 and %q in its output:\n%s", id, state, exit, want, text)
	}
	t.Logf("gorun stopped with SIGTERM; the job ended %v later (%s)", took.Round(time.Millisecond), state)
	c.NoneLeft(t, 10*time.Second)
}

// gorun killed outright (SIGKILL) inside an allocation that goes on: its
// srun clients die with it, and no rank is left on any node while the
// allocation still runs (the ranks' steps end when their stdin closes).
func testSlurmSbatchGorunKilled(t *testing.T, c *slurmtest.Cluster) {
	prog := slurmprog(t)
	pidFile := filepath.Join(t.TempDir(), "gorun.pid")
	// The script outlives gorun, so that Slurm's end-of-job cleanup is
	// not what ends the ranks; the test cancels it.
	id, output := slurmBatchScript(t, c, gorunCommandLine("-np", "4", "-x", "SLURMPROG_LOOP=1", prog)+" &\necho $! >"+pidFile+"\nwait\nexec sleep 120\n")
	read := func() string { b, _ := os.ReadFile(output); return string(b) }
	slurmVictim(t, c, c.Nodes[1], prog, "GORUN_RANK", 4, read) // wait for every rank to loop
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if _, err := fmt.Sscan(string(b), &pid); err != nil {
		t.Fatalf("%s: %q: %v", pidFile, b, err)
	}
	killed := time.Now()
	syscall.Kill(pid, syscall.SIGKILL)
	deadline := time.Now().Add(15 * time.Second)
	for {
		var left []string
		for _, p := range c.JobProcesses() {
			if strings.Contains(p, prog) || strings.Contains(p, "srun") || strings.Contains(p, "gorun-rank") {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("15s after gorun was killed, its ranks (or their srun or wrappers) still run:\n%s\njob output:\n%s\n%s", strings.Join(left, "\n"), read(), c.Logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("every rank gone %v after gorun was SIGKILLed, the allocation still running", time.Since(killed).Round(time.Millisecond))
	c.Run(t, c.Nodes[0], 10*time.Second, "scancel", id)
	c.WaitJob(t, id, 30*time.Second)
	c.NoneLeft(t, 10*time.Second)
}

// A rank killed while srun runs the job directly: the step ends (the other
// ranks fail on the lost peer and srun, with --kill-on-bad-exit, ends the
// step), srun names the killed task, and nothing is left on any node.
func testSlurmSrunRankKilled(t *testing.T, c *slurmtest.Cluster) {
	prog := slurmprog(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := c.Command(ctx, c.Nodes[0], "srun", "-N", "2", "-n", "4", "-w", "node[1-2]", "--kill-on-bad-exit=1", prog)
	cmd.Env = append(cmd.Env, "GORUN_JOB_KEY_FILE="+slurmJobKeyFile(t), "SLURMPROG_LOOP=1")
	out := new(syncBuf)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	victim, rank := slurmVictim(t, c, c.Nodes[1], prog, "SLURM_PROCID", 4, out.String)
	killed := time.Now()
	syscall.Kill(victim, syscall.SIGKILL)
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("srun did not end within 30s of rank %s's death; output:\n%s\n%s", rank, out, c.Logs())
	}
	took := time.Since(killed)
	want := fmt.Sprintf("srun: error: node2: task %s: Killed", rank)
	if err == nil || !strings.Contains(out.String(), want) {
		t.Errorf("srun: %v; want an error and %q in its output:\n%s", err, want, out)
	}
	// The other ranks' collective calls fail naming the lost rank.
	survivor := regexp.MustCompile(fmt.Sprintf(`(?m)^slurmprog: rank \d+: .*rank %s \(\S+\) disconnected$`, rank))
	if !survivor.MatchString(out.String()) {
		t.Errorf("no surviving rank says rank %s disconnected (%s):\n%s", rank, survivor, out)
	}
	t.Logf("killed rank %s (pid %d) on node2; srun ended %v later (%v)", rank, victim, took.Round(time.Millisecond), err)
	c.NoneLeft(t, 10*time.Second)
}

// --launcher is checked before anything starts: srun needs an allocation,
// and only ssh, srun and auto are launchers.
func TestSlurmLauncherFlag(t *testing.T) {
	env := slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, "SLURM_") })
	for _, tc := range []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"--launcher", "srun"}, nil,
			"gorun: --launcher srun: gorun is not inside a Slurm allocation (SLURM_JOB_ID or SLURM_JOB_NODELIST is not set): run gorun from an sbatch script or a salloc shell, or use --launcher ssh\n"},
		{[]string{"--launcher", "pbs"}, nil, "gorun: --launcher \"pbs\": want ssh, srun or auto\n"},
		{nil, []string{"SLURM_JOB_ID=12", "SLURM_JOB_NODELIST=node[1-2]", "SLURM_TASKS_PER_NODE=2"},
			"gorun: Slurm job 12: SLURM_TASKS_PER_NODE=2 gives 1 counts for the 2 nodes of SLURM_JOB_NODELIST=node[1-2] (or pass -H, or --launcher ssh)\n"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, gorunBin, append(tc.args, testprogBin)...)
		cmd.Env = append(env, tc.env...)
		out, err := cmd.CombinedOutput()
		cancel()
		if err == nil || string(out) != tc.want {
			t.Errorf("gorun %q with %q: %v, said:\n%s\nwant:\n%s", tc.args, tc.env, err, out, tc.want)
		}
	}
}

// node2 fails as a power loss would (its network gone, then every process
// on it killed: see slurmtest.Fail) while two jobs run on node[1-2]: one
// whose 4 ranks srun starts itself, and one where gorun, inside an sbatch
// allocation, starts them. Both run at once, sharing the nodes' CPUs
// (--oversubscribe), so that one failure tests both and TestSlurm stays
// short. Nothing tells the survivors that node2 is gone (no FIN, no RST):
//   - the ranks on node1, and gorun's rendezvous, find it by the heartbeat
//     bound, which is the collective timeout (GORUN_TIMEOUT or gorun
//     --timeout: 5s here, 60s by default), and fail naming a rank of node2;
//   - gorun stops the ranks on node1 and the srun clients of the ranks on
//     node2 (those only end when killed, after --grace and 5 s more, or
//     when Slurm ends the job), and fails the job;
//   - srun, whose tasks on node2 never report, and the sbatch job, whose
//     node2 never confirms it ended, end when slurmctld sets node2 DOWN,
//     7 to about 17 s after the failure with the cluster's SlurmdTimeout=10
//     (see slurmtest). That always comes after the ranks found the loss, but
//     may come before gorun is done stopping: Slurm then ends the job's
//     processes, the srun clients included, and gorun's verdict is the
//     same, only sooner.
//
// Then nothing is left on node1, and node2 is brought back for any later
// case.
func testSlurmNodeFailed(t *testing.T, c *slurmtest.Cluster) {
	prog := slurmprog(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	srun := c.Command(ctx, c.Nodes[0], "srun", "-N", "2", "-n", "4", "-w", "node[1-2]", "--oversubscribe", "--kill-on-bad-exit=1", prog)
	srun.Env = append(srun.Env, "GORUN_JOB_KEY_FILE="+slurmJobKeyFile(t), "SLURMPROG_LOOP=1", "GORUN_TIMEOUT=5s")
	srunOut := new(syncBuf)
	srun.Stdout, srun.Stderr = srunOut, srunOut
	if err := srun.Start(); err != nil {
		t.Fatal(err)
	}
	srunDone := make(chan error, 1)
	go func() { srunDone <- srun.Wait() }()
	// --no-requeue: Slurm would otherwise requeue a batch job that a node
	// failure ended, and start it again once node2 is back.
	id, output := slurmBatchOpts(t, c, []string{"--oversubscribe", "--no-requeue"},
		"exec "+gorunCommandLine("-np", "4", "--timeout", "5s", "--grace", "500ms", "-x", "SLURMPROG_LOOP=1", prog)+"\n")
	read := func() string { b, _ := os.ReadFile(output); return string(b) }
	slurmVictim(t, c, c.Nodes[1], prog, "SLURM_PROCID", 4, srunOut.String)
	slurmVictim(t, c, c.Nodes[1], prog, "GORUN_RANK", 4, read)

	failed := time.Now()
	c.Fail(t, c.Nodes[1])

	// gorun's verdict comes within --timeout, --grace and 5 s (11 s), or
	// sooner if Slurm ends the job first; 30 s on a loaded machine.
	gorunFailed := regexp.MustCompile(`(?m)^gorun: job failed: .*$`)
	deadline := failed.Add(30 * time.Second)
	for !gorunFailed.MatchString(read()) {
		if time.Now().After(deadline) {
			t.Fatalf("gorun did not fail the job within 30s of node2's failure; its output:\n%s\n%s", read(), c.Logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
	gorunTook := time.Since(failed)
	text := read()
	lost := `rank [23] \(/ip4/10\.213\.0\.2/tcp/\d+\) stopped responding: no heartbeat within 5s` // as the ranks say it
	// The cause first, a rank of node2 named with its host, then the first
	// rank that failed (a survivor, exiting on the abort). The other
	// survivor is listed after it, or folded into it when the last lines
	// of their stderr match (rank numbers aside), which depends on whether
	// both printed the same stall warnings before the abort.
	gorunWant := regexp.MustCompile(`(?m)^gorun: job failed: rank [23] on host node2 \(/ip4/10\.213\.0\.2/tcp/\d+\) stopped responding: no heartbeat within 5s, so the job was aborted; then rank [01] on host node1 failed: exit status 2 \(its stderr is above\); (also failed: rank [01] on host node1 \(exit status 2\)|rank [01] failed the same way \(exit status 2\))$`)
	if !gorunWant.MatchString(text) {
		t.Errorf("gorun's verdict does not match %s; its output:\n%s", gorunWant, text)
	}

	// srun ends when slurmctld sets node2 DOWN: about 17 s after the
	// failure at the latest (see slurmtest's SlurmdTimeout); 30 s on a
	// loaded machine.
	var srunErr error
	select {
	case srunErr = <-srunDone:
	case <-time.After(time.Until(failed.Add(30 * time.Second))):
		srun.Process.Kill()
		<-srunDone
		t.Fatalf("srun did not end within 30s of node2's failure; its output:\n%s\n%s", srunOut, c.Logs())
	}
	srunTook := time.Since(failed)
	state, exit := c.WaitJob(t, id, time.Until(failed.Add(30*time.Second)))
	jobTook := time.Since(failed)

	out := srunOut.String()
	for r := range 2 {
		survivor := regexp.MustCompile(fmt.Sprintf(`(?m)^slurmprog: rank %d: gorun: rank %d: %s$`, r, r, lost))
		if !survivor.MatchString(out) {
			t.Errorf("rank %d does not say a rank of node2 stopped responding (%s)", r, survivor)
		}
	}
	if want := "srun: error: Node failure on node2\n"; srunErr == nil || !strings.Contains(out, want) {
		t.Errorf("srun: %v; want an error and %q", srunErr, want)
	}
	if t.Failed() {
		t.Logf("srun's output:\n%s", out)
	}
	// FAILED if gorun was done before Slurm set node2 DOWN, else NODE_FAIL;
	// the exit code is gorun's either way.
	if state != "FAILED" && state != "NODE_FAIL" || exit != "1:0" {
		t.Errorf("job %s ended %s, exit code %s; want FAILED or NODE_FAIL, and 1:0 (gorun's); its output:\n%s", id, state, exit, text)
	}
	t.Logf("node2 failed: gorun failed the job %v later:\n%s", gorunTook.Round(time.Millisecond), gorunFailed.FindString(text))
	t.Logf("srun ended %v after the failure (%v): %s", srunTook.Round(time.Millisecond), srunErr, regexp.MustCompile(`(?m)^slurmprog: rank 0: .*$`).FindString(out))
	t.Logf("job %s ended %s %v after the failure", id, state, jobTook.Round(time.Millisecond))
	c.NoneLeft(t, 10*time.Second)
	c.Restore(t, c.Nodes[1])
}
