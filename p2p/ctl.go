package p2p

// The control stream: this rank's end of its registration stream with the
// rendezvous, which stays open for the whole job. ctlClient writes on it,
// reads everything the rendezvous sends and hands each message to whoever
// acts on it, and keeps it alive with heartbeats. What travels on it
// besides: progress reports and queries (progress.go), leaving early
// (leave.go), hang diagnosis (diagnose_rank.go) and elastic membership
// (elastic_ctl.go).

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
)

// ctlClient is a node's end of the control stream.
type ctlClient struct {
	n       *Node
	s       network.Stream // nil until registered
	writeMu sync.Mutex     // serialises writes
	dead    chan struct{}  // closed when the reader exits
	// lastRecv is when the rendezvous was last heard (UnixNano), by a
	// running process: a member cut off says how long it was silent.
	lastRecv atomic.Int64

	// A fixed-size job's setup: the table (written before tableReady
	// closes), the go; and the rendezvous' answer to a leave.
	tableReady chan struct{}
	table      []tableItem
	goCh       chan struct{}
	bye        chan struct{}

	progress progressReport // progress.go
	hang     hangAnswers    // diagnose_rank.go
	leave    leaveTracker   // leave.go
	group    groupClient    // ctl_resume.go: a replicated rendezvous
}

func newCtlClient(n *Node) *ctlClient {
	return &ctlClient{
		n:          n,
		dead:       make(chan struct{}),
		tableReady: make(chan struct{}),
		goCh:       make(chan struct{}),
		bye:        make(chan struct{}),
		progress:   progressReport{answer: make(chan []uint64, 1)},
		hang:       hangAnswers{answer: make(chan hangAnswer, 1)},
		leave:      leaveTracker{behind: map[int]uint64{}, lateOK: make(chan struct{}, 1)},
		group:      groupClient{up: closedChan()},
	}
}

// registered reports whether the control stream was set up.
func (c *ctlClient) registered() bool { return c.s != nil }

// closed reports whether the control stream's reader has ended.
func (c *ctlClient) closed() bool {
	select {
	case <-c.dead:
		return true
	default:
		return false
	}
}

// register performs the challenge-response with the rendezvous and starts
// the control reader and heartbeat.
func (n *Node) register(ctx context.Context, targets []groupItem) error {
	sctx, cancel := n.stepCtx(ctx, "registering with the rendezvous at "+n.cfg.Rendezvous)
	defer cancel()
	// Ranks may start before the rendezvous (rank 0 hosting it, started by
	// a batch system at the same time as everyone else): retry with
	// backoff until the step times out. ForceDirectDial skips the swarm's
	// own dial backoff, which would otherwise turn retries into instant
	// failures.
	dctx := network.WithForceDirectDial(sctx, "gorun rendezvous")
	var (
		s    network.Stream
		w    *msg
		at   groupItem
		hint *groupItem // the leader a replica redirected to
		err  error
	)
	logged := map[uint64]bool{}
	delay := 50 * time.Millisecond
	for i := 0; ; {
		at = targets[i%len(targets)]
		if hint != nil {
			at, hint = *hint, nil
		} else {
			i++
		}
		var final bool
		if s, w, final, err = n.registerWith(sctx, dctx, at, len(targets) > 1); err == nil {
			break
		}
		if final {
			return fmt.Errorf("register with rendezvous at %s: %w", at.Addr, err)
		}
		var re *redirectError
		if errors.As(err, &re) {
			// A replica of a replicated rendezvous that does not lead
			// (yet) sends this rank to the one that does.
			if it := re.leaderItem(); it != nil && it.ID != at.ID {
				hint = it
				continue
			}
		}
		if !logged[at.ID] {
			n.logf("rendezvous at %s not reachable yet, retrying: %v", at.Addr, err)
			logged[at.ID] = true
		}
		if i%len(targets) != 0 {
			continue // the next replica of the list at once
		}
		if moved, ok := n.relocate(sctx, targets); ok {
			// The rendezvous moved (a new leader in etcd): try it at once.
			targets, i = moved, 0
			continue
		}
		t := time.NewTimer(delay)
		select {
		case <-sctx.Done():
			t.Stop()
			return fmt.Errorf("connect to rendezvous at %s: %v: %w", n.cfg.Rendezvous, err, context.Cause(sctx))
		case <-t.C:
		}
		delay = min(2*delay, time.Second)
	}
	n.ctl.learn(w)
	n.ctl.group.mu.Lock()
	n.ctl.group.current = at.ID
	n.ctl.group.mu.Unlock()
	n.logf("registered with rendezvous %s", at.Addr)
	n.ctl.start(s)
	return nil
}

