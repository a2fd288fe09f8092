//go:build !amd64

package p2p

// useERMS is false where there is no REP MOVSB.
var useERMS = false

func copyBytesERMS(dst, src []byte) { copy(dst, src) }
