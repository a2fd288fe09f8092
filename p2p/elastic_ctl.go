package p2p

// What the rendezvous tells an elastic member on the control stream, and
// how the member takes it in: a new epoch's table (installEpoch), the
// announcement that its epoch ended, go, grow and depart answers; and what
// the member reports back (a broken link).

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

func (n *Node) installEpoch(t *msg) (*epochRun, error) {
	peers, rank, err := parseElasticTable(t.Table, n.h.ID())
	if err != nil {
		return nil, fmt.Errorf("membership epoch %d: %w", t.Epoch, err)
	}
	ids := n.addPeers(peers)
	// Lost members' peer IDs are refused from now on.
	n.g.set(ids...)
	view := View{Epoch: t.Epoch, Rank: rank, Size: len(peers), Lost: lostFromWire(t.Lost), Joined: slices.Clone(t.Joined)}
	n.mu.Lock()
	if n.el.causes == nil {
		n.el.causes = map[peer.ID]LostMember{}
	}
	for _, l := range view.Lost {
		n.el.causes[l.ID] = l
	}
	n.mu.Unlock()
	ep := &epochRun{epoch: t.Epoch, rank: rank, size: len(peers), done: make(chan struct{}),
		goCh: make(chan struct{}), reported: map[int]bool{}, view: view}
	n.mu.Lock()
	if n.fatal != nil {
		err := n.fatal
		n.mu.Unlock()
		return nil, err
	}
	old := n.cur.Load()
	var links []*link
	if old.err == nil {
		// The placeholder before the first epoch.
		links = n.endEpochLocked(old, &MembershipChangeError{Rank: old.rank, Epoch: old.epoch, Next: t.Epoch, Reason: "new table"})
	}
	n.cur.Store(ep)
	n.job = jobTable{table: t.Table, peers: peers}
	n.links = newEpochLinks(len(peers))
	n.expectLinks()
	if n.el.latest > ep.epoch && n.el.change != nil {
		// A newer epoch was announced while this table was on its way.
		c := *n.el.change
		c.Rank, c.Epoch = ep.rank, ep.epoch
		n.endEpochLocked(ep, &c)
	}
	n.mu.Unlock()
	for _, l := range links {
		l.close()
	}
	n.logf("forming membership epoch %d: rank %d of %d", ep.epoch, ep.rank, ep.size)
	return ep, nil
}

// parseElasticTable checks a table of an elastic job and finds this node
// (by its peer ID) in it.
func parseElasticTable(t []tableItem, self peer.ID) ([]Peer, int, error) {
	if _, err := checkTable(t); err != nil {
		return nil, -1, err
	}
	peers := make([]Peer, len(t))
	seen := make(map[peer.ID]int, len(t))
	rank := -1
	for i, it := range t {
		id, err := peer.Decode(it.ID)
		if err != nil {
			return nil, -1, fmt.Errorf("table: rank %d: bad peer ID: %w", i, err)
		}
		if j, dup := seen[id]; dup {
			return nil, -1, fmt.Errorf("table: ranks %d and %d have the same peer ID", j, i)
		}
		seen[id] = i
		if id == self {
			rank = i
		}
		peers[i] = Peer{Rank: i, ID: id, Addrs: slices.Clone(it.Addrs), HostID: it.HostID}
	}
	if rank < 0 {
		return nil, -1, fmt.Errorf("table of %d members does not list this node (%s)", len(t), self)
	}
	return peers, rank, nil
}

// sinceShown makes v's Lost and Joined relative to the View this node
// returned before (none for the first), and remembers v as that View.
// The rendezvous' lists are relative to the epoch before each table, which
// this node may never have run in: a member lost while the job re-formed
// would otherwise be missing, and ranks would be those of an epoch the
// caller never saw.
func (n *Node) sinceShown(v View) View {
	n.mu.Lock()
	defer n.mu.Unlock()
	prev, causes := n.el.shown, n.el.causes
	n.el.shown, n.el.causes = slices.Clone(v.Peers), nil
	if prev == nil {
		return v
	}
	now := map[peer.ID]bool{}
	for _, p := range v.Peers {
		now[p.ID] = true
	}
	was := map[peer.ID]bool{}
	v.Lost = nil
	for _, p := range prev {
		was[p.ID] = true
		if now[p.ID] {
			continue
		}
		l, ok := causes[p.ID]
		if !ok {
			l = LostMember{Member: Member{ID: p.ID, Host: p.HostID}, Cause: "left the job"}
		}
		l.Rank = p.Rank
		v.Lost = append(v.Lost, l)
	}
	v.Joined = nil
	for _, p := range v.Peers {
		if !was[p.ID] {
			v.Joined = append(v.Joined, p.Rank)
		}
	}
	return v
}

