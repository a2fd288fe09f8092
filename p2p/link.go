package p2p

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorun/gorun/ring"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/core/sec"
)

const ringProto protocol.ID = "/gorun/ring/1"

// sockBuf is the kernel buffer size requested for data sockets (unix,
// tcp-plaintext, tcp-tls); bigger buffers mean fewer wakeups per MiB moved.
const sockBuf = 4 << 20

// deadliner is what a link needs from a net.Conn or libp2p stream.
type deadliner interface {
	io.ReadWriter
	SetDeadline(time.Time) error
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
}

// link is one ordered stream between this rank and peer: id is the rank
// that sends on it (this rank or peer).
type link struct {
	id   int
	peer int    // the other rank
	addr string // the other rank's address, for error messages
	kind string
	c    net.Conn       // unix / tcp-plaintext / tcp-tls (the TLS conn)
	s    network.Stream // libp2p-tls
	rw   deadliner
	raw  syscall.RawConn // for polling reads on plain sockets; nil otherwise
	// shm, for kind "shm": the shared-memory ring that carries the data;
	// c is then the link's unix socket, which only watches the peer.
	shm *shmLink

	// tcp-tls only.
	sock   net.Conn // the TCP socket under c: close() closes it directly
	peerID peer.ID  // remote identity proven by the TLS handshake
	wbuf   []byte   // coalesces small buffers of a message into one record
	bc     *batchConn

	// blockedSince is when the socket transfer in progress on this link
	// started (UnixNano), 0 when none is: a hang diagnosis reads it to say
	// which peer a rank waits for (diagnose.go, waitSince). A socket
	// transfer makes system calls and arms a context watch anyway, which
	// cost far more than the clock read and two stores. A shm link keeps
	// its own (shmLink.waitingSince), set only when a transfer parks.
	blockedSince atomic.Int64

	// viewBuf receives RecvFromView's bytes from a socket link (a link
	// has one receiver at a time).
	viewBuf []byte
}

// waitSince is when the transfer in progress on l began waiting for the
// peer (UnixNano), 0 if none is waiting.
func (l *link) waitSince() int64 {
	if l.shm != nil {
		return l.shm.waitingSince.Load()
	}
	return l.blockedSince.Load()
}

// close breaks the link at once. A TLS conn is not closed through TLS: its
// Close would first try to send close_notify, which blocks (up to 5 s) when
// the socket's send buffer is full; an orderly end is drainLinks' job.
func (l *link) close() {
	switch {
	case l.sock != nil:
		l.sock.Close()
	case l.c != nil:
		l.c.Close() // first: it ends the shm watcher, which close waits for
		if l.shm != nil {
			l.shm.close()
		}
	default:
		l.s.Reset()
	}
}

