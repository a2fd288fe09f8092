package p2p

// Shared-memory links (kind "shm") between ranks of one host.
//
// A unix socket costs two system calls and two copies per message and a
// wake-up of the receiving thread; for the small, latency-bound messages of
// a ring step that is most of the time a collective takes. An shm link
// moves the bytes of one directed link through a ring buffer that both
// processes map, and uses the link's unix socket only to set it up and to
// notice that the peer is gone.
//
// # Setup
//
// A link starts as a unix link and is authenticated as one (dialLink,
// acceptHandshake: HMAC over the job key, the link's ranks and epoch). The
// dialer offers shared memory in its data hello, the acceptor agrees in its
// answer if it allows it too (Config.NoShm, GORUN_SHM=0 turn it off). Only
// then, so only to a rank that proved the job key, the end that sends on the
// link creates its ring: an anonymous memfd (nothing in /dev/shm, the memory
// goes away with the last process that maps it, kill -9 included), sized
// and sealed against shrinking and growing, mapped, with a header naming
// the link (sending rank, receiving rank, epoch). The fd goes to the peer
// over the link's socket with SCM_RIGHTS (and is closed at once: the
// mapping keeps the memory). The receiver checks the fd (one fd, a sealed
// file of the announced size) and the header against what the handshake
// established, maps it, closes the fd, and acks on the socket. Any failure
// short of a broken socket makes both ends keep the plain unix link, which
// the node says once in its log.
//
// # Ring
//
// One mapping per directed link: a page of header, then the data ring
// (capacity a power of two, GORUN_SHM_BYTES, default defaultShmBytes). The
// head (the writer's position in the stream, published) and tail (the
// reader's) counters sit on cache lines of their own, as do the two futex
// words; a write that wraps copies in two pieces, and a message that finds
// the ring empty starts at its first byte (see rewind). The link is a pure byte
// stream like a socket: the writer streams a message of any size through,
// publishing at least every shmChunk bytes so the reader can start, and the
// reader consumes what is there.
//
// # Waiting
//
// Both ends wait the same way: first poll for the budget of pollConfig
// (shmYieldBudget when the host runs more ranks than CPUs, where
// pollConfig does not poll): a few hot checks, then checks with the CPU
// yielded in between (sched_yield), so that a poll does not keep a peer
// that needs this CPU off it. Then park on a futex word in the mapping
// (FUTEX_WAIT, not the private variant: the waker is another process). To
// park, a side sets its word to 1, checks again, then waits while the
// word is 1; the other side publishes its counter, and only if the word
// is 1 swaps it to 0 and calls FUTEX_WAKE, so the fast path makes no
// system call. A parked wait is bounded by the ctx deadline (the futex timeout),
// and cancellation, Close and the end of the link's epoch (which closes
// the links) wake it: they set the word to 0 and wake it themselves. The
// context callback is only registered once an operation parks.
//
// # Liveness and the end of a link
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
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/ring"
)

const (
	envShm      = "GORUN_SHM"       // "0", "off", "false" or "no": ranks of one host use unix sockets
	envShmBytes = "GORUN_SHM_BYTES" // ring capacity of every shm link, rounded up to a power of two

	defaultShmBytes = 2 << 20 // measured (BenchmarkLink): 1 MiB cost ~1.7x the CPU per byte of 2 or 4 MiB
	// minShmBytes: the ring's schedules send a message of up to
	// ring.SmallBytes before they receive (see ring.SmallBytes), so every
	// link must buffer that much plus a header, or two ranks that send
	// to each other first would both wait for space forever.
	minShmBytes = 2 * ring.SmallBytes
	maxShmBytes = 1 << 30

	// shmChunk bounds how much a writer copies before it publishes (and a
	// reader before it frees space), so the other side works in parallel
	// on a long message.
	shmChunk = 64 << 10
	// shmSpins are the hot checks of a wait before it yields the CPU
	// between checks (see await).
	shmSpins = 64
	// shmYieldBudget is how long a wait polls (yielding the CPU between
	// checks, see await) before it parks when the host runs more ranks
	// than CPUs, where pollConfig does not poll sockets. Unlike a socket
	// poll, a check costs no system call, and the yield hands the CPU to
	// a peer that is runnable on it, which a park-and-wake would make wait
	// for a wake-up. Measured with 4 ranks on 2 CPUs (shared, busy): 4-byte allreduces
	// took 180-220 us with 50 us of yielding, 320-450 us without; 64 KiB
	// 340-440 us against 540-990 us; 1 MiB within the noise. 200 us
	// helped small messages no more and 1 MiB ones a little less.
	shmYieldBudget = 50 * time.Microsecond
	// maxPark bounds one futex wait. Every wake-up that matters is
	// explicit; this only caps the cost of one missed.
	maxPark = time.Second
)

