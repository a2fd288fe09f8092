package p2p

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
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

// Rendezvous is the membership and control service of one job.
type Rendezvous struct {
	cfg  RendezvousConfig
	h    host.Host
	id   peer.ID
	addr string

	mu             sync.Mutex
	progress       map[int]uint64 // last collective each rank reported entering
	regs           map[int]*rzConn
	tableSent      bool
	goSent         bool
	aborted        bool
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
	// relayMu orders broadcasts (departures, aborts, epochs): a rank that
	// fails because of a departure can not have its consequences reach
	// another rank before the departure itself.
	relayMu sync.Mutex
	hb      time.Duration // heartbeat bound: Timeout, or Elastic.HeartbeatTimeout
	el      rzElastic     // elastic mode, under mu
	// Hang diagnoses (diagnose.go), under mu: those being gathered, the
	// reports of the last diagnosed calls, the last gathering's id.
	hangs    map[hangKey]*hangGather
	hangKept []keptHang
	hangIDs  uint64
}

// rzConn is the server side of one rank's control stream.
type rzConn struct {
	id    int // key in regs: the rank it registered with, or a serial number for a joiner
	rank  int // its rank (in the current epoch, in elastic mode: under Rendezvous.mu)
	s     network.Stream
	addr  string // remote multiaddr, for messages
	item  tableItem
	wmu   sync.Mutex
	acked bool
	left  bool
	gone  bool
	// leaving: the rank announced it leaves after call lastCall.
	leaving  bool
	lastCall uint64
	// behind: the rank reported being in a later call than a rank that
	// left, so its own end is a consequence of that departure.
	behind bool
	// Elastic mode, under Rendezvous.mu.
	joiner     bool // registered as a joiner
	member     bool // in the current epoch's table (or a survivor waiting for one)
	ackEpoch   int  // the last epoch whose table it acked
	stableRank int  // its rank in the last established epoch, -1 if none
	growReq    bool // asked to grow the current epoch
	leaveReq   bool // with its grow request: it leaves the job (leaveWhy)
	leaveWhy   string
	departed   bool     // it left the job gracefully (at a grow)
	quitWhy    string   // it said it quits now (tQuit): why
	proc       string   // its hello's Proc (Config.ProcID)
	args       []string // its hello's Args (Config.Args)
	hostName   string   // its hello's HostName
	// heard is when a message from the rank was last read (UnixNano).
	heard atomic.Int64
}

func (c *rzConn) send(m *msg, timeout time.Duration) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
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
		regs:    map[int]*rzConn{},
		allReg:  make(chan struct{}),
		allGone: make(chan struct{}), abortDelivered: make(chan struct{}),
		closeCh: make(chan struct{}),
		hb:      hb,
	}
	r.el.nextID = cfg.Size
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
	h.SetStreamHandler(rendezvousProto, r.handle)
	cfg.Logf("rendezvous for %d ranks at %s (peer %s)", cfg.Size, r.addr, id)
	return r, nil
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
	if r.cfg.Elastic == nil || !r.tableSent {
		return r.cfg.Size
	}
	return len(r.el.members)
}

// procEventLocked tells OnProc about ev.
func (r *Rendezvous) procEventLocked(ev ProcEvent) {
	if r.cfg.OnProc == nil || r.cfg.Elastic == nil {
		return
	}
	ev.AfterLeave = r.el.leftClean
	ev.Members = len(r.el.members)
	if !r.tableSent {
		ev.Members = r.cfg.Size
	}
	r.cfg.OnProc(ev)
}

// WaitRegistered waits until all Size ranks registered.
func (r *Rendezvous) WaitRegistered(ctx context.Context) error {
	select {
	case <-r.allReg:
		return nil
	case <-ctx.Done():
		r.mu.Lock()
		missing := r.missingLocked()
		n := len(r.regs)
		r.mu.Unlock()
		return fmt.Errorf("p2p: waiting for ranks to register: missing ranks %v (%d of %d registered): %w",
			missing, n, r.cfg.Size, context.Cause(ctx))
	case <-r.closeCh:
		return errors.New("p2p: rendezvous closed")
	}
}

