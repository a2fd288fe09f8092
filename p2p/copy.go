package p2p

// Copies in and out of a shared-memory ring.
//
// Every byte a shm link carries is copied twice: into the ring by the
// writer, out of it by the reader (or reduced from it in place), and the
// two run on different cores. A ring line the writer fills was last read by
// the other core, and Go's copy (vector loads and stores) must first fetch
// each destination line for ownership, a round trip to the other core's
// cache, before it overwrites the line whole. REP MOVSB on CPUs with
// enhanced REP MOVSB (ERMS) stores whole lines without that read. Measured
// with gorun bench on this project's 2-CPU machine, medians of 5
// interleaved runs, Go copy / REP MOVSB: np=2 1 MiB allreduce 237 / 220 µs
// (264 / 212 in another series), 4 MiB 1064 / 882 µs, 64 MiB 24.1 / 21.7
// ms; np=4 1 MiB 877 / 761 µs, 64 KiB 83 / 73 µs. Copies within one core's
// cache measured the same either way, and REP MOVSB costs more below a few
// KiB (its start-up), so short copies keep Go's copy.

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
