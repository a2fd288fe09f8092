package p2p

// Link kind shm: one end of a shared-memory link, the byte stream through
// its ring (shm_ring.go) and the unix socket that watches the peer, and its
// setup on an authenticated unix link (shm_setup.go does the passing).
//
// The unix socket stays open and carries nothing after setup. A goroutine
// per shm link blocks reading it: when the peer process dies (kill -9 too)
// or closes the link, the kernel ends the socket, and the goroutine marks
// the link broken and wakes this side's futex word, so a transfer fails
// (through transport.fail, naming the peer) as it would on a unix socket.
// An orderly end (drainLinks) first marks the ring closed and then
// half-closes the socket: the reader takes what is left, then reads EOF.
//
// Closing a link (l.close: Close, abort, a new epoch) breaks it, wakes
// waiters, and unmaps once the last operation in flight has let go, so no
// mapping or fd outlives its link.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorun/gorun/internal/memcopy"
	"golang.org/x/sys/unix"
)

// of it this process is, and the unix socket that watches the peer.
type shmLink struct {
	ring   *shmRing
	writer bool
	conn   *net.UnixConn

	// Owned by the one transfer in flight (a link has one writer or one
	// reader): this side's counter (for a writer, including bytes not yet
	// published), the last value seen of the other side's (for a writer,
	// past its last rewind), and the head last published (or the end of a
	// rewind not yet followed by a publish: the reader jumps there).
	pos, peerPos, published uint64
	// The writer's last rewind (see rewind): a reader still at skipFrom
	// has read everything, and goes on at skipTo.
	skipFrom, skipTo uint64

	broken  atomic.Bool
	causeMu sync.Mutex
	cause   error

	// The mapping lives while a reference is held: one for the link
	// itself (dropped by close), one for the watcher, one per transfer.
	mu        sync.Mutex
	refs      int
	closing   bool
	released  chan struct{}
	closeOnce sync.Once

	// waitingSince is when the transfer in flight parked (UnixNano), 0
	// while none has: a hang diagnosis reads it to say which peer a rank
	// waits for (diagnose_rank.go). It is set only where a transfer parks (a
	// futex wait, a system call anyway) and cleared only by a transfer
	// that set it, so the fast path pays nothing for it.
	waitingSince atomic.Int64
}

func newShmLink(mem []byte, writer bool, c *net.UnixConn) *shmLink {
	// One reference for the link, one for the watcher (start).
	return &shmLink{ring: newShmRing(mem), writer: writer, conn: c, refs: 2, released: make(chan struct{})}
}

// start watches the peer through the link's socket, which must have no
// deadline left from the setup.
func (s *shmLink) start() { go s.watch() }

func (s *shmLink) acquire() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.refs++
	return true
}

func (s *shmLink) release() {
	s.mu.Lock()
	s.refs--
	last := s.refs == 0
	s.mu.Unlock()
	if last {
		unix.Munmap(s.ring.mem)
		close(s.released)
	}
}

// close breaks the link: it closes the socket first, which ends the
// watcher (it holds a reference), wakes this side's waiter and returns
// once the mapping is gone.
func (s *shmLink) close() {
	if s.conn != nil {
		s.conn.Close()
	}
	s.closeOnce.Do(func() {
		s.breakWith(net.ErrClosed)
		s.mu.Lock()
		s.closing = true
		s.mu.Unlock()
		s.release()
	})
	<-s.released
}

// breakWith marks the link broken (the first cause sticks) and wakes
// both futex words: this side's waiter, and the other side's should it be
// alive and parked (it finds its own end broken or closed, or parks again).
// Called with a reference held.
func (s *shmLink) breakWith(cause error) {
	s.causeMu.Lock()
	if s.cause == nil {
		s.cause = cause
	}
	s.causeMu.Unlock()
	s.broken.Store(true)
	interrupt(s.ring.dataWait)
	interrupt(s.ring.spaceWait)
}

func (s *shmLink) err() error {
	s.causeMu.Lock()
	defer s.causeMu.Unlock()
	return s.cause
}

// waitSince is when the transfer in flight parked (see waitingSince).
func (s *shmLink) waitSince() int64 { return s.waitingSince.Load() }

// myWord is the futex word this side parks on.
func (s *shmLink) myWord() *atomic.Uint32 {
	if s.writer {
		return s.ring.spaceWait
	}
	return s.ring.dataWait
}

