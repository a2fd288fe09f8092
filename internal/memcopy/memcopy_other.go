//go:build !amd64 || purego

package memcopy

// Copy without assembly: off amd64, and in purego builds.

// useERMS is false off amd64, and in purego builds (no assembly).
var useERMS = false

func copyBytesERMS(dst, src []byte) { copy(dst, src) }
