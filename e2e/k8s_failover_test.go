package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv/podsim"
)

// An elastic PyTorchJob "pj" of 4 pods (elasticPolicy minReplicas 1,
// maxReplicas 4, the Workers' replicas 4), played by processes
// (internal/testenv/podsim): each pod on a node of its own, its name
// resolving through /etc/hosts, its container elastictrain with exactly
// the environment the training operator's contract and the manifest
// (deploy/kubernetes/elastic-pytorchjob.yaml) give it. Pod 0 hosts
// replica 1 of the rendezvous group, which leads; pods 1 and 2 host the
// others. The kubelet restarts a failed container (restartPolicy:
// OnFailure) and the operator recreates a deleted pod: a replaced pod
// comes back as a joiner.

const podRdzvPort = 29400

// podJob starts the job's pods; every change lands mid-epoch (etDefault's
// gate).
func podJob(t *testing.T) (*etJob, *podsim.Cluster) {
	t.Helper()
	j := etNewJob(t, etDefault)
	j.out, j.err, j.done = newWatchedBuffer(), newWatchedBuffer(), make(chan struct{})
	var specs []podsim.Spec
	for i := range 4 {
		specs = append(specs, podsim.Spec{
			Name: fmt.Sprintf("pj-worker-%d", i),
			Env: []string{
				// The operator's (ElasticEnvVarGenerator, setPodEnv).
				"PYTHONUNBUFFERED=0", fmt.Sprintf("PET_RDZV_ENDPOINT=pj-worker-0:%d", podRdzvPort), "PET_RDZV_BACKEND=c10d",
				"PET_NNODES=1:4", "PET_MAX_RESTARTS=3", "PET_RDZV_ID=pj", "PET_NPROC_PER_NODE=1",
				// The manifest's.
				"GORUN_JOB_KEY=" + strings.Repeat("6b", 32), "GORUN_HEARTBEAT_TIMEOUT=" + etHeartbeat.String(),
			},
			Args: j.progArgs(),
		})
	}
	c := podsim.New(t, j.out, specs...)
	c.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { c.Wait(ctx); close(j.done) }()
	return j, c
}

// podsFinish opens the gate, waits for every pod to succeed, and checks
// the final lines: one per pod (the replaced ones rejoined), each with
// the uninterrupted run's parameters, every step done once; and that no
// process is left.
func podsFinish(t *testing.T, j *etJob, c *podsim.Cluster) {
	t.Helper()
	j.open()
	select {
	case <-j.done:
	case <-time.After(3 * time.Minute):
		j.fail("the pods did not end within 3m")
	}
	for _, p := range c.Pods {
		if state, exits := p.State(); state != "Succeeded" {
			t.Errorf("pod %s: %s; its containers ended %q", p.Name, state, exits)
		}
	}
	params, samples := etReference(t, j.cfg)
	total := j.cfg.epochs * ((j.cfg.length + j.cfg.batch - 1) / j.cfg.batch)
	finals := etFinalRE.FindAllStringSubmatch(j.out.String(), -1)
	if len(finals) != len(c.Pods) {
		t.Errorf("%d final lines, want %d (one per pod)", len(finals), len(c.Pods))
	}
	for _, m := range finals {
		if m[2] != params || m[3] != samples || m[4] != "0" || m[5] != "0" || m[6] != strconv.Itoa(total) {
			t.Errorf("final line %q: want params %s, samples %s, no sample twice or never, %d steps", m[0], params, samples, total)
		}
	}
	for _, p := range c.Pods {
		for _, pid := range p.PIDs() {
			if processRunning(pid) {
				t.Errorf("pod %s: pid %d still runs", p.Name, pid)
			}
		}
	}
	if c.Net != nil {
		noneLeft(t, c.Net)
	}
	if t.Failed() {
		t.Logf("the pods said:\n%s", j.out)
	}
}

// lostAtMostOneStep checks that the survivors' resets resumed from the
// commit of the last step the lost pod printed before it was lost, or the
// one before it: its loss cost at most one step.
func lostAtMostOneStep(t *testing.T, before string, resets [][]string) {
	t.Helper()
	steps := etSteps(before)
	if len(steps) == 0 {
		t.Fatalf("no step before the loss")
	}
	last := steps[len(steps)-1].steps
	for _, m := range etResumedRE.FindAllStringSubmatch(strings.Join(func() []string {
		var s []string
		for _, r := range resets {
			s = append(s, r[0])
		}
		return s
	}(), "\n"), -1) {
		if c, _ := strconv.Atoi(m[1]); c < last-1 {
			t.Errorf("a reset resumed from commit %d, but the lost pod had printed step %d: more than one step lost", c, last)
		}
	}
}