// setupShm moves a unix link whose handshake agreed on shared memory to
// it (shm.go): the end that writes on the link (writer) creates the ring
// and passes it over the socket, the other maps it. Only ever called once
// both ends proved the job key and the link's identity (ranks, epoch), on
// the link's own socket, so the fd reaches nobody else. A failure of the
// shared memory itself leaves the unix link (nil, nil; said once in the
// log); an error means the socket broke.
func (n *Node) setupShm(l *link, id shmIdentity, writer bool) (*shmLink, error) {
	c, ok := l.c.(*net.UnixConn)
	if !ok {
		return nil, nil
	}
	var s *shmLink
	var fallback, err error
	if writer {
		s, fallback, err = offerShm(c, id, n.shmBytes)
	} else {
		s, fallback, err = receiveShm(c, id)
	}
	if err != nil {
		return nil, fmt.Errorf("shared memory setup: %w", err)
	}
	if fallback != nil {
		if n.shmWarned.CompareAndSwap(false, true) {
			n.logf("shared memory with rank %d unavailable, keeping unix sockets for such links: %v", l.peer, fallback)
		}
		return nil, nil
	}
	// The watcher reads the socket from now on: no handshake deadline.
	c.SetDeadline(time.Time{})
	s.start()
	return s, nil
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

// newTLSLink sets up the socket c like any TCP link and runs libp2p's TLS
// 1.3 handshake on it: as the client, expecting peer ID want, or as the
// server (want ""), accepting any libp2p identity, which the caller checks.
func (n *Node) newTLSLink(ctx context.Context, c net.Conn, want peer.ID) (*link, error) {
	newConnLink(c, LinkTCPTLS) // socket options
	bc := &batchConn{Conn: c}
	var sc sec.SecureConn
	var err error
	if want != "" {
		sc, err = n.sec.SecureOutbound(ctx, bc, want)
	} else {
		sc, err = n.sec.SecureInbound(ctx, bc, "")
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("tls handshake: %w", err)
	}
	return &link{c: sc, rw: sc, sock: c, bc: bc, kind: LinkTCPTLS, peerID: sc.RemotePeer()}, nil
}

// batchSize is how many bytes of TLS records a tcp-tls link gathers per
// write(2) while it sends a message.
const batchSize = 256 << 10

// batchConn is the socket under a tcp-tls link's TLS conn. crypto/tls makes
// one Write, so one write(2), per record of at most 16 KiB. While a message
// is sent (batching), records are gathered and written batchSize at a
// time, which on 1 Gbit/s links between network namespaces took ~10% of a
// rank's CPU off (the kernel's cost is mostly per write, not per byte).
// Otherwise (handshake, close_notify, a KeyUpdate answered by the reading
// side) writes go straight through, in order after what is gathered. A
// failed write is sticky: TLS counts the records it handed over as sent, so
// the stream is broken for good (as after any failed send, the ring aborts).
type batchConn struct {
	net.Conn
	mu       sync.Mutex
	buf      []byte
	batching bool
	err      error // first write error
}

func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.batching {
		if err := b.flushLocked(); err != nil {
			return 0, err
		}
		n, err := b.Conn.Write(p)
		b.err = err
		return n, err
	}
	if len(b.buf)+len(p) > batchSize {
		if err := b.flushLocked(); err != nil {
			return 0, err
		}
	}
	if b.buf == nil {
		b.buf = make([]byte, 0, batchSize)
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// batch starts gathering records.
func (b *batchConn) batch() {
	b.mu.Lock()
	b.batching = true
	b.mu.Unlock()
}

// flush writes the gathered records and stops gathering.
func (b *batchConn) flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.batching = false
	return b.flushLocked()
}

func (b *batchConn) flushLocked() error {
	if b.err != nil {
		return b.err
	}
	if len(b.buf) > 0 {
		_, b.err = b.Conn.Write(b.buf)
		b.buf = b.buf[:0]
	}
	return b.err
}

// maxHandshake bounds the handshake of an accepted data connection (or
// the collective timeout, if that is shorter). It is short and independent
// of the collective timeout: anyone who can reach a data port can open a
// connection and say nothing, and it must not hold a goroutine and a socket
// for a minute. Ranks dial their links only once every rank is ready
// ("go"), so a real dialer answers within milliseconds.
const maxHandshake = 5 * time.Second

func (n *Node) handshakeTimeout() time.Duration { return min(maxHandshake, n.cfg.Timeout) }

// trackHandshake records c (an accepted connection or stream) as being in
// its handshake, so that shutdown closes it at once instead of waiting for
// its deadline. It reports false, and closes c, if the node is stopping.
// The caller must call untrackHandshake when the handshake ends.
func (n *Node) trackHandshake(c io.Closer) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped {
		c.Close()
		return false
	}
	n.handshakes[c] = struct{}{}
	n.wg.Add(1) // under mu and !stopped: never races with shutdown's Wait
	return true
}

func (n *Node) untrackHandshake(c io.Closer) {
	n.mu.Lock()
	delete(n.handshakes, c)
	n.mu.Unlock()
	n.wg.Done()
}

// closeHandshakes closes every connection still in its handshake; called
// once the node is stopped, so no new one is tracked.
func (n *Node) closeHandshakes() {
	n.mu.Lock()
	cs := make([]io.Closer, 0, len(n.handshakes))
	for c := range n.handshakes {
		cs = append(cs, c)
	}
	n.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

// streamResetter closes a libp2p stream by resetting it: an unfinished
// handshake has nothing to flush.
type streamResetter struct{ s network.Stream }

func (r streamResetter) Close() error { return r.s.Reset() }

func (n *Node) acceptLoop(ln net.Listener, kind string) {
	defer n.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		if !n.trackHandshake(c) {
			continue
		}
		go func() {
			defer n.untrackHandshake(c)
			if err := n.accept(c, kind); err != nil {
				n.logf("refused %s data connection from %s: %v", kind, c.RemoteAddr(), err)
				c.Close()
			}
		}()
	}
}

// accept authenticates one connection accepted on a data listener and, on
// success, hands the link to connectLinks.
func (n *Node) accept(c net.Conn, kind string) error {
	from := c.RemoteAddr().String()
	if kind != LinkTCPTLS {
		return n.acceptHandshake(newConnLink(c, kind), from)
	}
	ctx, cancel := context.WithTimeout(context.Background(), n.handshakeTimeout())
	defer cancel()
	c.SetDeadline(time.Now().Add(n.handshakeTimeout()))
	l, err := n.newTLSLink(ctx, c, "")
	if err != nil {
		return err
	}
	// Refuse a stranger before it learns anything, like the gater does.
	if !n.inTable(l.peerID) {
		return fmt.Errorf("peer %s is not in the job table", l.peerID)
	}
	return n.acceptHandshake(l, from)
}