// shmEnabled says whether this process allows shm links: cfg.NoShm and
// GORUN_SHM=0 turn them off.
func shmEnabled(cfg Config) bool {
	if cfg.NoShm {
		return false
	}
	switch os.Getenv(envShm) {
	case "0", "off", "false", "no":
		return false
	}
	return true
}

// shmCapacity is the ring size this process creates: GORUN_SHM_BYTES
// (4096, 512K, 4M), rounded up to a power of two and clamped to
// [minShmBytes, maxShmBytes], or defaultShmBytes.
func shmCapacity() (int, error) {
	s := os.Getenv(envShmBytes)
	if s == "" {
		return defaultShmBytes, nil
	}
	v, err := ring.ParseBytes(s)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("%s=%q: want the size of a shared-memory link's buffer, e.g. 2M", envShmBytes, s)
	}
	c := min(max(v, minShmBytes), maxShmBytes)
	return 1 << bits.Len(uint(c-1)), nil
}

// Mapping layout. Every counter the two processes write has a cache line
// (two, against the adjacent-line prefetcher) of its own.
const (
	shmMagic   = 0x676f72756e73686d // "gorunshm"
	shmVersion = 2                  // 2: the writer's rewind record (offSkipFrom, offSkipTo)
	shmLine    = 128

	offMagic   = 0  // uint64
	offVersion = 8  // uint64
	offCap     = 16 // uint64: data capacity in bytes
	offFrom    = 24 // uint64: the rank that writes
	offTo      = 32 // uint64: the rank that reads
	offEpoch   = 40 // uint64: the membership epoch of the link

	offHead      = 1 * shmLine  // uint64, writer: bytes ever written and published
	offClosed    = offHead + 8  // uint32, writer: 1 once it will write no more
	offSkipFrom  = offHead + 16 // uint64, writer: the stream position of its last rewind...
	offSkipTo    = offHead + 24 // uint64, writer: ...and where the stream went on (see rewind)
	offTail      = 2 * shmLine  // uint64, reader: bytes ever read
	offDataWait  = 3 * shmLine  // uint32 futex word: 1 while the reader is parked
	offSpaceWait = 4 * shmLine  // uint32 futex word: 1 while the writer is parked

	shmHdrSize = 4096 // data starts on its own page
)

// shmIdentity is what the unix handshake established about a link; the
// ring's header must say the same.
type shmIdentity struct{ from, to, epoch int }

// shmRing is one mapped ring.
type shmRing struct {
	mem                 []byte // the whole mapping
	data                []byte // mem[shmHdrSize:]
	mask                uint64
	head, tail          *atomic.Uint64
	skipFrom, skipTo    *atomic.Uint64
	closed              *atomic.Uint32
	dataWait, spaceWait *atomic.Uint32
}

func u64At(mem []byte, off int) *atomic.Uint64 { return (*atomic.Uint64)(unsafe.Pointer(&mem[off])) }
func u32At(mem []byte, off int) *atomic.Uint32 { return (*atomic.Uint32)(unsafe.Pointer(&mem[off])) }

func newShmRing(mem []byte) *shmRing {
	return &shmRing{
		mem: mem, data: mem[shmHdrSize:], mask: uint64(len(mem) - shmHdrSize - 1),
		head: u64At(mem, offHead), tail: u64At(mem, offTail), closed: u32At(mem, offClosed),
		skipFrom: u64At(mem, offSkipFrom), skipTo: u64At(mem, offSkipTo),
		dataWait: u32At(mem, offDataWait), spaceWait: u32At(mem, offSpaceWait),
	}
}

