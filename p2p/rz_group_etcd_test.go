package p2p

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv/etcdtest"
	"github.com/gorun/gorun/membership/etcdlog"
)

// Etcd: the membership kept in etcd (issue 28, item 3). These tests run a
// real 3-member etcd cluster (skipped without etcd) and select with -run
// 'Failover|Etcd'.

// startEtcdJob starts an elastic job of size ranks whose membership is in
// etcd cluster c: replica 1 only observes and reports (as gorun's does;
// the ranks reach it first), and the ranks in hosts host a replica that
// stands for leader.
func startEtcdJob(t *testing.T, c *etcdtest.Cluster, size int, hosts []int) *groupJob {
	t.Helper()
	j := &groupJob{key: NewJobKey(), log: &logRec{}, hb: 2 * time.Second, byRank: map[int]*Rendezvous{}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdzvID := fmt.Sprintf("job-%x", j.key[:6])
	rc := func(id uint64) RendezvousConfig {
		return RendezvousConfig{ListenAddr: "127.0.0.1:0", Size: size, JobKey: j.key, Timeout: 20 * time.Second,
			Logf:    func(f string, a ...any) { j.log.logf("replica %d: "+f, append([]any{id}, a...)...) },
			Elastic: &ElasticConfig{MinSize: 1, MaxSize: size, HeartbeatTimeout: j.hb},
			Group: &GroupConfig{ID: id, Reports: id == 1,
				Etcd: &EtcdGroup{Endpoints: c.Endpoints(), RendezvousID: rdzvID, Observe: id == 1, TLS: etcdTLS(c)}}}
	}
	first, err := StartRendezvous(ctx, rc(1))
	if err != nil {
		t.Fatal(err)
	}
	j.replicas = append(j.replicas, first)
	for _, r := range hosts {
		rz, err := StartRendezvous(ctx, rc(ReplicaID(r)))
		if err != nil {
			t.Fatal(err)
		}
		j.replicas = append(j.replicas, rz)
		j.byRank[r] = rz
	}
	j.joinRanks(t, ctx, size, first.Addr())
	eventually(t, 10*time.Second, "every replica knows every candidate", func() bool {
		for _, rz := range j.replicas {
			if rz.groupSize() != len(hosts) {
				return false
			}
		}
		return true
	})
	eventually(t, 10*time.Second, "every rank learns the group", func() bool {
		for _, n := range j.nodes {
			if !n.ctl.group.replicated() {
				return false
			}
		}
		return true
	})
	return j
}

// A toy data-parallel job on the data plane: at each step every member
// contributes a gradient that depends on who it is (its rank in the first
// epoch) and on the step, the ring sums them, and every member folds the
// sum into its parameter, so that a step lost, run twice, or run with
// other members changes the result.

func gradient(member, step int) uint64 {
	return uint64(member+1)*1_000_003 + uint64(step)*7919 ^ uint64(member)<<20
}

func fold(param, sum uint64) uint64 { return param*31 + sum }

// reference is the parameter of an uninterrupted run: members(step) are
// the members at each step.
func reference(steps int, members func(step int) []int) uint64 {
	var p uint64
	for s := range steps {
		var sum uint64
		for _, m := range members(s) {
			sum += gradient(m, s)
		}
		p = fold(p, sum)
	}
	return p
}

// ringSum adds v over the ring of size ranks.
func ringSum(ctx context.Context, n *Node, size int, v uint64) (uint64, error) {
	tr := n.Transport()
	sum, cur := v, binary.LittleEndian.AppendUint64(nil, v)
	for range size - 1 {
		sent := make(chan error, 1)
		go func() { sent <- tr.SendNext(ctx, cur) }()
		got := make([]byte, 8)
		err := tr.RecvPrev(ctx, got)
		if serr := <-sent; err == nil {
			err = serr
		}
		if err != nil {
			return 0, err
		}
		sum += binary.LittleEndian.Uint64(got)
		cur = got
	}
	return sum, nil
}

// train runs steps from..to-1 on every node at once; members[i] is who
// nodes[i] is, params[i] its parameter (updated). It returns, for each
// node, the step it failed at (-1: none) and why.
func train(nodes []*Node, members []int, params []uint64, from, to int) ([]int, []error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	failed, errs := make([]int, len(nodes)), make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		failed[i] = -1
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := from; s < to; s++ {
				sum, err := ringSum(ctx, n, len(nodes), gradient(members[i], s))
				if err != nil {
					failed[i], errs[i] = s, err
					return
				}
				params[i] = fold(params[i], sum)
			}
		}()
	}
	wg.Wait()
	return failed, errs
}

