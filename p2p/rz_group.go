package p2p

// A replicated rendezvous: the job's membership survives the loss of the
// process (or host) that leads it.
//
// A few Rendezvous, the group's replicas, keep the same membership.Machine
// through raft (membership/raftgroup): every event the leader hears from
// the ranks is proposed, and each replica Steps its Machine once the group
// committed it, so all hold the same membership. Only the leader has the
// ranks' control streams and carries out the Machine's actions (messages,
// timers, the abort); a follower only applies the log, and says what
// happens if it reports (the launcher's replica, whose callbacks the
// launcher reads).
//
// The group starts from one replica (ID 1: the launcher's, or rank 0's
// under a batch system) and grows to GroupConfig.Size as ranks that host
// a replica register: their hello names it, the log keeps it with their
// membership, and the leader adds it to the group. The ranks learn every replica's address from the welcome and the
// pings.
//
// When the leader is lost, its control streams end; the others elect a
// new leader within the heartbeat bound, and every rank reconnects to it
// (a follower it reaches redirects it) and resumes its place: the new
// leader tells it again what it may have missed (Machine.Resync), and the
// rank sends again what the old leader may not have taken. The data plane
// does not wait for any of this, so a leader change alone costs no step.
// A rank that has not come back twice the heartbeat bound after the new
// leader took over is lost, as any rank whose control stream ends; the
// ranks of the old leader's host sooner, once every other rank is back
// (lostAfterFailover).
//
// A replica whose process the membership counts as gone is taken out of
// the group, and a spare (a process that hosts a replica the group did
// not need) takes its place (changeGroupLocked): the group survives as
// many successive losses as it has spares, not only its minority.
//
// Only a majority of the group can commit: a replica cut off with a
// minority stops leading (raft's CheckQuorum), drops its ranks' streams,
// and those ranks, reaching no leader, stop as cut off.

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"crypto/hkdf"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/protocol"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/gorun/gorun/membership"
	"github.com/gorun/gorun/membership/etcdlog"
	"github.com/gorun/gorun/membership/raftgroup"
)

const raftProto protocol.ID = "/gorun/raft/1"

// GroupConfig makes a Rendezvous one replica of a replicated group.
type GroupConfig struct {
	// ID is this replica's id: 1 for the replica the group starts from,
	// ReplicaID(rank) for one a rank hosts.
	ID uint64
	// Size is how many replicas the group grows to (3, or 5 to survive
	// two losses); 0 = 3. Only the first replica's counts.
	Size int
	// Advertise is the "host:port" the other replicas and the ranks reach
	// this one at; "" = the listen address.
	Advertise string
	// Reports: this replica logs the membership's lines and calls the
	// RendezvousConfig callbacks even when it does not lead (the
	// launcher's). Otherwise only the leader logs.
	Reports bool
	// HandOff: once the group has Size voters, this replica hands the
	// lead to another (the launcher's does: the ranks' control streams
	// then stay among the ranks' hosts, and a launcher that is paused, or
	// on a busy login node, costs the job nothing).
	HandOff bool
	// Spare: this replica takes the place of a lost one rather than
	// complete the group at the start (its rank was picked as a spare):
	// the group grows with the others first, so that the launcher's
	// placement of the voters across hosts holds.
	Spare bool
	// Etcd, if set, keeps the group's log and election in etcd instead of
	// raft among the replicas (rz_group_etcd.go).
	Etcd *EtcdGroup
}

// ReplicaID is the group id of the replica that rank hosts.
func ReplicaID(rank int) uint64 { return uint64(rank) + 2 }

// maxRaftFrame bounds one raft message on the wire (raftgroup sends at
// most 1 MiB of entries at a time).
const maxRaftFrame = 8 << 20

// groupState is a Rendezvous' part in the group.
type groupState struct {
	cfg     GroupConfig
	rep     groupLog           // under Rendezvous.mu
	raft    *raftgroup.Replica // rep with raft; nil with etcd
	etcd    *etcdlog.Log       // rep with etcd; nil with raft
	tick    time.Duration
	recv    chan *raftpb.Message
	unreach chan uint64
	kick    chan struct{}

	// Under Rendezvous.mu.
	leading    bool
	leadTerm   int    // counts this replica's terms as leader
	nextID     int    // the last membership id this replica gave out
	confBusy   bool   // a group change is proposed and not applied yet
	told       string // the group as last logged
	handedOff  bool   // HandOff was done
	handedTo   uint64 // the replica this one last handed the lead to
	lastLeader uint64 // the leader as last logged
	prevLeader uint64 // the leader before lastLeader (0: none)
	// rejoined is closed (and replaced) when a rank reconnects to this
	// replica.
	rejoined chan struct{}
	// leadCh is closed (and replaced) when this replica gains or loses
	// the lead.
	leadCh    chan struct{}
	replicas  map[uint64]string
	peerIDs   map[uint64]peer.ID
	jobKey    []byte
	peersMu   sync.Mutex
	peers     map[uint64]*raftPeer // under peersMu
	inboundMu sync.Mutex
	inbound   map[network.Stream]bool
}

