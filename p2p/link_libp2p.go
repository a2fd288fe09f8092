package p2p

// Link kind libp2p-tls: a libp2p stream (/gorun/ring/1) on the hosts'
// connection, secured by its TLS and multiplexed by yamux. Used with
// DataPlane "libp2p", and to a peer that advertises no TCP data port.

import (
	"context"
	"io"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/protocol"
)

const ringProto protocol.ID = "/gorun/ring/1"

// newStreamLink makes a link of the libp2p stream s, not yet
// authenticated; addr names the peer's end in error messages.
func newStreamLink(s network.Stream, addr string) *link {
	return &link{rw: s, kind: LinkLibp2pTLS, addr: addr, peerID: s.Conn().RemotePeer(), conn: &streamConn{s: s}}
}

// streamConn is a libp2p-tls link.
type streamConn struct {
	socketState
	s network.Stream
}

func (c *streamConn) send(ctx context.Context, bufs [][]byte, _ linkWait) error {
	done := c.begin(ctx, c.s.SetWriteDeadline)
	var err error
	for _, b := range bufs {
		if _, err = c.s.Write(b); err != nil {
			break
		}
	}
	c.end(done)
	return err
}

func (c *streamConn) recv(ctx context.Context, buf []byte, _ linkWait) error {
	done := c.begin(ctx, c.s.SetReadDeadline)
	_, err := io.ReadFull(c.s, buf)
	c.end(done)
	return err
}

func (c *streamConn) recvView(ctx context.Context, n int, use func(span []byte), w linkWait) error {
	buf := c.viewBuffer(n)
	if err := c.recv(ctx, buf, w); err != nil {
		return err
	}
	use(buf)
	return nil
}

// closeWrite half-closes the stream; the peer reads EOF after the data.
func (c *streamConn) closeWrite() error {
	c.s.CloseWrite()
	return nil
}

func (c *streamConn) drain(deadline time.Time) bool { return drainStream(c.s, deadline) }

// close resets the stream.
func (c *streamConn) close() { c.s.Reset() }
