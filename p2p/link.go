package p2p

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/protocol"
)

const ringProto protocol.ID = "/gorun/ring/1"

// sockBuf is the kernel buffer size requested for plaintext data sockets;
// bigger buffers mean fewer wakeups per MiB moved.
const sockBuf = 4 << 20

// deadliner is what a link needs from a net.Conn or libp2p stream.
type deadliner interface {
	io.ReadWriter
	SetDeadline(time.Time) error
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
}

// link is one ring edge: id is the rank that sends on it.
type link struct {
	id   int
	peer int    // the other rank
	addr string // the other rank's address, for error messages
	kind string
	c    net.Conn       // unix / tcp-plaintext
	s    network.Stream // libp2p-tls
	rw   deadliner
	raw  syscall.RawConn // for polling reads on plain sockets; nil otherwise
}

func (l *link) close() {
	if l.c != nil {
		l.c.Close()
	} else {
		l.s.Reset()
	}
}

func newConnLink(c net.Conn, kind string) *link {
	switch cc := c.(type) {
	case *net.TCPConn:
		cc.SetNoDelay(true)
		cc.SetReadBuffer(sockBuf)
		cc.SetWriteBuffer(sockBuf)
	case *net.UnixConn:
		cc.SetReadBuffer(sockBuf)
		cc.SetWriteBuffer(sockBuf)
	}
	l := &link{c: c, rw: c, kind: kind}
	if sc, ok := c.(syscall.Conn); ok {
		l.raw, _ = sc.SyscallConn()
	}
	return l
}

func (n *Node) acceptLoop(ln net.Listener, kind string) {
	defer n.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			l := newConnLink(c, kind)
			if err := n.acceptHandshake(l, c.RemoteAddr().String()); err != nil {
				n.logf("refused %s data connection from %s: %v", kind, c.RemoteAddr(), err)
				c.Close()
			}
		}()
	}
}

func (n *Node) handleRingStream(s network.Stream) {
	// Add to the WaitGroup only while not stopped (under mu), so an Add can
	// never race with shutdown's Wait.
	n.mu.Lock()
	if n.stopped {
		n.mu.Unlock()
		s.Reset()
		return
	}
	n.wg.Add(1)
	n.mu.Unlock()
	defer n.wg.Done()
	l := &link{s: s, rw: s, kind: LinkLibp2pTLS}
	if err := n.acceptHandshake(l, s.Conn().RemoteMultiaddr().String()); err != nil {
		n.logf("refused libp2p data stream from %s: %v", s.Conn().RemotePeer(), err)
		s.Reset()
	}
}

// acceptHandshake authenticates a dialer: it must prove the job key over
// our fresh nonce and be the rank expected on that link (and, for libp2p,
// have that rank's peer ID). We prove the key back over its nonce.
func (n *Node) acceptHandshake(l *link, from string) error {
	l.rw.SetDeadline(time.Now().Add(n.cfg.Timeout))
	nonce := make([]byte, nonceLen)
	rand.Read(nonce)
	if err := writeMsg(l.rw, &msg{T: tDChal, Nonce: nonce}); err != nil {
		return err
	}
	m, err := readMsgMax(l.rw, maxSmallFrame)
	if err != nil {
		return err
	}
	if m.T != tDHello {
		return fmt.Errorf("expected data hello, got %q", m.T)
	}
	if !hmac.Equal(m.Proof, dataProof(n.cfg.JobKey, nonce, m.Rank, m.Link)) {
		return errors.New("bad job key")
	}
	n.mu.Lock()
	table := n.table
	n.mu.Unlock()
	if table == nil {
		return errors.New("no job table yet")
	}
	if err := checkDataHello(m, n.cfg.Rank, n.cfg.Size); err != nil {
		return err
	}
	if l.s != nil && l.s.Conn().RemotePeer().String() != table[m.Rank].ID {
		return fmt.Errorf("peer %s claims rank %d", l.s.Conn().RemotePeer(), m.Rank)
	}
	n.mu.Lock()
	if !n.expect[m.Link] || n.have[m.Link] {
		n.mu.Unlock()
		return fmt.Errorf("unexpected or duplicate link %d from rank %d", m.Link, m.Rank)
	}
	n.have[m.Link] = true
	n.mu.Unlock()
	if err := writeMsg(l.rw, &msg{T: tDOK, Proof: dataOKProof(n.cfg.JobKey, m.Nonce, n.cfg.Rank, m.Link)}); err != nil {
		return err
	}
	l.rw.SetDeadline(time.Time{})
	l.id, l.peer = m.Link, m.Rank
	l.addr = n.peerAddr(m.Rank, l.kind, from)
	n.accepted <- l // capacity covers every expected link
	return nil
}