// watch blocks on the link's socket, which carries nothing after setup:
// when it ends, the peer is gone (or closed the link) unless the ring was
// closed first (an orderly end: the reader takes what is left).
func (s *shmLink) watch() {
	defer s.release()
	var b [1]byte
	n, err := s.conn.Read(b[:])
	var cause error
	switch {
	case n > 0:
		cause = errors.New("unexpected data on an shm link's socket")
	case !s.writer && s.ring.closed.Load() != 0:
		return
	case errors.Is(err, net.ErrClosed):
		cause = net.ErrClosed
	case s.writer:
		cause = syscall.EPIPE // what a write to a socket whose reader is gone says
	case err == io.EOF:
		cause = io.EOF
	default:
		cause = err
	}
	s.breakWith(cause)
}

// send streams bufs, in order, into the ring.
func (s *shmLink) send(ctx context.Context, bufs [][]byte, w linkWait) error {
	if !s.acquire() {
		return net.ErrClosed
	}
	defer s.release()
	var p parked
	defer p.end(s)
	r := s.ring
	capacity := uint64(len(r.data))
	s.rewind()
	for _, b := range bufs {
		for len(b) > 0 {
			if s.broken.Load() {
				return s.err()
			}
			if s.pos-s.peerPos > capacity {
				return errShmCorrupt
			}
			free := capacity - (s.pos - s.peerPos)
			if free == 0 {
				s.peerPos = s.loadTail()
				if s.pos-s.peerPos > capacity {
					return errShmCorrupt
				}
				if free = capacity - (s.pos - s.peerPos); free == 0 {
					s.publish() // the reader can not free what it can not see
					if err := s.await(ctx, &p, w); err != nil {
						return err
					}
					continue
				}
			}
			n := min(free, uint64(len(b)), shmChunk)
			off := s.pos & r.mask
			k := memcopy.Copy(r.data[off:], b[:n])
			memcopy.Copy(r.data, b[k:n])
			s.pos += n
			b = b[n:]
			if s.pos-s.published >= shmChunk {
				s.publish()
			}
		}
	}
	s.publish()
	return nil
}

// rewind moves the writer of an empty ring, between messages, to the
// start of the ring's memory, so that messages that find the ring empty
// (all of a small or medium collective whose peer keeps up) reuse the same
// cache lines rather than march through the whole ring: 2 MiB of ring in
// each direction, beside the tensors, do not fit in a core's L2 cache.
//
// The stream skips the rest of the ring: the writer records where it was
// (skipFrom, all of which the reader has read) and where it goes on
// (skipTo) before it publishes a head past them, and a reader that finds
// its position at skipFrom goes on at skipTo (loadHead). A new record is
// written only when the reader has read everything past the last one
// (loadTail maps a reader still at skipFrom to skipTo, where a writer
// that wrote nothing since does not rewind), so a reader never sees one
// change under it.
func (s *shmLink) rewind() {
	r := s.ring
	if s.pos&r.mask == 0 || s.pos != s.published || s.loadTail() != s.pos {
		return
	}
	to := (s.pos + r.mask) &^ r.mask
	r.skipFrom.Store(s.pos)
	r.skipTo.Store(to)
	s.skipFrom, s.skipTo = s.pos, to
	s.pos, s.published, s.peerPos = to, to, to
}

// loadTail is the writer's view of the reader's position: the reader's
// counter, or the end of the last rewind if the reader has not yet moved
// past its start.
func (s *shmLink) loadTail() uint64 {
	if t := s.ring.tail.Load(); t != s.skipFrom {
		return t
	}
	return s.skipTo
}

// loadHead is the reader's view of the writer's counter; if the writer
// rewound from this reader's position, the reader goes on where the
// writer did.
func (s *shmLink) loadHead() uint64 {
	r := s.ring
	h := r.head.Load()
	if h != s.pos && r.skipFrom.Load() == s.pos {
		// A rewind moves 1 to capacity bytes on; counted modulo 2^64, as
		// every difference of counters is here (a counter wraps after
		// 2^64/capacity rewinds). Any other record breaks the protocol:
		// ignored, the counters then say errShmCorrupt or the ring's
		// headers catch the bytes.
		if to := r.skipTo.Load(); to-s.pos-1 <= r.mask {
			s.pos = to
		}
	}
	return h
}

func (s *shmLink) publish() {
	if s.pos != s.published {
		raceReleaseIO()
		s.ring.head.Store(s.pos)
		s.published = s.pos
		notify(s.ring.dataWait)
	}
}

// recv fills buf from the ring. At the end of the stream (the writer
// closed the ring) it returns io.EOF, or io.ErrUnexpectedEOF within buf.
func (s *shmLink) recv(ctx context.Context, buf []byte, w linkWait) error {
	got := 0
	return s.recvView(ctx, len(buf), func(span []byte) { got += memcopy.Copy(buf[got:], span) }, w)
}