func (r *Rendezvous) missingLocked() []int {
	var m []int
	for i := 0; i < r.cfg.Size; i++ {
		if _, ok := r.regs[i]; !ok {
			m = append(m, i)
		}
	}
	return m
}

func (r *Rendezvous) unackedLocked() []int {
	var m []int
	for i := 0; i < r.cfg.Size; i++ {
		if c, ok := r.regs[i]; !ok || !c.acked {
			m = append(m, i)
		}
	}
	return m
}

// Close stops the rendezvous. If the job is running (table sent, not
// aborted) it first waits, at most Timeout, for every rank to leave, so that
// a rank-0-hosted rendezvous does not pull the control path from under ranks
// that are still finishing.
func (r *Rendezvous) Close() error {
	var err error
	r.closeOnce.Do(func() {
		r.mu.Lock()
		wait := r.tableSent && !r.aborted
		r.mu.Unlock()
		if wait {
			t := time.NewTimer(r.cfg.Timeout)
			select {
			case <-r.allGone:
			case <-t.C:
				r.cfg.Logf("rendezvous: closing with ranks still connected")
			}
			t.Stop()
		}
		r.mu.Lock()
		r.closed = true
		close(r.closeCh)
		conns := make([]*rzConn, 0, len(r.regs))
		for _, c := range r.regs {
			conns = append(conns, c)
		}
		r.mu.Unlock()
		for _, c := range conns {
			c.s.Reset()
		}
		err = r.h.Close()
		r.wg.Wait()
	})
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
	c := &rzConn{id: rank, rank: rank, s: s, addr: raddr, joiner: m.Joiner, stableRank: -1, ackEpoch: -1, proc: m.Proc, args: m.Args, hostName: m.HostName, item: tableItem{
		Rank: m.Rank, ID: remote.String(), Addrs: m.Addrs, HostID: m.HostID, Unix: m.Unix, TCPPort: m.TCPPort, TLSPort: m.TLSPort,
	}}
	// Hold c's write lock from the moment c becomes visible in regs until
	// the welcome is written: otherwise another rank's registration could
	// send c the table (or a ping) before its welcome.
	c.wmu.Lock()
	if err := r.register(c, m.Elastic); err != nil {
		c.wmu.Unlock()
		who := fmt.Sprintf("rank %d", m.Rank)
		if m.Joiner {
			who = "joiner " + remote.String()
		}
		r.cfg.Logf("rendezvous: refused %s from %s: %v", who, raddr, err)
		if m.Joiner {
			r.mu.Lock()
			r.procEventLocked(ProcEvent{Kind: ProcSentAway, Member: r.memberOf(c, -1), Cause: err.Error()})
			r.mu.Unlock()
		}
		c.send(&msg{T: tError, Text: err.Error()}, to)
		s.CloseWrite()
		// Let the error reach the client before the reset (bounded).
		s.SetReadDeadline(time.Now().Add(time.Second))
		readMsgMax(s, maxSmallFrame)
		s.Reset()
		return
	}
	_ = s.SetWriteDeadline(time.Now().Add(to))
	err = writeMsg(s, &msg{T: tWelcome, Proof: welcomeProof(r.cfg.JobKey, m.Nonce, r.id.String())})
	c.wmu.Unlock()
	if err != nil {
		r.lost(c, err)
		return
	}
	if c.joiner {
		r.cfg.Logf("rendezvous: joiner %s registered from %s", remote, raddr)
		r.joinerRegistered()
	} else {
		r.cfg.Logf("rendezvous: rank %d registered from %s", c.rank, raddr)
		r.afterRegister()
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
				p := &msg{T: tPing}
				if !r.tableSent {
					p.Missing = r.missingLocked()
				} else if !r.goSent && r.cfg.Elastic == nil {
					p.Missing = r.unackedLocked()
				}
				if r.cfg.Elastic != nil {
					p.Epoch, p.Pending = r.el.epoch, r.admissibleLocked()
				}
				r.mu.Unlock()
				if c.send(p, to) != nil {
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
		switch m.T {
		case tPing:
		case tProgress, tState:
			r.mu.Lock()
			if r.progress == nil {
				r.progress = map[int]uint64{}
			}
			r.progress[c.rank] = max(r.progress[c.rank], m.Seq)
			r.mu.Unlock()
			if m.T == tState {
				r.hangAnswered(c, m.Text)
			}
		case tHangAsk:
			r.hangAsked(c, m.Seq, m.Epoch)
		case tProgQuery:
			r.mu.Lock()
			size := r.cfg.Size
			if r.cfg.Elastic != nil && r.el.tableSent {
				size = len(r.el.members)
			}
			p := make([]uint64, size)
			for rank, seq := range r.progress {
				if rank >= 0 && rank < len(p) {
					p[rank] = seq
				}
			}
			r.mu.Unlock()
			if c.send(&msg{T: tProgress, Progress: p}, to) != nil {
				r.lost(c, errors.New("progress reply failed"))
				return
			}
		case tAck:
			if r.cfg.Elastic != nil {
				r.elasticAck(c, m.Epoch)
			} else {
				r.ack(c)
			}
		case tLinkFail:
			r.linkFailed(c, m)
		case tGrow:
			r.growRequest(c, m.Epoch, m.Leave, m.Text)
		case tQuit:
			// A member that leaves outside a commit: a loss, with its
			// own reason instead of "disconnected".
			r.mu.Lock()
			c.quitWhy = m.Text
			r.mu.Unlock()
			r.lost(c, errQuit)
			return
		case tAbort:
			r.abort(fmt.Sprintf("rank %d aborted: %s", r.rankOf(c), m.Text))
		case tAbortOK:
			r.abortRead(c)
		case tLeaving:
			r.leaving(c, m.Seq)
		case tLate:
			r.late(c, m.Seq)
			if c.send(&msg{T: tLateOK}, to) != nil {
				r.lost(c, errors.New("late report acknowledgement failed"))
				return
			}
		case tLeave:
			r.mu.Lock()
			c.left = true
			rank := c.rank
			r.mu.Unlock()
			r.cfg.Logf("rendezvous: rank %d left", rank)
			c.send(&msg{T: tBye}, to)
			s.CloseWrite()
			// Wait for the client to close its side (bounded), then finish.
			_ = s.SetReadDeadline(time.Now().Add(to))
			for {
				if _, err := readMsg(s); err != nil {
					break
				}
			}
			r.lost(c, nil)
			return
		default:
			r.cfg.Logf("rendezvous: rank %d sent unexpected %q", r.rankOf(c), m.T)
		}
	}
}

// rankOf returns c's rank (which changes with the epochs of an elastic
// job).
func (r *Rendezvous) rankOf(c *rzConn) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return c.rank
}

