//go:build race

package memcopy

import (
	"runtime"
	"unsafe"
)

// raceCopy tells the race detector what an assembly copy is about to do,
// which it cannot see by itself: read src, write dst. Memory it does not
// track (a shared-memory ring) is ignored by it.
func raceCopy(dst, src []byte) {
	runtime.RaceReadRange(unsafe.Pointer(&src[0]), len(src))
	runtime.RaceWriteRange(unsafe.Pointer(&dst[0]), len(dst))
}