func (n *Node) handleRingStream(s network.Stream) {
	r := streamResetter{s}
	if !n.trackHandshake(r) {
		return
	}
	defer n.untrackHandshake(r)
	l := &link{s: s, rw: s, kind: LinkLibp2pTLS}
	if err := n.acceptHandshake(l, s.Conn().RemoteMultiaddr().String()); err != nil {
		n.logf("refused libp2p data stream from %s: %v", s.Conn().RemotePeer(), err)
		s.Reset()
	}
}

// acceptHandshake authenticates a dialer: it must prove the job key over
// our fresh nonce and be the rank expected on that link (and, over libp2p
// or TLS, have that rank's peer ID). We prove the key back over its nonce.
func (n *Node) acceptHandshake(l *link, from string) error {
	// The epoch this link would belong to: if the node moves on before the
	// handshake ends, the link is dropped (below).
	ep := n.cur.Load()
	l.rw.SetDeadline(time.Now().Add(n.handshakeTimeout()))
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
	if !hmac.Equal(m.Proof, dataProof(n.cfg.JobKey, nonce, m.Rank, m.Link, ep.epoch)) {
		if m.Epoch != ep.epoch && hmac.Equal(m.Proof, dataProof(n.cfg.JobKey, nonce, m.Rank, m.Link, m.Epoch)) {
			return fmt.Errorf("link from membership epoch %d, this rank is in epoch %d", m.Epoch, ep.epoch)
		}
		return errors.New("bad job key")
	}
	n.mu.Lock()
	table := n.table
	current := n.cur.Load() == ep
	n.mu.Unlock()
	if !current {
		return fmt.Errorf("membership epoch %d ended during the handshake", ep.epoch)
	}
	if table == nil {
		return errors.New("no job table yet")
	}
	me, size := ep.rank, ep.size
	if err := checkDataHello(m, me, size); err != nil {
		return err
	}
	remote := l.peerID
	if l.s != nil {
		remote = l.s.Conn().RemotePeer()
	}
	if (l.s != nil || l.kind == LinkTCPTLS) && remote.String() != table[m.Rank].ID {
		return fmt.Errorf("peer %s claims rank %d", remote, m.Rank)
	}
	recv := m.Link == m.Rank // the dialer sends, we receive
	key := linkKey(m.Rank, me, size)
	dir := fmt.Sprintf("link %d -> %d", m.Rank, me)
	if !recv {
		key = linkKey(me, m.Rank, size)
		dir = fmt.Sprintf("link %d -> %d", me, m.Rank)
	}
	n.mu.Lock()
	if n.cur.Load() != ep || !n.expect[key] || n.have[key] {
		n.mu.Unlock()
		return fmt.Errorf("unexpected or duplicate %s dialed by rank %d", dir, m.Rank)
	}
	n.have[key] = true
	n.mu.Unlock()
	shm := m.Shm && n.shm && l.kind == LinkUnix
	if err := writeMsg(l.rw, &msg{T: tDOK, Proof: dataOKProof(n.cfg.JobKey, m.Nonce, me, m.Link, ep.epoch), Shm: shm}); err != nil {
		return err
	}
	l.id, l.peer = m.Link, m.Rank
	l.addr = n.peerAddr(m.Rank, l.kind, from)
	if shm {
		// Authenticated above: the dialer proved the job key for this
		// link and epoch.
		id := shmIdentity{from: m.Rank, to: me, epoch: ep.epoch}
		if !recv {
			id = shmIdentity{from: me, to: m.Rank, epoch: ep.epoch}
		}
		s, err := n.setupShm(l, id, !recv)
		if err != nil {
			return err
		}
		if s != nil {
			l.shm, l.kind = s, LinkShm
		}
	}
	l.rw.SetDeadline(time.Time{})
	n.mu.Lock()
	if n.cur.Load() != ep || ep.err != nil {
		n.mu.Unlock()
		l.close()
		return fmt.Errorf("membership epoch %d ended during the handshake", ep.epoch)
	}
	// Recorded at once, so that the end of the epoch closes it even if
	// connectLinks is no longer there to take it.
	n.links = append(n.links, l)
	n.accepted <- l // capacity covers every expected link of the epoch
	n.mu.Unlock()
	return nil
}

// inTable reports whether id is the peer ID of a rank of the job.
func (n *Node) inTable(id peer.ID) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, it := range n.table {
		if it.ID == id.String() {
			return true
		}
	}
	return false
}