// checkDataHello verifies that a data hello names a link between the
// dialer and me (rank) of which the dialer is the designated dialer.
func checkDataHello(m *msg, me, size int) error {
	if m.Rank < 0 || m.Rank >= size || m.Link < 0 || m.Link >= size || size < 2 {
		return fmt.Errorf("rank %d / link %d out of range", m.Rank, m.Link)
	}
	a, b := m.Link, (m.Link+1)%size
	if !((a == me && b == m.Rank) || (b == me && a == m.Rank)) {
		return fmt.Errorf("link %d does not join rank %d and rank %d", m.Link, m.Rank, me)
	}
	if dialerOf(m.Link, size) != m.Rank {
		return fmt.Errorf("rank %d is not the dialer of link %d", m.Rank, m.Link)
	}
	return nil
}

// peerAddr is how error messages name a rank's end of a link.
func (n *Node) peerAddr(rank int, kind, fallback string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if rank < 0 || rank >= len(n.table) {
		return fallback
	}
	it := n.table[rank]
	switch kind {
	case LinkUnix:
		return it.Unix
	case LinkTCPPlaintext:
		return net.JoinHostPort(ipOfAddrs(it.Addrs), strconv.Itoa(it.TCPPort))
	}
	return fallback
}

// chooseKind decides, on the dialing side, how to reach peer p.
func (n *Node) chooseKind(p tableItem) string {
	if n.cfg.DataPlane != DataPlaneTLS && p.Unix != "" && p.HostID == n.hostID {
		return LinkUnix
	}
	if n.cfg.DataPlane == DataPlanePlaintext && p.TCPPort > 0 && ipOfAddrs(p.Addrs) != "" {
		return LinkTCPPlaintext
	}
	return LinkLibp2pTLS
}

// dialLink opens link id to rank to and authenticates both ends.
func (n *Node) dialLink(ctx context.Context, id, to int) (*link, error) {
	n.mu.Lock()
	p := n.table[to]
	n.mu.Unlock()
	kind := n.chooseKind(p)
	var l *link
	switch kind {
	case LinkUnix, LinkTCPPlaintext:
		network, addr := "unix", p.Unix
		if kind == LinkTCPPlaintext {
			network, addr = "tcp", net.JoinHostPort(ipOfAddrs(p.Addrs), strconv.Itoa(p.TCPPort))
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, fmt.Errorf("dial rank %d (%s): %w", to, addr, err)
		}
		l = newConnLink(c, kind)
		l.addr = addr
	default:
		id, err := peerIDOf(p)
		if err != nil {
			return nil, err
		}
		s, err := n.h.NewStream(ctx, id, ringProto)
		if err != nil {
			return nil, fmt.Errorf("open stream to rank %d (%s): %w", to, id, err)
		}
		l = &link{s: s, rw: s, kind: kind, addr: s.Conn().RemoteMultiaddr().String()}
	}
	l.id, l.peer = id, to
	if d, ok := ctx.Deadline(); ok {
		l.rw.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, l.close)
	err := func() error {
		ch, err := readMsg(l.rw)
		if err != nil {
			return err
		}
		if ch.T != tDChal {
			return fmt.Errorf("expected data challenge, got %q", ch.T)
		}
		nonce := make([]byte, nonceLen)
		rand.Read(nonce)
		if err := writeMsg(l.rw, &msg{T: tDHello, Rank: n.cfg.Rank, Link: id, Nonce: nonce,
			Proof: dataProof(n.cfg.JobKey, ch.Nonce, n.cfg.Rank, id)}); err != nil {
			return err
		}
		ok, err := readMsg(l.rw)
		if err != nil {
			return err
		}
		if ok.T != tDOK || !hmac.Equal(ok.Proof, dataOKProof(n.cfg.JobKey, nonce, to, id)) {
			return errors.New("peer failed to prove the job key")
		}
		return nil
	}()
	if !stop() && err == nil {
		err = context.Cause(ctx)
	}
	if err != nil {
		l.close()
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return nil, fmt.Errorf("data handshake with rank %d (%s, %s): %w", to, l.addr, kind, err)
	}
	l.rw.SetDeadline(time.Time{})
	return l, nil
}

