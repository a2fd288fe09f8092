package p2p

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/gorun/gorun/membership"
)

const rendezvousProto protocol.ID = "/gorun/rendezvous/1"

// RendezvousConfig configures StartRendezvous.
type RendezvousConfig struct {
	ListenAddr string        // "host:port"; port 0 picks a free port
	Size       int           // number of ranks in the job
	JobKey     []byte        // shared secret, >= 16 bytes
	Timeout    time.Duration // heartbeat/dead-peer bound (elastic: Elastic.HeartbeatTimeout) and Close wait; 0 = 60s
	Logf       func(format string, args ...any)
	// OnLeave, if set, is called when a rank in good health announces that
	// it leaves the job (Node.Close, hence Comm.Close), with the sequence
	// number of its last collective call (0 if it made none): once per
	// rank, before the other ranks are told. When every rank closes after
	// the same call the job ended cleanly; a rank whose lastCall is below
	// another rank's progress left early, and the ranks still in later
	// calls fail naming it. It runs on the rendezvous' goroutines, possibly
	// concurrently for different ranks, and must not block.
	OnLeave func(rank int, lastCall uint64)
	// OnAbort, if set, is called once with the cause of the job's first
	// abort (e.g. "rank 2 (/ip4/...) stopped responding: no heartbeat
	// within 4s"), before the ranks are told: the launcher names that
	// cause, since the ranks that exit first are often only its victims.
	// It must not block.
	OnAbort func(Abort)
	// Elastic, if set, makes the job elastic (see elastic.go): a lost
	// member starts a new membership epoch instead of aborting the job,
	// and joiners (Config.Rank -1) can be admitted. Size is the number of
	// ranks that start the job. nil: a fixed-size job, as always.
	Elastic *ElasticConfig
	// OnChange, if set, is called once per established epoch after 0 (every
	// member acknowledged the new table), for the launcher's log. It runs
	// on a rendezvous goroutine and must not block.
	OnChange func(Change)
	// OnProc, if set, is told what becomes of each process in an elastic
	// job as it happens, by the process id its hello carried
	// (Config.ProcID): so a launcher knows exactly which of its processes
	// the rendezvous lost, let go or sent away, before the epoch that
	// follows is established (if it ever is). It is called with the
	// rendezvous' lock held: it must not block nor call the Rendezvous.
	OnProc func(ProcEvent)
	// OnHang, if set, is given every hang diagnosis (see diagnose.go): a
	// rank waited past its stall threshold and every rank's state was
	// gathered. It is called once per stalled call, however many ranks
	// ask. It returns where it wrote the report ("" if nowhere); the ranks
	// that asked are told it printed the diagnosis, so they do not print
	// it again. It runs on a rendezvous goroutine of its own and may write
	// a file, but must not block for long. Unset, the rendezvous writes
	// the report (with every rank's state) itself, and the rank that
	// asked first prints the diagnosis.
	OnHang func(*HangReport) (dump string)
	// Group, if set, makes this rendezvous one replica of a replicated
	// group (rz_group.go): the membership survives the loss of its
	// leader. nil: a lone rendezvous, as always.
	Group *GroupConfig
}

// ProcEventKind is what became of a process (ProcEvent).
type ProcEventKind int

const (
	// ProcLost: a member was lost (disconnected, stopped responding,
	// unreachable, or closed during a reconfiguration).
	ProcLost ProcEventKind = iota + 1
	// ProcLeft: a member left cleanly (Close) in an established epoch.
	ProcLeft
	// ProcSentAway: a joiner was refused, or sent away before it was
	// admitted (the job ended or has no member left to admit it).
	ProcSentAway
	// ProcDeparted: a member left the job gracefully at a commit boundary
	// (Node.Depart: SIGTERM, a scale-down), the others going on from that
	// commit: no step lost. Cause says why it left.
	ProcDeparted
)

// ProcEvent is what RendezvousConfig.OnProc is told.
type ProcEvent struct {
	Kind   ProcEventKind
	Member Member // Rank: in the newest epoch (-1 for a joiner not admitted)
	Cause  string // ProcLost: as LostMember.Cause; ProcSentAway, ProcDeparted: why
	// AfterLeave: a member had already left the job cleanly when this
	// happened (the job was finishing).
	AfterLeave bool
	Members    int // members left after it
}

