package p2p

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// groupJob is an elastic job whose rendezvous is a replicated group, in
// this process: replicas[0] is replica 1 (the launcher's, or rank 0's),
// and the ranks in hosts host the others.
type groupJob struct {
	key      []byte
	log      *logRec
	hb       time.Duration
	replicas []*Rendezvous
	byRank   map[int]*Rendezvous
	nodes    []*Node
}

// startGroupJob starts replica 1 and size ranks; the ranks in hosts host
// a replica each (rank 0 in hosts: it hosts replica 1, as under srun).
func startGroupJob(t *testing.T, size int, hosts []int, handOff bool) *groupJob {
	t.Helper()
	j := &groupJob{key: NewJobKey(), log: &logRec{}, hb: 2 * time.Second, byRank: map[int]*Rendezvous{}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rc := func(id uint64) RendezvousConfig {
		return RendezvousConfig{ListenAddr: "127.0.0.1:0", Size: size, JobKey: j.key, Timeout: 20 * time.Second,
			Logf:    func(f string, a ...any) { j.log.logf("replica %d: "+f, append([]any{id}, a...)...) },
			Elastic: &ElasticConfig{MinSize: 1, MaxSize: size, HeartbeatTimeout: j.hb},
			Group:   &GroupConfig{ID: id, Size: 3, Reports: id == 1, HandOff: handOff && id == 1}}
	}
	first, err := StartRendezvous(ctx, rc(1))
	if err != nil {
		t.Fatal(err)
	}
	j.replicas = append(j.replicas, first)
	for _, r := range hosts {
		if r == 0 {
			j.byRank[0] = first
			continue
		}
		rz, err := StartRendezvous(ctx, rc(ReplicaID(r)))
		if err != nil {
			t.Fatal(err)
		}
		j.replicas = append(j.replicas, rz)
		j.byRank[r] = rz
	}
	j.joinRanks(t, ctx, size, first.Addr())
	eventually(t, 10*time.Second, "the group grows to 3 replicas, all knowing it", func() bool {
		n := 0 // replicas beyond 3 are spares, outside the group
		for _, rz := range j.replicas {
			if rz.groupSize() == 3 {
				n++
			}
		}
		return n == 3
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

// joinRanks starts size ranks at rendezvous, each hosting its replica in
// byRank (if any), and has the test's end close them and crash the
// replicas.
func (j *groupJob) joinRanks(t *testing.T, ctx context.Context, size int, rendezvous string) {
	t.Helper()
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, n := range j.nodes {
			if n != nil {
				wg.Add(1)
				go func() { defer wg.Done(); n.Close() }()
			}
		}
		wg.Wait()
		for _, rz := range j.replicas {
			rz.crash()
			rz.wg.Wait()
		}
	})
	j.nodes = make([]*Node, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := Config{Rank: r, Size: size, JobKey: j.key, Rendezvous: rendezvous, Timeout: 20 * time.Second,
				Logf: func(f string, a ...any) { j.log.logf(fmt.Sprintf("rank %d: ", r)+f, a...) }, Elastic: true, HeartbeatTimeout: j.hb,
				HostID: otherHosts(r)}
			if rz := j.byRank[r]; rz != nil {
				cfg.Replica = rz // rank 0's may be replica 1, which its hello names too
			}
			j.nodes[r], errs[r] = Join(ctx, cfg)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

func (j *groupJob) leader() *Rendezvous {
	for _, rz := range j.replicas {
		if !rz.isClosed() && rz.Leads() {
			return rz
		}
	}
	return nil
}

func (r *Rendezvous) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// The launcher's replica, which leads the group, is lost (its process is
// not a rank): another replica takes over, every rank reconnects to it,
// no member is lost and the ranks go on in the same epoch, data flowing
// throughout.
func TestFailoverLeaderReplicaLost(t *testing.T) {
	j := startGroupJob(t, 4, []int{1, 2}, false)
	if j.leader() != j.replicas[0] {
		t.Fatal("replica 1 does not lead the group it started")
	}
	exchange(t, j.nodes, []int{1, 1000})
	j.replicas[0].crash()
	// The data plane does not wait for the control plane.
	exchange(t, j.nodes, []int{10, 300 << 10})
	waitLogWithin(t, j.log, 3*j.hb+5*time.Second, "rendezvous: every rank reconnected to replica")
	for r, n := range j.nodes {
		if n.ctl.group.current == 1 || n.Err() != nil || n.Epoch() != 0 {
			t.Errorf("rank %d: on replica %d, err %v, epoch %d; want another replica, no error, epoch 0", r, n.ctl.group.current, n.Err(), n.Epoch())
		}
	}
	// The new leader serves the membership: a Grow round with nobody to
	// admit comes back in the same epoch.
	views := growAll(t, j.nodes)
	for r, v := range views {
		if v.Epoch != 0 || v.Size != 4 || v.Rank != r {
			t.Errorf("rank %d after the failover: %+v, want epoch 0 of 4", r, v)
		}
	}
	exchange(t, j.nodes, []int{100})
}

// Rank 0 hosts replica 1, which leads (as under srun or on Kubernetes),
// and is killed: the group elects another leader, the survivors reconnect
// to it, rank 0 is lost, and they go on in epoch 1 without it.
func TestFailoverRankHostingLeaderKilled(t *testing.T) {
	j := startGroupJob(t, 4, []int{0, 1, 2}, false)
	j.nodes[0].crash()
	j.replicas[0].crash()
	survivors := j.nodes[1:]
	for _, n := range survivors {
		waitDone(t, n, 4*j.hb+5*time.Second, "rank 0 (", "call Reconfigure to go on in epoch 1")
	}
	views := reconfigureAll(t, survivors)
	checkViews(t, views, survivors, 1, []int{0}, nil)
	// Counted lost once the others were back, not after the new leader's
	// whole grace: it hosted the old leader. (Or by the old leader itself,
	// if rank 0's stream ended before it did.)
	if l := views[0].Lost; len(l) != 1 || !strings.Contains(l[0].Cause, "was lost with the rendezvous leader") && l[0].Cause != "disconnected" {
		t.Errorf("lost: %+v", l)
	}
	exchange(t, survivors, []int{1, 1000, 300 << 10})
	if l := j.leader(); l == nil || l == j.replicas[0] {
		t.Errorf("leader after the loss: %v", l)
	}
}

// The launcher's replica hands the lead to a rank's once the group is
// complete (as gorun's does); that rank is killed: another replica
// leads, and the others go on in epoch 1 without it.
func TestFailoverHandedOffLeaderKilled(t *testing.T) {
	j := startGroupJob(t, 4, []int{1, 2}, true)
	var victim int
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
	for r, n := range j.nodes {
		if r != victim {
			survivors = append(survivors, n)
		}
	}
	for _, n := range survivors {
		waitDone(t, n, 4*j.hb+5*time.Second, fmt.Sprintf("rank %d (", victim), "call Reconfigure to go on in epoch 1")
	}
	views := reconfigureAll(t, survivors)
	checkViews(t, views, survivors, 1, []int{victim}, nil)
	exchange(t, survivors, []int{1, 1000, 300 << 10})
	if l := j.leader(); l == nil || l == j.byRank[victim] {
		t.Errorf("leader after the loss: %v", l)
	}
}

// growAll calls Grow on every node at once.
func growAll(t *testing.T, nodes []*Node) []View {
	t.Helper()
	return onAllNodes(t, nodes, (*Node).Grow)
}

func waitLogWithin(t *testing.T, log *logRec, within time.Duration, want string) {
	t.Helper()
	eventually(t, within, fmt.Sprintf("log line %q", want), func() bool { return log.has(want) })
}

// Rank 0, hosting replica 1, is lost; a process started later to take its
// place (a pod recreated, a second srun step) is given the group as a list
// whose first entry is gone: it tries the others, a follower sends it to
// the leader, and it joins the survivors in the next epoch.
func TestFailoverJoinerFindsNewLeader(t *testing.T) {
	j := startGroupJob(t, 4, []int{0, 1, 2}, false)
	list := j.replicas[0].Addr()
	for _, r := range []int{1, 2} {
		list += fmt.Sprintf(",%d@%s", ReplicaID(r), j.byRank[r].Addr())
	}
	j.nodes[0].crash()
	j.replicas[0].crash()
	survivors := slices.Clone(j.nodes[1:])
	for _, n := range survivors {
		waitDone(t, n, 4*j.hb+5*time.Second, "rank 0 (", "call Reconfigure to go on in epoch 1")
	}
	checkViews(t, reconfigureAll(t, survivors), survivors, 1, []int{0}, nil)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type joinResult struct {
		n   *Node
		err error
	}
	joined := make(chan joinResult, 1)
	go func() {
		n, err := Join(ctx, Config{Rank: -1, JobKey: j.key, Rendezvous: list, Timeout: 20 * time.Second,
			Logf: func(f string, a ...any) { j.log.logf("joiner: "+f, a...) }, Elastic: true, HeartbeatTimeout: j.hb,
			HostID: otherHosts(4)})
		joined <- joinResult{n, err}
	}()
	eventually(t, 20*time.Second, "every survivor sees the pending joiner", func() bool {
		for _, n := range survivors {
			if n.PendingJoiners() != 1 {
				return false
			}
		}
		return true
	})
	views := growAll(t, survivors)
	res := <-joined
	if res.err != nil {
		t.Fatal(res.err)
	}
	j.nodes = append(j.nodes, res.n)  // closed by the cleanup
	jv, err := res.n.Reconfigure(ctx) // the current view
	if err != nil {
		t.Fatal(err)
	}
	all := append(survivors, res.n)
	checkViews(t, append(views, jv), all, 2, nil, []int{3})
	if cur := res.n.ctl.group.current; cur == 1 {
		t.Errorf("the joiner is on replica 1, which is gone")
	}
	exchange(t, all, []int{1, 1000, 300 << 10})
}

// groupIDs is the group as replica r knows it.
func (r *Rendezvous) groupIDs() []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.grp.replicas))
}

// A replica whose rank is lost is taken out of the group and a spare (a
// rank that hosts a replica the group did not need yet) takes its place,
// so the group survives a second loss: rank 0 with the leading replica 1
// is killed, then the rank that hosts the next leader. Without the
// replacement, one voter of three would be left, and the job would stop.
func TestFailoverReplicaReplaced(t *testing.T) {
	j := startGroupJob(t, 5, []int{0, 1, 2, 3}, false)
	spare := -1
	in := j.replicas[0].groupIDs()
	for _, r := range []int{1, 2, 3} {
		if !slices.Contains(in, ReplicaID(r)) {
			spare = r
		}
	}
	if spare < 0 {
		t.Fatalf("group %v: no spare among the replicas of ranks 1, 2 and 3", in)
	}
	j.nodes[0].crash()
	j.replicas[0].crash()
	alive := map[int]*Node{}
	for r, n := range j.nodes[1:] {
		alive[r+1] = n
	}
	survivors := slices.Collect(maps.Values(alive))
	for _, n := range survivors {
		waitDone(t, n, 4*j.hb+5*time.Second, "rank 0 (", "call Reconfigure to go on in epoch 1")
	}
	reconfigureAll(t, survivors)
	var leader *Rendezvous
	eventually(t, 10*time.Second, "the spare replaces replica 1 as a voter", func() bool {
		leader = j.leader()
		if leader == nil {
			return false
		}
		ids := leader.groupIDs()
		return leader.groupSize() == 3 && slices.Contains(ids, ReplicaID(spare)) && !slices.Contains(ids, 1)
	})
	waitLogWithin(t, j.log, time.Second, "rendezvous: replica 1 went with its process; taking it out of the group")

	// The second loss: the rank whose replica now leads.
	victim := -1
	for r, rz := range j.byRank {
		if rz == leader {
			victim = r
		}
	}
	j.nodes[victim].crash()
	j.byRank[victim].crash()
	delete(alive, victim)
	ranks := slices.Sorted(maps.Keys(alive))
	survivors = survivors[:0]
	for _, r := range ranks {
		survivors = append(survivors, alive[r])
	}
	for _, n := range survivors {
		waitDone(t, n, 4*j.hb+5*time.Second, "call Reconfigure to go on in epoch 2")
	}
	views := reconfigureAll(t, survivors)
	for i, v := range views {
		if v.Epoch != 2 || v.Size != 3 {
			t.Errorf("survivor %d (rank %d at the start): %+v, want epoch 2 of 3", i, ranks[i], v)
		}
	}
	exchange(t, survivors, []int{1, 1000, 300 << 10})
}

// Which members missing after a failover are plainly lost before the
// grace: the lost leader's process once every other rank is back; the
// ranks of its host once every rank of the other hosts is back and none
// of that host is.
func TestFailoverShortcut(t *testing.T) {
	const (
		back       = 1 << iota // reconnected
		leader                 // hosted the lost leader
		leaderHost             // on that process' host
	)
	for _, tc := range []struct {
		name  string
		ranks []int
		want  int
	}{
		{"the leader's host cut off, the others back", []int{leader | leaderHost, leaderHost, back, back}, shortcutLeaderHost},
		{"the leader's host cut off, another host not back yet", []int{leader | leaderHost, leaderHost, back, 0}, shortcutNone},
		{"the leader's process killed, its host-mate back", []int{leader | leaderHost, back | leaderHost, back, back}, shortcutLeaderProc},
		{"the leader's process killed, its host-mate not back yet", []int{leader | leaderHost, leaderHost, back, back}, shortcutLeaderHost},
		{"the leader's process killed, a host-mate back, another not", []int{leader | leaderHost, back | leaderHost, leaderHost, back}, shortcutNone},
		{"one host: the leader's process killed, the others back", []int{leader | leaderHost, back | leaderHost, back | leaderHost}, shortcutLeaderProc},
		{"one host: nobody back yet", []int{leader | leaderHost, leaderHost, leaderHost}, shortcutNone},
		{"one host: one back, one not", []int{leader | leaderHost, back | leaderHost, leaderHost}, shortcutNone},
		{"gorun's replica led: nothing known", []int{0, back, back}, shortcutNone},
	} {
		var ranks []failoverRank
		for _, r := range tc.ranks {
			ranks = append(ranks, failoverRank{back: r&back != 0, leader: r&leader != 0, leaderHost: r&leaderHost != 0})
		}
		if got := failoverShortcut(ranks); got != tc.want {
			t.Errorf("%s: shortcut %d, want %d", tc.name, got, tc.want)
		}
	}
}
