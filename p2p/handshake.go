package p2p

// The data handshake: the dialer of a link and its acceptor prove the job
// key to each other over fresh nonces, for this link (ranks, direction)
// and membership epoch, and agree on shared memory for a unix link.
// Either side refuses a link nobody expects, and the acceptor a peer
// whose TLS identity is not the table's for the rank it claims.

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// dialHandshake authenticates the link l, just dialed to rank to, of
// epoch ep, on which rank id sends: the acceptor challenges, we prove the
// job key and check its proof back. Bounded by ctx, which also closes l
// if it ends first. On success l carries the data (moved to shared memory
// if both ends agreed); on failure l is closed.
func (n *Node) dialHandshake(ctx context.Context, ep *epochRun, l *link, id, to int) (*link, error) {
	kind := l.kind
	l.id, l.peer = id, to
	if d, ok := ctx.Deadline(); ok {
		l.rw.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, l.close)
	wantShm := kind == LinkUnix && n.data.shm
	var shm *shmLink
	err := func() error {
		ch, err := readMsg(l.rw)
		if err != nil {
			return err
		}
		if ch.T == tError {
			return fmt.Errorf("rank %d ended the handshake: %s", to, ch.Text)
		}
		if ch.T != tDChal {
			return fmt.Errorf("expected data challenge, got %q", ch.T)
		}
		nonce := make([]byte, nonceLen)
		rand.Read(nonce)
		if err := writeMsg(l.rw, &msg{T: tDHello, Rank: ep.rank, Link: id, Nonce: nonce, Epoch: ep.epoch,
			Proof: dataProof(n.cfg.JobKey, ch.Nonce, ep.rank, id, ep.epoch), Shm: wantShm}); err != nil {
			return peerEnded(l.rw, to, err)
		}
		ok, err := readMsg(l.rw)
		if err != nil {
			return err
		}
		if ok.T == tError {
			return fmt.Errorf("rank %d ended the handshake: %s", to, ok.Text)
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
			// does not get the ring, which goes with the socket.
			defer shm.close()
		} else {
			l.conn, l.kind = shm, LinkShm
		}
	}
	if err != nil {
		l.close()
		if ctx.Err() != nil {
			err = setupDeadline(ctx)
		}
		return nil, fmt.Errorf("data handshake with rank %d (%s, %s): %w", to, l.addr, kind, err)
	}
	l.rw.SetDeadline(time.Time{})
	return l, nil
}

// acceptHandshake authenticates a dialer: it must prove the job key over
// our fresh nonce and be the rank expected on that link (and, over libp2p
// or TLS, have that rank's peer ID). We prove the key back over its nonce.
// w is the watch on the wait for the hello (handshake_deadline.go), nil if
// none started yet.
func (n *Node) acceptHandshake(l *link, from string, w *helloWatch) error {
	// The epoch this link would belong to: if the node moves on before the
	// handshake ends, the link is dropped (below).
	ep := n.cur.Load()
	if w == nil {
		w = n.watchHello(l.rw, true, nil)
	} else {
		w.use(l.rw)
	}
	m, err := n.readHello(l, ep)
	if err != nil {
		return w.endedByWatch(err)
	}
	// The dialer is a rank of the job: the rest is bounded like its side.
	w.stop()
	l.rw.SetDeadline(time.Now().Add(n.cfg.Timeout))
	n.mu.Lock()
	table := n.job.table
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
	if (l.kind == LinkLibp2pTLS || l.kind == LinkTCPTLS) && l.peerID.String() != table[m.Rank].ID {
		return fmt.Errorf("peer %s claims rank %d", l.peerID, m.Rank)
	}
	recv := m.Link == m.Rank // the dialer sends, we receive
	key := linkKey(m.Rank, me, size)
	dir := fmt.Sprintf("link %d -> %d", m.Rank, me)
	if !recv {
		key = linkKey(me, m.Rank, size)
		dir = fmt.Sprintf("link %d -> %d", me, m.Rank)
	}
	n.mu.Lock()
	if n.cur.Load() != ep || !n.links.expect[key] || n.links.have[key] {
		n.mu.Unlock()
		return fmt.Errorf("unexpected or duplicate %s dialed by rank %d", dir, m.Rank)
	}
	n.links.have[key] = true
	n.mu.Unlock()
	shm := m.Shm && n.data.shm && l.kind == LinkUnix
	if err := writeMsg(l.rw, &msg{T: tDOK, Proof: dataOKProof(n.cfg.JobKey, m.Nonce, me, m.Link, ep.epoch), Shm: shm}); err != nil {
		return n.afterProof(err)
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
			return n.afterProof(err)
		}
		if s != nil {
			l.conn, l.kind = s, LinkShm
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
	n.links.all = append(n.links.all, l)
	n.links.accepted <- l // capacity covers every expected link of the epoch
	n.mu.Unlock()
	return nil
}

// readHello challenges the dialer of l and reads its hello, which must
// prove the job key for epoch ep.
func (n *Node) readHello(l *link, ep *epochRun) (*msg, error) {
	nonce := make([]byte, nonceLen)
	rand.Read(nonce)
	if err := writeMsg(l.rw, &msg{T: tDChal, Nonce: nonce}); err != nil {
		return nil, err
	}
	m, err := readMsgMax(l.rw, maxSmallFrame)
	if err != nil {
		return nil, err
	}
	if m.T != tDHello {
		return nil, fmt.Errorf("expected data hello, got %q", m.T)
	}
	if !hmac.Equal(m.Proof, dataProof(n.cfg.JobKey, nonce, m.Rank, m.Link, ep.epoch)) {
		if m.Epoch != ep.epoch && hmac.Equal(m.Proof, dataProof(n.cfg.JobKey, nonce, m.Rank, m.Link, m.Epoch)) {
			return nil, fmt.Errorf("link from membership epoch %d, this rank is in epoch %d", m.Epoch, ep.epoch)
		}
		return nil, errors.New("bad job key")
	}
	return m, nil
}

// inTable reports whether id is the peer ID of a rank of the job.
func (n *Node) inTable(id peer.ID) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, it := range n.job.table {
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
	if rank < 0 || rank >= len(n.job.table) {
		return fallback
	}
	it := n.job.table[rank]
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
