//go:build amd64 && !purego

// AVX2 + F16C kernels of the fp16 codec: Encode, EncodeFeedback, Decode,
// DecodeAdd and the fused EncodeFeedbackAdd. The rules that keep them bit
// for bit with the Go code are at the top of kernels_amd64.s.

#include "textflag.h"

// BCAST puts the 32-bit constant val in every dword of Y (through X).
#define BCAST(val, Y, X) MOVL $val, DX; VMOVD DX, X; VPBROADCASTD X, Y

// ---- fp16 ----

// F16ONE converts the 8 floats at off(SI)(AX*4) to binary16 at
// off/2(DI)(AX*2) and folds their |x| bits into the running max Y13.
// VCVTPS2PH with imm 0 rounds to nearest even and makes subnormals, which
// is f16Fast for |x| <= 65504; larger values, Inf and NaN are caught by
// the max test and redone in Go.
#define F16ONE(soff, doff, V, A, H) \
	VMOVUPS   soff(SI)(AX*4), V; \
	VPAND     V, Y15, A; \
	VPMAXUD   A, Y13, Y13; \
	VCVTPS2PH $0, V, H; \
	VMOVDQU   H, doff(DI)(AX*2)

// F16ONERES also stores the residual x - decoded at soff(R8)(AX*4); the
// binary16 -> float32 conversion is exact.
#define F16ONERES(soff, doff, V, A, H) \
	F16ONE(soff, doff, V, A, H); \
	VCVTPH2PS H, A; \
	VSUBPS    A, V, A; \
	VMOVUPS   A, soff(R8)(AX*4)

// F16CHECK jumps to bad if the running max of |x| bits exceeds 65504.
// Signed compare is fine: both sides are below 2^31.
#define F16CHECK(bad) \
	VPCMPGTD Y14, Y13, Y0; \
	VPTEST   Y0, Y0; \
	JNZ      bad

#define F16SETUP \
	BCAST(0x7FFFFFFF, Y15, X15); \
	BCAST(0x477FE000, Y14, X14); \
	VPXOR Y13, Y13, Y13

