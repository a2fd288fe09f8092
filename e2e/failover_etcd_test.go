package e2e

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv/etcdtest"
)

// Failover with the membership in etcd (gorun --rdzv-backend etcd, issue
// 28 item 3): elastictrain under gorun on this host, against a real
// 3-member etcd cluster. These tests select with -run 'Failover|Etcd'.

var etLeadsRE = regexp.MustCompile(`rendezvous: replica (\d+) leads the group`)

// etcdJob starts elastictrain's 4 ranks under gorun with the membership in
// etcd cluster c; the ranks gorun picks, the group's and the spares (on one
// host, all four), stand for leader (gorun's replica only follows and
// reports), and etcdJob returns once one leads, with its rank.
func etcdJob(t *testing.T, c *etcdtest.Cluster) (*etJob, int) {
	t.Helper()
	j := etStart(t, etDefault, append(etElasticFlags, "--rdzv-backend", "etcd",
		"--rdzv-endpoints", strings.Join(c.Endpoints(), ","))...)
	if err := j.err.waitFor(" leads the group", 1, time.Minute, j.done); err != nil {
		j.fail("gorun does not say which replica leads: %v", err)
	}
	m := etLeadsRE.FindStringSubmatch(j.err.String())
	id, _ := strconv.Atoi(m[1])
	leader := id - 2 // p2p.ReplicaID(rank) = rank + 2
	if leader < 0 || leader > 3 {
		j.fail("replica %d leads, want a rank's (replicas 2 to 5)", id)
	}
	return j, leader
}

// The etcd cluster's leader member is killed (kill -9) mid-job: nothing
// happens to the job: no reset, every rank ends with the uninterrupted
// run's parameters, and no process is left.
func TestFailoverEtcdLeaderKilled(t *testing.T) {
	c := etcdtest.Start(t)
	j, _ := etcdJob(t, c)
	j.pids(4)
	j.waitStep("step 3", time.Minute, func(s etStep) bool { return s.steps >= 3 })
	killed := c.KillLeader()
	j.open()
	j.finish(4)
	if resets := etResetRE.FindAllString(j.out.String(), -1); len(resets) > 0 {
		t.Errorf("the ranks reset after etcd member %d (the etcd leader) was killed: %q", killed, resets)
	}
	t.Logf("etcd member %d (the etcd leader) killed; gorun said:\n%s", killed, j.err)
}

// The rank whose replica leads the membership is killed (kill -9): its
// lease expires, the other candidate leads, the other ranks reconnect to
// it and go on without the killed rank (one reset, the step in flight
// only), and end with the uninterrupted run's parameters.
func TestFailoverEtcdRankLeaderKilled(t *testing.T) {
	c := etcdtest.Start(t)
	j, leader := etcdJob(t, c)
	pids := j.pids(4)
	j.waitStep("step 3", time.Minute, func(s etStep) bool { return s.steps >= 3 })
	killed := time.Now()
	etKill(t, pids[leader], syscall.SIGKILL)
	resets := j.waitResets(3, 1, time.Minute)
	for _, m := range resets {
		if m[3] != "4" || m[4] != "3" || m[5] != strconv.Itoa(leader) {
			t.Errorf("reset %q: want 4->3 ranks, lost rank %d", m[0], leader)
		}
	}
	took := time.Since(killed)
	j.open()
	j.finish(3)
	errOut := j.err.String()
	i := strings.Index(errOut, fmt.Sprintf("rendezvous: replica %d leads the group", leader+2))
	if i < 0 || !etLeadsRE.MatchString(strings.Replace(errOut[i:], fmt.Sprintf("replica %d leads", leader+2), "", 1)) {
		t.Errorf("gorun does not say another replica leads after replica %d:\n%s", leader+2, errOut)
	}
	t.Logf("rank %d (the leader's process) killed; the others reset %v later; gorun said:\n%s", leader, took.Round(time.Millisecond), errOut)
}