// replicaIdentity is replica id's libp2p key, derived from the job key as
// the lone rendezvous' is (replica 1 has that one): a rank knows every
// replica's peer ID from the key alone, and TLS proves it.
func replicaIdentity(jobKey []byte, id uint64) (crypto.PrivKey, peer.ID, error) {
	if id <= 1 {
		return rendezvousIdentity(jobKey)
	}
	seed, err := hkdf.Key(sha256.New, jobKey, nil, "gorun rendezvous replica "+strconv.FormatUint(id, 10)+" ed25519 identity v1", ed25519.SeedSize)
	if err != nil {
		return nil, "", err
	}
	sk, err := crypto.UnmarshalEd25519PrivateKey(ed25519.NewKeyFromSeed(seed))
	if err != nil {
		return nil, "", err
	}
	pid, err := peer.IDFromPrivateKey(sk)
	return sk, pid, err
}

// startGroup makes r a replica (StartRendezvous, before the stream
// handlers are set).
func (r *Rendezvous) startGroup() error {
	gc := *r.cfg.Group
	if gc.Size <= 0 {
		gc.Size = 3
	}
	if gc.Advertise == "" {
		gc.Advertise = r.addr
	}
	// A tick of a twentieth of the heartbeat bound, an election after
	// 10–20 ticks without the leader: a new leader within the bound, and
	// a leader that a loaded host holds up for less than half of it keeps
	// the lead (as a rank is lost only after the whole bound).
	g := &groupState{cfg: gc, tick: max(r.hb/20, 5*time.Millisecond),
		recv: make(chan *raftpb.Message, 256), unreach: make(chan uint64, 16), kick: make(chan struct{}, 1),
		replicas: map[uint64]string{}, peerIDs: map[uint64]peer.ID{}, jobKey: r.cfg.JobKey,
		peers: map[uint64]*raftPeer{}, inbound: map[network.Stream]bool{}, leadCh: make(chan struct{}),
		rejoined: make(chan struct{})}
	if gc.Etcd != nil {
		return r.startEtcdGroup(g)
	}
	rc := raftgroup.Config{ID: gc.ID, ElectionTicks: 10, HeartbeatTicks: 1, Membership: r.machineConfig()}
	if gc.ID == 1 {
		rc.Peers, rc.Addrs = []uint64{1}, map[uint64]string{1: gc.Advertise}
	}
	rep, err := raftgroup.New(rc)
	if err != nil {
		return err
	}
	r.cfg.Logf = r.asyncLogf(r.cfg.Logf)
	g.rep, g.raft = rep, rep
	r.grp = g
	r.m = rep.Machine()
	if gc.ID == 1 {
		// Alone in its group at first: it leads at once, before the
		// first hello, instead of after an election timeout.
		if err := rep.Campaign(); err != nil {
			return err
		}
		if err := r.groupReady(); err != nil {
			return err
		}
	}
	r.h.SetStreamHandler(raftProto, r.handleRaft)
	r.wg.Add(1)
	go r.raftLoop()
	return nil
}

// kickGroup wakes the raft loop after a proposal.
func (g *groupState) kickGroup() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// propose asks the group to apply ev; only the leader proposes (a
// follower has no ranks' streams, and what a deposed leader still hears
// must not reach the log through the new one). The caller holds mu.
func (r *Rendezvous) proposeLocked(ev membership.Event) bool {
	g := r.grp
	if !g.leading {
		return false
	}
	if err := g.rep.Propose(time.Now(), ev); err != nil {
		r.cfg.Logf("rendezvous: replica %d could not propose %T: %v", g.cfg.ID, ev, err)
		return false
	}
	g.kickGroup()
	return true
}

// raftLoop drives the replica: ticks, messages from the other replicas,
// and what raft asks for after each.
func (r *Rendezvous) raftLoop() {
	defer r.wg.Done()
	g := r.grp
	t := time.NewTicker(g.tick)
	defer t.Stop()
	for {
		select {
		case <-r.closeCh:
			return
		case <-t.C:
			r.mu.Lock()
			g.raft.Tick()
			r.mu.Unlock()
		case m := <-g.recv:
			r.mu.Lock()
			_ = g.raft.Step(m) // a stale or foreign-term message is raft's to ignore
			r.mu.Unlock()
		case id := <-g.unreach:
			r.mu.Lock()
			g.raft.ReportUnreachable(id)
			r.mu.Unlock()
		case <-g.kick:
		}
		if err := r.groupReady(); err != nil {
			r.cfg.Logf("rendezvous: replica %d: %v", g.cfg.ID, err)
			return
		}
	}
}