// Rendezvous is the membership and control service of one job: a driver
// of its membership.Machine. It turns what happens on the ranks' control
// streams and on its timers into the machine's events, and the machine's
// actions into messages and callbacks (rz_actions.go).
type Rendezvous struct {
	cfg   RendezvousConfig
	h     host.Host
	hosts hostGuard // h closes only between dials
	id    peer.ID
	addr  string

	mu             sync.Mutex
	m              *membership.Machine // under mu; Stepped with relayMu held too
	conns          map[membership.ID]*rzConn
	nextConn       membership.ID
	progress       map[int]uint64 // last collective each rank reported entering
	allReg         chan struct{}
	allGone        chan struct{} // closed when every registered rank left or died (after table)
	abortDelivered chan struct{} // closed once the ranks waited for read the abort or are gone (abortWith)
	// abortUnread: the recipients of the abort waited for that have
	// neither acknowledged it nor gone (nil until the abort was sent);
	// abortDone closes abortDelivered.
	abortUnread map[*rzConn]bool
	abortDone   sync.Once
	closed      bool
	closeCh     chan struct{}
	wg          sync.WaitGroup
	closeOnce   sync.Once
	// relayMu orders the membership's steps and what they send
	// (departures, aborts, epochs): a rank that fails because of a
	// departure can not have its consequences reach another rank before
	// the departure itself.
	relayMu sync.Mutex
	hb      time.Duration // heartbeat bound: Timeout, or Elastic.HeartbeatTimeout
	// Hang diagnoses (diagnose.go), under mu: those being gathered, the
	// reports of the last diagnosed calls, the last gathering's id.
	hangs    map[hangKey]*hangGather
	hangKept []keptHang
	hangIDs  uint64
	grp      *groupState // a replica of a group (rz_group.go); nil: a lone rendezvous
}

// rzConn is the server side of one rank's control stream. What the rank
// is in the job (its rank, membership, leave) is the machine's, under mid.
type rzConn struct {
	mid  membership.ID
	s    network.Stream
	addr string // remote multiaddr, for messages
	item tableItem
	wmu  sync.Mutex
	// heard is when a message from the rank was last read (UnixNano).
	heard atomic.Int64
	// A replicated rendezvous' registration (rz_group.go): the welcome to
	// send once the group applied it, and the outcome; registered closes
	// then.
	welcome    *msg
	registered chan struct{}
	refused    string
	welcomeErr error
}

func (c *rzConn) send(m *msg, timeout time.Duration) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.sendLocked(m, timeout)
}

func (c *rzConn) sendLocked(m *msg, timeout time.Duration) error {
	_ = c.s.SetWriteDeadline(time.Now().Add(timeout))
	return writeMsg(c.s, m)
}

func defaultTimeout(t time.Duration) time.Duration {
	if t <= 0 {
		return 60 * time.Second
	}
	return t
}

func nopLogf(string, ...any) {}

