//go:build amd64 && !purego

#include "textflag.h"

// AVX2 reduction kernels: dst[i] = a[i] op b[i] over byte slices holding
// elements of SZ bytes. Every kernel takes (dst, a, b []byte), reduces
// len(dst) rounded down to a multiple of SZ bytes, and relies on its Go
// wrapper (reduceAVX2) to have checked len(a), len(b) >= len(dst). Pointers
// may be unaligned (VEX loads and memory operands do not fault on
// misalignment), and dst may alias a or b exactly: each block is loaded
// before it is stored.
//
// The first source of every vector op is a and the second is b. With two
// NaN operands x86 returns the first source's NaN, so NaN op NaN always
// carries a's payload (quietened): a fixed function of the inputs, and the
// same as a normal build of the Go kernels, which compile x[i]+y[i] to
// MOVSS x; ADDSS y (see sameAsGoKernel in kernels_test.go).
//
// Register use: DI = dst, SI = a, DX = b, CX = byte count, AX = byte
// offset, BX = end of the current vector loop.

// REDUCE expands the body of one kernel.
//   VOP:  the packed op (VADDPS, VPMULLD, ...), applied as VOP b, a, dst.
//   VMOV: the full-width unaligned move for the type's domain.
//   SMOV: the single-element move (VMOVD for 4-byte, VMOVQ for 8-byte
//         elements); it zeroes the upper lanes, which the op then ignores.
//   SZ:   the element size in bytes.
// The main loop does 128 bytes (4 YMM) per iteration, then 32-byte steps,
// then single elements for the remaining < 32 bytes.
#define REDUCE(VOP, VMOV, SMOV, SZ) \
	MOVQ	dst_base+0(FP), DI; \
	MOVQ	dst_len+8(FP), CX; \
	MOVQ	a_base+24(FP), SI; \
	MOVQ	b_base+48(FP), DX; \
	ANDQ	$~(SZ-1), CX; \
	XORQ	AX, AX; \
	MOVQ	CX, BX; \
	ANDQ	$~127, BX; \
	JMP	check128; \
loop128: \
	VMOV	(SI)(AX*1), Y0; \
	VMOV	32(SI)(AX*1), Y1; \
	VMOV	64(SI)(AX*1), Y2; \
	VMOV	96(SI)(AX*1), Y3; \
	VOP	(DX)(AX*1), Y0, Y0; \
	VOP	32(DX)(AX*1), Y1, Y1; \
	VOP	64(DX)(AX*1), Y2, Y2; \
	VOP	96(DX)(AX*1), Y3, Y3; \
	VMOV	Y0, (DI)(AX*1); \
	VMOV	Y1, 32(DI)(AX*1); \
	VMOV	Y2, 64(DI)(AX*1); \
	VMOV	Y3, 96(DI)(AX*1); \
	ADDQ	$128, AX; \
check128: \
	CMPQ	AX, BX; \
	JB	loop128; \
	MOVQ	CX, BX; \
	ANDQ	$~31, BX; \
	JMP	check32; \
loop32: \
	VMOV	(SI)(AX*1), Y0; \
	VOP	(DX)(AX*1), Y0, Y0; \
	VMOV	Y0, (DI)(AX*1); \
	ADDQ	$32, AX; \
check32: \
	CMPQ	AX, BX; \
	JB	loop32; \
	JMP	checkone; \
loopone: \
	SMOV	(SI)(AX*1), X0; \
	SMOV	(DX)(AX*1), X1; \
	VOP	X1, X0, X0; \
	SMOV	X0, (DI)(AX*1); \
	ADDQ	$SZ, AX; \
checkone: \
	CMPQ	AX, CX; \
	JB	loopone; \
	VZEROUPPER; \
	RET

// func sumFloat32AVX2(dst, a, b []byte)
TEXT ·sumFloat32AVX2(SB), NOSPLIT, $0-72
	REDUCE(VADDPS, VMOVUPS, VMOVD, 4)

// func sumFloat64AVX2(dst, a, b []byte)
TEXT ·sumFloat64AVX2(SB), NOSPLIT, $0-72
	REDUCE(VADDPD, VMOVUPD, VMOVQ, 8)

// func sumInt32AVX2(dst, a, b []byte)
TEXT ·sumInt32AVX2(SB), NOSPLIT, $0-72
	REDUCE(VPADDD, VMOVDQU, VMOVD, 4)

// func sumInt64AVX2(dst, a, b []byte)
TEXT ·sumInt64AVX2(SB), NOSPLIT, $0-72
	REDUCE(VPADDQ, VMOVDQU, VMOVQ, 8)

// func prodFloat32AVX2(dst, a, b []byte)
TEXT ·prodFloat32AVX2(SB), NOSPLIT, $0-72
	REDUCE(VMULPS, VMOVUPS, VMOVD, 4)

// func prodFloat64AVX2(dst, a, b []byte)
TEXT ·prodFloat64AVX2(SB), NOSPLIT, $0-72
	REDUCE(VMULPD, VMOVUPD, VMOVQ, 8)

// func prodInt32AVX2(dst, a, b []byte)
TEXT ·prodInt32AVX2(SB), NOSPLIT, $0-72
	REDUCE(VPMULLD, VMOVDQU, VMOVD, 4)

// func minInt32AVX2(dst, a, b []byte)
TEXT ·minInt32AVX2(SB), NOSPLIT, $0-72
	REDUCE(VPMINSD, VMOVDQU, VMOVD, 4)

// func maxInt32AVX2(dst, a, b []byte)
TEXT ·maxInt32AVX2(SB), NOSPLIT, $0-72
	REDUCE(VPMAXSD, VMOVDQU, VMOVD, 4)
