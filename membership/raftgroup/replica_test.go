package raftgroup

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/gorun/gorun/membership"
)

// A group of replicas over an in-memory network that the test controls:
// replicas can crash (they neither send nor receive) and links can be cut.
type group struct {
	t       *testing.T
	ids     []uint64
	reps    map[uint64]*Replica
	down    map[uint64]bool
	cut     map[[2]uint64]bool
	applied map[uint64][]Applied
	now     time.Time
}

var jobConfig = membership.Config{Size: 4, Heartbeat: 3 * time.Second, Elastic: true, MinSize: 2, MaxSize: 4, WaitTimeout: time.Minute}

func newGroup(t *testing.T, n int) *group {
	g := &group{t: t, reps: map[uint64]*Replica{}, down: map[uint64]bool{}, cut: map[[2]uint64]bool{},
		applied: map[uint64][]Applied{}, now: time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)}
	for i := range n {
		g.ids = append(g.ids, uint64(i+1))
	}
	for _, id := range g.ids {
		r, err := New(Config{ID: id, Peers: g.ids, Membership: jobConfig})
		if err != nil {
			t.Fatal(err)
		}
		g.reps[id] = r
	}
	return g
}

func (g *group) linked(a, b uint64) bool {
	return !g.down[a] && !g.down[b] && !g.cut[[2]uint64{min(a, b), max(a, b)}]
}

// settle delivers messages until no live replica has anything to do.
func (g *group) settle() {
	g.t.Helper()
	for range 1000 {
		var msgs []*raftpb.Message
		for _, id := range g.ids {
			r := g.reps[id]
			if g.down[id] || !r.HasReady() {
				continue
			}
			rd, err := r.Ready()
			if err != nil {
				g.t.Fatal(err)
			}
			msgs = append(msgs, rd.Messages...)
			g.applied[id] = append(g.applied[id], rd.Applied...)
		}
		if len(msgs) == 0 {
			return
		}
		for _, m := range msgs {
			if g.linked(m.GetFrom(), m.GetTo()) {
				g.reps[m.GetTo()].Step(m)
			}
		}
	}
	g.t.Fatal("the group never settled")
}

func (g *group) tick() {
	for _, id := range g.ids {
		if !g.down[id] {
			g.reps[id].Tick()
		}
	}
	g.settle()
}

// leaderAmong ticks until the replicas in ids agree on a leader among
// them, and returns it with the ticks it took.
func (g *group) leaderAmong(ids ...uint64) (uint64, int) {
	g.t.Helper()
	for n := range 200 {
		l := g.reps[ids[0]].Leader()
		agreed := l != 0 && slices.Contains(ids, l)
		for _, id := range ids {
			agreed = agreed && g.reps[id].Leader() == l
		}
		if agreed {
			return l, n
		}
		g.tick()
	}
	g.t.Fatalf("replicas %v elected no leader in 200 ticks", ids)
	return 0, 0
}

func (g *group) propose(via uint64, ev membership.Event) {
	g.t.Helper()
	g.now = g.now.Add(time.Millisecond)
	if err := g.reps[via].Propose(g.now, ev); err != nil {
		g.t.Fatalf("replica %d: propose %T: %v", via, ev, err)
	}
	g.settle()
}

// start proposes a job's start: 4 ranks register and ack.
func (g *group) start(via uint64) {
	for r := range 4 {
		g.propose(via, membership.Register{ID: membership.ID(r + 1), Rank: r, Heartbeat: 3000, Info: membership.Info{Addr: fmt.Sprintf("a%d", r)}})
	}
	for r := range 4 {
		g.propose(via, membership.Ack{ID: membership.ID(r + 1)})
	}
}

// sameLogs checks that every replica in ids applied the same events with
// the same actions, and that they are what one Machine stepping the same
// events alone gives.
func (g *group) sameLogs(ids ...uint64) {
	g.t.Helper()
	ref := membership.New(jobConfig)
	want := g.applied[ids[0]]
	for _, a := range want {
		if acts := ref.Step(a.At, a.Event); !reflect.DeepEqual(acts, a.Actions) {
			g.t.Errorf("entry %d (%T): the group's actions differ from a lone machine's", a.Index, a.Event)
		}
	}
	for _, id := range ids[1:] {
		if !reflect.DeepEqual(g.applied[id], want) {
			g.t.Errorf("replica %d applied %d entries, replica %d %d, or they differ", id, len(g.applied[id]), ids[0], len(want))
		}
	}
}

func TestGroupReplicatesMembership(t *testing.T) {
	g := newGroup(t, 3)
	leader, _ := g.leaderAmong(1, 2, 3)
	follower := g.ids[(slices.Index(g.ids, leader)+1)%3]
	g.start(follower) // a follower forwards to the leader
	g.propose(leader, membership.Disconnected{ID: 3, Timeout: true})
	g.sameLogs(1, 2, 3)
	for _, id := range g.ids {
		m := g.reps[id].Machine()
		if m.Epoch() != 1 || m.Members() != 3 || !m.Started() {
			t.Errorf("replica %d: epoch %d, %d members, want epoch 1 of 3", id, m.Epoch(), m.Members())
		}
	}
	if n := len(g.applied[1]); n != 9 {
		t.Errorf("%d entries applied, want 9", n)
	}
}