// groupReady carries out what the replica's Ready asks: raft messages
// out, and the applied events' actions (all of them on the leader, only
// the reports elsewhere), in log order.
func (r *Rendezvous) groupReady() error {
	g := r.grp
	r.relayMu.Lock()
	defer r.relayMu.Unlock()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	rd, err := g.rep.Ready()
	if err != nil {
		r.mu.Unlock()
		return err
	}
	was := g.leading
	g.leading = rd.Leader
	if was != rd.Leader {
		close(g.leadCh)
		g.leadCh = make(chan struct{})
	}
	leader := g.rep.Leader()
	newLeader := leader != 0 && leader != g.lastLeader
	if newLeader {
		g.prevLeader, g.lastLeader = g.lastLeader, leader
	}
	if rd.GroupChanged {
		g.confBusy = false
		g.replicas = g.rep.Replicas()
	}
	replicas := maps.Clone(g.replicas)
	r.mu.Unlock()
	for _, m := range rd.Messages {
		r.sendRaft(m, replicas)
	}
	if newLeader && (rd.Leader || g.cfg.Reports) {
		r.cfg.Logf("rendezvous: replica %d leads the group", leader)
	}
	if rd.Leader && !was {
		r.becameLeader()
	} else if !rd.Leader && was {
		r.steppedDown()
	}
	for _, a := range rd.Applied {
		if rd.Leader {
			r.do(a.Actions)
		} else {
			r.report(a.Actions)
		}
	}
	if rd.GroupChanged && rd.Leader {
		// Every rank must know the group before the leader can be lost:
		// tell them now rather than at the next ping.
		r.mu.Lock()
		missing, epoch, pending := r.m.Ping()
		ping := &msg{T: tPing, Missing: missing, Epoch: epoch, Pending: pending, Group: r.groupItemsLocked()}
		conns := r.connsLocked()
		r.mu.Unlock()
		r.broadcast(conns, ping)
	}
	if rd.GroupChanged && (rd.Leader || g.cfg.Reports) {
		r.mu.Lock()
		voters := g.rep.Voters()
		r.mu.Unlock()
		if text := fmt.Sprintf("%d of %d replicas vote: %s", voters, len(replicas), groupText(replicas)); text != g.told {
			g.told = text
			r.cfg.Logf("rendezvous: the group has %s", text)
		}
	}
	if rd.Leader {
		r.mu.Lock()
		r.changeGroupLocked()
		to := r.handOffLocked()
		r.mu.Unlock()
		if to != 0 {
			r.cfg.Logf("rendezvous: replica %d hands the lead to replica %d", g.cfg.ID, to)
		}
	}
	return nil
}

// handOffLocked hands the lead to another voter, once, when HandOff asks
// for it and the group is complete; it returns that voter (0: none).
func (r *Rendezvous) handOffLocked() uint64 {
	g := r.grp
	// Not before the job's first epoch is established: the ranks that
	// are still registering would have to follow it.
	if !g.cfg.HandOff || g.handedOff || g.confBusy || g.rep.Voters() < g.cfg.Size || !r.m.Established() {
		return 0
	}
	for _, id := range g.rep.VoterIDs() {
		if id != g.cfg.ID {
			g.handedOff, g.handedTo = true, id
			g.rep.TransferLeader(id)
			g.kickGroup()
			return id
		}
	}
	return 0
}

// CloseNow closes a replica whose process leaves the job while the job
// goes on (a rank that departs, or was dropped): if it leads, it hands the
// lead to another voter first (waiting at most the heartbeat bound), so
// the ranks reconnect at once rather than after an election; it does not
// wait for the ranks to leave, as Close does. A lone rendezvous just
// closes.
func (r *Rendezvous) CloseNow() error {
	if g := r.grp; g != nil {
		r.mu.Lock()
		var to uint64
		changed := g.leadCh
		if g.leading && !r.closed {
			for _, id := range g.rep.VoterIDs() {
				if id != g.cfg.ID {
					to = id
					break
				}
			}
			if to != 0 {
				g.handedTo = to
				g.rep.TransferLeader(to)
				g.kickGroup()
			}
		}
		r.mu.Unlock()
		if to != 0 {
			t := time.NewTimer(r.hb)
			select {
			case <-changed:
			case <-t.C:
			case <-r.closeCh:
			}
			t.Stop()
		}
	}
	var err error
	r.closeOnce.Do(func() { err = r.teardown() })
	return err
}