// checkDataHello verifies that a data hello names a link between the
// dialer and me (rank), in either direction, and that the dialer is the
// designated dialer of the pair (the lower rank).
func checkDataHello(m *msg, me, size int) error {
	if size < 2 || me < 0 || me >= size || m.Rank < 0 || m.Rank >= size || m.Link < 0 || m.Link >= size {
		return fmt.Errorf("rank %d / link %d out of range", m.Rank, m.Link)
	}
	if m.Rank == me {
		return fmt.Errorf("rank %d dialed itself", m.Rank)
	}
	if m.Link != m.Rank && m.Link != me {
		return fmt.Errorf("link from rank %d does not join rank %d and rank %d", m.Link, m.Rank, me)
	}
	if dialerOf(m.Rank, me) != m.Rank {
		return fmt.Errorf("rank %d is not the dialer of its links with rank %d", m.Rank, me)
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
	case LinkUnix, LinkShm:
		return it.Unix
	case LinkTCPPlaintext:
		return net.JoinHostPort(ipOfAddrs(it.Addrs), strconv.Itoa(it.TCPPort))
	case LinkTCPTLS:
		return net.JoinHostPort(ipOfAddrs(it.Addrs), strconv.Itoa(it.TLSPort))
	}
	return fallback
}

// chooseKind decides, on the dialing side, how to reach peer p: see
// Config.DataPlane. A kind is only chosen if p listens for it (which
// depends on p's mode), with a libp2p stream as the fallback.
func (n *Node) chooseKind(p tableItem) string {
	mode := n.cfg.DataPlane
	if mode != DataPlaneTLS && p.Unix != "" && p.HostID == n.hostID {
		return LinkUnix
	}
	if ipOfAddrs(p.Addrs) != "" {
		switch {
		case mode == DataPlanePlaintext && p.TCPPort > 0:
			return LinkTCPPlaintext
		case (mode == DataPlaneAuto || mode == DataPlaneTLS) && p.TLSPort > 0:
			return LinkTCPTLS
		}
	}
	return LinkLibp2pTLS
}