// relocate asks Config.Relocate where the rendezvous is, after a round of
// targets failed, and returns it as the new targets if it is not one of
// them. The question is bounded by the heartbeat bound, so that an
// unreachable etcd does not hold up the retries.
func (n *Node) relocate(ctx context.Context, targets []groupItem) ([]groupItem, bool) {
	if n.cfg.Relocate == nil {
		return nil, false
	}
	rctx, cancel := context.WithTimeout(ctx, n.hbTimeout())
	id, addr, err := n.cfg.Relocate(rctx)
	cancel()
	if err != nil {
		n.logf("looking for the rendezvous again: %v", err)
		return nil, false
	}
	for _, t := range targets {
		if t.ID == id && t.Addr == addr {
			return nil, false
		}
	}
	n.logf("the rendezvous is now replica %d at %s", id, addr)
	return []groupItem{{ID: id, Addr: addr}}, true
}

// registerWith opens a control stream with replica it and says hello;
// final: the hello failed in a way that trying again cannot mend (a
// refusal, a wrong job key). In a list (bounded), one replica's dial is
// bounded by the heartbeat bound, so that a replica whose host is gone
// does not hold up the others.
func (n *Node) registerWith(sctx, dctx context.Context, it groupItem, bounded bool) (s network.Stream, w *msg, final bool, err error) {
	pid, addrs, err := n.replicaAddrs(sctx, it)
	if err != nil {
		return nil, nil, false, err
	}
	n.h.Peerstore().AddAddrs(pid, addrs, peerstore.PermanentAddrTTL)
	if bounded {
		var cancel context.CancelFunc
		dctx, cancel = context.WithTimeout(dctx, n.hbTimeout())
		defer cancel()
	}
	if s, err = n.hosts.newStream(dctx, n.h, pid, rendezvousProto); err != nil {
		return nil, nil, false, err
	}
	if w, err = n.hello(sctx, s, pid, false); err != nil {
		var re *redirectError
		return nil, nil, !errors.As(err, &re) && sctx.Err() == nil, err
	}
	return s, w, false, nil
}

// hello runs the challenge-response on a new stream s with the
// rendezvous replica pid, fresh or (resume) taking up this process' place
// with a new leader, and returns the welcome. The stream is reset on an
// error, and when ctx ends first.
func (n *Node) hello(ctx context.Context, s network.Stream, pid peer.ID, resume bool) (*msg, error) {
	if d, ok := ctx.Deadline(); ok {
		s.SetDeadline(d)
	}
	stopWatch := context.AfterFunc(ctx, func() { s.Reset() })
	fail := func(err error) (*msg, error) {
		stopWatch()
		s.Reset()
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return nil, err
	}
	ch, err := readMsg(s)
	if err != nil {
		return fail(err)
	}
	if ch.T != tChallenge {
		return fail(fmt.Errorf("expected challenge, got %q", ch.T))
	}
	myNonce := make([]byte, nonceLen)
	rand.Read(myNonce)
	var addrs []string
	for _, a := range n.h.Addrs() {
		addrs = append(addrs, a.String())
	}
	hello := &msg{T: tHello, Rank: max(n.cfg.Rank, 0), Joiner: n.cfg.Rank < 0, Nonce: myNonce,
		Elastic: elasticHello(n.cfg),
		Proof:   registerProof(n.cfg.JobKey, ch.Nonce, n.h.ID().String(), n.cfg.Rank),
		Addrs:   addrs,
		HostID:  n.cfg.HostID, Unix: n.data.unixName, TCPPort: n.data.tcpPort, TLSPort: n.data.tlsPort, Proc: n.cfg.ProcID}
	if n.cfg.Elastic {
		hello.Args = helloArgs(n.cfg.Args)
		hello.HostName = n.cfg.HostName
	}
	if r := n.cfg.Replica; r != nil && r.grp != nil {
		hello.Replica = &groupItem{ID: r.grp.cfg.ID, Addr: r.grp.cfg.Advertise, Spare: r.grp.cfg.Spare}
	}
	if resume {
		n.ctl.group.mu.Lock()
		hello.Resume, hello.MID = true, n.ctl.group.mid
		n.ctl.group.mu.Unlock()
	}
	if err := writeMsg(s, hello); err != nil {
		return fail(err)
	}
	w, err := readMsg(s)
	if err != nil {
		return fail(fmt.Errorf("%w (wrong job key, or refused)", err))
	}
	switch w.T {
	case tWelcome:
	case tRedirect:
		stopWatch()
		s.Reset()
		return nil, &redirectError{leader: w.Seq, group: w.Group}
	case tError:
		return fail(fmt.Errorf("%w: %s", errRefused, w.Text))
	default:
		return fail(fmt.Errorf("expected welcome, got %q", w.T))
	}
	if !hmac.Equal(w.Proof, welcomeProof(n.cfg.JobKey, myNonce, pid.String())) {
		return fail(errors.New("rendezvous failed to prove it knows the job key"))
	}
	if !stopWatch() {
		return fail(context.Cause(ctx))
	}
	s.SetDeadline(time.Time{})
	return w, nil
}

// start runs the client on the registered stream s: the reader, the
// heartbeat and the progress reports.
func (c *ctlClient) start(s network.Stream) {
	c.s = s
	c.n.life.wg.Add(3)
	go c.read()
	go c.heartbeat()
	go c.reportProgress()
}