// func f16Enc(dst *byte, src *float32, n int) int
TEXT ·f16Enc(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	XORQ AX, AX
	F16SETUP
	LEAQ -32(CX), BX

f16e_loop32:
	CMPQ AX, BX
	JGT  f16e_loop8
	F16ONE(0, 0, Y1, Y2, X3)
	F16ONE(32, 16, Y4, Y5, X6)
	F16ONE(64, 32, Y7, Y8, X9)
	F16ONE(96, 48, Y10, Y11, X12)
	F16CHECK(f16e_done)
	ADDQ $32, AX
	JMP  f16e_loop32

f16e_loop8:
	CMPQ AX, CX
	JGE  f16e_done
	F16ONE(0, 0, Y1, Y2, X3)
	F16CHECK(f16e_done)
	ADDQ $8, AX
	JMP  f16e_loop8

f16e_done:
	MOVQ AX, ret+24(FP)
	VZEROUPPER
	RET

// func f16EncRes(dst *byte, src *float32, res *float32, n int) int
TEXT ·f16EncRes(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ res+16(FP), R8
	MOVQ n+24(FP), CX
	XORQ AX, AX
	F16SETUP
	LEAQ -32(CX), BX

f16r_loop32:
	CMPQ AX, BX
	JGT  f16r_loop8
	F16ONERES(0, 0, Y1, Y2, X3)
	F16ONERES(32, 16, Y4, Y5, X6)
	F16ONERES(64, 32, Y7, Y8, X9)
	F16ONERES(96, 48, Y10, Y11, X12)
	F16CHECK(f16r_done)
	ADDQ $32, AX
	JMP  f16r_loop32

f16r_loop8:
	CMPQ AX, CX
	JGE  f16r_done
	F16ONERES(0, 0, Y1, Y2, X3)
	F16CHECK(f16r_done)
	ADDQ $8, AX
	JMP  f16r_loop8

f16r_done:
	MOVQ AX, ret+32(FP)
	VZEROUPPER
	RET

// F16NAN jumps to bad if any of the 8 codes at off(SI)(AX*2) is a NaN:
// (h & 0x7FFF) > 0x7C00, a signed 16-bit compare of non-negative values.
// Y15 = 0x7FFF words, Y14 = 0x7C00 words.
#define F16NAN(off, T, bad) \
	VPAND    off(SI)(AX*2), X15, T; \
	VPCMPGTW X14, T, T; \
	VPTEST   T, T; \
	JNZ      bad

#define F16NAN32(T, U, bad) \
	VPAND    0(SI)(AX*2), Y15, T; \
	VPAND    32(SI)(AX*2), Y15, U; \
	VPCMPGTW Y14, T, T; \
	VPCMPGTW Y14, U, U; \
	VPOR     U, T, T; \
	VPTEST   T, T; \
	JNZ      bad

#define F16DSETUP \
	MOVL $0x7FFF7FFF, DX; \
	VMOVD DX, X15; \
	VPBROADCASTD X15, Y15; \
	MOVL $0x7C007C00, DX; \
	VMOVD DX, X14; \
	VPBROADCASTD X14, Y14

// func f16Dec(dst *float32, src *byte, n int) int
TEXT ·f16Dec(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	XORQ AX, AX
	F16DSETUP
	LEAQ -32(CX), BX

f16d_loop32:
	CMPQ AX, BX
	JGT  f16d_one8
	F16NAN32(Y0, Y1, f16d_one8)
	VCVTPH2PS 0(SI)(AX*2), Y2
	VCVTPH2PS 16(SI)(AX*2), Y3
	VCVTPH2PS 32(SI)(AX*2), Y4
	VCVTPH2PS 48(SI)(AX*2), Y5
	VMOVUPS   Y2, 0(DI)(AX*4)
	VMOVUPS   Y3, 32(DI)(AX*4)
	VMOVUPS   Y4, 64(DI)(AX*4)
	VMOVUPS   Y5, 96(DI)(AX*4)
	ADDQ      $32, AX
	JMP       f16d_loop32

f16d_one8:
	// Fewer than 32 codes left, or a NaN among the next 32: do 8 so that
	// only the group of 8 holding the NaN goes back to Go.
	CMPQ AX, CX
	JGE  f16d_done
	F16NAN(0, X0, f16d_done)
	VCVTPH2PS 0(SI)(AX*2), Y2
	VMOVUPS   Y2, 0(DI)(AX*4)
	ADDQ      $8, AX
	JMP       f16d_loop32

f16d_done:
	MOVQ AX, ret+24(FP)
	VZEROUPPER
	RET

// func f16DecAdd(dst *float32, src *byte, n int) int
TEXT ·f16DecAdd(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	XORQ AX, AX
	F16DSETUP
	LEAQ -32(CX), BX

f16a_loop32:
	CMPQ AX, BX
	JGT  f16a_one8
	F16NAN32(Y0, Y1, f16a_one8)
	VCVTPH2PS 0(SI)(AX*2), Y2
	VCVTPH2PS 16(SI)(AX*2), Y3
	VCVTPH2PS 32(SI)(AX*2), Y4
	VCVTPH2PS 48(SI)(AX*2), Y5
	VMOVUPS   0(DI)(AX*4), Y6
	VMOVUPS   32(DI)(AX*4), Y7
	VMOVUPS   64(DI)(AX*4), Y8
	VMOVUPS   96(DI)(AX*4), Y9
	VADDPS    Y2, Y6, Y6 // dst first
	VADDPS    Y3, Y7, Y7
	VADDPS    Y4, Y8, Y8
	VADDPS    Y5, Y9, Y9
	VMOVUPS   Y6, 0(DI)(AX*4)
	VMOVUPS   Y7, 32(DI)(AX*4)
	VMOVUPS   Y8, 64(DI)(AX*4)
	VMOVUPS   Y9, 96(DI)(AX*4)
	ADDQ      $32, AX
	JMP       f16a_loop32

f16a_one8:
	CMPQ AX, CX
	JGE  f16a_done
	F16NAN(0, X0, f16a_done)
	VCVTPH2PS 0(SI)(AX*2), Y2
	VMOVUPS   0(DI)(AX*4), Y6
	VADDPS    Y2, Y6, Y6
	VMOVUPS   Y6, 0(DI)(AX*4)
	ADDQ      $8, AX
	JMP       f16a_loop32

f16a_done:
	MOVQ AX, ret+24(FP)
	VZEROUPPER
	RET

// ---- fp16: fused residual add + encode with feedback (see kernels_amd64.s) ----

// F16LOADADD loads the 8 values m = src + res at soff(SI)(AX*4),
// soff(R8)(AX*4) into V and folds their |m| bits into the running max Y13.
#define F16LOADADD(soff, V, A) \
	VMOVUPS soff(SI)(AX*4), V; \
	VADDPS  soff(R8)(AX*4), V, V; \
	VPAND   V, Y15, A; \
	VPMAXUD A, Y13, Y13

// F16STOREADD converts the 8 values in V to binary16 at doff(DI)(AX*2) and
// stores the residual V - decoded at soff(R8)(AX*4).
#define F16STOREADD(soff, doff, V, A, H) \
	VCVTPS2PH $0, V, H; \
	VMOVDQU   H, doff(DI)(AX*2); \
	VCVTPH2PS H, A; \
	VSUBPS    A, V, A; \
	VMOVUPS   A, soff(R8)(AX*4)

// func f16EncAddRes(dst *byte, src *float32, res *float32, n int) int
//
// f16EncRes of m = src + res. A group of 32 (or, at the end, 8) values is
// checked before anything of it is written, and the kernel stops at the
// start of the first group holding an |m| > 65504 or a NaN.
TEXT ·f16EncAddRes(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ res+16(FP), R8
	MOVQ n+24(FP), CX
	XORQ AX, AX
	F16SETUP
	LEAQ -32(CX), BX

f16ar_loop32:
	CMPQ AX, BX
	JGT  f16ar_loop8
	F16LOADADD(0, Y1, Y2)
	F16LOADADD(32, Y4, Y5)
	F16LOADADD(64, Y7, Y8)
	F16LOADADD(96, Y10, Y11)
	F16CHECK(f16ar_done)
	F16STOREADD(0, 0, Y1, Y2, X3)
	F16STOREADD(32, 16, Y4, Y5, X6)
	F16STOREADD(64, 32, Y7, Y8, X9)
	F16STOREADD(96, 48, Y10, Y11, X12)
	ADDQ $32, AX
	JMP  f16ar_loop32

f16ar_loop8:
	CMPQ AX, CX
	JGE  f16ar_done
	F16LOADADD(0, Y1, Y2)
	F16CHECK(f16ar_done)
	F16STOREADD(0, 0, Y1, Y2, X3)
	ADDQ $8, AX
	JMP  f16ar_loop8

f16ar_done:
	MOVQ AX, ret+32(FP)
	VZEROUPPER
	RET
