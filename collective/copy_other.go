//go:build !amd64 || purego || race

package collective

// copyState copies src into dst (see copy_amd64.go): Go's copy off amd64,
// in purego builds, and where the race detector must see the copy.
func copyState(dst, src []byte) { copy(dst, src) }