// connectLinks establishes this rank's send link (to rank+1) and receive
// link (from rank-1): dialing the ones we are the lower rank of, waiting for
// the others.
func (n *Node) connectLinks(ctx context.Context) error {
	size, me := n.cfg.Size, n.cfg.Rank
	if size == 1 {
		return nil
	}
	next, prev := (me+1)%size, (me-1+size)%size
	sctx, cancel := n.stepCtx(ctx, fmt.Sprintf("connecting ring links (to rank %d, from rank %d)", next, prev))
	defer cancel()
	type res struct {
		l   *link
		err error
	}
	dials := make(chan res, 2)
	ndial, nwait := 0, 0
	for _, lk := range []struct{ id, peer int }{{me, next}, {prev, prev}} {
		if dialerOf(lk.id, size) == me {
			ndial++
			go func() {
				l, err := n.dialLink(sctx, lk.id, lk.peer)
				dials <- res{l, err}
			}()
		} else {
			nwait++
		}
	}
	var send, recv *link
	var firstErr error
	put := func(l *link) {
		n.mu.Lock()
		n.links = append(n.links, l)
		aborted := n.err != nil
		n.mu.Unlock()
		if aborted {
			l.close()
		}
		if l.id == me {
			send = l
		} else {
			recv = l
		}
	}
	stepDone, nodeDone := sctx.Done(), n.done
	for ndial > 0 || nwait > 0 {
		select {
		case r := <-dials:
			ndial--
			if r.err != nil {
				if firstErr == nil {
					firstErr = r.err
					cancel()
				}
				continue
			}
			put(r.l)
		case l := <-n.accepted:
			nwait--
			put(l)
		case <-stepDone:
			stepDone = nil
			if firstErr == nil {
				firstErr = n.waitingErr(sctx, send, recv, next, prev)
			}
			nwait = 0 // stop waiting for accepts; dials end via ctx
		case <-nodeDone:
			nodeDone = nil
			if firstErr == nil {
				firstErr = n.Err()
				cancel()
			}
			nwait = 0
		}
	}
	if firstErr != nil {
		return firstErr
	}
	local := 0
	for _, p := range n.peers {
		if p.HostID == n.hostID {
			local++
		}
	}
	n.tr = &transport{n: n, send: send, recv: recv}
	n.tr.pollBudget, n.tr.pollYield = pollConfig(local)
	n.mu.Lock()
	if n.peers[next].Link == "" {
		n.peers[next].Link = send.kind
	}
	if n.peers[prev].Link == "" {
		n.peers[prev].Link = recv.kind
	}
	n.mu.Unlock()
	n.logf("ring links up: to rank %d via %s (%s), from rank %d via %s (%s)",
		next, send.kind, send.addr, prev, recv.kind, recv.addr)
	return nil
}

func (n *Node) waitingErr(ctx context.Context, send, recv *link, next, prev int) error {
	var miss []string
	if send == nil {
		miss = append(miss, fmt.Sprintf("link to rank %d", next))
	}
	if recv == nil {
		miss = append(miss, fmt.Sprintf("link from rank %d", prev))
	}
	return fmt.Errorf("waiting for %v: %w", miss, context.Cause(ctx))
}

// linkGrace is how long a failed transfer waits for the control path to
// explain the failure.
const linkGrace = time.Second

// transport implements ring.Transport over the node's two links.
type transport struct {
	n          *Node
	send, recv *link
	pollBudget time.Duration
	pollYield  bool
}

// watch applies ctx to one operation: its deadline becomes the socket
// deadline, and cancellation sets a past deadline so a blocked call returns.
// The returned func must be called when the operation ends; it makes sure the
// cancellation callback has finished so it can not hit the next operation.
func watch(ctx context.Context, set func(time.Time) error) func() {
	if d, ok := ctx.Deadline(); ok {
		set(d)
	} else {
		set(time.Time{})
	}
	if ctx.Done() == nil {
		return func() {}
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		set(time.Unix(1, 0))
		close(fired)
	})
	return func() {
		if !stop() {
			<-fired
		}
	}
}

func (t *transport) pre(ctx context.Context) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	select {
	case <-t.n.done:
		return t.n.Err()
	default:
		return nil
	}
}

// fail turns a link error into the error the caller should see: the
// context's cause if ctx ended, the node's abort cause if the job was
// aborted, otherwise the error naming the peer.
func (t *transport) fail(ctx context.Context, err error, op string, l *link) error {
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		// The socket deadline can fire a hair before the context's timer.
		tm := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-tm.C:
		}
		tm.Stop()
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	// A link usually breaks because a peer aborted or died; the control
	// path brings the real cause a moment later. Wait for it briefly so the
	// caller sees "rank 1 aborted: ..." rather than a bare EOF.
	tm := time.NewTimer(linkGrace)
	defer tm.Stop()
	select {
	case <-t.n.done:
		return t.n.Err()
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-tm.C:
	}
	return fmt.Errorf("%s rank %d (%s): %w", op, l.peer, l.addr, err)
}

// SendNext writes bufs, in order, to rank+1 (one writev for socket links).
func (t *transport) SendNext(ctx context.Context, bufs ...[]byte) error {
	if err := t.pre(ctx); err != nil {
		return err
	}
	l := t.send
	done := watch(ctx, l.rw.SetWriteDeadline)
	var err error
	if l.c != nil {
		nb := make(net.Buffers, 0, len(bufs))
		for _, b := range bufs {
			if len(b) > 0 {
				nb = append(nb, b)
			}
		}
		_, err = nb.WriteTo(l.c)
	} else {
		for _, b := range bufs {
			if _, err = l.s.Write(b); err != nil {
				break
			}
		}
	}
	done()
	if err != nil {
		return t.fail(ctx, err, "send to", l)
	}
	return nil
}

// RecvPrev reads exactly len(buf) bytes from rank-1.
func (t *transport) RecvPrev(ctx context.Context, buf []byte) error {
	if err := t.pre(ctx); err != nil {
		return err
	}
	l := t.recv
	done := watch(ctx, l.rw.SetReadDeadline)
	var err error
	if l.raw != nil {
		err = pollReadFull(l.raw, buf, t.pollBudget, t.pollYield)
	} else {
		_, err = io.ReadFull(l.rw, buf)
	}
	done()
	if err != nil {
		return t.fail(ctx, err, "recv from", l)
	}
	return nil
}