func groupText(replicas map[uint64]string) string {
	ids := slices.Sorted(maps.Keys(replicas))
	s := ""
	for i, id := range ids {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%d at %s", id, replicas[id])
	}
	return s
}

// report carries out, on a follower, the actions that are the replica's
// own: the log lines if it reports, and the launcher's callbacks.
func (r *Rendezvous) report(acts []membership.Action) {
	for _, a := range acts {
		switch a := a.(type) {
		case membership.Log:
			if r.grp.cfg.Reports {
				r.cfg.Logf("%s", a.Text)
			}
		case membership.ProcEvent:
			if r.cfg.OnProc != nil {
				r.cfg.OnProc(ProcEvent{Kind: ProcEventKind(a.Kind), Member: memberOf(a.Rank, a.Info), Cause: a.Cause,
					AfterLeave: a.AfterLeave, Members: a.Members})
			}
		case membership.Abort:
			if r.cfg.OnAbort != nil {
				r.cfg.OnAbort(Abort{Cause: a.Cause, Unresponsive: a.Unresponsive, Rank: a.Rank, Addr: a.Addr, Why: a.Why})
			}
			r.abortDone.Do(func() { close(r.abortDelivered) })
		default:
			r.doLocal(a)
		}
	}
}

// becameLeader takes up the leader's duties: the timers the membership is
// in (a wait below the minimum size), and the loss of the members that do
// not reconnect (lostAfterFailover).
// The caller holds relayMu.
func (r *Rendezvous) becameLeader() {
	g := r.grp
	r.mu.Lock()
	g.leadTerm++
	term := g.leadTerm
	since, waiting := r.m.WaitingSince()
	idle := !r.m.Started() && r.m.Registered() == 0
	r.mu.Unlock()
	if waiting {
		r.afterWaiting(since)
	}
	if idle {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.wg.Add(1) // under mu and !closed: never races with Close's Wait
	go func() {
		defer r.wg.Done()
		r.lostAfterFailover(term)
	}()
}

// lostAfterFailover counts as lost, for the new leader of term term, the
// members that do not reconnect. A rank notices its leader's silence
// within the heartbeat bound, and may have to try every replica: it has
// twice the bound after the election, unless failoverShortcut says its
// loss is plain sooner: then an eighth of the bound more (a rank that is
// alive notices the silence as soon as the others), so that losing the
// leader's process or host costs about what losing any other costs, one
// heartbeat bound.
func (r *Rendezvous) lostAfterFailover(term int) {
	g := r.grp
	grace := 2 * r.hb
	r.mu.Lock()
	leaderProc, suspect := r.leaderProcLocked(g.prevLeader)
	r.mu.Unlock()
	start := time.Now()
	shortAt := time.Time{} // when failoverShortcut first held
	for {
		r.mu.Lock()
		if r.closed || !g.leading || g.leadTerm != term {
			r.mu.Unlock()
			return
		}
		var missing []membership.ID
		var ranks []failoverRank
		for _, id := range r.m.Conns() {
			info, _ := r.m.Info(id)
			back := r.conns[id] != nil
			if !back {
				missing = append(missing, id)
			}
			ranks = append(ranks, failoverRank{back: back, leader: leaderProc != 0 && id == leaderProc, leaderHost: suspect != "" && info.Host == suspect})
		}
		rejoined := g.rejoined
		if len(missing) == 0 {
			r.mu.Unlock()
			r.cfg.Logf("rendezvous: every rank reconnected to replica %d", g.cfg.ID)
			return
		}
		why := failoverShortcut(ranks)
		switch {
		case why == shortcutNone:
			shortAt = time.Time{}
		case shortAt.IsZero():
			shortAt = time.Now()
		}
		deadline := start.Add(grace)
		if !shortAt.IsZero() {
			deadline = shortAt.Add(r.hb / 8)
		}
		if !time.Now().Before(deadline) {
			ranks := make([]int, 0, len(missing))
			for _, id := range missing {
				ranks = append(ranks, r.m.Rank(id))
				why, cause := failoverLossReason(why, grace, hostOf(r.m, id))
				r.proposeLocked(membership.Disconnected{ID: id, Timeout: true, Err: why, Cause: cause})
			}
			r.mu.Unlock()
			r.cfg.Logf("rendezvous: ranks %v did not reconnect to replica %d", ranks, g.cfg.ID)
			return
		}
		r.mu.Unlock()
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-r.closeCh:
			t.Stop()
			return
		case <-rejoined:
		case <-t.C:
		}
		t.Stop()
	}
}

// failoverRank is a member as a new leader sees it: back (reconnected),
// the process that hosted the lost leader, on that process' host.
type failoverRank struct{ back, leader, leaderHost bool }