// StartRendezvous starts the rendezvous service of a job. It can run in the
// launcher or in the same process as a rank (rank 0 without a launcher).
func StartRendezvous(ctx context.Context, cfg RendezvousConfig) (*Rendezvous, error) {
	if cfg.Size < 1 {
		return nil, fmt.Errorf("p2p: rendezvous size %d < 1", cfg.Size)
	}
	if len(cfg.JobKey) < minKeyLen {
		return nil, fmt.Errorf("p2p: job key of %d bytes, need >= %d", len(cfg.JobKey), minKeyLen)
	}
	if err := ctx.Err(); err != nil {
		return nil, context.Cause(ctx)
	}
	cfg.Timeout = defaultTimeout(cfg.Timeout)
	if cfg.Logf == nil {
		cfg.Logf = nopLogf
	}
	hb := cfg.Timeout
	if e := cfg.Elastic; e != nil {
		ec := *e
		if ec.MinSize <= 0 {
			ec.MinSize = 1
		}
		if ec.MaxSize <= 0 {
			ec.MaxSize = max(cfg.Size, ec.MinSize)
		}
		if ec.MinSize > cfg.Size || cfg.Size > ec.MaxSize {
			return nil, fmt.Errorf("p2p: elastic rendezvous: need min size %d <= size %d <= max size %d", ec.MinSize, cfg.Size, ec.MaxSize)
		}
		if ec.WaitTimeout <= 0 {
			ec.WaitTimeout = defaultWaitTimeout
		}
		ec.HeartbeatTimeout = defaultHeartbeat(ec.HeartbeatTimeout)
		hb = ec.HeartbeatTimeout
		cfg.Elastic = &ec
	}
	sk, id, err := rendezvousIdentity(cfg.JobKey)
	if cfg.Group != nil {
		sk, id, err = replicaIdentity(cfg.JobKey, cfg.Group.ID)
	}
	if err != nil {
		return nil, err
	}
	hs, ps, err := net.SplitHostPort(cfg.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("p2p: rendezvous listen address %q: %w", cfg.ListenAddr, err)
	}
	if hs == "" {
		hs = "0.0.0.0"
	}
	port, err := strconv.Atoi(ps)
	if err != nil {
		return nil, fmt.Errorf("p2p: rendezvous listen port %q", ps)
	}
	ip := net.ParseIP(hs)
	if ip == nil {
		ips, err := net.DefaultResolver.LookupIP(ctx, "ip", hs)
		if err != nil || len(ips) == 0 {
			return nil, fmt.Errorf("p2p: resolve rendezvous listen host %q: %v", hs, err)
		}
		ip = ips[0]
	}
	la, err := ipMultiaddr(ip, port)
	if err != nil {
		return nil, err
	}
	h, err := newHost(sk, la, nil)
	if err != nil {
		return nil, fmt.Errorf("p2p: rendezvous host: %w", err)
	}
	r := &Rendezvous{
		cfg: cfg, h: h, id: id,
		conns:   map[membership.ID]*rzConn{},
		allReg:  make(chan struct{}),
		allGone: make(chan struct{}), abortDelivered: make(chan struct{}),
		closeCh: make(chan struct{}),
		hb:      hb,
	}
	// Find the bound port.
	for _, a := range h.Network().ListenAddresses() {
		if p, err := a.ValueForProtocol(0x06); err == nil { // tcp
			r.addr = net.JoinHostPort(ip.String(), p)
			break
		}
	}
	if r.addr == "" {
		h.Close()
		return nil, errors.New("p2p: rendezvous: no TCP listen address")
	}
	if cfg.Group != nil {
		if err := r.startGroup(); err != nil {
			h.Close()
			return nil, fmt.Errorf("p2p: rendezvous replica %d: %w", cfg.Group.ID, err)
		}
	} else {
		r.m = membership.New(r.machineConfig())
	}
	h.SetStreamHandler(rendezvousProto, r.handle)
	if cfg.Group != nil {
		cfg.Logf("rendezvous replica %d for %d ranks at %s (peer %s)", cfg.Group.ID, cfg.Size, r.addr, id)
	} else {
		cfg.Logf("rendezvous for %d ranks at %s (peer %s)", cfg.Size, r.addr, id)
	}
	return r, nil
}

// machineConfig is the membership's configuration.
func (r *Rendezvous) machineConfig() membership.Config {
	mc := membership.Config{Size: r.cfg.Size, Heartbeat: r.hb}
	if e := r.cfg.Elastic; e != nil {
		mc.Elastic, mc.MinSize, mc.MaxSize, mc.WaitTimeout = true, e.MinSize, e.MaxSize, e.WaitTimeout
	}
	return mc
}

// Addr returns the "host:port" the rendezvous listens on.
func (r *Rendezvous) Addr() string { return r.addr }

// PeerID returns the rendezvous' libp2p peer ID (derived from the job key).
func (r *Rendezvous) PeerID() peer.ID { return r.id }

// Members returns how many members an elastic job has now (after the
// start: those of the newest epoch, or the survivors waiting for one);
// Size before the start, and in a fixed-size job.
func (r *Rendezvous) Members() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m.Members()
}

// WaitRegistered waits until all Size ranks registered.
func (r *Rendezvous) WaitRegistered(ctx context.Context) error {
	select {
	case <-r.allReg:
		return nil
	case <-ctx.Done():
		r.mu.Lock()
		missing := r.m.MissingRanks()
		n := r.m.Registered()
		r.mu.Unlock()
		return fmt.Errorf("p2p: waiting for ranks to register: missing ranks %v (%d of %d registered): %w",
			missing, n, r.cfg.Size, context.Cause(ctx))
	case <-r.closeCh:
		return errors.New("p2p: rendezvous closed")
	}
}