// createShm makes the ring of a link this process writes: a sealed memfd
// of the right size, mapped, with its header filled in. It returns the
// mapping and the fd (to pass to the peer, then close).
func createShm(id shmIdentity, capacity int) (mem []byte, fd int, err error) {
	fd, err = unix.MemfdCreate("gorun-shm", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, -1, fmt.Errorf("memfd_create: %w", err)
	}
	size := shmHdrSize + capacity
	if err = unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, -1, fmt.Errorf("ftruncate: %w", err)
	}
	// Allocated now, so that a host short of memory fails the setup (and
	// keeps the unix link) rather than a transfer (SIGBUS on a page fault).
	if err = unix.Fallocate(fd, 0, 0, int64(size)); err != nil {
		unix.Close(fd)
		return nil, -1, fmt.Errorf("fallocate: %w", err)
	}
	// The receiver relies on the size: a peer that shrank the file under
	// its mapping would crash it with SIGBUS.
	if _, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return nil, -1, fmt.Errorf("seal memfd: %w", err)
	}
	mem, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, -1, fmt.Errorf("mmap: %w", err)
	}
	binary.LittleEndian.PutUint64(mem[offMagic:], shmMagic)
	binary.LittleEndian.PutUint64(mem[offVersion:], shmVersion)
	binary.LittleEndian.PutUint64(mem[offCap:], uint64(capacity))
	binary.LittleEndian.PutUint64(mem[offFrom:], uint64(id.from))
	binary.LittleEndian.PutUint64(mem[offTo:], uint64(id.to))
	binary.LittleEndian.PutUint64(mem[offEpoch:], uint64(id.epoch))
	return mem, fd, nil
}

// createShmRing is createShm; tests make it fail.
var createShmRing = createShm

// The setup messages on the link's socket, after the handshake. The offer
// (writer -> reader) carries the fd; capacity 0 and no fd say the writer
// could not create its ring. The ack (reader -> writer) says whether the
// reader mapped it.
const (
	shmOfferMagic = "GSHMOFR1"
	shmOfferLen   = 16 // magic, capacity (uint64 LE)
	shmAckMagic   = "GSHMACK"
	shmAckLen     = 8 // magic, status: 1 mapped, 0 keep the unix link
)

// offerShm is the writer's half of the setup on a link whose handshake
// succeeded with shared memory agreed. It returns the shm link, or a
// reason to keep the unix link (fallback), or the socket's error (ioErr:
// the link itself is broken).
func offerShm(c *net.UnixConn, id shmIdentity, capacity int) (s *shmLink, fallback, ioErr error) {
	offer := make([]byte, shmOfferLen)
	copy(offer, shmOfferMagic)
	mem, fd, err := createShmRing(id, capacity)
	if err != nil {
		// Tell the reader, which waits for an offer.
		if _, ioErr = c.Write(offer); ioErr != nil {
			return nil, nil, ioErr
		}
		if _, ioErr = readAck(c); ioErr != nil {
			return nil, nil, ioErr
		}
		return nil, err, nil
	}
	binary.LittleEndian.PutUint64(offer[8:], uint64(capacity))
	_, _, ioErr = c.WriteMsgUnix(offer, unix.UnixRights(fd), nil)
	unix.Close(fd) // the message holds its own reference, the mapping another
	if ioErr == nil {
		var ok bool
		if ok, ioErr = readAck(c); ioErr == nil && !ok {
			fallback = errors.New("the peer did not map the shared memory")
		}
	}
	if ioErr != nil || fallback != nil {
		unix.Munmap(mem)
		return nil, fallback, ioErr
	}
	return newShmLink(mem, true, c), nil, nil
}

func readAck(c *net.UnixConn) (bool, error) {
	var ack [shmAckLen]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return false, err
	}
	if string(ack[:7]) != shmAckMagic {
		return false, errors.New("shm setup: bad ack")
	}
	return ack[7] == 1, nil
}