func trainOK(t *testing.T, nodes []*Node, members []int, params []uint64, from, to int) {
	t.Helper()
	failed, errs := train(nodes, members, params, from, to)
	for i, f := range failed {
		if f >= 0 {
			t.Fatalf("member %d failed at step %d of %d..%d: %v", members[i], f, from, to-1, errs[i])
		}
	}
}

func checkParams(t *testing.T, members []int, params []uint64, want uint64) {
	t.Helper()
	for i, p := range params {
		if p != want {
			t.Errorf("member %d ends with parameter %#x, want the uninterrupted run's %#x", members[i], p, want)
		}
	}
}

// The etcd cluster's leader member is killed (kill -9) mid-job: the job
// goes on with no step lost and no member lost, a membership round (Grow)
// goes through the log while etcd elects its new leader, and every member
// ends with the uninterrupted run's parameter.
func TestEtcdLeaderKilled(t *testing.T) {
	c := etcdtest.Start(t)
	j := startEtcdJob(t, c, 4, []int{0, 1, 2})
	const steps = 40
	members := []int{0, 1, 2, 3}
	params := make([]uint64, 4)
	trainOK(t, j.nodes, members, params, 0, 10)
	var leadBefore *Rendezvous
	eventually(t, 10*time.Second, "a replica leads", func() bool { leadBefore = j.leader(); return leadBefore != nil })
	killed := c.KillLeader()
	t.Logf("etcd member %d (the cluster's leader) killed", killed)
	trainOK(t, j.nodes, members, params, 10, 20)
	// Through the log: every Grow is an event the leader appends.
	for r, v := range growAll(t, j.nodes) {
		if v.Epoch != 0 || v.Size != 4 || v.Rank != r {
			t.Errorf("rank %d: Grow after the etcd leader's loss: %+v, want epoch 0 of 4", r, v)
		}
	}
	trainOK(t, j.nodes, members, params, 20, steps)
	checkParams(t, members, params, reference(steps, func(int) []int { return members }))
	for r, n := range j.nodes {
		if n.Err() != nil || n.Epoch() != 0 {
			t.Errorf("rank %d: err %v, epoch %d; want none, epoch 0", r, n.Err(), n.Epoch())
		}
	}
	if l := j.leader(); l != leadBefore {
		t.Logf("the rendezvous lead moved during the etcd election (the ranks followed it)")
	}
	if j.log.has(" was lost") {
		j.log.mu.Lock()
		t.Errorf("a member was lost:\n%s", strings.Join(j.log.lines, "\n"))
		j.log.mu.Unlock()
	}
}

// The rank whose replica leads the rendezvous is killed (kill -9: its
// process and its replica stop at once, its etcd session left to expire):
// another candidate leads, the others reconnect to it, lose the step in
// flight only, go on in a new epoch without it, and end with the parameter
// of an uninterrupted run with that membership.
func TestEtcdRendezvousLeaderKilled(t *testing.T) {
	c := etcdtest.Start(t)
	j := startEtcdJob(t, c, 4, []int{0, 1, 2})
	const steps, killAt = 30, 10
	members := []int{0, 1, 2, 3}
	params := make([]uint64, 4)
	trainOK(t, j.nodes, members, params, 0, killAt)
	victim := -1
	eventually(t, 10*time.Second, "a rank's replica leads", func() bool {
		for r, rz := range j.byRank {
			if rz.Leads() {
				victim = r
				return true
			}
		}
		return false
	})
	j.nodes[victim].crash()
	j.byRank[victim].crash()
	var survivors []*Node
	var left []int
	var leftParams []uint64
	for r, n := range j.nodes {
		if r != victim {
			survivors, left, leftParams = append(survivors, n), append(left, r), append(leftParams, params[r])
		}
	}
	failed, _ := train(survivors, left, leftParams, killAt, steps)
	for i, f := range failed {
		if f != killAt {
			t.Fatalf("member %d failed at step %d, want the step in flight, %d", left[i], f, killAt)
		}
	}
	for _, n := range survivors {
		waitDone(t, n, 4*j.hb+5*time.Second, "call Reconfigure to go on in epoch 1")
	}
	// The survivors report the broken links as they reconnect, within
	// the new leader's grace for the ranks to come back: the membership
	// may first re-form with the same members (epoch 1), and then drops
	// the rank that did not come back (epoch 2). Either way only the step
	// in flight is lost.
	views := reconfigureAll(t, survivors)
	if e := views[0].Epoch; e != 1 && e != 2 {
		t.Fatalf("the survivors go on in epoch %d, want 1 or 2", e)
	}
	checkViews(t, views, survivors, views[0].Epoch, []int{victim}, nil)
	for i, n := range survivors {
		n.ctl.group.mu.Lock()
		on := n.ctl.group.current
		n.ctl.group.mu.Unlock()
		if on == ReplicaID(victim) || on == 1 {
			t.Errorf("member %d is on replica %d, want a surviving candidate's", left[i], on)
		}
	}
	trainOK(t, survivors, left, leftParams, killAt, steps)
	checkParams(t, left, leftParams, reference(steps, func(s int) []int {
		if s < killAt {
			return members
		}
		return left
	}))
	if l := j.leader(); l == nil || l == j.byRank[victim] || slices.Contains(j.replicas[:1], l) {
		t.Errorf("leader after the loss: %v, want another rank's replica", l)
	}
}

