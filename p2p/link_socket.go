package p2p

// Link kinds unix and tcp-plaintext: a kernel socket of the link's own,
// the bytes written and read as they are. Both kinds run the same code;
// they differ in how they are reached (dial.go) and in socket options.

import (
	"context"
	"io"
	"net"
	"syscall"
	"time"
)

// sockBuf is the kernel buffer size requested for data sockets (unix,
// tcp-plaintext, tcp-tls); bigger buffers mean fewer wakeups per MiB moved.
const sockBuf = 4 << 20

// setSocketOptions tunes a data socket: no Nagle delay on TCP, big kernel
// buffers.
func setSocketOptions(c net.Conn) {
	switch cc := c.(type) {
	case *net.TCPConn:
		cc.SetNoDelay(true)
		cc.SetReadBuffer(sockBuf)
		cc.SetWriteBuffer(sockBuf)
	case *net.UnixConn:
		cc.SetReadBuffer(sockBuf)
		cc.SetWriteBuffer(sockBuf)
	}
}

// newSocketLink makes a link of kind (unix or tcp-plaintext) of the socket
// c, not yet authenticated.
func newSocketLink(c net.Conn, kind string) *link {
	setSocketOptions(c)
	sc := &sockConn{c: c}
	if s, ok := c.(syscall.Conn); ok {
		sc.raw, _ = s.SyscallConn()
	}
	return &link{rw: c, kind: kind, conn: sc}
}

// sockConn is a link over a plain socket.
type sockConn struct {
	socketState
	c   net.Conn
	raw syscall.RawConn // for polling reads; nil if c has none
}

// send writes bufs with one writev.
func (c *sockConn) send(ctx context.Context, bufs [][]byte, _ linkWait) error {
	done := c.begin(ctx, c.c.SetWriteDeadline)
	nb := make(net.Buffers, 0, len(bufs))
	for _, b := range bufs {
		if len(b) > 0 {
			nb = append(nb, b)
		}
	}
	_, err := nb.WriteTo(c.c)
	c.end(done)
	return err
}

// recv polls the socket for w's budget before it waits (poll.go).
func (c *sockConn) recv(ctx context.Context, buf []byte, w linkWait) error {
	done := c.begin(ctx, c.c.SetReadDeadline)
	var err error
	if c.raw != nil {
		err = pollReadFull(c.raw, buf, w.budget, w.yield)
	} else {
		_, err = io.ReadFull(c.c, buf)
	}
	c.end(done)
	return err
}

func (c *sockConn) recvView(ctx context.Context, n int, use func(span []byte), w linkWait) error {
	buf := c.viewBuffer(n)
	if err := c.recv(ctx, buf, w); err != nil {
		return err
	}
	use(buf)
	return nil
}

// closeWrite half-closes the socket; the peer reads EOF after the data.
func (c *sockConn) closeWrite() error {
	if cw, ok := c.c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	return nil
}

func (c *sockConn) drain(deadline time.Time) bool { return drainStream(c.c, deadline) }

func (c *sockConn) close() { c.c.Close() }
