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
	"time"

	"github.com/libp2p/go-libp2p/core/network"
)

// listenData opens the data listeners this rank may be dialed on: a unix
// socket unless the mode is tls, a tcp-tls port in auto and tls modes, a
// tcp-plaintext port in plaintext mode. What a rank listens on is what it
// accepts (besides libp2p streams): a tls rank never takes plaintext.
func (n *Node) listenData(ip net.IP) error {
	mode := n.cfg.DataPlane
	if mode == DataPlaneAuto || mode == DataPlaneTLS {
		ln, err := listenTCP(ip)
		if err != nil {
			return err
		}
		n.tlsLn = ln
		n.tlsPort = ln.Addr().(*net.TCPAddr).Port
		n.wg.Add(1)
		go n.acceptLoop(ln, LinkTCPTLS)
	}
	if mode == DataPlaneTLS {
		return nil
	}
	var rb [8]byte
	rand.Read(rb[:])
	// A leading '@' makes Go use the Linux abstract namespace: nothing on
	// disk to clean up after a crash, scoped to the network namespace.
	n.unixName = "@gorun-" + hex.EncodeToString(rb[:])
	ln, err := net.Listen("unix", n.unixName)
	if err != nil {
		return fmt.Errorf("unix listen %s: %w", n.unixName, err)
	}
	n.unixLn = ln
	n.wg.Add(1)
	go n.acceptLoop(ln, LinkUnix)
	if mode == DataPlanePlaintext {
		ln, err := listenTCP(ip)
		if err != nil {
			return err
		}
		n.tcpLn = ln
		n.tcpPort = ln.Addr().(*net.TCPAddr).Port
		n.wg.Add(1)
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
		return n.acceptHandshake(newSocketLink(c, kind), from)
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
	from := s.Conn().RemoteMultiaddr().String()
	if err := n.acceptHandshake(newStreamLink(s, from), from); err != nil {
		n.logf("refused libp2p data stream from %s: %v", s.Conn().RemotePeer(), err)
		s.Reset()
	}
}