// The leader crashes: the other two elect a leader within the election
// bound, the job's membership goes on from where it was, and the crashed
// replica, back, catches up to the same log.
func TestGroupFailover(t *testing.T) {
	g := newGroup(t, 3)
	leader, _ := g.leaderAmong(1, 2, 3)
	g.start(leader)
	g.down[leader] = true
	var rest []uint64
	for _, id := range g.ids {
		if id != leader {
			rest = append(rest, id)
		}
	}
	next, ticks := g.leaderAmong(rest...)
	// Followers wait a randomized [ElectionTicks, 2×ElectionTicks) before
	// campaigning, and two that campaign at once both lose and wait again:
	// mostly one election timeout, now and then a few. Ten is a bound no
	// run comes near; the driver picks its tick so that this fits in the
	// membership's heartbeat bound.
	if ticks > 10*10 {
		t.Errorf("a new leader after %d ticks, want within 10 election timeouts", ticks)
	}
	g.propose(rest[0], membership.Disconnected{ID: 2})
	for _, id := range rest {
		if m := g.reps[id].Machine(); m.Epoch() != 1 || m.Members() != 3 {
			t.Errorf("replica %d after the failover: epoch %d, %d members", id, m.Epoch(), m.Members())
		}
	}
	g.down[leader] = false
	for range 30 {
		g.tick()
	}
	g.sameLogs(leader, rest[0], rest[1])
	t.Logf("leader %d crashed; replica %d led after %d ticks", leader, next, ticks)
}

// The leader is cut off from both others: it steps down (it no longer
// hears a majority), what it is asked to apply is never applied, the
// majority goes on, and once the cut heals every replica has the
// majority's log.
func TestGroupPartitionMinorityStops(t *testing.T) {
	g := newGroup(t, 3)
	old, _ := g.leaderAmong(1, 2, 3)
	g.start(old)
	var rest []uint64
	for _, id := range g.ids {
		if id != old {
			rest = append(rest, id)
			g.cut[[2]uint64{min(old, id), max(old, id)}] = true
		}
	}
	before := len(g.applied[old])
	g.now = g.now.Add(time.Millisecond)
	_ = g.reps[old].Propose(g.now, membership.AbortRequest{ID: 1, Text: "from the minority"})
	g.settle()
	g.leaderAmong(rest...)
	for range 30 {
		g.tick()
	}
	if l := g.reps[old].Leader(); l == old {
		t.Errorf("the cut-off replica still leads")
	}
	if len(g.applied[old]) != before {
		t.Errorf("the minority applied %d entries", len(g.applied[old])-before)
	}
	g.propose(rest[0], membership.Disconnected{ID: 4})
	clear(g.cut)
	for range 30 {
		g.tick()
	}
	g.sameLogs(rest[0], rest[1], old)
	for _, a := range g.applied[old] {
		if _, ok := a.Event.(membership.AbortRequest); ok {
			t.Error("the minority's proposal was applied")
		}
	}
	if m := g.reps[old].Machine(); m.Aborted() || m.Epoch() != 1 {
		t.Errorf("the healed replica: aborted %v, epoch %d; want the majority's epoch 1", m.Aborted(), m.Epoch())
	}
}

// A group that starts with one replica (the launcher's, or rank 0's) and
// adds the others once they are up, as learners promoted once they have
// the log: each added replica catches up to the whole log, learns every
// replica's address, and the group survives the loss of the one it
// started from.
func TestGroupGrowsFromOne(t *testing.T) {
	g := &group{t: t, reps: map[uint64]*Replica{}, down: map[uint64]bool{}, cut: map[[2]uint64]bool{},
		applied: map[uint64][]Applied{}, now: time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC), ids: []uint64{1}}
	first, err := New(Config{ID: 1, Peers: []uint64{1}, Addrs: map[uint64]string{1: "a1"}, Membership: jobConfig})
	if err != nil {
		t.Fatal(err)
	}
	g.reps[1] = first
	g.leaderAmong(1)
	g.start(1)
	for _, id := range []uint64{2, 3} {
		r, err := New(Config{ID: id, Membership: jobConfig})
		if err != nil {
			t.Fatal(err)
		}
		g.reps[id], g.ids = r, append(g.ids, id)
		if err := first.AddReplica(id, fmt.Sprintf("a%d", id)); err != nil {
			t.Fatal(err)
		}
		g.settle()
		for range 5 {
			g.tick()
		}
		// A learner first: the group's majority is still the voters'.
		if v := first.Voters(); v != len(g.ids)-1 {
			t.Fatalf("replica %d added: %d voters, want %d until it is promoted", id, v, len(g.ids)-1)
		}
		if p, err := first.PromoteCaughtUp(); err != nil || p != id {
			t.Fatalf("promote: %d, %v; want replica %d, caught up", p, err, id)
		}
		g.settle()
		if v := first.Voters(); v != len(g.ids) {
			t.Fatalf("replica %d promoted: %d voters, want %d", id, v, len(g.ids))
		}
	}
	want := map[uint64]string{1: "a1", 2: "a2", 3: "a3"}
	for _, id := range g.ids {
		if got := g.reps[id].Replicas(); !reflect.DeepEqual(got, want) {
			t.Errorf("replica %d knows the group as %v, want %v", id, got, want)
		}
		if m := g.reps[id].Machine(); !m.Started() || m.Members() != 4 || !m.Established() {
			t.Errorf("replica %d: started %v, %d members, established %v; want the running job of 4", id, m.Started(), m.Members(), m.Established())
		}
	}
	g.down[1] = true
	g.leaderAmong(2, 3)
	g.propose(2, membership.Disconnected{ID: 1, Timeout: true})
	for _, id := range []uint64{2, 3} {
		if m := g.reps[id].Machine(); m.Epoch() != 1 || m.Members() != 3 {
			t.Errorf("replica %d after losing replica 1: epoch %d, %d members; want epoch 1 of 3", id, m.Epoch(), m.Members())
		}
	}
}