// The rendezvous leader's process, pod 0's container, killed (kill -9):
// the replicas on pods 1 and 2 elect a leader, the other pods go on
// without it, at most one step lost; the kubelet restarts the container,
// which finds the running group and joins it instead of starting a
// second one; every pod ends with the uninterrupted run's parameters.
func TestFailoverPodsLeaderKilled(t *testing.T) {
	j, c := podJob(t)
	j.pids(4)
	j.waitStep("step 3", time.Minute, func(s etStep) bool { return s.steps >= 3 })
	before := j.out.String()
	killed := time.Now()
	if err := c.Pods[0].Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	resets := j.waitLost0(time.Minute)
	took := time.Since(killed)
	lostAtMostOneStep(t, before, resets)
	j.waitRejoined("pj-worker-0", time.Minute)
	podsFinish(t, j, c)
	t.Logf("pod 0 killed: the others reset %v later; the pods said:\n%s", took.Round(time.Millisecond), podLines(j.out.String()))
}

// Pod 0's node cut off (its link down): the others go on without it; pod
// 0, cut off, stops by itself. The node comes back and the pod, evicted
// meanwhile, is created again: it joins the running group.
func TestFailoverPodsLeaderLinkDown(t *testing.T) {
	j, c := podJob(t)
	j.pids(4)
	j.waitStep("step 3", time.Minute, func(s etStep) bool { return s.steps >= 3 })
	before := j.out.String()
	h0 := c.Pods[0].Host
	cut := time.Now()
	etIP(t, c.Net, h0, "link", "set", "eth0", "down")
	resets := j.waitLost0(time.Minute)
	took := time.Since(cut)
	lostAtMostOneStep(t, before, resets)
	j.waitOut("pod 0 cut off", time.Minute, func(out string) bool {
		return strings.Contains(out, "[pj-worker-0]") && strings.Contains(out, "cut off from the rendezvous")
	})
	etIP(t, c.Net, h0, "link", "set", "eth0", "up")
	// The node controller evicted the pod of the unreachable node; the
	// operator creates it again.
	if err := c.Pods[0].Delete(2*time.Second, true); err != nil {
		t.Fatal(err)
	}
	j.waitRejoined("pj-worker-0", time.Minute)
	podsFinish(t, j, c)
	t.Logf("pod 0's node cut off: the others reset %v later; the pods said:\n%s", took.Round(time.Millisecond), podLines(j.out.String()))
}

// A pod deleted (SIGTERM, then its grace period): it leaves at the next
// commit, costing no step; the operator creates it again and it joins.
func TestFailoverPodsDeleted(t *testing.T) {
	j, c := podJob(t)
	j.pids(4)
	j.waitStep("step 3", time.Minute, func(s etStep) bool { return s.steps >= 3 })
	if err := c.Pods[3].Delete(30*time.Second, true); err != nil {
		t.Fatal(err)
	}
	if _, exits := c.Pods[3].State(); len(exits) != 1 || exits[0] != "exit 0" {
		t.Errorf("the deleted pod's container ended %q, want exit 0 (a graceful leave)", exits)
	}
	out := j.out.String()
	if !strings.Contains(out, "[pj-worker-3] left rank=3") {
		t.Errorf("pod 3 did not leave gracefully:\n%s", out)
	}
	j.waitRejoined("pj-worker-3", time.Minute)
	podsFinish(t, j, c)
	if n := strings.Count(j.out.String(), "interrupted rank="); n != 0 {
		t.Errorf("%d steps interrupted by a graceful leave", n)
	}
}

// waitLost0 waits until pods 1, 2 and 3 reset without rank 0 (pod 0's
// first container), and returns their resets. The replaced pod 0 may
// rejoin in the same reset, or in a later one.
func (j *etJob) waitLost0(limit time.Duration) [][]string { return j.waitLostPod(0, limit) }

// waitLostPod waits until the 3 other pods reset without rank i (pod i's
// first container), and returns their resets.
func (j *etJob) waitLostPod(i int, limit time.Duration) [][]string {
	j.t.Helper()
	var got [][]string
	j.waitOut(fmt.Sprintf("3 resets that lost rank %d", i), limit, func(out string) bool {
		got = nil
		for _, m := range etResetRE.FindAllStringSubmatch(out, -1) {
			if m[5] == strconv.Itoa(i) && !strings.HasPrefix(m[0], fmt.Sprintf("[pj-worker-%d]", i)) {
				got = append(got, m)
			}
		}
		return len(got) >= 3
	})
	return got
}

// waitRejoined waits until the replaced pod started as a joiner and every
// pod reset into a job of 4 with it.
func (j *etJob) waitRejoined(pod string, limit time.Duration) {
	j.t.Helper()
	j.waitOut(pod+" rejoined", limit, func(out string) bool {
		if !regexp.MustCompile(`(?m)^\[` + pod + `\] start pid=\d+ rank=\d+ size=4 joiner=true `).MatchString(out) {
			return false
		}
		n := 0
		for _, m := range etResetRE.FindAllStringSubmatch(out, -1) {
			if m[4] == "4" && m[6] != "" {
				n++
			}
		}
		return n >= 4
	})
}

// podLines is the pods' output without their step lines.
func podLines(out string) string {
	var keep []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if !etStepRE.MatchString(l) {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}