// etcd unreachable: the replica does not start, within its timeout, and
// says which endpoints it tried.
func TestEtcdUnreachableAtStart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	began := time.Now()
	_, err = StartRendezvous(context.Background(), RendezvousConfig{ListenAddr: "127.0.0.1:0", Size: 2, JobKey: NewJobKey(), Timeout: 2 * time.Second,
		Elastic: &ElasticConfig{MinSize: 1, MaxSize: 2, HeartbeatTimeout: time.Second},
		Group:   &GroupConfig{ID: 2, Etcd: &EtcdGroup{Endpoints: []string{addr}, RendezvousID: "job"}}})
	if err == nil || !strings.Contains(err.Error(), "etcd at "+addr) {
		t.Fatalf("StartRendezvous with etcd down: %v, want an error naming %s", err, addr)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("StartRendezvous took %v to fail, want about its 2s timeout", took)
	}
}

// With an etcd cluster that serves TLS only and checks its clients'
// certificates, the group keeps the membership there as over plain TCP
// (the ranks train); a replica without the cluster's CA, or over plain
// TCP, fails within its timeout, saying why.
func TestEtcdTLS(t *testing.T) {
	c := etcdtest.StartTLS(t)
	j := startEtcdJob(t, c, 3, []int{0, 1})
	params := make([]uint64, 3)
	trainOK(t, j.nodes, []int{0, 1, 2}, params, 0, 5)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	noCA := *etcdTLS(c)
	noCA.CACert = ""
	_, err := StartRendezvous(ctx, RendezvousConfig{ListenAddr: "127.0.0.1:0", Size: 3, JobKey: j.key, Timeout: 5 * time.Second,
		Elastic: &ElasticConfig{MinSize: 1, MaxSize: 3, HeartbeatTimeout: j.hb},
		Group:   &GroupConfig{ID: ReplicaID(2), Etcd: &EtcdGroup{Endpoints: c.Endpoints(), RendezvousID: "job-no-ca", TLS: &noCA}}})
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a replica without etcd's CA: %v; want an error about its certificate", err)
	}
	t.Logf("without the CA: %v", err)
	_, err = StartRendezvous(ctx, RendezvousConfig{ListenAddr: "127.0.0.1:0", Size: 3, JobKey: j.key, Timeout: 5 * time.Second,
		Elastic: &ElasticConfig{MinSize: 1, MaxSize: 3, HeartbeatTimeout: j.hb},
		Group:   &GroupConfig{ID: ReplicaID(2), Etcd: &EtcdGroup{Endpoints: c.Endpoints(), RendezvousID: "job-plain"}}})
	if err == nil || !strings.Contains(err.Error(), "serves TLS: give https:// endpoints") {
		t.Fatalf("a replica over plain TCP: %v; want an error saying etcd serves TLS", err)
	}
	t.Logf("over plain TCP: %v", err)
}

// etcdTLS is how a client reaches cluster c (nil: plain TCP).
func etcdTLS(c *etcdtest.Cluster) *etcdlog.TLS {
	f := c.TLS()
	if f == nil {
		return nil
	}
	return &etcdlog.TLS{CACert: f.CACert, Cert: f.Cert, Key: f.Key}
}
