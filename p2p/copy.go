package p2p

// Copies in and out of a shared-memory ring.
//
// Every byte a shm link carries is copied twice: into the ring by the
// writer, out of it by the reader (or reduced from it in place), and the
// two run on different cores, so most lines a copy touches were last used
// by the other core. On CPUs with enhanced REP MOVSB (ERMS), REP MOVSB is
// the CPU's fast-string copy, which can store whole cache lines without
// first reading them for ownership; Go's copy moves such blocks with vector
// loads and stores, or with REP MOVSQ when the destination is 16-byte
// aligned, which the ring's payloads (after a 56-byte header) are not;
// but the alignment is not what makes REP MOVSB faster here, the stores
// that skip the read for ownership are (BENCHMARKS.md). Within one core's
// cache the two copy alike, and REP MOVSB costs more below a few KiB (its
// start-up), so short copies keep Go's copy.

// ermsMinBytes is the shortest copy ringCopy hands to REP MOVSB.
const ermsMinBytes = 4096

// ringCopy copies min(len(dst), len(src)) bytes, which must not overlap,
// as copy does, and returns how many; it is for copies into and out of a
// shm ring.
func ringCopy(dst, src []byte) int {
	n := min(len(dst), len(src))
	if n >= ermsMinBytes && useERMS {
		raceCopy(dst[:n], src[:n])
		copyBytesERMS(dst[:n], src[:n])
		return n
	}
	return copy(dst, src)
}
