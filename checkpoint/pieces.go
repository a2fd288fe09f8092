package checkpoint

import (
	"io"
	"runtime"
)

// piece is the most bytes hashed, copied or written in one call. SHA-256,
// CRC-32 and memmove over a whole shard are each one assembly call that
// the scheduler cannot preempt, however big the shard: the background
// writes of in-process ranks would hold every P while the
// ranks' Polls wait for a rank that cannot run. Between pieces the writer
// yields (runtime.Gosched).
const piece = 1 << 20

// hashPieces writes b into h a piece at a time.
func hashPieces(h io.Writer, b []byte) {
	for len(b) > 0 {
		n := min(len(b), piece)
		h.Write(b[:n])
		b = b[n:]
		runtime.Gosched()
	}
}

// copyPieces is copy(dst, src), a piece at a time. It runs on the training
// path (SaveAsync's snapshot), so it does not yield: the pieces only give
// the scheduler a chance to preempt it, and yielding would hand the CPU to
// the background writers while the training loop waits.
func copyPieces(dst, src []byte) int {
	n := 0
	for n < len(dst) && n < len(src) {
		n += copy(dst[n:], src[n:min(len(src), n+piece)])
	}
	return n
}
