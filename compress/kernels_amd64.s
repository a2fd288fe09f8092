//go:build amd64 && !purego

// AVX2 + F16C kernels for the codecs. Every kernel reproduces the Go code
// bit for bit on the inputs it accepts and stops (returning how far it
// got) at the first group it cannot, for the Go driver (kernels.go) to
// finish. Rules that keep the results identical to Go:
//
//   - No FMA: each product is rounded to float32 before it is added, as Go
//     does with float32(x*y). VMULPS then VADDPS/VSUBPS, never VFMADD.
//   - Rounding comes from MXCSR, which Go leaves at round to nearest with
//     denormals kept (no FTZ/DAZ); VCVTPS2PH gets imm 0 (nearest even).
//   - Subtractions keep Go's operand order (x - decoded), additions put dst
//     first (see addF32): the first operand decides which NaN a result
//     carries when both are NaN.
//
// One file per codec: kernels_int8_amd64.s, kernels_f16_amd64.s and
// kernels_bf16_amd64.s; this one has none's DecodeAdd. Each codec's file
// ends with its fused residual add + encode with feedback (the
// EncodeFeedbackAdd kernels). These take m = src + res (one VADDPS, src as
// the first operand so that a NaN + NaN sum is src's NaN, quieted, as
// addF32(src, res)), encode m as the EncodeFeedback kernels do and
// overwrite res with m - decoded. A group they stop at has not been
// written at all (neither dst nor res), so that the Go driver can redo it
// from src and the residual as they were.

#include "textflag.h"

// ---- none ----

// func f32AddK(dst *float32, src *byte, n int)
TEXT ·f32AddK(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	XORQ AX, AX
	LEAQ -32(CX), BX

f32a_loop32:
	CMPQ AX, BX
	JGT  f32a_loop8
	VMOVUPS 0(DI)(AX*4), Y4
	VMOVUPS 32(DI)(AX*4), Y5
	VMOVUPS 64(DI)(AX*4), Y6
	VMOVUPS 96(DI)(AX*4), Y7
	VADDPS  0(SI)(AX*4), Y4, Y4 // dst first
	VADDPS  32(SI)(AX*4), Y5, Y5
	VADDPS  64(SI)(AX*4), Y6, Y6
	VADDPS  96(SI)(AX*4), Y7, Y7
	VMOVUPS Y4, 0(DI)(AX*4)
	VMOVUPS Y5, 32(DI)(AX*4)
	VMOVUPS Y6, 64(DI)(AX*4)
	VMOVUPS Y7, 96(DI)(AX*4)
	ADDQ    $32, AX
	JMP     f32a_loop32

f32a_loop8:
	CMPQ AX, CX
	JGE  f32a_done
	VMOVUPS 0(DI)(AX*4), Y4
	VADDPS  0(SI)(AX*4), Y4, Y4
	VMOVUPS Y4, 0(DI)(AX*4)
	ADDQ    $8, AX
	JMP     f32a_loop8

f32a_done:
	VZEROUPPER
	RET