// Close stops the rendezvous. If the job is running (table sent, not
// aborted) it first waits, at most Timeout, for every rank to leave, so that
// a rank-0-hosted rendezvous does not pull the control path from under ranks
// that are still finishing.
func (r *Rendezvous) Close() error {
	var err error
	r.closeOnce.Do(func() {
		r.mu.Lock()
		wait := r.m.Started() && !r.m.Aborted()
		r.mu.Unlock()
		if wait {
			limit := r.cfg.Timeout
			if r.grp != nil {
				// A replica waits only for ranks finishing with its own:
				// once the others closed, the group can apply nothing
				// more (its AllGone included).
				limit = min(limit, 2*r.hb)
			}
			t := time.NewTimer(limit)
			select {
			case <-r.allGone:
			case <-t.C:
				r.cfg.Logf("rendezvous: closing with ranks still connected")
			}
			t.Stop()
		}
		err = r.teardown()
	})
	return err
}

// teardown stops the rendezvous: its streams, its group's, its host, and
// waits for its goroutines. Close and CloseNow run it once.
func (r *Rendezvous) teardown() error {
	r.mu.Lock()
	r.closed = true
	close(r.closeCh)
	conns := make([]*rzConn, 0, len(r.conns))
	for _, c := range r.conns {
		conns = append(conns, c)
	}
	r.mu.Unlock()
	for _, c := range conns {
		c.s.Reset()
	}
	if r.grp != nil {
		r.closeGroup()
	}
	err := r.hosts.close(r.h)
	r.wg.Wait()
	return err
}

// handle serves one rank's control stream for its whole life.
func (r *Rendezvous) handle(s network.Stream) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		s.Reset()
		return
	}
	r.wg.Add(1) // under mu and !closed: never races with Close's Wait
	r.mu.Unlock()
	defer r.wg.Done()
	remote := s.Conn().RemotePeer()
	raddr := s.Conn().RemoteMultiaddr().String()
	to := r.hb
	_ = s.SetDeadline(time.Now().Add(r.cfg.Timeout))

	nonce := make([]byte, nonceLen)
	rand.Read(nonce)
	if err := writeMsg(s, &msg{T: tChallenge, Nonce: nonce}); err != nil {
		s.Reset()
		return
	}
	m, err := readMsgMax(s, maxSmallFrame)
	if err == nil && m.T != tHello {
		err = fmt.Errorf("got %q", m.T)
	}
	if err != nil {
		r.cfg.Logf("rendezvous: refused peer %s (%s): bad hello: %v", remote, raddr, err)
		s.Reset()
		return
	}
	rank := m.Rank
	if m.Joiner {
		rank = -1
	}
	if !hmac.Equal(m.Proof, registerProof(r.cfg.JobKey, nonce, remote.String(), rank)) {
		r.cfg.Logf("rendezvous: refused peer %s (%s): bad job key", remote, raddr)
		s.Reset()
		return
	}
	c := &rzConn{s: s, addr: raddr, item: tableItem{
		Rank: m.Rank, ID: remote.String(), Addrs: m.Addrs, HostID: m.HostID, Unix: m.Unix, TCPPort: m.TCPPort, TLSPort: m.TLSPort,
	}}
	reg := membership.Register{Rank: m.Rank, Joiner: m.Joiner, Heartbeat: m.Elastic, Args: m.Args,
		Info: membership.Info{PeerID: remote.String(), Host: m.HostID, HostName: m.HostName, Addr: raddr, Proc: m.Proc, Contact: contact(c.item)}}
	if m.Replica != nil {
		reg.Info.Replica, reg.Info.ReplicaAddr, reg.Info.ReplicaSpare = m.Replica.ID, m.Replica.Addr, m.Replica.Spare
	}
	welcome := &msg{T: tWelcome, Proof: welcomeProof(r.cfg.JobKey, m.Nonce, r.id.String())}
	var refused string
	redirect := func() {
		r.redirect(c)
		s.CloseWrite()
		s.SetReadDeadline(time.Now().Add(time.Second))
		readMsgMax(s, maxSmallFrame)
		s.Reset()
	}
	switch {
	case r.grp != nil && !r.Leads():
		redirect()
		return
	case r.grp != nil && m.Resume:
		if refused = r.resume(c, membership.ID(m.MID), remote, welcome); refused == errNotLeading {
			redirect() // it lost the lead since: the rank follows the redirect
			return
		}
	case r.grp != nil:
		refused, err = r.registerReplicated(c, reg, welcome)
	default:
		refused, err = r.register(c, reg, welcome)
	}
	if refused != "" {
		c.send(&msg{T: tError, Text: refused}, to)
		s.CloseWrite()
		// Let the error reach the client before the reset (bounded).
		s.SetReadDeadline(time.Now().Add(time.Second))
		readMsgMax(s, maxSmallFrame)
		s.Reset()
		return
	}
	if err != nil {
		r.lost(c, err)
		return
	}

	// Heartbeat: a write every to/4 keeps the peer's read deadline fresh.
	stop, hbDone := make(chan struct{}), make(chan struct{})
	defer func() { close(stop); <-hbDone }()
	go func() {
		defer close(hbDone)
		t := time.NewTicker(to / 4)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				r.mu.Lock()
				missing, epoch, pending := r.m.Ping()
				var group []groupItem
				if r.grp != nil {
					group = r.groupItemsLocked()
				}
				r.mu.Unlock()
				if c.send(&msg{T: tPing, Missing: missing, Epoch: epoch, Pending: pending, Group: group}, to) != nil {
					return
				}
			}
		}
	}()
	for {
		_ = s.SetReadDeadline(time.Now().Add(to))
		m, err := readMsg(s)
		if err != nil {
			r.lost(c, err)
			return
		}
		c.heard.Store(time.Now().UnixNano())
		if !r.serve(c, m) {
			return
		}
	}
}

