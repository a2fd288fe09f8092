//go:build amd64 && !purego && !race

#include "textflag.h"

// func copyERMS(dst, src unsafe.Pointer, n uintptr)
//
// One REP MOVSB (see copy_amd64.go).
TEXT ·copyERMS(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	CLD
	REP; MOVSB
	RET
