package p2p

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Elastic membership.
//
// In an elastic job (RendezvousConfig.Elastic, Config.Elastic) the set of
// members changes while the job runs, in numbered membership epochs (0 at
// start). Every member keeps its libp2p peer ID for life and gets a rank
// per epoch. When the rendezvous loses a member (its control stream
// breaks: a killed process; or stays silent for HeartbeatTimeout: a frozen
// or cut-off host) it does not abort the job: it announces epoch e+1 to
// every remaining member ("reconfig"), whose Node fails its current epoch at
// once (Err is a *MembershipChangeError, the data links are closed, so a
// blocked transfer returns). Each member then calls Reconfigure, which
// forms the new epoch exactly like the start of a job: table (survivors in
// their old order, then joiners), gater, ack, go, links. Data-link proofs
// include the epoch, so nothing of an old ring reaches the new one. A
// member that is lost while an epoch forms makes the rendezvous move on to
// the next epoch, and every Reconfigure follows it.
//
// Only the side of a partition that holds the rendezvous goes on: a member
// that loses its control stream stops for good (*CutOffError).

// ElasticConfig makes a rendezvous elastic (RendezvousConfig.Elastic).
type ElasticConfig struct {
	// MinSize is the fewest members the job runs with (--min-np); 0 = 1.
	// Below it the rendezvous waits up to WaitTimeout for joiners, then
	// aborts the job.
	MinSize int
	// MaxSize is the most members the job admits (--max-np); 0 = Size.
	// Further joiners wait until there is room.
	MaxSize int
	// WaitTimeout is how long the job may stay below MinSize; 0 = 600s.
	WaitTimeout time.Duration
	// HeartbeatTimeout is how long a member's control stream may be silent
	// before it counts as lost; 0 = 3s. Pings go out every quarter of it.
	// Members must use the same value (Config.HeartbeatTimeout).
	HeartbeatTimeout time.Duration
}

const (
	defaultHeartbeatTimeout = 3 * time.Second
	defaultWaitTimeout      = 600 * time.Second
)

func defaultHeartbeat(d time.Duration) time.Duration {
	if d <= 0 {
		return defaultHeartbeatTimeout
	}
	return d
}

// elasticHello is what a hello says about elastic mode: 0 for a fixed-size
// member, else its heartbeat bound in ms (which must be the rendezvous').
func elasticHello(cfg Config) int64 {
	if !cfg.Elastic {
		return 0
	}
	return max(cfg.HeartbeatTimeout.Milliseconds(), 1)
}

// Member identifies a member of an elastic job in one epoch.
type Member struct {
	Rank int     // its rank in that epoch
	ID   peer.ID // stable for the member's life
	Host string  // its HostID
	// HostName is the name of its host in messages: the launcher's
	// (gorun's -H or discovery name) when it set GORUN_HOST, else the OS
	// host name; "" from an older peer.
	HostName string
	Addr     string // where the rendezvous saw its control connection come from
	Proc     string // the launcher's id of its process (Config.ProcID), "" if none
}

// LostMember is a member that is no longer in the job: lost without a
// clean Close, or (Left) gone gracefully at a commit boundary (Depart).
type LostMember struct {
	Member
	Cause string // "disconnected", "stopped responding: ...", "unreachable: ...", "left the job (SIGTERM)"
	// Left: it left at a commit every member took (Node.Depart), handing
	// over its unique state there; no step is lost.
	Left bool
}

func (l LostMember) String() string {
	return fmt.Sprintf("rank %d (host %s, %s) %s", l.Rank, l.HostLabel(), l.Addr, l.Cause)
}

// HostLabel is the name of m's host for messages: HostName, or else the
// host name part of its HostID.
func (m Member) HostLabel() string {
	if m.HostName != "" {
		return m.HostName
	}
	name, _, _ := strings.Cut(m.Host, "/")
	return name
}

// View describes the epoch a Reconfigure (or Grow, or an elastic Join)
// put this node in.
type View struct {
	Epoch int
	Rank  int
	Size  int
	Peers []Peer
	// Lost: the members of the epoch this node was last in (the View its
	// previous Reconfigure, Grow or Join returned) that are not in this
	// one, with their ranks in that epoch and why they went. Epochs formed
	// and overtaken in between (a further loss while the job re-formed)
	// are folded in, so nothing lost is missing and the ranks are the ones
	// the caller knew.
	Lost []LostMember
	// Joined: the ranks, in this epoch, of the members that were not in
	// the epoch this node was last in (they have none of the job's state
	// yet).
	Joined []int
}

