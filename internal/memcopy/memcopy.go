// Package memcopy copies large byte blocks the fastest way this CPU has:
// shared-memory links copy every byte into and out of a ring, and an
// elastic commit copies the whole registered state into its snapshot
// after every step.
//
// On CPUs with enhanced REP MOVSB (ERMS), REP MOVSB is the CPU's
// fast-string copy, which can store whole cache lines without first
// reading them for ownership; Go's copy moves such blocks with vector
// loads and stores, or with REP MOVSQ when the destination is 16-byte
// aligned, each line read first. Within one core's cache the two copy
// alike, and REP MOVSB costs more below a few KiB (its start-up), so short
// copies keep Go's copy (BENCHMARKS.md, "REP MOVSB for link copies").
package memcopy

// MinERMSBytes is the shortest copy Copy hands to REP MOVSB.
const MinERMSBytes = 4096

// Copy copies min(len(dst), len(src)) bytes, which must not overlap, as
// copy does, and returns how many.
func Copy(dst, src []byte) int {
	n := min(len(dst), len(src))
	if n >= MinERMSBytes && useERMS {
		raceCopy(dst[:n], src[:n])
		copyBytesERMS(dst[:n], src[:n])
		return n
	}
	return copy(dst, src)
}