func lostFromWire(items []lostItem) []LostMember {
	var out []LostMember
	for _, it := range items {
		id, _ := peer.Decode(it.ID)
		out = append(out, LostMember{Member: Member{Rank: it.Rank, ID: id, Host: it.Host, HostName: it.Name, Addr: it.Addr, Proc: it.Proc}, Cause: it.Cause, Left: it.Left})
	}
	return out
}

// elasticCtl handles the control messages of elastic mode; it reports
// whether m was one.
func (n *Node) elasticCtl(m *msg) bool {
	switch m.T {
	case tPing:
		n.el.pending.Store(int64(m.Pending))
		return false // the missing ranks, as in a fixed-size job
	case tTable:
		n.mu.Lock()
		if m.Epoch > n.el.tableEpoch {
			n.el.table, n.el.tableEpoch = m, m.Epoch
			n.el.latest = max(n.el.latest, m.Epoch)
			n.el.waiting = ""
		}
		n.mu.Unlock()
		n.el.wake()
	case tReconfig:
		n.membershipChanged(m)
	case tWaiting:
		n.mu.Lock()
		n.el.waiting = m.Text
		n.mu.Unlock()
		n.logf("rendezvous: %s", m.Text)
		n.el.wake()
	case tGo:
		if ep := n.cur.Load(); ep.epoch == m.Epoch && ep.goCh != nil && !ep.goClosed.Swap(true) {
			n.el.pending.Store(int64(m.Pending))
			close(ep.goCh)
		}
	case tGrowNone:
		n.mu.Lock()
		if n.el.growNone != nil && n.el.growEpoch == m.Epoch {
			n.el.pending.Store(0)
			close(n.el.growNone)
			n.el.growNone = nil
		}
		n.mu.Unlock()
	case tDropped:
		n.abortLocal(errors.New(m.Text))
	case tDeparted:
		n.mu.Lock()
		if n.el.departed != nil && n.el.growEpoch == m.Epoch {
			close(n.el.departed)
			n.el.departed = nil
		}
		n.mu.Unlock()
	default:
		return false
	}
	return true
}

// membershipChanged ends the current epoch because the rendezvous
// announced epoch m.Epoch.
func (n *Node) membershipChanged(m *msg) {
	n.mu.Lock()
	n.el.latest = max(n.el.latest, m.Epoch)
	ep := n.cur.Load()
	change := &MembershipChangeError{Rank: ep.rank, Epoch: ep.epoch, Next: m.Epoch, Lost: lostFromWire(m.Lost), Reason: m.Text}
	n.el.change = change
	var links []*link
	first := n.fatal == nil && ep.err == nil && ep.epoch < m.Epoch
	if first {
		links = n.endEpochLocked(ep, change)
	}
	n.mu.Unlock()
	if first && ep.epoch >= 0 {
		n.logf("%v", change)
	} else {
		n.logf("membership epoch %d begins: %s", m.Epoch, change.Reason)
	}
	for _, l := range links {
		l.close()
	}
	n.el.wake()
}

// reportLinkFailure tells the rendezvous, once per epoch and peer, that
// this rank's link with peer broke: it decides whether the peer is gone or
// the link must be set up again, and starts the next epoch either way.
func (n *Node) reportLinkFailure(ep *epochRun, peer int, err error) {
	n.mu.Lock()
	skip := ep.err != nil || n.fatal != nil || ep.reported[peer]
	if ep.reported != nil {
		ep.reported[peer] = true
	}
	n.mu.Unlock()
	if skip {
		return
	}
	n.logf("reporting to the rendezvous: %v", err)
	if e := n.ctl.send(&msg{T: tLinkFail, Rank: peer, Epoch: ep.epoch, Text: err.Error()}); e != nil {
		n.logf("could not report the broken link with rank %d to the rendezvous: %v", peer, e)
	}
}

// cutOffErr is why a member stops when its control stream fails.
func (n *Node) cutOffErr(err error) error {
	silence := n.cfg.HeartbeatTimeout
	if t := n.ctl.lastRecv.Load(); t != 0 {
		silence = time.Since(time.Unix(0, t)).Round(100 * time.Millisecond)
	}
	return &CutOffError{Rank: n.rank(), Rendezvous: n.cfg.Rendezvous, Silence: silence, Err: err}
}
