package p2p

// The shared mapping of an shm link: its layout, and how the writer
// creates it (a sealed memfd).
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

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

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
