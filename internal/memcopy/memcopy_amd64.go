//go:build amd64 && !purego

package memcopy

// Copy's REP MOVSB path on amd64 CPUs that have fast string moves.

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// useERMS says whether Copy uses REP MOVSB (tests turn it off to
// compare).
var useERMS = cpu.X86.HasERMS

//go:noescape
func copyERMS(dst, src unsafe.Pointer, n uintptr)

// copyBytesERMS copies len(dst) == len(src) > 0 bytes with REP MOVSB.
func copyBytesERMS(dst, src []byte) {
	copyERMS(unsafe.Pointer(&dst[0]), unsafe.Pointer(&src[0]), uintptr(len(dst)))
}