// receiveShm is the reader's half of the setup: it reads the writer's
// offer, checks and maps the ring, and acks. Whatever the offer holds (no
// fd, several, a file of the wrong size or kind, a header for another
// link), it closes every fd received and answers with a fallback, never a
// crash.
func receiveShm(c *net.UnixConn, id shmIdentity) (s *shmLink, fallback, ioErr error) {
	offer := make([]byte, shmOfferLen)
	// Room for a few fds, so that extra ones are seen (and closed), not cut.
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(offer, oob)
	if err != nil {
		return nil, nil, err
	}
	fds, ferr := rightsOf(oob[:oobn])
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	if n < len(offer) {
		// Later bytes carry no fd: a plain read drops (closes) any.
		if _, err := io.ReadFull(c, offer[n:]); err != nil {
			return nil, nil, err
		}
	}
	var mem []byte
	fallback = func() error {
		if ferr != nil {
			return ferr
		}
		if flags&unix.MSG_CTRUNC != 0 {
			return errors.New("control message truncated")
		}
		if string(offer[:8]) != shmOfferMagic {
			return errors.New("bad offer")
		}
		capacity := binary.LittleEndian.Uint64(offer[8:])
		if capacity == 0 && len(fds) == 0 {
			return errors.New("the peer could not create shared memory")
		}
		if len(fds) != 1 {
			return fmt.Errorf("offer with %d fds, want 1", len(fds))
		}
		if capacity < minShmBytes || capacity > maxShmBytes || capacity&(capacity-1) != 0 {
			return fmt.Errorf("offer of %d bytes", capacity)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fds[0], &st); err != nil {
			return fmt.Errorf("fstat: %w", err)
		}
		size := shmHdrSize + int64(capacity)
		if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != size {
			return fmt.Errorf("fd is not a %d-byte file (mode %o, %d bytes)", size, st.Mode, st.Size)
		}
		seals, err := unix.FcntlInt(uintptr(fds[0]), unix.F_GET_SEALS, 0)
		if err != nil || seals&(unix.F_SEAL_SHRINK|unix.F_SEAL_GROW) != unix.F_SEAL_SHRINK|unix.F_SEAL_GROW {
			return errors.New("fd is not a memfd sealed against resizing")
		}
		m, err := unix.Mmap(fds[0], 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return fmt.Errorf("mmap: %w", err)
		}
		le := binary.LittleEndian
		switch {
		case le.Uint64(m[offMagic:]) != shmMagic || le.Uint64(m[offVersion:]) != shmVersion:
			err = errors.New("bad ring header")
		case le.Uint64(m[offCap:]) != capacity:
			err = errors.New("ring header and offer disagree on the size")
		case le.Uint64(m[offFrom:]) != uint64(id.from) || le.Uint64(m[offTo:]) != uint64(id.to) || le.Uint64(m[offEpoch:]) != uint64(id.epoch):
			err = fmt.Errorf("ring of link %d -> %d (epoch %d), want %d -> %d (epoch %d)",
				le.Uint64(m[offFrom:]), le.Uint64(m[offTo:]), le.Uint64(m[offEpoch:]), id.from, id.to, id.epoch)
		case u64At(m, offHead).Load() != 0 || u64At(m, offTail).Load() != 0 || u32At(m, offClosed).Load() != 0 ||
			u64At(m, offSkipFrom).Load() != 0 || u64At(m, offSkipTo).Load() != 0:
			err = errors.New("ring not fresh")
		}
		if err != nil {
			unix.Munmap(m)
			return err
		}
		mem = m
		return nil
	}()
	ack := []byte(shmAckMagic + "\x00")
	if fallback == nil {
		ack[7] = 1
	}
	if _, ioErr = c.Write(ack); ioErr != nil || fallback != nil {
		if mem != nil {
			unix.Munmap(mem)
		}
		return nil, fallback, ioErr
	}
	return newShmLink(mem, false, c), nil, nil
}

// rightsOf returns every fd in the SCM_RIGHTS messages of oob.
func rightsOf(oob []byte) (fds []int, err error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("control message: %w", err)
	}
	for i := range msgs {
		f, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			continue // not SCM_RIGHTS: nothing to close
		}
		fds = append(fds, f...)
	}
	return fds, nil
}