// send writes m on the control stream, bounded by Timeout.
func (c *ctlClient) send(m *msg) error {
	s, err := c.streamFor(m)
	if err != nil || s == nil {
		return err
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if s != c.s {
		return nil // resumed meanwhile: sent again on the new stream if it matters
	}
	c.s.SetWriteDeadline(time.Now().Add(c.n.cfg.Timeout))
	err = writeMsg(c.s, m)
	if err != nil && c.group.replicated() {
		// The reader sees the stream break too and reconnects; what
		// matters is sent again then (resend).
		return nil
	}
	return err
}

// heartbeat pings the rendezvous every quarter of the heartbeat bound
// (Timeout, or HeartbeatTimeout in elastic mode), so a frozen rank is seen
// within that bound. It runs on a goroutine of its own and shares only the
// control stream's write lock, which guards small messages: nothing on
// this path waits for a data transfer.
func (c *ctlClient) heartbeat() {
	n := c.n
	c.tick(n.hbTimeout()/4, func() *msg { return &msg{T: tPing, Rank: max(n.rank(), 0)} })
}

// tick sends next() on the control path every interval, skipping nil, until
// the node stops or the control path dies.
func (c *ctlClient) tick(interval time.Duration, next func() *msg) {
	n := c.n
	defer n.life.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-n.life.stop:
			return
		case <-c.dead:
			return
		case <-t.C:
			if n.sim.frozen.Load() {
				continue
			}
			if m := next(); m != nil && c.send(m) != nil && !c.group.replicated() {
				return
			}
		}
	}
}

// read handles everything the rendezvous sends after registration. Any
// read error (including no heartbeat for Timeout) means the control path is
// lost, which aborts the job for this rank unless we are closing.
func (c *ctlClient) read() {
	n := c.n
	defer n.life.wg.Done()
	defer close(c.dead)
	gotTable := false
	for {
		c.writeMu.Lock()
		s := c.s
		c.writeMu.Unlock()
		s.SetReadDeadline(time.Now().Add(n.hbTimeout()))
		m, err := readMsg(s)
		if err == nil && !n.sim.frozen.Load() {
			c.lastRecv.Store(time.Now().UnixNano())
		}
		if !n.waitThaw() {
			return
		}
		if err == nil && m.T == tRedirect {
			// The leader handed the lead over (or lost it): follow.
			c.learn(m)
			c.group.mu.Lock()
			c.group.hint = m.Seq
			c.group.mu.Unlock()
			err = fmt.Errorf("the rendezvous leader handed over to replica %d", m.Seq)
		}
		if err != nil && !n.life.closing.Load() && c.group.replicated() {
			if rerr := c.reconnect(err); rerr == nil {
				continue
			} else {
				err = rerr
			}
		}
		if err != nil {
			if !n.life.closing.Load() {
				if n.cfg.Elastic {
					n.abortLocal(n.cutOffErr(err))
				} else {
					n.abortLocal(fmt.Errorf("lost rendezvous at %s: %v", n.cfg.Rendezvous, err))
				}
			}
			return
		}
		if n.cfg.Elastic && n.elasticCtl(m) {
			continue
		}
		c.learn(m)
		switch m.T {
		case tPing:
			n.mu.Lock()
			changed := !slices.Equal(n.job.missing, m.Missing)
			n.job.missing = m.Missing
			n.mu.Unlock()
			if changed && len(m.Missing) > 0 {
				n.logf("waiting for ranks %v to register", m.Missing)
			}
		case tTable:
			if !gotTable {
				gotTable = true
				c.table = m.Table
				close(c.tableReady)
			}
		case tGo:
			closeIfOpen(c.goCh)
		case tAbort:
			// Acknowledged before acting on it: a rank hosting the
			// rendezvous waits for this before it exits (AbortDelivered).
			_ = c.send(&msg{T: tAbortOK, Rank: max(n.rank(), 0)})
			if m.Left {
				// The job ends because a rank left early: the call this
				// rank is in, or would enter next, can never complete.
				n.abortLocal(&PeerLeftError{Rank: m.Rank, LastCall: m.Seq, Self: n.rank(), Call: max(c.progress.last.Load(), m.Seq+1)})
				break
			}
			n.abortLocal(errors.New(m.Text))
		case tHang:
			c.hangReportArrived(m.Text, m.Rank)
		case tProgress:
			select {
			case c.progress.answer <- m.Progress:
			default:
			}
		case tStateAsk:
			// Answered on a goroutine of its own: the reader goes on
			// reading (heartbeats) while the stacks are taken.
			n.life.wg.Add(1) // the reader is counted: never races with Wait
			go c.answerHang(m.Text)
		case tBye:
			closeIfOpen(c.bye)
		case tLeaving:
			c.peerLeaving(m.Rank, m.Seq)
		case tLate:
			c.peerBehind(m.Rank, m.Seq)
		case tLateOK:
			select {
			case c.leave.lateOK <- struct{}{}:
			default:
			}
		default:
			n.logf("unexpected control message %q", m.T)
		}
	}
}

// closeIfOpen closes ch unless it is closed; only the reader closes these.
func closeIfOpen(ch chan struct{}) {
	select {
	case <-ch:
	default:
		close(ch)
	}
}
