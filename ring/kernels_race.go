//go:build race

package ring

import (
	"runtime"
	"unsafe"
)

// raceKernelAccess tells the race detector what an assembly kernel is
// about to do, which it cannot see by itself: read a and b, write dst. So
// a reduction that races with, say, a sender goroutine still reading the
// buffer is reported in -race builds, as it is with the Go kernels.
// Memory the detector does not track (a shared-memory link's ring) is
// ignored by it.
func raceKernelAccess(dst, a, b []byte) {
	if len(dst) == 0 {
		return
	}
	runtime.RaceReadRange(unsafe.Pointer(&a[0]), len(a))
	runtime.RaceReadRange(unsafe.Pointer(&b[0]), len(b))
	runtime.RaceWriteRange(unsafe.Pointer(&dst[0]), len(dst))
}