func (r *Rendezvous) register(c *rzConn, elastic int64) error {
	switch e := r.cfg.Elastic; {
	case e == nil && elastic != 0:
		return errors.New("this job is not elastic: join it without Config.Elastic (and not as a joiner)")
	case e != nil && elastic == 0:
		return errors.New("this job is elastic: join it with Config.Elastic")
	case e != nil && elastic != max(e.HeartbeatTimeout.Milliseconds(), 1):
		return fmt.Errorf("heartbeat bound %v differs from the job's %v (Config.HeartbeatTimeout)",
			time.Duration(elastic)*time.Millisecond, e.HeartbeatTimeout)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.joiner {
		return r.registerJoinerLocked(c)
	}
	switch {
	case r.aborted:
		return errors.New("job already aborted")
	case c.rank < 0 || c.rank >= r.cfg.Size:
		return fmt.Errorf("rank %d out of range [0,%d)", c.rank, r.cfg.Size)
	case r.regs[c.rank] != nil:
		return fmt.Errorf("rank %d already registered from %s", c.rank, r.regs[c.rank].addr)
	case r.tableSent:
		if r.cfg.Elastic != nil {
			return errors.New("registration closed: the job runs; join it as a joiner (rank -1)")
		}
		return errors.New("registration closed")
	}
	r.regs[c.rank] = c
	return nil
}

// afterRegister tells everybody who is still missing and, once complete,
// sends the table (phase 1 of the start).
func (r *Rendezvous) afterRegister() {
	if r.cfg.Elastic != nil {
		// The table of epoch 0 goes out before any later epoch's.
		r.relayMu.Lock()
		defer r.relayMu.Unlock()
	}
	r.mu.Lock()
	missing := r.missingLocked()
	conns := r.connsLocked()
	var table []tableItem
	away := &outbox{}
	if len(missing) == 0 && !r.tableSent {
		r.tableSent = true
		close(r.allReg)
		for i := 0; i < r.cfg.Size; i++ {
			table = append(table, r.regs[i].item)
		}
		if r.cfg.Elastic != nil {
			r.startElasticLocked()
			r.refuseEarlyJoinersLocked(away)
		}
	}
	if r.cfg.Elastic != nil {
		conns = slices.DeleteFunc(conns, func(c *rzConn) bool { return c.joiner })
	}
	r.mu.Unlock()
	r.deliver(away)
	m := &msg{T: tPing, Missing: missing}
	if table != nil {
		r.cfg.Logf("rendezvous: all %d ranks registered, sending table", r.cfg.Size)
		m = &msg{T: tTable, Table: table}
	}
	for _, c := range conns {
		if err := c.send(m, r.cfg.Timeout); err != nil {
			c.s.Reset() // its reader will report it
		}
	}
}

func (r *Rendezvous) connsLocked() []*rzConn {
	out := make([]*rzConn, 0, len(r.regs))
	for _, c := range r.regs {
		if !c.gone {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b *rzConn) int { return a.rank - b.rank })
	return out
}

// ack records that c installed the table; after the last ack: "go" (phase 2).
func (r *Rendezvous) ack(c *rzConn) {
	r.mu.Lock()
	c.acked = true
	send := false
	if r.tableSent && !r.goSent && len(r.unackedLocked()) == 0 {
		r.goSent = true
		send = true
	}
	conns := r.connsLocked()
	r.mu.Unlock()
	if send {
		r.cfg.Logf("rendezvous: all ranks acked the table, go")
		for _, c := range conns {
			if err := c.send(&msg{T: tGo}, r.cfg.Timeout); err != nil {
				c.s.Reset()
			}
		}
	}
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

// abort relays the first abort of the job to every connected rank.
func (r *Rendezvous) abort(text string) {
	r.abortWith(&msg{T: tAbort, Text: text}, Abort{})
}

// abortWith relays the first abort of the job, m, to every connected rank;
// a describes it to OnAbort (its Cause is m.Text).
func (r *Rendezvous) abortWith(m *msg, a Abort) {
	text := m.Text
	r.mu.Lock()
	if r.aborted || r.closed {
		r.mu.Unlock()
		return
	}
	r.aborted = true
	r.mu.Unlock()
	r.cfg.Logf("rendezvous: job aborted: %s", text)
	if r.cfg.OnAbort != nil {
		a.Cause = text
		r.cfg.OnAbort(a)
	}
	r.relayMu.Lock()
	r.mu.Lock()
	conns := r.connsLocked()
	// Acknowledgements may come before the broadcast ends: count every
	// recipient as unread first. Only ranks heard from within half the
	// heartbeat bound (two pings) are waited for: a rank on a host that
	// died or froze would never answer, and under srun, which ends the
	// step as soon as another rank exits, the rank hosting the rendezvous
	// would be killed waiting, before it printed why the job failed.
	recent := time.Now().Add(-r.hb / 2).UnixNano()
	r.abortUnread = make(map[*rzConn]bool, len(conns))
	for _, c := range conns {
		if c.heard.Load() >= recent {
			r.abortUnread[c] = true
		}
	}
	r.mu.Unlock()
	r.broadcast(conns, m)
	r.relayMu.Unlock()
	r.abortRead(nil)
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

// leaving records that c's rank leaves after call lastCall, tells OnLeave,
// and tells every rank that may be behind it: all but those that announced
// their own leave, which made no later call (it could not have completed).
func (r *Rendezvous) leaving(c *rzConn, lastCall uint64) {
	r.mu.Lock()
	if !r.tableSent || c.leaving {
		r.mu.Unlock()
		return
	}
	if c.departed {
		// It left the elastic job at a commit already; its Close says
		// nothing the others must act on.
		r.mu.Unlock()
		return
	}
	c.leaving, c.lastCall = true, lastCall
	if r.cfg.Elastic != nil && c.member {
		r.el.leftClean = true // the job is finishing
	}
	aborted := r.aborted || r.closed
	rank := c.rank
	r.mu.Unlock()
	r.cfg.Logf("rendezvous: rank %d leaves after call #%d", rank, lastCall)
	if r.cfg.OnLeave != nil {
		r.cfg.OnLeave(rank, lastCall)
	}
	if aborted {
		return // every rank has been told why already
	}
	r.relayMu.Lock()
	defer r.relayMu.Unlock()
	r.mu.Lock()
	var to []*rzConn
	for _, o := range r.connsLocked() {
		if o != c && !o.leaving {
			to = append(to, o)
		}
	}
	r.mu.Unlock()
	r.broadcast(to, &msg{T: tLeaving, Rank: rank, Seq: lastCall})
}

// late passes on c's report that its rank is in call `call`, after ranks
// left following earlier calls, to those ranks if they are still here: their
// Close says whom they left behind. The caller acknowledges the report
// after this returns, so it precedes the bye on the leaver's stream.
func (r *Rendezvous) late(c *rzConn, call uint64) {
	r.mu.Lock()
	var to []*rzConn
	var ranks []int
	for _, o := range r.connsLocked() {
		if o.leaving && !o.left && o.lastCall < call {
			to = append(to, o)
			ranks = append(ranks, o.rank)
		}
	}
	rank := c.rank
	c.behind = true
	r.mu.Unlock()
	for i, o := range to {
		r.cfg.Logf("rendezvous: rank %d was in call #%d when rank %d left after call #%d", rank, call, ranks[i], o.lastCall)
		o.send(&msg{T: tLate, Rank: rank, Seq: call}, r.cfg.Timeout)
	}
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
	c.s.Reset()
	r.abortRead(c)
	r.mu.Lock()
	c.gone = true
	started := r.tableSent
	left := c.left
	closed := r.closed
	if !started || c.joiner && !c.member {
		// Before the table nobody depends on this rank yet (nor ever on a
		// joiner not admitted yet): forget it so it can register again.
		delete(r.regs, c.id)
	}
	allGone := started && len(r.connsLocked()) == 0
	if allGone {
		select {
		case <-r.allGone:
		default:
			close(r.allGone)
		}
	}
	r.mu.Unlock()
	if closed {
		return
	}
	if c.joiner && !started {
		r.elasticLost(c, err, left)
		return
	}
	if !started {
		r.cfg.Logf("rendezvous: rank %d (%s) dropped before the job started: %v", c.rank, c.addr, err)
		r.afterRegister()
		return
	}
	if r.cfg.Elastic != nil {
		r.elasticLost(c, err, left)
		return
	}
	if !left {
		var timeout interface{ Timeout() bool }
		if errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &timeout) && timeout.Timeout()) {
			// No heartbeat: the process is frozen, stopped or cut off.
			why := fmt.Sprintf("no heartbeat within %v", r.cfg.Timeout)
			r.abortWith(&msg{T: tAbort, Text: fmt.Sprintf("rank %d (%s) stopped responding: %s", c.rank, c.addr, why)},
				Abort{Unresponsive: true, Rank: c.rank, Addr: c.addr, Why: why})
			return
		}
		if d := r.departureBefore(c); d != nil {
			// It failed because a rank left early: say that, so a rank
			// that had not reached the later call yet blames the
			// departure, not this rank's exit.
			r.abortWith(&msg{T: tAbort, Left: true, Rank: d.rank, Seq: d.lastCall,
				Text: fmt.Sprintf("rank %d closed its communicator after call #%d; rank %d (%s) was in a later call and exited", d.rank, d.lastCall, c.rank, c.addr)},
				Abort{})
			return
		}
		r.abort(fmt.Sprintf("rank %d (%s) disconnected", c.rank, c.addr))
	}
}

// departureBefore returns the departure (earliest last call) that put c
// behind, if c reported being behind one.
func (r *Rendezvous) departureBefore(c *rzConn) *departure {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !c.behind {
		return nil
	}
	var d *departure
	for _, o := range r.regs {
		if o.leaving && (d == nil || o.lastCall < d.lastCall) {
			d = &departure{rank: o.rank, lastCall: o.lastCall}
		}
	}
	return d
}