// dialLink opens the link of epoch ep between this rank and rank to on
// which rank id (this rank or to) sends, and authenticates both ends.
func (n *Node) dialLink(ctx context.Context, ep *epochRun, id, to int) (*link, error) {
	n.mu.Lock()
	if n.cur.Load() != ep || to >= len(n.table) {
		n.mu.Unlock()
		return nil, fmt.Errorf("membership epoch %d ended before its link with rank %d was dialed", ep.epoch, to)
	}
	p := n.table[to]
	n.mu.Unlock()
	kind := n.chooseKind(p)
	var l *link
	switch kind {
	case LinkUnix, LinkTCPPlaintext, LinkTCPTLS:
		network, addr := "unix", p.Unix
		switch kind {
		case LinkTCPPlaintext:
			network, addr = "tcp", net.JoinHostPort(ipOfAddrs(p.Addrs), strconv.Itoa(p.TCPPort))
		case LinkTCPTLS:
			network, addr = "tcp", net.JoinHostPort(ipOfAddrs(p.Addrs), strconv.Itoa(p.TLSPort))
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, fmt.Errorf("dial rank %d (%s): %w", to, addr, err)
		}
		if kind == LinkTCPTLS {
			want, err := peerIDOf(p)
			if err != nil {
				c.Close()
				return nil, err
			}
			if d, ok := ctx.Deadline(); ok {
				c.SetDeadline(d)
			}
			if l, err = n.newTLSLink(ctx, c, want); err != nil {
				if ctx.Err() != nil {
					err = context.Cause(ctx)
				}
				return nil, fmt.Errorf("data handshake with rank %d (%s, %s): %w", to, addr, kind, err)
			}
		} else {
			l = newConnLink(c, kind)
		}
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
	wantShm := kind == LinkUnix && n.shm
	var shm *shmLink
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
		if err := writeMsg(l.rw, &msg{T: tDHello, Rank: ep.rank, Link: id, Nonce: nonce, Epoch: ep.epoch,
			Proof: dataProof(n.cfg.JobKey, ch.Nonce, ep.rank, id, ep.epoch), Shm: wantShm}); err != nil {
			return err
		}
		ok, err := readMsg(l.rw)
		if err != nil {
			return err
		}
		if ok.T != tDOK || !hmac.Equal(ok.Proof, dataOKProof(n.cfg.JobKey, nonce, to, id, ep.epoch)) {
			return errors.New("peer failed to prove the job key")
		}
		if wantShm && ok.Shm {
			// Both ends are authenticated for this link and epoch.
			link := shmIdentity{from: ep.rank, to: to, epoch: ep.epoch}
			if id != ep.rank {
				link = shmIdentity{from: to, to: ep.rank, epoch: ep.epoch}
			}
			shm, err = n.setupShm(l, link, id == ep.rank)
		}
		return err
	}()
	if !stop() && err == nil {
		err = context.Cause(ctx)
	}
	if shm != nil {
		if err != nil {
			// ctx ended: its callback may be closing l right now, so l
			// does not get the ring; the ring goes once the socket does.
			defer shm.close()
		} else {
			l.shm, l.kind = shm, LinkShm
		}
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

// connectLinks establishes this rank's links to and from every other rank:
// it dials both links of every pair of which it is the lower rank and waits
// for the higher ranks to dial the others. Setup is bounded by ctx and
// Timeout; a timeout names the ranks whose links are missing.
func (n *Node) connectLinks(ctx context.Context) error {
	_, err := n.connectEpochLinks(ctx, n.cur.Load())
	return err
}

// connectEpochLinks connects the links of epoch ep. On failure it also
// returns the peers whose links failed or are missing.
func (n *Node) connectEpochLinks(ctx context.Context, ep *epochRun) (blame []int, _ error) {
	size, me := ep.size, ep.rank
	if size == 1 {
		return nil, nil
	}
	n.mu.Lock()
	accepted := n.accepted
	n.mu.Unlock()
	sctx, cancel := n.stepCtx(ctx, fmt.Sprintf("connecting data links (rank %d of %d, to and from every peer)", me, size))
	defer cancel()
	type res struct {
		l    *link
		peer int
		err  error
	}
	dials := make(chan res, 2*size)
	ndial, nwait := 0, 0
	for p := range size {
		if p == me {
			continue
		}
		if dialerOf(me, p) != me {
			nwait += 2
			continue
		}
		for _, id := range []int{me, p} { // me -> p, then p -> me
			ndial++
			go func() {
				l, err := n.dialLink(sctx, ep, id, p)
				dials <- res{l, p, err}
			}()
		}
	}
	to, from := make([]*link, size), make([]*link, size)
	var firstErr error
	put := func(l *link, dialed bool) {
		n.mu.Lock()
		aborted := ep.err != nil || n.cur.Load() != ep
		if dialed && !aborted {
			n.links = append(n.links, l)
		}
		n.mu.Unlock()
		if aborted {
			l.close()
		}
		if l.id == me {
			to[l.peer] = l
		} else {
			from[l.peer] = l
		}
	}
	stepDone, nodeDone := sctx.Done(), ep.done
	for ndial > 0 || nwait > 0 {
		select {
		case r := <-dials:
			ndial--
			if r.err != nil {
				if firstErr == nil {
					firstErr = r.err
					blame = append(blame, r.peer)
					cancel()
				}
				continue
			}
			put(r.l, true)
		case l := <-accepted:
			nwait--
			put(l, false)
		case <-stepDone:
			stepDone = nil
			if firstErr == nil {
				firstErr = missingLinksErr(sctx, me, to, from)
				blame = missingPeers(me, to, from)
			}
			nwait = 0 // stop waiting for accepts; dials end via ctx
		case <-nodeDone:
			nodeDone = nil
			if firstErr == nil {
				firstErr = n.epochErr(ep)
				cancel()
			}
			nwait = 0
		}
	}
	if firstErr != nil {
		return blame, firstErr
	}
	local := 0
	n.mu.Lock()
	for _, p := range n.peers {
		if p.HostID == n.hostID {
			local++
		}
	}
	tr := &transport{n: n, ep: ep, me: me, size: size, to: to, from: from}
	tr.pollBudget, tr.pollYield = pollConfig(local)
	tr.groupSteps = local <= runtime.NumCPU() && 2*local > runtime.NumCPU()
	if n.cur.Load() != ep || ep.err != nil {
		err := ep.err
		n.mu.Unlock()
		if err == nil {
			err = fmt.Errorf("membership epoch %d ended while its links were set up", ep.epoch)
		}
		return nil, err
	}
	n.tr = tr
	kinds := map[string]int{}
	for p, l := range to {
		if l == nil {
			continue
		}
		kinds[l.kind]++
		if n.peers[p].Link == "" {
			n.peers[p].Link = l.kind
		}
	}
	n.mu.Unlock()
	next, prev := (me+1)%size, (me-1+size)%size
	n.logf("data links up to and from %d peers %v; ring: to rank %d via %s (%s), from rank %d via %s (%s)",
		size-1, kinds, next, to[next].kind, to[next].addr, prev, from[prev].kind, from[prev].addr)
	return nil, nil
}

// missingPeers lists the peers with a link missing.
func missingPeers(me int, to, from []*link) []int {
	var ranks []int
	for p := range to {
		if p != me && (to[p] == nil || from[p] == nil) {
			ranks = append(ranks, p)
		}
	}
	return ranks
}

// missingLinksErr names the peers whose links did not come up in time.
func missingLinksErr(ctx context.Context, me int, to, from []*link) error {
	var ranks []int
	var miss []string
	for p := range to {
		if p == me || (to[p] != nil && from[p] != nil) {
			continue
		}
		ranks = append(ranks, p)
		if to[p] == nil {
			miss = append(miss, fmt.Sprintf("to rank %d", p))
		}
		if from[p] == nil {
			miss = append(miss, fmt.Sprintf("from rank %d", p))
		}
	}
	return fmt.Errorf("waiting for data links with ranks %v (%s): %w", ranks, strings.Join(miss, ", "), context.Cause(ctx))
}

// dialerOf returns which rank of a pair dials both links between them: the
// lower one, so a pair never dials each other at the same time
// (go-libp2p#2925).
func dialerOf(a, b int) int { return min(a, b) }

// linkKey identifies the ordered link from -> to among size ranks.
func linkKey(from, to, size int) int { return from*size + to }

// expectLinks lists the links this rank accepts: both links of every pair
// with a lower rank. Called with n.mu held.
func (n *Node) expectLinks() {
	ep := n.cur.Load()
	size, me := ep.size, ep.rank
	for p := range size {
		if p != me && dialerOf(me, p) == p {
			n.expect[linkKey(p, me, size)] = true
			n.expect[linkKey(me, p, size)] = true
		}
	}
}

// linkGrace is how long a failed transfer waits for the control path to
// explain the failure.
const linkGrace = time.Second

// transport implements ring.Mesh over the node's links: one ordered stream
// to and one from every other rank. SendNext and RecvPrev use the streams
// to rank+1 and from rank-1.
type transport struct {
	n          *Node
	ep         *epochRun // the epoch whose links these are
	me, size   int
	to, from   []*link // indexed by peer rank; nil at me
	pollBudget time.Duration
	pollYield  bool
	// linkBufferTest, set only by tests, overrides LinkBuffer's choice for
	// shm links: +1 promises the ring's capacity even with pollYield and
	// GOMAXPROCS 1 (the send-first path on any host), -1 promises nothing
	// (a sender goroutine, as a rank that chose otherwise would run).
	linkBufferTest int8
	// groupSteps: every rank of the job on this host has a CPU, but not
	// two (GroupedSteps). groupStepsTest, set only by tests, overrides
	// it: +1 true, -1 false.
	groupSteps     bool
	groupStepsTest int8
	// concurrent counts the collectives that run goroutines of their own
	// now (ring.Concurrency): a shm wait then lets them run before it
	// polls and before it parks.
	concurrent atomic.Int32
}

var (
	_ ring.Mesh         = (*transport)(nil)
	_ ring.Concurrency  = (*transport)(nil)
	_ ring.LinkBuffers  = (*transport)(nil)
	_ ring.ViewReceiver = (*transport)(nil)
	_ ring.GroupedSteps = (*transport)(nil)
)

// RecvFromView implements ring.ViewReceiver: from a shared-memory link the
// bytes are handed over in place; from a socket they are read into the
// link's buffer first.
func (t *transport) RecvFromView(ctx context.Context, rank, n int, use func(span []byte)) error {
	if rank < 0 || rank >= t.size || rank == t.me {
		return fmt.Errorf("p2p: rank %d cannot receive from rank %d (size %d)", t.me, rank, t.size)
	}
	l := t.from[rank]
	if l.shm != nil {
		if err := t.pre(ctx); err != nil {
			return err
		}
		if err := l.shm.readView(ctx, n, use, t.waitPolicy()); err != nil {
			return t.fail(ctx, err, "recv from", l)
		}
		return nil
	}
	if cap(l.viewBuf) < n {
		l.viewBuf = make([]byte, n)
	}
	buf := l.viewBuf[:n]
	if err := t.RecvFrom(ctx, rank, buf); err != nil {
		return err
	}
	use(buf)
	return nil
}

// LinkBuffer implements ring.LinkBuffers: a shared-memory link holds its
// ring's capacity; a socket's kernel buffer is not promised (0).
//
// On a host with more ranks than CPUs (pollYield) it promises nothing
// either while this process runs Go code on one thread (GOMAXPROCS 1, as
// the MNIST example sets when 4 ranks share 2 CPUs): there the sender
// goroutine did better. With more threads, sending a whole step before
// receiving did better. Measured on 2 CPUs, 4 ranks, medians of 4-5
// interleaved runs: MNIST with GOMAXPROCS 1, 0.565 s per epoch with the
// sender goroutine against 0.705 sequential; with GOMAXPROCS 2, 0.69
// against 0.625; gorun bench (GOMAXPROCS 2) 256 KiB 533 -> 259 us and
// 1 MiB 1302 -> 724 us, 64 KiB 96 -> 100 us.
func (t *transport) LinkBuffer(rank int) int {
	if rank < 0 || rank >= len(t.to) || t.to[rank] == nil || t.to[rank].shm == nil {
		return 0
	}
	switch {
	case t.linkBufferTest < 0:
		return 0
	case t.linkBufferTest == 0 && t.pollYield && runtime.GOMAXPROCS(0) == 1:
		return 0
	}
	return len(t.to[rank].shm.ring.data)
}

// GroupedSteps implements ring.GroupedSteps: true where the host has a
// CPU for every rank of the job on it but not two, so that a sender
// goroutine beside the receiver would only take turns with it. Measured
// with 2 ranks on 2 CPUs, the groups were faster (see ring.Ring.runGrouped);
// with 3 or 4 ranks on 2 CPUs they were not.
func (t *transport) GroupedSteps() bool {
	if t.groupStepsTest != 0 {
		return t.groupStepsTest > 0
	}
	return t.groupSteps
}

// waitPolicy is how a shm operation of this transport waits.
func (t *transport) waitPolicy() shmWait {
	return shmWait{budget: t.pollBudget, yield: t.pollYield, gosched: t.concurrent.Load() > 0}
}

// Concurrent implements ring.Concurrency.
func (t *transport) Concurrent(on bool) {
	if on {
		t.concurrent.Add(1)
	} else {
		t.concurrent.Add(-1)
	}
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
	case <-t.ep.done:
		return t.n.epochErr(t.ep)
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
	grace := linkGrace
	if t.n.cfg.Elastic {
		// The rendezvous decides what a broken link means (a lost member,
		// or a link to set up again) and always answers with a new epoch;
		// it needs at most a heartbeat bound to see a member is gone.
		t.n.reportLinkFailure(t.ep, l.peer, fmt.Errorf("%s rank %d (%s): %w", op, l.peer, l.addr, err))
		grace = t.n.cfg.HeartbeatTimeout + t.n.cfg.Timeout
	}
	tm := time.NewTimer(grace)
	defer tm.Stop()
	select {
	case <-t.ep.done:
		return t.n.epochErr(t.ep)
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-tm.C:
	}
	return fmt.Errorf("%s rank %d (%s): %w", op, l.peer, l.addr, err)
}

// SendNext writes bufs, in order, to rank+1 (one writev for socket links).
func (t *transport) SendNext(ctx context.Context, bufs ...[]byte) error {
	return t.SendTo(ctx, (t.me+1)%t.size, bufs...)
}

// RecvPrev reads exactly len(buf) bytes from rank-1.
func (t *transport) RecvPrev(ctx context.Context, buf []byte) error {
	return t.RecvFrom(ctx, (t.me-1+t.size)%t.size, buf)
}

// SendTo writes bufs, in order, to rank (one writev for socket links). Calls
// for different ranks may run concurrently.
func (t *transport) SendTo(ctx context.Context, rank int, bufs ...[]byte) error {
	if rank < 0 || rank >= t.size || rank == t.me {
		return fmt.Errorf("p2p: rank %d cannot send to rank %d (size %d)", t.me, rank, t.size)
	}
	if err := t.pre(ctx); err != nil {
		return err
	}
	l := t.to[rank]
	if l.shm != nil {
		if err := l.shm.write(ctx, bufs, t.waitPolicy()); err != nil {
			return t.fail(ctx, err, "send to", l)
		}
		return nil
	}
	l.blockedSince.Store(time.Now().UnixNano())
	done := watch(ctx, l.rw.SetWriteDeadline)
	var err error
	switch {
	case l.sock != nil:
		err = l.writeTLS(bufs)
	case l.c != nil:
		nb := make(net.Buffers, 0, len(bufs))
		for _, b := range bufs {
			if len(b) > 0 {
				nb = append(nb, b)
			}
		}
		_, err = nb.WriteTo(l.c)
	default:
		for _, b := range bufs {
			if _, err = l.s.Write(b); err != nil {
				break
			}
		}
	}
	done()
	l.blockedSince.Store(0)
	if err != nil {
		return t.fail(ctx, err, "send to", l)
	}
	return nil
}

// tlsRecord is the most plaintext one TLS record carries.
const tlsRecord = 16 << 10

// writeTLS writes one message (bufs, in order) to a tcp-tls link. Every
// Write to a TLS conn ends in a record of its own (with its own 22 bytes of
// header and tag): a 56-byte message header written alone would take a
// record, and a packet, of its own. So pieces are gathered in l.wbuf until
// it holds a full record, large buffers are written directly in whole
// records, and what is left at the end goes out as one record: a message
// takes as few records as its size allows. This copies less than two
// records per message. The records reach the socket through l.bc in
// batches, the last one when writeTLS returns.
func (l *link) writeTLS(bufs [][]byte) error {
	w := l.wbuf[:0]
	if cap(w) < tlsRecord {
		w = make([]byte, 0, tlsRecord)
	}
	defer func() { l.wbuf = w[:0] }()
	if l.bc != nil {
		l.bc.batch()
		defer l.bc.flush() // on an error: stop gathering
	}
	for _, b := range bufs {
		if len(w) > 0 && len(w)+len(b) >= tlsRecord {
			k := tlsRecord - len(w)
			w = append(w, b[:k]...)
			b = b[k:]
			if _, err := l.c.Write(w); err != nil {
				return err
			}
			w = w[:0]
		}
		if direct := len(b) / tlsRecord * tlsRecord; direct > 0 {
			if _, err := l.c.Write(b[:direct]); err != nil {
				return err
			}
			b = b[direct:]
		}
		w = append(w, b...)
	}
	if len(w) > 0 {
		if _, err := l.c.Write(w); err != nil {
			return err
		}
	}
	if l.bc != nil {
		return l.bc.flush()
	}
	return nil
}

// RecvFrom reads exactly len(buf) bytes from rank. Calls for different
// ranks may run concurrently.
func (t *transport) RecvFrom(ctx context.Context, rank int, buf []byte) error {
	if rank < 0 || rank >= t.size || rank == t.me {
		return fmt.Errorf("p2p: rank %d cannot receive from rank %d (size %d)", t.me, rank, t.size)
	}
	if err := t.pre(ctx); err != nil {
		return err
	}
	l := t.from[rank]
	if l.shm != nil {
		if err := l.shm.read(ctx, buf, t.waitPolicy()); err != nil {
			return t.fail(ctx, err, "recv from", l)
		}
		return nil
	}
	l.blockedSince.Store(time.Now().UnixNano())
	done := watch(ctx, l.rw.SetReadDeadline)
	var err error
	if l.raw != nil {
		err = pollReadFull(l.raw, buf, t.pollBudget, t.pollYield)
	} else {
		_, err = io.ReadFull(l.rw, buf)
	}
	done()
	l.blockedSince.Store(0)
	if err != nil {
		return t.fail(ctx, err, "recv from", l)
	}
	return nil
}

// drainLinks ends the data links in order before a clean Close: it
// half-closes every link this rank sends on, so the peer reads all data and
// then EOF, and waits, bounded by Timeout, for EOF on every link it receives
// on. Closing a socket or a libp2p connection outright while a peer's data
// is in flight resets it, and the peer would lose the end of the last
// collective. On a job that was aborted there is nothing to save.
//
// A tcp-tls link is half-closed with TLS close_notify (tls.Conn.CloseWrite),
// which the peer's Read returns as io.EOF; the TCP socket stays open until
// close(). Sending the alert can block while the socket's send buffer is
// full (crypto/tls bounds it by 5 s), so those run concurrently with the
// drain of the incoming links, which is what lets the peers make room.
func (n *Node) drainLinks() {
	select {
	case <-n.Done():
		return
	default:
	}
	me := n.rank()
	n.mu.Lock()
	links := slices.Clone(n.links)
	n.mu.Unlock()
	deadline := time.Now().Add(n.cfg.Timeout)
	var wg sync.WaitGroup
	for _, l := range links {
		if l.id != me {
			continue
		}
		if l.shm != nil {
			l.shm.closeWrite() // before the half-close: see shmLink.watch
		}
		switch {
		case l.s != nil:
			l.s.CloseWrite()
		case l.sock != nil:
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := l.c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
					n.logf("closing link to rank %d (%s): %v", l.peer, l.addr, err)
				}
			}()
		case l.c != nil:
			if cw, ok := l.c.(interface{ CloseWrite() error }); ok {
				cw.CloseWrite()
			}
		}
	}
	for _, l := range links {
		if l.id == me {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if l.shm != nil {
				// No hurry at the end: park at once.
				if !l.shm.drain(deadline) && time.Now().After(deadline) {
					n.logf("rank %d did not finish its side of the link within %v", l.peer, n.cfg.Timeout)
				}
				return
			}
			l.rw.SetReadDeadline(deadline)
			if _, err := io.Copy(io.Discard, l.rw); err != nil && time.Now().After(deadline) {
				n.logf("rank %d did not finish its side of the link within %v", l.peer, n.cfg.Timeout)
			}
		}()
	}
	wg.Wait()
}
