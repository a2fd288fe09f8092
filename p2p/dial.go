package p2p

// Dialling data links: which kind of link reaches a peer, and opening it.
// The lower rank of every pair dials both of the pair's links; the other
// end takes them in (accept.go), and both authenticate (handshake.go).

import (
	"context"
	"fmt"
	"net"
	"strconv"
)

// chooseKind decides, on the dialing side, how to reach peer p: see
// Config.DataPlane. A kind is only chosen if p listens for it (which
// depends on p's mode), with a libp2p stream as the fallback.
func (n *Node) chooseKind(p tableItem) string {
	mode := n.cfg.DataPlane
	if mode != DataPlaneTLS && p.Unix != "" && p.HostID == n.cfg.HostID {
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
	if n.cur.Load() != ep || to >= len(n.job.table) {
		n.mu.Unlock()
		return nil, fmt.Errorf("membership epoch %d ended before its link with rank %d was dialed", ep.epoch, to)
	}
	p := n.job.table[to]
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
			l = newSocketLink(c, kind)
		}
		l.addr = addr
	default:
		id, err := peerIDOf(p)
		if err != nil {
			return nil, err
		}
		s, err := n.hosts.newStream(ctx, n.h, id, ringProto)
		if err != nil {
			return nil, fmt.Errorf("open stream to rank %d (%s): %w", to, id, err)
		}
		l = newStreamLink(s, s.Conn().RemoteMultiaddr().String())
	}
	return n.dialHandshake(ctx, ep, l, id, to)
}