// recvView hands the next n bytes to use, in order, as spans of the ring
// itself (two where the ring wraps, and pieces of at most shmChunk), each
// valid only during its call: the writer may reuse the space once use
// returns. A receiver that reduces what it receives does so straight from
// the ring; recv copies. At the end of the stream it returns io.EOF, or
// io.ErrUnexpectedEOF within the n bytes.
func (s *shmLink) recvView(ctx context.Context, n int, use func(span []byte), w linkWait) error {
	if !s.acquire() {
		return net.ErrClosed
	}
	defer s.release()
	var p parked
	defer p.end(s)
	r := s.ring
	got := 0
	for got < n {
		avail := s.peerPos - s.pos
		if avail == 0 {
			s.peerPos = s.loadHead()
			avail = s.peerPos - s.pos
		}
		if avail > uint64(len(r.data)) {
			return errShmCorrupt
		}
		if avail == 0 {
			// What the writer wrote before it closed the ring (or died)
			// is still read, as from a socket.
			if r.closed.Load() != 0 {
				if s.peerPos = s.loadHead(); s.peerPos != s.pos {
					continue
				}
				return eofAfter(got)
			}
			if s.broken.Load() {
				if err := s.err(); err != io.EOF {
					return err
				}
				return eofAfter(got)
			}
			if err := s.await(ctx, &p, w); err != nil {
				return err
			}
			continue
		}
		raceAcquireIO()
		k := int(min(avail, uint64(n-got), shmChunk))
		off := int(s.pos & r.mask)
		first := min(k, len(r.data)-off)
		use(r.data[off : off+first])
		if first < k {
			use(r.data[:k-first])
		}
		got += k
		s.pos += uint64(k)
		r.tail.Store(s.pos)
		notify(r.spaceWait)
	}
	return nil
}

// errShmCorrupt: the peer's counter says more than the ring holds. Only a
// peer that broke the protocol does that; the link is unusable.
var errShmCorrupt = errors.New("shm ring counters out of range")

func eofAfter(got int) error {
	if got == 0 {
		return io.EOF
	}
	return io.ErrUnexpectedEOF
}

// closeWrite ends the stream in order: the reader takes what is in the
// ring, then reads EOF. Only then is the socket half-closed, so that the
// reader's watcher finds the ring closed and knows the end is no crash.
func (s *shmLink) closeWrite() error {
	if s.acquire() {
		// Every send published all it wrote before it returned.
		s.ring.closed.Store(1)
		notify(s.ring.dataWait)
		s.release()
	}
	if s.conn != nil {
		s.conn.CloseWrite()
	}
	return nil
}

// drain reads and drops everything until the writer's end of the stream,
// bounded by deadline; it reports whether the end came.
func (s *shmLink) drain(deadline time.Time) bool {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	buf := make([]byte, shmChunk)
	for {
		switch err := s.recv(ctx, buf, linkWait{}); err {
		case nil:
		case io.EOF, io.ErrUnexpectedEOF:
			return true
		default:
			return false
		}
	}
}

// localRanks is the number of the job's ranks on this host, this one
// included.
func (n *Node) localRanks() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	local := 0
	for _, p := range n.job.peers {
		if p.HostID == n.cfg.HostID {
			local++
		}
	}
	return max(local, 1)
}

// setupShm moves a unix link whose handshake agreed on shared memory to
// it: the end that writes on the link (writer) creates the ring and passes
// it over the socket, the other maps it (shm_setup.go). Only ever called
// once both ends proved the job key and the link's identity (ranks,
// epoch), on the link's own socket, so the fd reaches nobody else. A
// failure of the shared memory itself leaves the unix link (nil, nil; said
// once in the log); an error means the socket broke.
func (n *Node) setupShm(l *link, id shmIdentity, writer bool) (*shmLink, error) {
	c, ok := l.rw.(*net.UnixConn)
	if !ok {
		return nil, nil
	}
	var s *shmLink
	var fallback, err error
	if writer {
		capacity := n.data.shmBytes
		if n.data.shmByHost {
			capacity = shmRingBytes(n.localRanks())
		}
		s, fallback, err = offerShm(c, id, capacity)
	} else {
		s, fallback, err = receiveShm(c, id)
	}
	if err != nil {
		return nil, fmt.Errorf("shared memory setup: %w", err)
	}
	if fallback != nil {
		if n.data.shmWarned.CompareAndSwap(false, true) {
			n.logf("shared memory with rank %d unavailable, keeping unix sockets for such links: %v", l.peer, fallback)
		}
		return nil, nil
	}
	// The watcher reads the socket from now on: no handshake deadline.
	c.SetDeadline(time.Time{})
	s.start()
	return s, nil
}