// Why the ranks still missing after a failover are plainly lost.
const (
	shortcutNone       = iota
	shortcutLeaderProc // only the lost leader's process is missing
	shortcutLeaderHost // only ranks of the lost leader's host are, none of them back
)

// failoverShortcut says whether the members still missing after a
// failover are plainly lost (and why), before the grace the others get:
//   - only the lost leader's own process is missing, and another rank is
//     back: the replica went with it, so it died or is cut off;
//   - only ranks of the lost leader's host are missing, none of them is
//     back, and a rank of another host is: the host went (its link, its
//     node). If one of them is back, the host lives, and the others of it
//     get the whole grace; on one host, every rank is on the leader's.
func failoverShortcut(ranks []failoverRank) int {
	leaderOnly, hostOnly, anyBack, hostBack, otherBack := true, true, false, false, false
	for _, r := range ranks {
		switch {
		case r.back:
			anyBack = true
			hostBack = hostBack || r.leaderHost
			otherBack = otherBack || !r.leaderHost
		case r.leader:
			hostOnly = hostOnly && r.leaderHost
		default:
			leaderOnly = false
			hostOnly = hostOnly && r.leaderHost
		}
	}
	switch {
	case leaderOnly && anyBack:
		return shortcutLeaderProc
	case hostOnly && !hostBack && otherBack:
		return shortcutLeaderHost
	}
	return shortcutNone
}

// failoverLossReason says why a rank missing after a failover is counted
// lost, for its error and its cause, by the shortcut taken.
func failoverLossReason(shortcut int, grace time.Duration, host string) (why, cause string) {
	switch shortcut {
	case shortcutLeaderProc:
		return "it did not reconnect to the new rendezvous leader, and its process hosted the lost one",
			"stopped responding: its process was lost with the rendezvous leader it hosted"
	case shortcutLeaderHost:
		return fmt.Sprintf("it did not reconnect to the new rendezvous leader, and the old leader's host (%s) is lost", host),
			fmt.Sprintf("stopped responding: its host (%s) was lost with the rendezvous leader", host)
	}
	return fmt.Sprintf("it did not reconnect to the new rendezvous leader within %v", grace),
		fmt.Sprintf("stopped responding: it did not reconnect to the rendezvous within %v of its leader's loss", grace)
}

// leaderProcLocked is the member that hosted replica id, and its host (0
// and "" if none did: gorun's replica, or one that is not known).
func (r *Rendezvous) leaderProcLocked(id uint64) (membership.ID, string) {
	if id == 0 {
		return 0, ""
	}
	for _, mid := range r.m.Conns() {
		if info, ok := r.m.Info(mid); ok && info.Replica == id {
			return mid, info.Host
		}
	}
	return 0, ""
}

// hostOf names member id's host for messages.
func hostOf(m *membership.Machine, id membership.ID) string {
	info, _ := m.Info(id)
	return cmp.Or(info.HostName, info.Host)
}

// steppedDown drops the ranks' streams: they reconnect to the new leader.
// The caller holds relayMu.
func (r *Rendezvous) steppedDown() {
	r.mu.Lock()
	conns := slices.Collect(maps.Values(r.conns))
	clear(r.conns)
	leader := r.leaderLocked()
	if leader == 0 || leader == r.grp.cfg.ID {
		leader = r.grp.handedTo // a hand-over under way: the leader-to-be
	}
	redirect := &msg{T: tRedirect, Seq: leader, Group: r.groupItemsLocked()}
	r.mu.Unlock()
	r.cfg.Logf("rendezvous: replica %d no longer leads the group; its ranks reconnect to the leader", r.grp.cfg.ID)
	// Where the lead went, if this replica knows (it handed it over): the
	// ranks go there at once instead of searching.
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Closed for writing, not reset: a reset would drop the
			// redirect before the rank read it. The rank ends the stream
			// once it has; its reader here then ends (bounded by the
			// heartbeat deadline).
			if c.send(redirect, r.hb/4) != nil {
				c.s.Reset()
				return
			}
			c.s.CloseWrite()
		}()
	}
	wg.Wait()
}

