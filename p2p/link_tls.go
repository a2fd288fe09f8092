package p2p

// Link kind tcp-tls: a TCP connection of the link's own, secured by
// libp2p's TLS 1.3 handshake with the ranks' libp2p identities, no stream
// multiplexer. Messages are cut into as few TLS records as their size
// allows, and the records reach the socket in batches.

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/sec"
)

// newTLSLink sets up the socket c like any TCP link and runs libp2p's TLS
// 1.3 handshake on it: as the client, expecting peer ID want, or as the
// server (want ""), accepting any libp2p identity, which the caller checks.
func (n *Node) newTLSLink(ctx context.Context, c net.Conn, want peer.ID) (*link, error) {
	setSocketOptions(c)
	bc := &batchConn{Conn: c}
	if s, ok := c.(syscall.Conn); ok {
		bc.raw, _ = s.SyscallConn()
	}
	var sc sec.SecureConn
	var err error
	if want != "" {
		sc, err = n.data.sec.SecureOutbound(ctx, bc, want)
	} else {
		sc, err = n.data.sec.SecureInbound(ctx, bc, "")
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("tls handshake: %w", err)
	}
	return &link{rw: sc, kind: LinkTCPTLS, peerID: sc.RemotePeer(), conn: &tlsConn{tc: sc, sock: c, bc: bc}}, nil
}

// tlsConn is a tcp-tls link.
type tlsConn struct {
	socketState
	tc   net.Conn   // the TLS conn
	sock net.Conn   // the TCP socket under tc: close closes it directly
	bc   *batchConn // between tc and sock; nil in tests
	wbuf []byte     // coalesces small buffers of a message into one record
}

func (c *tlsConn) send(ctx context.Context, bufs [][]byte, _ linkWait) error {
	done := c.begin(ctx, c.tc.SetWriteDeadline)
	err := c.writeTLS(bufs)
	c.end(done)
	return err
}

// recv reads one message. The TLS conn's reads of the socket poll for w's
// budget before they wait (batchConn.Read), as a plain socket's do.
func (c *tlsConn) recv(ctx context.Context, buf []byte, w linkWait) error {
	done := c.begin(ctx, c.tc.SetReadDeadline)
	if c.bc != nil {
		c.bc.wait = w
	}
	_, err := io.ReadFull(c.tc, buf)
	c.end(done)
	return err
}

func (c *tlsConn) recvView(ctx context.Context, n int, use func(span []byte), w linkWait) error {
	buf := c.viewBuffer(n)
	if err := c.recv(ctx, buf, w); err != nil {
		return err
	}
	use(buf)
	return nil
}

// closeWrite sends TLS close_notify (tls.Conn.CloseWrite), which the
// peer's Read returns as io.EOF; the TCP socket stays open until close.
// Sending the alert can block while the socket's send buffer is full
// (crypto/tls bounds it by 5 s).
func (c *tlsConn) closeWrite() error {
	return c.tc.(interface{ CloseWrite() error }).CloseWrite()
}

func (c *tlsConn) drain(deadline time.Time) bool { return drainStream(c.tc, deadline) }

// close breaks the link at once. The TLS conn is not closed through TLS:
// its Close would first try to send close_notify, which blocks (up to
// 5 s) when the socket's send buffer is full; an orderly end is
// closeWrite's job.
func (c *tlsConn) close() { c.sock.Close() }

// batchSize is how many bytes of TLS records a tcp-tls link gathers per
// write(2) while it sends a message.
const batchSize = 256 << 10

// batchConn is the socket under a tcp-tls link's TLS conn. crypto/tls makes
// one Write, so one write(2), per record of at most 16 KiB. While a message
// is sent (batching), records are gathered and written batchSize at a
// time: the kernel's cost is mostly per write, not per byte.
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

	// Reads (the TLS conn's, one at a time: the link's receiver or the
	// handshake) poll raw for wait's budget before they wait in the
	// runtime's poller, as a plain socket's receive does (poll.go): a
	// small message's hop is otherwise mostly the wake-up.
	raw  syscall.RawConn
	wait linkWait
}

func (b *batchConn) Read(p []byte) (int, error) {
	if b.raw == nil || b.wait.budget <= 0 {
		return b.Conn.Read(p)
	}
	return pollRead(b.raw, p, b.wait.budget, b.wait.yield)
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

// tlsRecord is the most plaintext one TLS record carries.
const tlsRecord = 16 << 10

// writeTLS writes one message (bufs, in order) to a tcp-tls link. Every
// Write to a TLS conn ends in a record of its own (with its own 22 bytes of
// header and tag): a 56-byte message header written alone would take a
// record, and a packet, of its own. So pieces are gathered in c.wbuf until
// it holds a full record, large buffers are written directly in whole
// records, and what is left at the end goes out as one record: a message
// takes as few records as its size allows. This copies less than two
// records per message. The records reach the socket through c.bc in
// batches, the last one when writeTLS returns.
func (c *tlsConn) writeTLS(bufs [][]byte) error {
	w := c.wbuf[:0]
	if cap(w) < tlsRecord {
		w = make([]byte, 0, tlsRecord)
	}
	defer func() { c.wbuf = w[:0] }()
	if c.bc != nil {
		c.bc.batch()
		defer c.bc.flush() // on an error: stop gathering
	}
	for _, b := range bufs {
		if len(w) > 0 && len(w)+len(b) >= tlsRecord {
			k := tlsRecord - len(w)
			w = append(w, b[:k]...)
			b = b[k:]
			if _, err := c.tc.Write(w); err != nil {
				return err
			}
			w = w[:0]
		}
		if direct := len(b) / tlsRecord * tlsRecord; direct > 0 {
			if _, err := c.tc.Write(b[:direct]); err != nil {
				return err
			}
			b = b[direct:]
		}
		w = append(w, b...)
	}
	if len(w) > 0 {
		if _, err := c.tc.Write(w); err != nil {
			return err
		}
	}
	if c.bc != nil {
		return c.bc.flush()
	}
	return nil
}
