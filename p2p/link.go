package p2p

// A data link and the interface every kind of link implements.
//
// A link is one ordered byte stream between this rank and a peer, in one
// direction. What it runs over is its kind (Peer.Link): shared memory
// (link_shm.go), a unix or plain TCP socket (link_socket.go), TCP with
// libp2p's TLS (link_tls.go) or a libp2p stream (link_libp2p.go). The
// kinds differ only behind conn, which the ring.Transport adapter
// (transport.go) calls once per transfer. How links are opened
// (dial.go, accept.go), authenticated (handshake.go) and set up and ended
// for an epoch (epoch_links.go) is the same for every kind.

import (
	"context"
	"io"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Link kinds (Peer.Link).
const (
	LinkUnix         = "unix"
	LinkTCPPlaintext = "tcp-plaintext"
	LinkTCPTLS       = "tcp-tls"
	LinkLibp2pTLS    = "libp2p-tls"
	// LinkShm is a ring buffer in shared memory between ranks of one host
	// (shm.go), set up over, and watched through, a unix link.
	LinkShm = "shm"
)

// conn is what a kind of link does once the link is set up: move bytes one
// way, say since when a transfer waits for the peer, and end. A link has
// at most one transfer in flight (one sender or one receiver), so an
// implementation keeps per-transfer state without locks.
type conn interface {
	// send writes bufs, in order, to the peer.
	send(ctx context.Context, bufs [][]byte, w linkWait) error
	// recv reads exactly len(buf) bytes from the peer.
	recv(ctx context.Context, buf []byte, w linkWait) error
	// recvView hands the next n bytes to use, in order, in one or more
	// spans that are valid only during their call (ring.ViewReceiver).
	recvView(ctx context.Context, n int, use func(span []byte), w linkWait) error
	// waitSince is when the transfer in progress began waiting for the
	// peer (UnixNano), 0 if none is: a hang diagnosis reads it.
	waitSince() int64
	// closeWrite ends what this side sends in order: the peer reads all
	// of it, then EOF. It may block while the peer does not read.
	closeWrite() error
	// drain reads and drops what the peer sends until its end of the
	// stream, bounded by deadline, and reports whether the end came.
	drain(deadline time.Time) bool
	// close breaks the link at once, failing a transfer in flight.
	close()
}

// linkWait is how a transfer waits for its peer: the poll budget and
// yielding of pollConfig, and whether the caller's collective runs other
// goroutines that must get this thread's P before it sleeps (shm only).
type linkWait struct {
	budget  time.Duration
	yield   bool
	gosched bool
}

// deadliner is what a link's handshake needs from a net.Conn or libp2p
// stream.
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
	// rw is the stream the handshake runs on: the socket, the TLS conn or
	// the libp2p stream (for shm, the unix socket it was set up over).
	rw deadliner
	// peerID is the remote identity that TLS proved (tcp-tls and
	// libp2p-tls links); "" for other kinds.
	peerID peer.ID
	// conn moves the data once the handshake is done.
	conn conn
}

// waitSince is when the transfer in progress on l began waiting for the
// peer (UnixNano), 0 if none is waiting.
func (l *link) waitSince() int64 { return l.conn.waitSince() }

// close breaks the link at once.
func (l *link) close() { l.conn.close() }

// watch applies ctx to one operation on a socket or stream: its deadline
// becomes the socket deadline, and cancellation sets a past deadline so a
// blocked call returns. The returned func must be called when the
// operation ends; it makes sure the cancellation callback has finished so
// it can not hit the next operation.
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

// drainStream reads and drops what rw carries until EOF, bounded by
// deadline; it reports whether EOF came.
func drainStream(rw deadliner, deadline time.Time) bool {
	rw.SetReadDeadline(deadline)
	_, err := io.Copy(io.Discard, rw)
	return err == nil
}

// socketState is what the kinds that run over a socket or stream (all but
// shm) keep besides it.
type socketState struct {
	// since is when the transfer in progress on this link started
	// (UnixNano), 0 when none is: a hang diagnosis reads it to say which
	// peer a rank waits for (pendingWaits, diagnose_rank.go). A socket transfer
	// makes system calls and arms a context watch anyway, which cost far
	// more than the clock read and two stores. A shm link keeps its own
	// (shmLink.waitingSince), set only when a transfer parks.
	since atomic.Int64
	// viewBuf receives recvView's bytes (a link has one receiver at a
	// time).
	viewBuf []byte
}

// begin marks a transfer as started and applies ctx to it through set
// (see watch); the transfer must call end with the result when it ends.
func (s *socketState) begin(ctx context.Context, set func(time.Time) error) func() {
	s.since.Store(time.Now().UnixNano())
	return watch(ctx, set)
}

// end ends a transfer that begin started.
func (s *socketState) end(done func()) {
	done()
	s.since.Store(0)
}

func (s *socketState) waitSince() int64 { return s.since.Load() }

// viewBuffer returns n bytes of viewBuf, grown if needed.
func (s *socketState) viewBuffer(n int) []byte {
	if cap(s.viewBuf) < n {
		s.viewBuf = make([]byte, n)
	}
	return s.viewBuf[:n]
}