// changeGroupLocked makes the next change the group needs, one at a time
// (raft takes one at a time): it takes out a replica whose process the
// membership counts as gone, makes a voter of a learner that caught up,
// or adds (as a learner) a replica that a process of the job hosts, until
// the group has its size. The membership says which process hosts which
// replica (its hello offered it), so a new leader knows as much as the old
// one; a replica on a host with fewer comes first, so that losing a host
// takes as few replicas as possible.
func (r *Rendezvous) changeGroupLocked() {
	g := r.grp
	if g.raft == nil {
		return // etcd: every replica registers itself
	}
	if g.confBusy {
		return
	}
	hosted := r.m.HostedReplicas()
	for _, h := range hosted {
		if _, in := g.replicas[h.ID]; in && h.Gone && h.ID != g.cfg.ID {
			if err := g.raft.RemoveReplica(h.ID); err != nil {
				r.cfg.Logf("rendezvous: could not take replica %d out of the group: %v", h.ID, err)
				return
			}
			r.cfg.Logf("rendezvous: replica %d went with its process; taking it out of the group", h.ID)
			g.confBusy = true
			g.kickGroup()
			return
		}
	}
	if id, err := g.raft.PromoteCaughtUp(); err != nil {
		r.cfg.Logf("rendezvous: could not promote replica %d: %v", id, err)
		return
	} else if id != 0 {
		g.confBusy = true
		g.kickGroup()
		return
	}
	if len(g.replicas) >= g.cfg.Size {
		return
	}
	perHost := map[string]int{}
	ownHost := ""
	for _, h := range hosted {
		if _, in := g.replicas[h.ID]; in {
			perHost[h.Host]++
		}
		if h.ID == g.cfg.ID {
			ownHost = h.Host
		}
	}
	// A replica picked to complete the group before a spare; then the
	// candidate on the host with the fewest replicas; between equals,
	// one away from this leader's host (the group grows from replica 1,
	// rank 0's under srun: with two nodes, the other node takes two, so
	// that losing rank 0's node leaves a majority), then the lowest id.
	better := func(a, b *membership.HostedReplica) bool {
		if a.Spare != b.Spare {
			return b.Spare
		}
		if perHost[a.Host] != perHost[b.Host] {
			return perHost[a.Host] < perHost[b.Host]
		}
		if (a.Host == ownHost) != (b.Host == ownHost) {
			return b.Host == ownHost
		}
		return a.ID < b.ID
	}
	// Spares wait for the start: by then every replica picked for the
	// group has registered, and the spares only fill what is missing.
	started := r.m.Started()
	var pick *membership.HostedReplica
	for _, h := range hosted {
		if _, in := g.replicas[h.ID]; in || !h.Live || h.Addr == "" || h.ID <= 1 || h.Spare && !started {
			continue
		}
		if pick == nil || better(&h, pick) {
			pick = &h
		}
	}
	if pick == nil {
		return
	}
	if err := g.raft.AddReplica(pick.ID, pick.Addr); err != nil {
		r.cfg.Logf("rendezvous: could not add replica %d at %s: %v", pick.ID, pick.Addr, err)
		return
	}
	g.confBusy = true
	g.kickGroup()
}

// groupItemsLocked is the group as a welcome or a ping gives it.
func (r *Rendezvous) groupItemsLocked() []groupItem {
	g := r.grp
	out := make([]groupItem, 0, len(g.replicas))
	for _, id := range slices.Sorted(maps.Keys(g.replicas)) {
		out = append(out, groupItem{ID: id, Addr: g.replicas[id]})
	}
	return out
}

// leaderLocked returns the leader's id as this replica knows it (0:
// none).
func (r *Rendezvous) leaderLocked() uint64 { return r.grp.rep.Leader() }

// Leads says whether this replica leads its group (true for a lone
// rendezvous).
func (r *Rendezvous) Leads() bool {
	if r.grp == nil {
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.grp.leading
}

// registerReplicated proposes c's registration and waits until the group
// applied it (the welcome, or why it is refused, went out then).
func (r *Rendezvous) registerReplicated(c *rzConn, reg membership.Register, welcome *msg) (refused string, err error) {
	g := r.grp
	c.registered = make(chan struct{})
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return "rendezvous closed", nil
	}
	g.nextID++
	c.mid = membership.ID(int(g.cfg.ID)<<32 | g.nextID)
	reg.ID = c.mid
	welcome.MID = int64(c.mid)
	welcome.Group = r.groupItemsLocked()
	c.welcome = welcome
	r.conns[c.mid] = c
	ok := r.proposeLocked(reg)
	r.mu.Unlock()
	if !ok {
		return "", errors.New("this replica no longer leads the rendezvous group")
	}
	t := time.NewTimer(r.hb)
	defer t.Stop()
	select {
	case <-c.registered:
		return c.refused, c.welcomeErr
	case <-t.C:
		err = fmt.Errorf("the rendezvous group did not take the registration within %v (no majority of its replicas reachable?)", r.hb)
	case <-r.closeCh:
		err = errors.New("rendezvous closed")
	}
	r.mu.Lock()
	if r.conns[c.mid] == c {
		delete(r.conns, c.mid)
	}
	r.mu.Unlock()
	return "", err
}

