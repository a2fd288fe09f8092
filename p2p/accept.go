package p2p

// Taking data links in: the listeners a rank may be dialed on (unix,
// tcp-tls, tcp-plaintext) and libp2p ring streams, and the connections
// still in their handshake, which shutdown closes.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
)

// dataPlane is how this rank's data links are reached and made: its
// listeners, its TLS identity for tcp-tls, whether it allows shared memory,
// and the accepted connections still in their handshake.
type dataPlane struct {
	unixName string // the abstract unix socket ranks of this host dial
	unixLn   net.Listener
	tcpLn    net.Listener // tcp-plaintext
	tcpPort  int
	tlsLn    net.Listener // tcp-tls
	tlsPort  int
	sec      *libp2ptls.Transport // TLS with this rank's libp2p identity, for tcp-tls links

	shm      bool // shm links allowed (shmEnabled)
	shmBytes int  // ring capacity of the shm links this rank writes...
	// ...unless shmByHost: GORUN_SHM_BYTES is not set, and the capacity
	// is the host's share (shmRingBytes).
	shmByHost bool
	shmWarned atomic.Bool // a failed shm setup was logged

	// handshakeIdle is GORUN_HANDSHAKE_TIMEOUT (handshake_deadline.go).
	handshakeIdle time.Duration

	// handshakes, under Node.mu, holds the accepted data connections (and
	// libp2p streams) not yet authenticated; shutdown closes them.
	handshakes map[io.Closer]struct{}
}

// closeListeners stops taking connections in.
func (d *dataPlane) closeListeners() {
	for _, ln := range []net.Listener{d.unixLn, d.tcpLn, d.tlsLn} {
		if ln != nil {
			ln.Close()
		}
	}
}

// listenData opens the data listeners this rank may be dialed on: a unix
// socket unless the mode is tls, a tcp-tls port in auto and tls modes, a
// tcp-plaintext port in plaintext mode. What a rank listens on is what it
// accepts (besides libp2p streams): a tls rank never takes plaintext.
func (n *Node) listenData(ip net.IP) error {
	idle, err := handshakeIdleTimeout()
	if err != nil {
		return err
	}
	n.data.handshakeIdle = idle
	n.data.shmByHost = os.Getenv(envShmBytes) == ""
	mode := n.cfg.DataPlane
	if mode == DataPlaneAuto || mode == DataPlaneTLS {
		ln, err := listenTCP(ip)
		if err != nil {
			return err
		}
		n.data.tlsLn = ln
		n.data.tlsPort = ln.Addr().(*net.TCPAddr).Port
		n.life.wg.Add(1)
		go n.acceptLoop(ln, LinkTCPTLS)
	}
	if mode == DataPlaneTLS {
		return nil
	}
	var rb [8]byte
	rand.Read(rb[:])
	// A leading '@' makes Go use the Linux abstract namespace: nothing on
	// disk to clean up after a crash, scoped to the network namespace.
	n.data.unixName = "@gorun-" + hex.EncodeToString(rb[:])
	ln, err := net.Listen("unix", n.data.unixName)
	if err != nil {
		return fmt.Errorf("unix listen %s: %w", n.data.unixName, err)
	}
	n.data.unixLn = ln
	n.life.wg.Add(1)
	go n.acceptLoop(ln, LinkUnix)
	if mode == DataPlanePlaintext {
		ln, err := listenTCP(ip)
		if err != nil {
			return err
		}
		n.data.tcpLn = ln
		n.data.tcpPort = ln.Addr().(*net.TCPAddr).Port
		n.life.wg.Add(1)
		go n.acceptLoop(ln, LinkTCPPlaintext)
	}
	return nil
}

func listenTCP(ip net.IP) (net.Listener, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		return nil, fmt.Errorf("tcp listen: %w", err)
	}
	return ln, nil
}

// trackHandshake records c (an accepted connection or stream) as being in
// its handshake, so that shutdown closes it at once instead of waiting for
// its deadline. It reports false, and closes c, if the node is stopping.
// The caller must call untrackHandshake when the handshake ends.
func (n *Node) trackHandshake(c io.Closer) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.life.stopped {
		c.Close()
		return false
	}
	n.data.handshakes[c] = struct{}{}
	n.life.wg.Add(1) // under mu and !stopped: never races with shutdown's Wait
	return true
}

func (n *Node) untrackHandshake(c io.Closer) {
	n.mu.Lock()
	delete(n.data.handshakes, c)
	n.mu.Unlock()
	n.life.wg.Done()
}

// closeHandshakes closes every connection still in its handshake; called
// once the node is stopped, so no new one is tracked.
func (n *Node) closeHandshakes() {
	n.mu.Lock()
	cs := make([]io.Closer, 0, len(n.data.handshakes))
	for c := range n.data.handshakes {
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
	defer n.life.wg.Done()
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
		return n.acceptHandshake(newSocketLink(c, kind), from, nil)
	}
	// The TLS handshake comes before the dialer proves anything: it runs
	// under the same watch as the wait for the hello (handshake_deadline.go).
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	w := n.watchHello(c, false, cancel)
	l, err := n.newTLSLink(ctx, c, "")
	if err != nil {
		return w.endedByWatch(err)
	}
	// Refuse a stranger before it learns anything, like the gater does.
	if !n.inTable(l.peerID) {
		w.stop()
		return fmt.Errorf("peer %s is not in the job table", l.peerID)
	}
	return n.acceptHandshake(l, from, w)
}

func (n *Node) handleRingStream(s network.Stream) {
	r := streamResetter{s}
	if !n.trackHandshake(r) {
		return
	}
	defer n.untrackHandshake(r)
	from := s.Conn().RemoteMultiaddr().String()
	if err := n.acceptHandshake(newStreamLink(s, from), from, nil); err != nil {
		n.logf("refused libp2p data stream from %s: %v", s.Conn().RemotePeer(), err)
		s.Reset()
	}
}