// Change is what RendezvousConfig.OnChange is told once a new epoch is
// established (every member acknowledged its table).
type Change struct {
	Epoch  int
	Lost   []LostMember // Rank: in the previous established epoch
	Joined []Member     // Rank: in this epoch
	Size   int
	Took   time.Duration // from the first loss (or grow request) to the go
}

// MembershipChangeError is a Node's Err (and what its blocked transfers
// return) when the rendezvous started a new epoch: the current one can not
// complete. Call Node.Reconfigure to go on in the new one.
type MembershipChangeError struct {
	Rank   int          // this node's rank in Epoch
	Epoch  int          // the epoch that ended
	Next   int          // the epoch being formed
	Lost   []LostMember // who was lost, if anybody
	Reason string       // why the rendezvous started the new epoch
}

func (e *MembershipChangeError) Error() string {
	what := e.Reason
	if len(e.Lost) > 0 {
		parts := make([]string, len(e.Lost))
		for i, l := range e.Lost {
			parts[i] = l.String()
		}
		what = strings.Join(parts, "; ")
	}
	return fmt.Sprintf("p2p: rank %d: membership epoch %d ended: %s; call Reconfigure to go on in epoch %d",
		e.Rank, e.Epoch, what, e.Next)
}

// CutOffError is why a member of an elastic job stops for good: it lost its
// control stream to the rendezvous, which goes on without it (if it still
// has enough members).
type CutOffError struct {
	Rank       int
	Rendezvous string        // host:port
	Silence    time.Duration // since the rendezvous was last heard
	Err        error         // what the control stream reported
}

func (e *CutOffError) Error() string {
	return fmt.Sprintf("rank %d: cut off from the rendezvous at %s for %v (%v): this rank stops; the job goes on without it if the rendezvous still has --min-np members",
		e.Rank, e.Rendezvous, e.Silence, e.Err)
}

func (e *CutOffError) Unwrap() error { return e.Err }

// epochRun is one membership epoch of a node: a fixed-size job has one.
// epoch, rank, size and the channels never change; err is under Node.mu.
type epochRun struct {
	epoch      int
	rank, size int
	done       chan struct{}
	err        error
	goCh       chan struct{} // elastic: closed on the rendezvous' go for this epoch
	goClosed   atomic.Bool
	reported   map[int]bool // elastic, under Node.mu: peers whose broken link was reported
	view       View         // elastic: without Peers
}

// elasticNode is a node's elastic-mode state; fields without a comment are
// under Node.mu.
type elasticNode struct {
	lastRecv   atomic.Int64 // unix ns of the last control message (any node)
	pending    atomic.Int64 // joiners the rendezvous would admit now
	latest     int          // newest epoch announced by a reconfig or table
	table      *msg         // newest table not installed yet
	tableEpoch int
	change     *MembershipChangeError // the newest reconfig, for epochs it overtakes
	waiting    string                 // the rendezvous' last "waiting for members" status
	growNone   chan struct{}          // closed when the Grow under way admitted nobody
	growEpoch  int                    // the epoch that Grow (or Depart) is for
	departed   chan struct{}          // closed when the rendezvous let the Depart under way go
	tableCh    chan struct{}          // cap 1: a table, a status or a fatal error arrived
	// shown: the peers of the View last returned to the caller; causes:
	// why each member lost since then went, from every table installed
	// since (a table only lists the losses since the epoch before it).
	shown  []Peer
	causes map[peer.ID]LostMember
}

func (e *elasticNode) init() {
	e.latest, e.tableEpoch = -1, -1
	e.tableCh = make(chan struct{}, 1)
}

func (e *elasticNode) wake() {
	if e.tableCh == nil {
		return
	}
	select {
	case e.tableCh <- struct{}{}:
	default:
	}
}

// Epoch returns the membership epoch the node is in (always 0 in a
// fixed-size job; -1 for a joiner not yet admitted).
func (n *Node) Epoch() int { return n.cur.Load().epoch }

// PendingJoiners returns how many joiners the rendezvous would admit if
// the members called Grow now (as of its last ping, every quarter of the
// heartbeat bound). Always 0 in a fixed-size job.
func (n *Node) PendingJoiners() int { return int(n.el.pending.Load()) }