// resume binds c, a rank that reconnected after the leader changed, to
// the membership id it had, and tells it again what it may have missed. It
// returns why c can not resume ("" if it did).
func (r *Rendezvous) resume(c *rzConn, mid membership.ID, remote peer.ID, welcome *msg) string {
	r.relayMu.Lock()
	defer r.relayMu.Unlock()
	r.mu.Lock()
	if r.closed || r.grp == nil || !r.grp.leading {
		r.mu.Unlock()
		return errNotLeading
	}
	info, known := r.m.Info(mid)
	if !known || info.PeerID != remote.String() {
		r.mu.Unlock()
		return "the rendezvous does not know this process"
	}
	msgs, refused := r.m.Resync(mid)
	if refused != "" {
		r.mu.Unlock()
		return refused
	}
	old := r.conns[mid]
	c.mid = mid
	r.conns[mid] = c
	close(r.grp.rejoined)
	r.grp.rejoined = make(chan struct{})
	welcome.MID = int64(mid)
	welcome.Group = r.groupItemsLocked()
	wire := make([]*msg, 0, len(msgs))
	for _, m := range msgs {
		wire = append(wire, r.wireLocked(m))
	}
	rank := r.m.Rank(mid)
	r.mu.Unlock()
	if old != nil && old != c {
		old.s.Reset()
	}
	c.wmu.Lock()
	err := c.sendLocked(welcome, r.hb)
	for _, m := range wire {
		if err == nil {
			err = c.sendLocked(m, r.hb)
		}
	}
	c.wmu.Unlock()
	if err != nil {
		return "" // its reader reports the broken stream
	}
	r.cfg.Logf("rendezvous: rank %d reconnected to replica %d", rank, r.grp.cfg.ID)
	return ""
}

// redirect tells a rank that reached a follower where the leader is.
func (r *Rendezvous) redirect(c *rzConn) {
	r.mu.Lock()
	leader := r.leaderLocked()
	group := r.groupItemsLocked()
	r.mu.Unlock()
	c.send(&msg{T: tRedirect, Seq: leader, Group: group}, r.hb)
}

// raftPeer is the outgoing side of this replica's link with another.
type raftPeer struct {
	id   uint64
	addr string
	q    chan []byte
}

// sendRaft queues m for its replica; raft takes a lost message as it
// takes a lossy network, so a full queue drops it.
func (r *Rendezvous) sendRaft(m *raftpb.Message, replicas map[uint64]string) {
	g := r.grp
	// A replica that joined has not applied the entries that give the
	// others' addresses before it must answer: it answers on the
	// connection the leader opened (an empty address: the existing
	// connection only).
	to := m.GetTo()
	addr := replicas[to]
	b, err := proto.Marshal(m)
	if err != nil {
		return
	}
	g.peersMu.Lock()
	p := g.peers[to]
	if p == nil || p.addr != addr {
		p = &raftPeer{id: to, addr: addr, q: make(chan []byte, 256)}
		g.peers[to] = p
		r.mu.Lock()
		run := !r.closed
		if run {
			r.wg.Add(1) // under mu and !closed: never races with Close's Wait
		}
		r.mu.Unlock()
		if run {
			go r.raftSender(p)
		}
	}
	g.peersMu.Unlock()
	select {
	case p.q <- b:
	default:
	}
}

// raftSender writes the queued messages to replica p over one stream,
// dialling it again after a failure (what was queued meanwhile is
// dropped, and the replica reported unreachable).
func (r *Rendezvous) raftSender(p *raftPeer) {
	defer r.wg.Done()
	g := r.grp
	var s network.Stream
	defer func() {
		if s != nil {
			s.Reset()
		}
	}()
	var failedAt time.Time
	for {
		var b []byte
		select {
		case <-r.closeCh:
			return
		case b = <-p.q:
		}
		g.peersMu.Lock()
		current := g.peers[p.id] == p
		g.peersMu.Unlock()
		if !current {
			return // the replica moved; a new sender has its address
		}
		if s == nil {
			if time.Since(failedAt) < g.tick {
				continue // do not dial for every message while it is down
			}
			var err error
			if s, err = r.dialReplica(p); err != nil {
				failedAt = time.Now()
				r.unreachable(p.id)
				continue
			}
		}
		_ = s.SetWriteDeadline(time.Now().Add(r.hb))
		var hdr [4]byte
		binary.BigEndian.PutUint32(hdr[:], uint32(len(b)))
		if _, err := s.Write(append(hdr[:], b...)); err != nil {
			s.Reset()
			s, failedAt = nil, time.Now()
			r.unreachable(p.id)
		}
	}
}

func (r *Rendezvous) unreachable(id uint64) {
	select {
	case r.grp.unreach <- id:
	default:
	}
}