// serve handles one message from c's rank; false: its stream is done.
func (r *Rendezvous) serve(c *rzConn, m *msg) bool {
	to := r.hb
	switch m.T {
	case tPing:
	case tProgress, tState:
		r.mu.Lock()
		if r.progress == nil {
			r.progress = map[int]uint64{}
		}
		rank := r.m.Rank(c.mid)
		r.progress[rank] = max(r.progress[rank], m.Seq)
		r.mu.Unlock()
		if m.T == tState {
			r.hangAnswered(c, m.Text)
		}
	case tHangAsk:
		r.hangAsked(c, m.Seq, m.Epoch)
	case tProgQuery:
		r.mu.Lock()
		p := make([]uint64, r.m.ProgressSize())
		for rank, seq := range r.progress {
			if rank >= 0 && rank < len(p) {
				p[rank] = seq
			}
		}
		r.mu.Unlock()
		if c.send(&msg{T: tProgress, Progress: p}, to) != nil {
			r.lost(c, errors.New("progress reply failed"))
			return false
		}
	case tAck:
		r.step(membership.Ack{ID: c.mid, Epoch: m.Epoch})
	case tLinkFail:
		r.step(membership.LinkFailed{ID: c.mid, Epoch: m.Epoch, Rank: m.Rank, Text: m.Text})
	case tGrow:
		r.step(membership.Grow{ID: c.mid, Epoch: m.Epoch, Leave: m.Leave, Why: m.Text, Seq: m.Seq})
	case tQuit:
		// A member that leaves outside a commit: a loss, with its own
		// reason instead of "disconnected".
		r.end(c, membership.Disconnected{ID: c.mid, Quit: m.Text, Err: "the member quit"})
		return false
	case tAbort:
		r.step(membership.AbortRequest{ID: c.mid, Text: m.Text})
	case tAbortOK:
		r.abortRead(c)
	case tLeaving:
		r.step(membership.Leaving{ID: c.mid, LastCall: m.Seq})
	case tLate:
		r.step(membership.Late{ID: c.mid, Call: m.Seq})
		if c.send(&msg{T: tLateOK}, to) != nil {
			r.lost(c, errors.New("late report acknowledgement failed"))
			return false
		}
	case tLeave:
		r.step(membership.Leave{ID: c.mid})
		c.send(&msg{T: tBye}, to)
		c.s.CloseWrite()
		// Wait for the client to close its side (bounded), then finish.
		_ = c.s.SetReadDeadline(time.Now().Add(to))
		for {
			if _, err := readMsg(c.s); err != nil {
				break
			}
		}
		r.lost(c, nil)
		return false
	default:
		r.cfg.Logf("rendezvous: rank %d sent unexpected %q", r.rankOf(c), m.T)
	}
	return true
}

// rankOf returns c's rank (which changes with the epochs of an elastic
// job).
func (r *Rendezvous) rankOf(c *rzConn) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m.Rank(c.mid)
}