// Reconfigure moves this node into the next membership epoch after its
// current one ended with a *MembershipChangeError: it waits for the new
// table, installs it in the gater, acknowledges it, waits for every member
// to do so and connects the new epoch's links. If the membership changes
// again meanwhile it follows into the newer epoch. Each step is bounded by
// ctx and Timeout, except that the wait for a table is not bounded by
// Timeout while the rendezvous reports that it waits for members (it
// aborts the job itself after its WaitTimeout). Afterwards Rank, Size,
// Peers, Transport, Mesh, Done and Err describe the new epoch.
//
// If the current epoch has not ended, Reconfigure returns its View at
// once. An error is final: the node can not take part any more (the job
// was aborted, this node was cut off or dropped, or a step timed out).
func (n *Node) Reconfigure(ctx context.Context) (View, error) {
	if !n.cfg.Elastic {
		return View{}, fmt.Errorf("p2p: rank %d: Reconfigure needs an elastic job (Config.Elastic)", n.rank())
	}
	v, err := n.reconfigure(ctx, true)
	return v, n.wrapErr(err)
}

// wrapErr names this node in an error of Reconfigure, Grow or an elastic
// Join, unless the error already does.
func (n *Node) wrapErr(err error) error {
	if err == nil {
		return nil
	}
	who := fmt.Sprintf("rank %d", n.rank())
	if n.rank() < 0 {
		who = "joiner"
	}
	if text := err.Error(); strings.HasPrefix(text, "p2p: ") || strings.HasPrefix(text, who+": ") {
		return err
	}
	return fmt.Errorf("p2p: %s: %w", who, err)
}

// Grow admits the joiners that are waiting (PendingJoiners) into a new
// epoch. Every member must call it at the same point of its program (a
// commit boundary): the rendezvous decides once all members asked, and
// admits the joiners waiting at that moment (up to MaxSize), then every
// member, and every admitted joiner's Join, forms the new epoch as in
// Reconfigure. If nobody is waiting, Grow returns the current View and the
// links stay as they are. If a member is lost meanwhile, Grow follows into
// that reconfiguration (which admits the waiting joiners too) and returns
// its View. Waiting for the other members is bounded by ctx and Timeout.
func (n *Node) Grow(ctx context.Context) (View, error) {
	if !n.cfg.Elastic {
		return View{}, fmt.Errorf("p2p: rank %d: Grow needs an elastic job (Config.Elastic)", n.rank())
	}
	v, err := n.grow(ctx)
	return v, n.wrapErr(err)
}

func (n *Node) grow(ctx context.Context) (View, error) {
	ep := n.cur.Load()
	if n.epochErr(ep) != nil {
		return n.reconfigure(ctx, true)
	}
	// One Grow at a time per epoch: the rendezvous answers once every
	// member asked, so the answer is this call's.
	none := make(chan struct{})
	n.mu.Lock()
	n.el.growNone, n.el.growEpoch = none, ep.epoch
	n.mu.Unlock()
	if err := n.sendCtl(&msg{T: tGrow, Rank: ep.rank, Epoch: ep.epoch}); err != nil {
		return View{}, fmt.Errorf("grow: telling the rendezvous: %w", err)
	}
	sctx, cancel := n.stepCtx(ctx, "waiting for every member to call Grow")
	defer cancel()
	select {
	case <-none:
		return n.viewOf(ep), nil
	case <-ep.done:
		return n.reconfigure(ctx, true)
	case <-sctx.Done():
		return View{}, fmt.Errorf("grow of epoch %d: %w", ep.epoch, context.Cause(sctx))
	}
}

// ErrLeft is why a node (and a Comm) that left an elastic job gracefully
// (Depart) takes no further part: match it with errors.Is.
var ErrLeft = errors.New("left the elastic job")

// LeftError says that this member left the job at a commit boundary, and
// why (e.g. "SIGTERM"). It matches ErrLeft.
type LeftError struct {
	Rank int // its rank in the last epoch it was in
	Why  string
}

func (e *LeftError) Error() string {
	return fmt.Sprintf("rank %d left the elastic job at a commit (%s); the others go on from that commit", e.Rank, e.Why)
}

func (e *LeftError) Is(target error) bool { return target == ErrLeft }

