//go:build amd64 && !purego

#include "textflag.h"

// func copyERMS(dst, src unsafe.Pointer, n uintptr)
//
// One REP MOVSB: on CPUs with enhanced REP MOVSB (ERMS) it can write whole
// cache lines without first reading them for ownership (see memcopy.go).
TEXT ·copyERMS(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	CLD
	REP; MOVSB
	RET