// register makes c known to the membership and carries out what that
// changes; c's welcome goes before anything else sent to it. It returns
// why c is refused, or the welcome's write error.
func (r *Rendezvous) register(c *rzConn, reg membership.Register, welcome *msg) (refused string, err error) {
	// Hold c's write lock from the moment c becomes visible until the
	// welcome is written: otherwise a hang diagnosis could write to it
	// first. Nothing the membership sends can: it goes out under relayMu,
	// held here.
	c.wmu.Lock()
	r.relayMu.Lock()
	defer r.relayMu.Unlock()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		c.wmu.Unlock()
		return "rendezvous closed", nil
	}
	r.nextConn++
	c.mid, reg.ID = r.nextConn, r.nextConn
	acts := r.m.Step(time.Now(), reg)
	for _, a := range acts {
		if f, ok := a.(membership.Refuse); ok && f.To == c.mid {
			refused = f.Why
		}
	}
	if refused == "" {
		r.conns[c.mid] = c
	}
	r.mu.Unlock()
	if refused == "" {
		err = c.sendLocked(welcome, r.hb)
	}
	c.wmu.Unlock()
	r.do(acts)
	return refused, err
}

// step applies ev to the membership and carries out what it says.
func (r *Rendezvous) step(ev membership.Event) {
	r.relayMu.Lock()
	defer r.relayMu.Unlock()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	if r.grp != nil {
		// The group applies it once a majority has it; the raft loop
		// carries out what it does.
		r.proposeLocked(ev)
		r.mu.Unlock()
		return
	}
	acts := r.m.Step(time.Now(), ev)
	r.mu.Unlock()
	r.do(acts)
}

// connsLocked returns the connections of the processes still in the
// membership, by rank.
func (r *Rendezvous) connsLocked() []*rzConn {
	ids := r.m.Conns()
	out := make([]*rzConn, 0, len(ids))
	for _, id := range ids {
		// In a replicated rendezvous, a member that has not reconnected
		// to a new leader yet has no stream here.
		if c := r.conns[id]; c != nil {
			out = append(out, c)
		}
	}
	return out
}

// Abort is the cause of a job's first abort, as OnAbort is given it.
type Abort struct {
	Cause string // as the ranks are told it
	// Unresponsive: the cause is that rank Rank, at Addr, stopped
	// responding (Why, e.g. "no heartbeat within 4s").
	Unresponsive bool
	Rank         int
	Addr, Why    string
}

// abortRead records that c (nil: nobody new) read the abort or is gone, and
// closes abortDelivered once no recipient is left that may not have read it.
// Sending is not enough: a rank that exits with unread data resets its
// connections, and the reset drops what the others had not read yet, so
// they would see only "lost rendezvous" instead of the cause.
func (r *Rendezvous) abortRead(c *rzConn) {
	r.mu.Lock()
	if r.abortUnread == nil {
		r.mu.Unlock()
		return
	}
	if c != nil {
		delete(r.abortUnread, c)
	}
	done := len(r.abortUnread) == 0
	r.mu.Unlock()
	if done {
		r.abortDone.Do(func() { close(r.abortDelivered) })
	}
}

// broadcast sends m to conns concurrently (one frozen rank must not hold up
// the others) and returns when every send ended. The caller holds relayMu.
func (r *Rendezvous) broadcast(conns []*rzConn, m *msg) {
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.send(m, r.cfg.Timeout)
		}()
	}
	wg.Wait()
}

// AbortDelivered is closed once the job has been aborted and every rank
// still connected and heard from lately (abortWith) has acknowledged
// reading the cause, or is gone. A rank
// that hosts the rendezvous waits for it (bounded) before it exits on an
// error, or the other ranks would see only "lost rendezvous" instead of
// what went wrong.
func (r *Rendezvous) AbortDelivered() <-chan struct{} { return r.abortDelivered }

// lost handles the end of a control stream. err == nil: orderly leave.
func (r *Rendezvous) lost(c *rzConn, err error) {
	var timeout interface{ Timeout() bool }
	to := errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &timeout) && timeout.Timeout())
	r.end(c, membership.Disconnected{ID: c.mid, Timeout: to, Err: fmt.Sprint(err)})
}

// end closes c's stream and tells the membership how it ended (ev).
func (r *Rendezvous) end(c *rzConn, ev membership.Disconnected) {
	c.s.Reset()
	r.abortRead(c)
	if r.grp != nil {
		r.mu.Lock()
		current := c.mid != 0 && r.conns[c.mid] == c
		r.mu.Unlock()
		if !current {
			return // replaced by the stream it resumed on, or dropped when this replica stepped down
		}
	}
	r.step(ev)
}