// Depart leaves the elastic job gracefully, where the other members call
// Grow: at a commit boundary every member holds (the same point as
// Grow). The rendezvous decides once every member asked: the members that
// depart are let go, and the others form the next epoch without them
// (admitting waiting joiners too), going on from that commit. Depart
// returns nil once this node is out of the job; it takes no further part
// (Err is a *LeftError) and Close just disconnects. If the membership
// changes first (a member lost meanwhile), Depart returns that
// *MembershipChangeError: call Reconfigure and depart at the next commit.
// Waiting for the other members is bounded by ctx and Timeout.
func (n *Node) Depart(ctx context.Context, why string) error {
	if !n.cfg.Elastic {
		return fmt.Errorf("p2p: rank %d: Depart needs an elastic job (Config.Elastic)", n.rank())
	}
	ep := n.cur.Load()
	if err := n.epochErr(ep); err != nil {
		return err
	}
	ch := make(chan struct{})
	n.mu.Lock()
	n.el.departed, n.el.growEpoch = ch, ep.epoch
	n.mu.Unlock()
	if err := n.sendCtl(&msg{T: tGrow, Rank: ep.rank, Epoch: ep.epoch, Leave: true, Text: why}); err != nil {
		return n.wrapErr(fmt.Errorf("depart: telling the rendezvous: %w", err))
	}
	sctx, cancel := n.stepCtx(ctx, "waiting for every member to reach the commit this rank leaves at")
	defer cancel()
	select {
	case <-ch:
		n.departedJob.Store(true)
		n.abortLocal(&LeftError{Rank: ep.rank, Why: why})
		n.logf("left the job at a commit (%s)", why)
		return nil
	case <-ep.done:
		return n.epochErr(ep)
	case <-sctx.Done():
		return n.wrapErr(fmt.Errorf("depart from epoch %d: %w", ep.epoch, context.Cause(sctx)))
	}
}

// Quit leaves the elastic job at once, outside a commit (the program gave
// up, e.g. its context was cancelled): the rendezvous counts it as lost,
// with why as the cause, and the others go on from their last commit,
// running the interrupted step again. This node takes no further part.
func (n *Node) Quit(why string) {
	if !n.cfg.Elastic || n.fatalErr() != nil {
		return
	}
	if n.ctl != nil {
		if err := n.sendCtl(&msg{T: tQuit, Rank: max(n.rank(), 0), Text: why}); err != nil {
			n.logf("could not tell the rendezvous this rank quits: %v", err)
		}
	}
	n.departedJob.Store(true)
	n.abortLocal(&LeftError{Rank: n.rank(), Why: why + ", outside a commit"})
	if n.ctl != nil {
		// After the quit message, in order (a reset could overtake it):
		// the rendezvous counts this member as lost at once.
		n.ctl.CloseWrite()
	}
}

// viewOf returns the View of ep, with the current peers.
func (n *Node) viewOf(ep *epochRun) View {
	v := ep.view
	v.Lost = slices.Clone(v.Lost)
	v.Joined = slices.Clone(v.Joined)
	v.Peers = n.Peers()
	return v
}

func (n *Node) fatalErr() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.fatal
}

// reconfigure forms the next epoch (the first one, when called by Join).
// started: the node has been in an epoch before.
func (n *Node) reconfigure(ctx context.Context, started bool) (View, error) {
	if ep := n.cur.Load(); started && n.epochErr(ep) == nil {
		return n.viewOf(ep), nil
	}
	for {
		if err := n.fatalErr(); err != nil {
			return View{}, err
		}
		t, err := n.nextTable(ctx)
		if err != nil {
			return View{}, err
		}
		ep, err := n.installEpoch(t)
		if err != nil {
			// The rendezvous sent something this node can not use: a bug
			// or a mismatch of versions, not a lost member.
			n.Abort(err)
			return View{}, err
		}
		if n.epochErr(ep) != nil {
			continue // overtaken already
		}
		if err := n.sendCtl(&msg{T: tAck, Rank: ep.rank, Epoch: ep.epoch}); err != nil {
			return View{}, n.stepErr(ep, fmt.Errorf("ack to the rendezvous: %w", err))
		}
		if err := n.waitFor(ctx, fmt.Sprintf("waiting for go of epoch %d (members that have not acked its table)", ep.epoch), ep.goCh); err != nil {
			if n.overtaken(ep) {
				continue
			}
			return View{}, n.stepErr(ep, err)
		}
		blame, err := n.connectEpochLinks(ctx, ep)
		if err == nil {
			n.logf("in membership epoch %d: rank %d of %d", ep.epoch, ep.rank, ep.size)
			return n.sinceShown(n.viewOf(ep)), nil
		}
		if n.overtaken(ep) {
			continue
		}
		if ctx.Err() != nil {
			return View{}, n.stepErr(ep, err)
		}
		// The links could not be set up: the rendezvous decides whom to
		// drop and starts the next epoch.
		for _, p := range blame {
			n.reportLinkFailure(ep, p, err)
		}
		if len(blame) == 0 {
			return View{}, n.stepErr(ep, err)
		}
		wctx, cancel := n.stepCtx(ctx, "waiting for the rendezvous to answer a link failure")
		select {
		case <-ep.done:
		case <-wctx.Done():
		}
		cancel()
		if !n.overtaken(ep) {
			return View{}, n.stepErr(ep, err)
		}
	}
}

