package memcopy

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestCopy checks Copy against copy at lengths around
// MinERMSBytes and at several alignments of source and destination, with and
// without REP MOVSB, including the bytes either side of the copy that it
// must leave alone.
func TestCopy(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	src := make([]byte, 3*MinERMSBytes)
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	lengths := []int{0, 1, 7, 63, 64, MinERMSBytes - 1, MinERMSBytes, MinERMSBytes + 1, 2*MinERMSBytes + 13}
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
						if got := Copy(dst[do:do+n], src[so:]); got != n {
							t.Fatalf("Copy returned %d, want %d", got, n)
						}
						if !bytes.Equal(dst, want) {
							t.Fatalf("Copy of %d bytes wrote the wrong bytes", n)
						}
					})
				}
			}
		}
		useERMS = old
	}
}
