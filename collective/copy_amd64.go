//go:build amd64 && !purego && !race

package collective

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// A commit copies the whole registered state (parameters, optimizer
// moments) into its snapshot after every step, and nothing reads the
// snapshot until a reset. On CPUs with enhanced REP MOVSB (ERMS), REP
// MOVSB is the CPU's fast-string copy, which can store whole cache lines
// without first reading them for ownership, so the copy moves about half
// the bytes through the caches that Go's copy moves (vector or REP MOVSQ
// stores, each line read first). Copies under ermsMinBytes keep Go's copy:
// REP MOVSB's start-up costs more there. Race builds keep Go's copy too,
// which the race detector sees.

// ermsMinBytes is the shortest copy copyState hands to REP MOVSB.
const ermsMinBytes = 4096

var useERMS = cpu.X86.HasERMS

//go:noescape
func copyERMS(dst, src unsafe.Pointer, n uintptr)

// copyState copies src into dst, which must not overlap and must be as
// long: a commit's snapshot of a registered slice, or its restore.
func copyState(dst, src []byte) {
	if len(src) >= ermsMinBytes && len(dst) == len(src) && useERMS {
		copyERMS(unsafe.Pointer(&dst[0]), unsafe.Pointer(&src[0]), uintptr(len(src)))
		return
	}
	copy(dst, src)
}
