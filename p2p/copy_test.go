package p2p

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestRingCopy checks ringCopy against copy at lengths around
// ermsMinBytes and at several alignments of source and destination, with and
// without REP MOVSB, including the bytes either side of the copy that it
// must leave alone.
func TestRingCopy(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	src := make([]byte, 3*ermsMinBytes)
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	lengths := []int{0, 1, 7, 63, 64, ermsMinBytes - 1, ermsMinBytes, ermsMinBytes + 1, 2*ermsMinBytes + 13}
	for _, erms := range []bool{false, useERMS} {
		old := useERMS
		useERMS = erms
		for _, n := range lengths {
			for _, so := range []int{0, 1, 5, 32} {
				for _, do := range []int{0, 3, 8, 63} {
					t.Run(fmt.Sprintf("erms=%v/n=%d/src+%d/dst+%d", erms, n, so, do), func(t *testing.T) {
						dst := bytes.Repeat([]byte{0xEE}, n+do+16)
						want := bytes.Clone(dst)
						copy(want[do:do+n], src[so:so+n])
						if got := ringCopy(dst[do:do+n], src[so:]); got != n {
							t.Fatalf("ringCopy returned %d, want %d", got, n)
						}
						if !bytes.Equal(dst, want) {
							t.Fatalf("ringCopy of %d bytes wrote the wrong bytes", n)
						}
					})
				}
			}
		}
		useERMS = old
	}
}