func (r *Rendezvous) dialReplica(p *raftPeer) (network.Stream, error) {
	g := r.grp
	pid, err := g.peerID(p.id)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.hb/2)
	defer cancel()
	if p.addr == "" {
		return r.hosts.newStream(ctx, r.h, pid, raftProto)
	}
	addrs, err := resolveHostPort(ctx, p.addr)
	if err != nil {
		return nil, err
	}
	r.h.Peerstore().AddAddrs(pid, addrs, peerstore.PermanentAddrTTL)
	return r.hosts.newStream(network.WithForceDirectDial(ctx, "gorun raft"), r.h, pid, raftProto)
}

// peerID is replica id's peer ID (derived from the job key).
func (g *groupState) peerID(id uint64) (peer.ID, error) {
	g.peersMu.Lock()
	defer g.peersMu.Unlock()
	if pid, ok := g.peerIDs[id]; ok {
		return pid, nil
	}
	_, pid, err := replicaIdentity(g.jobKey, id)
	if err == nil {
		g.peerIDs[id] = pid
	}
	return pid, err
}

// handleRaft reads another replica's messages; each must come from the
// replica it names (its peer ID, derived from the job key, proves it).
func (r *Rendezvous) handleRaft(s network.Stream) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		s.Reset()
		return
	}
	r.wg.Add(1) // under mu and !closed: never races with Close's Wait
	r.mu.Unlock()
	defer r.wg.Done()
	defer s.Reset()
	g := r.grp
	g.inboundMu.Lock()
	g.inbound[s] = true
	g.inboundMu.Unlock()
	defer func() {
		g.inboundMu.Lock()
		delete(g.inbound, s)
		g.inboundMu.Unlock()
	}()
	remote := s.Conn().RemotePeer()
	var hdr [4]byte
	for {
		// The leader speaks every tick; a follower that is silent for long
		// is only a follower with nothing to say: the deadline only bounds
		// a stream whose sender is gone without a reset.
		_ = s.SetReadDeadline(time.Now().Add(10 * r.hb))
		if _, err := io.ReadFull(s, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n > maxRaftFrame {
			r.cfg.Logf("rendezvous: replica %s sent a raft frame of %d bytes; dropping its stream", remote, n)
			return
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(s, b); err != nil {
			return
		}
		m := &raftpb.Message{}
		if err := proto.Unmarshal(b, m); err != nil {
			r.cfg.Logf("rendezvous: bad raft message from %s: %v", remote, err)
			return
		}
		if pid, err := g.peerID(m.GetFrom()); err != nil || pid != remote {
			r.cfg.Logf("rendezvous: peer %s sent a raft message as replica %d; dropping its stream", remote, m.GetFrom())
			return
		}
		select {
		case g.recv <- m:
		case <-r.closeCh:
			return
		}
	}
}

// closeGroup ends the replica's streams (Close).
func (r *Rendezvous) closeGroup() {
	g := r.grp
	g.inboundMu.Lock()
	for s := range g.inbound {
		s.Reset()
	}
	g.inboundMu.Unlock()
	if g.etcd != nil {
		// Its keys go at once: another replica leads without waiting
		// for the session to expire.
		if err := g.etcd.Close(); err != nil {
			r.cfg.Logf("rendezvous: replica %d could not end its etcd session: %v", g.cfg.ID, err)
		}
	}
}

// contact is a rank's table entry as the membership keeps it
// (Info.Contact): the log carries it, since every replica may have to send
// the tables.
func contact(it tableItem) string {
	b, _ := json.Marshal(it)
	return string(b)
}

func itemOf(info membership.Info) tableItem {
	var it tableItem
	_ = json.Unmarshal([]byte(info.Contact), &it) // written by contact
	return it
}

// groupSize is how many replicas count in the majority, as this one
// knows.
func (r *Rendezvous) groupSize() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.grp.rep.Voters()
}

// asyncLogf writes a replica's log lines on a goroutine of their own: the
// raft loop logs with its locks held, and a rank's output may be stuck (an
// ssh session whose link is cut holds its pipe full) while the group must
// go on, or step down. Lines that find the queue full are dropped, and
// counted in the next line that gets through.
func (r *Rendezvous) asyncLogf(logf func(string, ...any)) func(string, ...any) {
	lines := make(chan string, 256)
	var dropped atomic.Int64
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			select {
			case l := <-lines:
				if n := dropped.Swap(0); n > 0 {
					l += fmt.Sprintf(" (%d earlier lines dropped: the output was stuck)", n)
				}
				logf("%s", l)
			case <-r.closeCh:
				return
			}
		}
	}()
	return func(format string, args ...any) {
		select {
		case lines <- fmt.Sprintf(format, args...):
		default:
			dropped.Add(1)
		}
	}
}

// errNotLeading is resume's refusal when the replica lost the lead after
// the rank's hello reached it: the rank is redirected, not refused.
const errNotLeading = "this replica does not lead the rendezvous group"
