//go:build !amd64 || purego

package p2p

// ringCopy without assembly: off amd64, and in purego builds.

// useERMS is false off amd64, and in purego builds (no assembly).
var useERMS = false

func copyBytesERMS(dst, src []byte) { copy(dst, src) }
