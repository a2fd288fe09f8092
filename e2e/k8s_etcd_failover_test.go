package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv/etcdtest"
	"github.com/gorun/gorun/internal/testenv/podsim"
	"github.com/gorun/gorun/p2p"
)

// An elastic PyTorchJob "pj" of 4 pods whose elasticPolicy says
// rdzvBackend: etcd: the operator gives each pod PET_RDZV_ENDPOINT (the
// etcd cluster's), PET_RDZV_ID and PET_NNODES=1:4, and no rank; the pods
// keep the membership in a real 3-member etcd cluster. The pods are
// processes of this host (podsim.NewLocal): the etcd cluster listens on
// this host's loopback, which a namespace host could not reach, and with
// etcd the pods need no DNS names of each other.

// The pod whose replica leads the membership is killed (kill -9): its
// lease expires, another pod's replica leads, the others go on without it,
// at most one step lost; the kubelet restarts the container, which finds
// the job running and joins it as a joiner; every pod ends with the
// uninterrupted run's parameters and no process is left.
func TestFailoverPodsEtcdLeaderKilled(t *testing.T) {
	c := etcdtest.Start(t)
	j := etNewJob(t, etDefault)
	j.out, j.err, j.done = newWatchedBuffer(), newWatchedBuffer(), make(chan struct{})
	group := p2p.EtcdGroup{Endpoints: c.Endpoints(), RendezvousID: "pj-etcd"}
	var specs []podsim.Spec
	for i := range 4 {
		specs = append(specs, podsim.Spec{
			Name: fmt.Sprintf("pj-worker-%d", i),
			Env: []string{
				// The operator's (ElasticEnvVarGenerator, setPodEnv), for
				// an elasticPolicy with rdzvBackend etcd, rdzvHost and
				// rdzvPort naming the etcd cluster, rdzvId pj-etcd.
				"PYTHONUNBUFFERED=0", "PET_RDZV_ENDPOINT=" + strings.Join(group.Endpoints, ","), "PET_RDZV_BACKEND=etcd",
				"PET_NNODES=1:4", "PET_MAX_RESTARTS=3", "PET_RDZV_ID=" + group.RendezvousID, "PET_NPROC_PER_NODE=1",
				// The manifest's.
				"GORUN_JOB_KEY=" + strings.Repeat("6b", 32), "GORUN_HEARTBEAT_TIMEOUT=" + etHeartbeat.String(),
			},
			Args: j.progArgs(),
		})
	}
	pods := podsim.NewLocal(t, j.out, specs...)
	pods.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { pods.Wait(ctx); close(j.done) }()

	j.pids(4)
	j.waitStep("step 3", time.Minute, func(s etStep) bool { return s.steps >= 3 })
	fctx, fcancel := context.WithTimeout(ctx, 30*time.Second)
	id, _, err := p2p.FindEtcdLeader(fctx, group)
	fcancel()
	if err != nil {
		t.Fatalf("finding the leader in etcd: %v", err)
	}
	leader := int(id) - 2 // p2p.ReplicaID(rank) = rank + 2
	if leader < 0 || leader > 3 {
		t.Fatalf("replica %d leads, want a pod's (replicas 2 to 5)", id)
	}
	before := j.out.String()
	killed := time.Now()
	if err := pods.Pods[leader].Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	resets := j.waitLostPod(leader, time.Minute)
	took := time.Since(killed)
	lostAtMostOneStep(t, before, resets)
	pod := fmt.Sprintf("pj-worker-%d", leader)
	j.waitRejoined(pod, time.Minute)
	podsFinish(t, j, pods)
	t.Logf("pod %d (its replica led) killed: the others reset %v later; the pods said:\n%s", leader, took.Round(time.Millisecond), podLines(j.out.String()))
}