// shmLink is one end of a shared-memory link: the mapped ring, which side
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
	// waits for (diagnose.go). It is set only where a transfer parks (a
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

// close breaks the link, wakes this side's waiter and returns once the
// mapping is gone. The caller closes the socket (which ends the watcher).
func (s *shmLink) close() {
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

// ready reports whether this side can make progress: data or the end of
// the stream for the reader, space for the writer.
func (s *shmLink) ready() bool {
	r := s.ring
	if s.writer {
		return s.pos-s.loadTail() < uint64(len(r.data))
	}
	return r.head.Load() != s.pos || r.closed.Load() != 0
}

// notify wakes the other side if it is parked on w: only then is there a
// system call.
func notify(w *atomic.Uint32) {
	if w.Load() != 0 && w.CompareAndSwap(1, 0) {
		futexWake(w)
	}
}

// interrupt wakes this process's waiter on w whatever the flag says; the
// waiter then finds out why (ctx, broken link).
func interrupt(w *atomic.Uint32) {
	w.Store(0)
	futexWake(w)
}

const (
	futexWaitOp = 0 // FUTEX_WAIT: shared, the waker is another process
	futexWakeOp = 1 // FUTEX_WAKE
)

func futexWait(w *atomic.Uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWaitOp, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

func futexWake(w *atomic.Uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWakeOp, math.MaxInt32, 0, 0, 0)
}

// parked is the context callback of a transfer that parked (registered on
// the first park, never on the fast path).
type parked struct {
	stop  func() bool
	fired chan struct{}
	// waiting: the transfer parked and set its link's waitingSince.
	waiting bool
}

// end unregisters the callback, waiting for it if it is running: it
// touches the mapping, which must outlive it. It clears s.waitingSince if
// the transfer set it.
func (p *parked) end(s *shmLink) {
	if p.waiting {
		s.waitingSince.Store(0)
	}
	if p.stop != nil && !p.stop() {
		<-p.fired
	}
}

// shmWait is how a shm operation waits (see await): the poll budget and
// yielding of pollConfig, and whether the caller's collective runs other
// goroutines that must get this thread's P before it sleeps.
type shmWait struct {
	budget  time.Duration
	yield   bool
	gosched bool
}

// await returns once this side may make progress (ready) or the link is
// broken; or with ctx's cause, or os.ErrDeadlineExceeded at its deadline.
// It polls for budget (pollConfig's; shmYieldBudget if that is 0 because
// the host runs more ranks than CPUs, which yield says), then parks on
// this side's futex word.
//
// A poll is a few hot checks, which catch a peer that answers within a
// microsecond or so without any system call, then checks with the CPU
// yielded in between: a peer that takes longer is likely waiting for a
// CPU, maybe this one, and a hot spin would keep it off. Measured with 2
// ranks on 2 CPUs that other processes kept busy (load ~7): 4-byte
// allreduces took 44-74 us with yields against 172-191 us hot, 64 KiB
// 67-100 us against 254-279 us.
func (s *shmLink) await(ctx context.Context, p *parked, wait shmWait) error {
	budget := wait.budget
	if budget <= 0 && wait.yield {
		budget = shmYieldBudget
	}
	var start time.Time
	for i := 0; ; i++ {
		if s.ready() || s.broken.Load() {
			return nil
		}
		if i < shmSpins {
			continue
		}
		if budget <= 0 {
			break
		}
		if i == shmSpins {
			start = time.Now()
			if wait.gosched {
				runtime.Gosched() // see below: a readied sender starts now, not after the poll
			}
		} else if time.Since(start) > budget {
			break
		}
		syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
	}
	// Let other goroutines run before this one parks: the ring's sender,
	// just readied by this receiver, or the training loop's own goroutines
	// computing while an async collective waits, may sit on this P, and a
	// futex wait holds the P until sysmon takes it back, which takes
	// hundreds of microseconds. Measured with gorun bench, with and without
	// the Goscheds alternated: np=2, 256 KiB 290-317 us -> 139-171 us and
	// 1 MiB 396-482 -> 367-387; np=4, 256 KiB 783-867 -> 508-607 and 1 MiB
	// 1411-1451 -> 963-1260; the MNIST example at np=4 (4 ranks on 2 CPUs,
	// its allreduces overlapping its backward pass) 0.76-0.83 s per epoch
	// without this one when its allreduces ran on one goroutine, 0.55-0.60
	// with it. Only the early Gosched, before polling, is left to
	// collectives of several goroutines (wait.gosched): a small one that
	// waits a few microseconds would only wake another thread, which cost
	// 4-byte allreduces 6.5 -> 12 us at np=2 and 126-140 -> 167-205 us at
	// np=4; the wait has lasted the poll budget by the time it parks.
	runtime.Gosched()
	if !p.waiting {
		// From here on the transfer waits for the peer: say so to a hang
		// diagnosis (the spins and yields above are too short to matter).
		p.waiting = true
		s.waitingSince.Store(time.Now().UnixNano())
	}
	w := s.myWord()
	if p.stop == nil && ctx.Done() != nil {
		p.fired = make(chan struct{})
		p.stop = context.AfterFunc(ctx, func() {
			interrupt(w)
			close(p.fired)
		})
	}
	deadline, hasDeadline := ctx.Deadline()
	for {
		w.Store(1)
		// Checked after the flag is up: whoever changes one of these
		// afterwards sees the flag and wakes us.
		if s.ready() || s.broken.Load() {
			w.Store(0)
			return nil
		}
		if ctx.Err() != nil {
			w.Store(0)
			return context.Cause(ctx)
		}
		d := maxPark
		if hasDeadline {
			left := time.Until(deadline)
			if left <= 0 {
				w.Store(0)
				return os.ErrDeadlineExceeded
			}
			d = min(d, left)
		}
		futexWait(w, 1, d)
	}
}

// write streams bufs, in order, into the ring.
func (s *shmLink) write(ctx context.Context, bufs [][]byte, w shmWait) error {
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
			k := ringCopy(r.data[off:], b[:n])
			ringCopy(r.data, b[k:n])
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
// Measured with gorun bench, medians of 7 interleaved runs, np=2, without
// and with: 64 KiB 18.6 -> 14.7 us, 256 KiB 61.8 -> 47.5, 1 MiB 245 -> 208
// (another series: 263 -> 214), 4 MiB 1098 -> 950; np=4 1 MiB 783 -> 666
// (5 runs); 4 bytes and 64 MiB the same.
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

// read fills buf from the ring. At the end of the stream (the writer
// closed the ring) it returns io.EOF, or io.ErrUnexpectedEOF within buf.
func (s *shmLink) read(ctx context.Context, buf []byte, w shmWait) error {
	got := 0
	return s.readView(ctx, len(buf), func(span []byte) { got += ringCopy(buf[got:], span) }, w)
}

// readView hands the next n bytes to use, in order, as spans of the ring
// itself (two where the ring wraps, and pieces of at most shmChunk), each
// valid only during its call: the writer may reuse the space once use
// returns. A receiver that reduces what it receives does so straight from
// the ring; read copies. At the end of the stream it returns io.EOF, or
// io.ErrUnexpectedEOF within the n bytes.
func (s *shmLink) readView(ctx context.Context, n int, use func(span []byte), w shmWait) error {
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
// ring, then reads EOF. The caller half-closes the socket afterwards, so
// the reader's watcher finds the ring closed and knows the end is no crash.
func (s *shmLink) closeWrite() {
	if !s.acquire() {
		return
	}
	defer s.release()
	// Every write published all it wrote before it returned.
	s.ring.closed.Store(1)
	notify(s.ring.dataWait)
}

// drain reads and drops everything until the writer's end of the stream,
// bounded by deadline; it reports whether the end came.
func (s *shmLink) drain(deadline time.Time) bool {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	buf := make([]byte, shmChunk)
	for {
		switch err := s.read(ctx, buf, shmWait{}); err {
		case nil:
		case io.EOF, io.ErrUnexpectedEOF:
			return true
		default:
			return false
		}
	}
}
