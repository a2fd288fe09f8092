package p2p

// Passing an shm link's ring to the peer over the link's unix socket, and
// checking what arrives.
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

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	"golang.org/x/sys/unix"
)

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