// overtaken reports whether ep ended because a newer epoch began (rather
// than for good).
func (n *Node) overtaken(ep *epochRun) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	var mc *MembershipChangeError
	return n.fatal == nil && ep.err != nil && errors.As(ep.err, &mc)
}

// stepErr makes a failed step of a reconfiguration final for this node.
func (n *Node) stepErr(ep *epochRun, err error) error {
	if f := n.fatalErr(); f != nil {
		return f
	}
	return n.quit(fmt.Errorf("forming membership epoch %d: %w", ep.epoch, err))
}

// quit ends this node's part in an elastic job for good (a step it could
// not complete, a cancelled Reconfigure): it also ends its control stream,
// so that the rendezvous counts it as lost at once and the others go on
// without it instead of waiting for it to acknowledge their next table.
func (n *Node) quit(err error) error {
	if !n.abortLocal(err) {
		return n.fatalErr()
	}
	if n.ctl != nil {
		n.ctl.Reset()
	}
	return err
}

// nextTable waits for the table of the newest announced epoch.
func (n *Node) nextTable(ctx context.Context) (*msg, error) {
	first := n.cur.Load().epoch < 0
	joiner := n.cfg.Rank < 0
	what := "waiting for the table of the next membership epoch"
	if first && !joiner {
		what = "waiting for the job table (ranks not registered yet)"
	}
	var timeout <-chan time.Time
	if !(first && joiner) { // a joiner waits as long as the job runs without it
		t := time.NewTimer(n.cfg.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	for {
		n.mu.Lock()
		t, fatal, waiting := n.el.table, n.fatal, n.el.waiting
		if t != nil && t.Epoch >= n.el.latest && t.Epoch > n.cur.Load().epoch {
			n.el.table = nil
			n.mu.Unlock()
			return t, nil
		}
		n.mu.Unlock()
		if fatal != nil {
			return nil, fatal
		}
		select {
		case <-n.el.tableCh:
		case <-ctx.Done():
			return nil, n.quit(fmt.Errorf("%s: %w", what, context.Cause(ctx)))
		case <-timeout:
			if waiting != "" {
				// The rendezvous waits for members (and will abort the job
				// itself if none come): so do we.
				t := time.NewTimer(n.cfg.Timeout)
				defer t.Stop()
				timeout = t.C
				continue
			}
			err := fmt.Errorf("%s: timed out after %v", what, n.cfg.Timeout)
			if m := n.getMissing(); len(m) > 0 {
				err = fmt.Errorf("%s: missing ranks %v: timed out after %v", what, m, n.cfg.Timeout)
			}
			return nil, n.quit(err)
		}
	}
}

// installEpoch makes the table t the node's current epoch: gater, peers,
// expected links. The previous epoch has ended (or is the placeholder
// before the first table).
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
	n.table = t.Table
	n.peers = peers
	n.missing = nil
	n.expect, n.have = map[int]bool{}, map[int]bool{}
	n.links = nil
	n.tr = nil
	n.accepted = make(chan *link, 2*len(peers))
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
	if e := n.sendCtl(&msg{T: tLinkFail, Rank: peer, Epoch: ep.epoch, Text: err.Error()}); e != nil {
		n.logf("could not report the broken link with rank %d to the rendezvous: %v", peer, e)
	}
}

// cutOffErr is why a member stops when its control stream fails.
func (n *Node) cutOffErr(err error) error {
	silence := n.cfg.HeartbeatTimeout
	if t := n.el.lastRecv.Load(); t != 0 {
		silence = time.Since(time.Unix(0, t)).Round(100 * time.Millisecond)
	}
	return &CutOffError{Rank: n.rank(), Rendezvous: n.cfg.Rendezvous, Silence: silence, Err: err}
}

// set replaces the set of allowed peers (the rendezvous always stays).
func (g *gater) set(ids ...peer.ID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for id := range g.allowed {
		if id != g.rz {
			delete(g.allowed, id)
		}
	}
	for _, id := range ids {
		g.allowed[id] = true
	}
}
