//go:build amd64 && !purego

// AVX2 kernels of the int8 codec with block size 64: Encode,
// EncodeFeedback, Decode, DecodeAdd and the fused EncodeFeedbackAdd. The
// rules that keep them bit for bit with the Go code are at the top of
// kernels_amd64.s.

#include "textflag.h"

// Dword order that undoes the in-lane interleaving of VPACKSSDW+VPACKSSWB.
DATA int8perm<>+0(SB)/4, $0
DATA int8perm<>+4(SB)/4, $4
DATA int8perm<>+8(SB)/4, $1
DATA int8perm<>+12(SB)/4, $5
DATA int8perm<>+16(SB)/4, $2
DATA int8perm<>+20(SB)/4, $6
DATA int8perm<>+24(SB)/4, $3
DATA int8perm<>+28(SB)/4, $7
GLOBL int8perm<>(SB), RODATA|NOPTR, $32

// BCAST puts the 32-bit constant val in every dword of Y (through X).
#define BCAST(val, Y, X) MOVL $val, DX; VMOVD DX, X; VPBROADCASTD X, Y

// ---- int8, block size 64 ----

// ABSMAX64 leaves the largest |x| bits of the 64 floats at SI in every lane
// of X0 and in DX. Integer max of the sign-cleared bits orders floats
// correctly (and puts NaN above Inf, which the hugeBits test catches).
// Uses Y0-Y7; Y15 = 0x7FFFFFFF.
#define ABSMAX64 \
	VPAND   0(SI), Y15, Y0; \
	VPAND   32(SI), Y15, Y1; \
	VPAND   64(SI), Y15, Y2; \
	VPAND   96(SI), Y15, Y3; \
	VPAND   128(SI), Y15, Y4; \
	VPAND   160(SI), Y15, Y5; \
	VPAND   192(SI), Y15, Y6; \
	VPAND   224(SI), Y15, Y7; \
	VPMAXUD Y1, Y0, Y0; \
	VPMAXUD Y3, Y2, Y2; \
	VPMAXUD Y5, Y4, Y4; \
	VPMAXUD Y7, Y6, Y6; \
	VPMAXUD Y2, Y0, Y0; \
	VPMAXUD Y6, Y4, Y4; \
	VPMAXUD Y4, Y0, Y0; \
	VEXTRACTI128 $1, Y0, X1; \
	VPMAXUD X1, X0, X0; \
	VPSHUFD $0x4E, X0, X1; \
	VPMAXUD X1, X0, X0; \
	VPSHUFD $0xB1, X0, X1; \
	VPMAXUD X1, X0, X0; \
	VMOVD   X0, DX

// QUANT computes T = int32(roundAway(float32(x*inv))) for the 8 floats at
// off(SI): t = x*inv rounded, plus 0.49999997 with the sign of t, rounded,
// then truncated (VCVTTPS2DQ, like Go's float32 -> int32 conversion).
// Y2 = inv, Y13 = sign bit, Y14 = 0.49999997.
#define QUANT(off, T, H) \
	VMULPS     off(SI), Y2, T; \
	VANDPS     T, Y13, H; \
	VORPS      H, Y14, H; \
	VADDPS     H, T, T; \
	VCVTTPS2DQ T, T

// QUANTRES is QUANT that also stores the residual x - float32(q*scale) at
// off(R8); Y9 = scale. X is a scratch register for x.
#define QUANTRES(off, T, X, H) \
	VMOVUPS    off(SI), X; \
	VMULPS     X, Y2, T; \
	VANDPS     T, Y13, H; \
	VORPS      H, Y14, H; \
	VADDPS     H, T, T; \
	VCVTTPS2DQ T, T; \
	VCVTDQ2PS  T, H; \
	VMULPS     Y9, H, H; \
	VSUBPS     H, X, H; \
	VMOVUPS    H, off(R8)

// PACK4 narrows four vectors of int32 in [-127, 127] (A..D, values 0-31 of
// a half block) to 32 bytes at out. The saturating packs are exact there.
#define PACK4(A, B, C, D, out) \
	VPACKSSDW B, A, A; \
	VPACKSSDW D, C, C; \
	VPACKSSWB C, A, A; \
	VPERMD    A, Y12, A; \
	VMOVDQU   A, out

// INT8SETUP loads the constants both encoders use and DX is clobbered.
#define INT8SETUP \
	BCAST(0x7FFFFFFF, Y15, X15); \
	BCAST(0x3EFFFFFF, Y14, X14); \
	BCAST(0x80000000, Y13, X13); \
	VMOVDQU int8perm<>(SB), Y12; \
	MOVL    $0x42FE0000, DX; \
	VMOVD   DX, X11; \
	MOVL    $0x3F800000, DX; \
	VMOVD   DX, X10

// func int8Enc64(dst *byte, src *float32, nblk int) int
TEXT ·int8Enc64(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ nblk+16(FP), CX
	XORQ AX, AX
	INT8SETUP
	CMPQ CX, $0
	JLE  enc_done

enc_loop:
	ABSMAX64
	CMPL DX, $0x7E800000 // hugeBits: NaN, Inf or near MaxFloat32 -> Go
	JAE  enc_done
	VDIVSS X11, X0, X1   // scale = absmax / 127, rounded as in Go
	VMOVD  X1, DX
	TESTL  DX, DX
	JZ     enc_zero
	CMPL   DX, $0x00800000 // subnormal scale: Go divides instead
	JB     enc_done
	MOVL   DX, 0(DI)
	VDIVSS X1, X10, X2     // inv = 1 / scale
	VBROADCASTSS X2, Y2
	QUANT(0, Y0, Y1)
	QUANT(32, Y3, Y4)
	QUANT(64, Y5, Y6)
	QUANT(96, Y7, Y8)
	PACK4(Y0, Y3, Y5, Y7, 4(DI))
	QUANT(128, Y0, Y1)
	QUANT(160, Y3, Y4)
	QUANT(192, Y5, Y6)
	QUANT(224, Y7, Y8)
	PACK4(Y0, Y3, Y5, Y7, 36(DI))

enc_next:
	ADDQ $256, SI
	ADDQ $68, DI
	INCQ AX
	CMPQ AX, CX
	JLT  enc_loop

enc_done:
	MOVQ AX, ret+24(FP)
	VZEROUPPER
	RET

enc_zero:
	// scale rounds to 0 (all zeros, or absmax < 127*2^-150): Go's
	// int8Div writes 0 for every value.
	MOVL    $0, 0(DI)
	VPXOR   Y0, Y0, Y0
	VMOVDQU Y0, 4(DI)
	VMOVDQU Y0, 36(DI)
	JMP     enc_next

// func int8EncRes64(dst *byte, src *float32, res *float32, nblk int) int
TEXT ·int8EncRes64(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ res+16(FP), R8
	MOVQ nblk+24(FP), CX
	XORQ AX, AX
	INT8SETUP
	CMPQ CX, $0
	JLE  encr_done

encr_loop:
	ABSMAX64
	CMPL DX, $0x7E800000
	JAE  encr_done
	VDIVSS X11, X0, X1
	VMOVD  X1, DX
	TESTL  DX, DX
	JZ     encr_zero
	CMPL   DX, $0x00800000
	JB     encr_done
	MOVL   DX, 0(DI)
	VDIVSS X1, X10, X2
	VBROADCASTSS X2, Y2
	VBROADCASTSS X1, Y9
	QUANTRES(0, Y0, Y5, Y6)
	QUANTRES(32, Y1, Y7, Y8)
	QUANTRES(64, Y3, Y5, Y6)
	QUANTRES(96, Y4, Y7, Y8)
	PACK4(Y0, Y1, Y3, Y4, 4(DI))
	QUANTRES(128, Y0, Y5, Y6)
	QUANTRES(160, Y1, Y7, Y8)
	QUANTRES(192, Y3, Y5, Y6)
	QUANTRES(224, Y4, Y7, Y8)
	PACK4(Y0, Y1, Y3, Y4, 36(DI))

encr_next:
	ADDQ $256, SI
	ADDQ $256, R8
	ADDQ $68, DI
	INCQ AX
	CMPQ AX, CX
	JLT  encr_loop

encr_done:
	MOVQ AX, ret+32(FP)
	VZEROUPPER
	RET

encr_zero:
	// All values quantize to 0, so the residual x - 0*0 is x itself (x
	// is finite here, and x - (+0) == x bit for bit, -0 included).
	MOVL    $0, 0(DI)
	VPXOR   Y0, Y0, Y0
	VMOVDQU Y0, 4(DI)
	VMOVDQU Y0, 36(DI)
	VMOVUPS 0(SI), Y1
	VMOVUPS 32(SI), Y2
	VMOVUPS 64(SI), Y3
	VMOVUPS 96(SI), Y4
	VMOVUPS Y1, 0(R8)
	VMOVUPS Y2, 32(R8)
	VMOVUPS Y3, 64(R8)
	VMOVUPS Y4, 96(R8)
	VMOVUPS 128(SI), Y1
	VMOVUPS 160(SI), Y2
	VMOVUPS 192(SI), Y3
	VMOVUPS 224(SI), Y4
	VMOVUPS Y1, 128(R8)
	VMOVUPS Y2, 160(R8)
	VMOVUPS Y3, 192(R8)
	VMOVUPS Y4, 224(R8)
	JMP     encr_next

// DEQ converts the 8 bytes at qoff(SI) to float32 times the scale in Y14
// and stores them at doff(DI). The int8 -> float32 conversion is exact.
#define DEQ(qoff, doff, R) \
	VPMOVSXBD qoff(SI), R; \
	VCVTDQ2PS R, R; \
	VMULPS    Y14, R, R; \
	VMOVUPS   R, doff(DI)

// DEQADD is DEQ adding into dst: the product is rounded first (no FMA).
// q*scale is never NaN, so the operand order of the addition is free.
#define DEQADD(qoff, doff, R) \
	VPMOVSXBD qoff(SI), R; \
	VCVTDQ2PS R, R; \
	VMULPS    Y14, R, R; \
	VADDPS    doff(DI), R, R; \
	VMOVUPS   R, doff(DI)

// DECCHECK jumps to bad if the block at SI has a scale above maxScaleBits
// (negative, NaN, Inf or too large) or a byte 0x80; nothing is written
// for such a block. Y15 = 0x80 bytes.
#define DECCHECK(bad) \
	MOVL     0(SI), DX; \
	CMPL     DX, $0x7C010203; \
	JA       bad; \
	VPCMPEQB 4(SI), Y15, Y0; \
	VPCMPEQB 36(SI), Y15, Y1; \
	VPOR     Y1, Y0, Y0; \
	VPTEST   Y0, Y0; \
	JNZ      bad; \
	VBROADCASTSS 0(SI), Y14

// func int8Dec64(dst *float32, src *byte, nblk int) int
TEXT ·int8Dec64(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ nblk+16(FP), CX
	XORQ AX, AX
	BCAST(0x80808080, Y15, X15)
	CMPQ CX, $0
	JLE  dec_done

dec_loop:
	DECCHECK(dec_done)
	DEQ(4, 0, Y0)
	DEQ(12, 32, Y1)
	DEQ(20, 64, Y2)
	DEQ(28, 96, Y3)
	DEQ(36, 128, Y4)
	DEQ(44, 160, Y5)
	DEQ(52, 192, Y6)
	DEQ(60, 224, Y7)
	ADDQ $68, SI
	ADDQ $256, DI
	INCQ AX
	CMPQ AX, CX
	JLT  dec_loop

dec_done:
	MOVQ AX, ret+24(FP)
	VZEROUPPER
	RET

// func int8DecAdd64(dst *float32, src *byte, nblk int) int
TEXT ·int8DecAdd64(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ nblk+16(FP), CX
	XORQ AX, AX
	BCAST(0x80808080, Y15, X15)
	CMPQ CX, $0
	JLE  deca_done

deca_loop:
	DECCHECK(deca_done)
	DEQADD(4, 0, Y0)
	DEQADD(12, 32, Y1)
	DEQADD(20, 64, Y2)
	DEQADD(28, 96, Y3)
	DEQADD(36, 128, Y4)
	DEQADD(44, 160, Y5)
	DEQADD(52, 192, Y6)
	DEQADD(60, 224, Y7)
	ADDQ $68, SI
	ADDQ $256, DI
	INCQ AX
	CMPQ AX, CX
	JLT  deca_loop

deca_done:
	MOVQ AX, ret+24(FP)
	VZEROUPPER
	RET

// ---- int8: fused residual add + encode with feedback (see kernels_amd64.s) ----

// LOADADD64 loads the block m = src + res at SI, R8 into Y0-Y7.
#define LOADADD64 \
	VMOVUPS 0(SI), Y0; \
	VMOVUPS 32(SI), Y1; \
	VMOVUPS 64(SI), Y2; \
	VMOVUPS 96(SI), Y3; \
	VMOVUPS 128(SI), Y4; \
	VMOVUPS 160(SI), Y5; \
	VMOVUPS 192(SI), Y6; \
	VMOVUPS 224(SI), Y7; \
	VADDPS  0(R8), Y0, Y0; \
	VADDPS  32(R8), Y1, Y1; \
	VADDPS  64(R8), Y2, Y2; \
	VADDPS  96(R8), Y3, Y3; \
	VADDPS  128(R8), Y4, Y4; \
	VADDPS  160(R8), Y5, Y5; \
	VADDPS  192(R8), Y6, Y6; \
	VADDPS  224(R8), Y7, Y7

// ABSMAXREG is ABSMAX64 on the block held in Y0-Y7 (left intact): the
// largest |m| bits in the low lane of X8 and in DX. Uses Y8-Y11.
#define ABSMAXREG \
	VPAND   Y0, Y15, Y8; \
	VPAND   Y1, Y15, Y9; \
	VPAND   Y2, Y15, Y10; \
	VPAND   Y3, Y15, Y11; \
	VPMAXUD Y9, Y8, Y8; \
	VPMAXUD Y11, Y10, Y10; \
	VPAND   Y4, Y15, Y9; \
	VPAND   Y5, Y15, Y11; \
	VPMAXUD Y9, Y8, Y8; \
	VPMAXUD Y11, Y10, Y10; \
	VPAND   Y6, Y15, Y9; \
	VPAND   Y7, Y15, Y11; \
	VPMAXUD Y9, Y8, Y8; \
	VPMAXUD Y11, Y10, Y10; \
	VPMAXUD Y10, Y8, Y8; \
	VEXTRACTI128 $1, Y8, X9; \
	VPMAXUD X9, X8, X8; \
	VPSHUFD $0x4E, X8, X9; \
	VPMAXUD X9, X8, X8; \
	VPSHUFD $0xB1, X8, X9; \
	VPMAXUD X9, X8, X8; \
	VMOVD   X8, DX

// QADD quantizes the 8 values in M (QUANT), stores the residual
// M - float32(q*scale) at off(R8) and leaves q (int32) in A; M is free
// afterwards. Y10 = inv, Y11 = scale, Y13 = sign bit, Y14 = 0.49999997.
#define QADD(M, A, B, off) \
	VMULPS     Y10, M, A; \
	VANDPS     A, Y13, B; \
	VORPS      B, Y14, B; \
	VADDPS     B, A, A; \
	VCVTTPS2DQ A, A; \
	VCVTDQ2PS  A, B; \
	VMULPS     Y11, B, B; \
	VSUBPS     B, M, B; \
	VMOVUPS    B, off(R8)

// func int8EncAddRes64(dst *byte, src *float32, res *float32, nblk int) int
//
// int8EncRes64 of m = src + res, block by block; the 64 values of a block
// stay in Y0-Y7 from the load to the quantization. It stops before a block
// whose absmax is >= hugeBits or whose scale is subnormal.
TEXT ·int8EncAddRes64(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ res+16(FP), R8
	MOVQ nblk+24(FP), CX
	XORQ AX, AX
	BCAST(0x7FFFFFFF, Y15, X15)
	BCAST(0x3EFFFFFF, Y14, X14)
	BCAST(0x80000000, Y13, X13)
	VMOVDQU int8perm<>(SB), Y12
	CMPQ CX, $0
	JLE  encar_done

encar_loop:
	LOADADD64
	ABSMAXREG
	CMPL DX, $0x7E800000 // hugeBits: NaN, Inf or near MaxFloat32 -> Go
	JAE  encar_done
	MOVL   $0x42FE0000, BX // 127
	VMOVD  BX, X9
	VDIVSS X9, X8, X9      // scale = absmax / 127
	VMOVD  X9, DX
	TESTL  DX, DX
	JZ     encar_zero
	CMPL   DX, $0x00800000 // subnormal scale: Go divides instead
	JB     encar_done
	MOVL   DX, 0(DI)
	MOVL   $0x3F800000, BX // 1
	VMOVD  BX, X10
	VDIVSS X9, X10, X10    // inv = 1 / scale
	VBROADCASTSS X10, Y10
	VBROADCASTSS X9, Y11
	QADD(Y0, Y8, Y9, 0)
	QADD(Y1, Y0, Y9, 32)
	QADD(Y2, Y1, Y9, 64)
	QADD(Y3, Y2, Y9, 96)
	PACK4(Y8, Y0, Y1, Y2, 4(DI))
	QADD(Y4, Y8, Y9, 128)
	QADD(Y5, Y0, Y9, 160)
	QADD(Y6, Y1, Y9, 192)
	QADD(Y7, Y2, Y9, 224)
	PACK4(Y8, Y0, Y1, Y2, 36(DI))

encar_next:
	ADDQ $256, SI
	ADDQ $256, R8
	ADDQ $68, DI
	INCQ AX
	CMPQ AX, CX
	JLT  encar_loop

encar_done:
	MOVQ AX, ret+32(FP)
	VZEROUPPER
	RET

encar_zero:
	// Every value quantizes to 0 and the residual m - 0*0 is m itself (m
	// is finite here, and m - (+0) == m bit for bit, -0 included).
	MOVL    $0, 0(DI)
	VPXOR   Y8, Y8, Y8
	VMOVDQU Y8, 4(DI)
	VMOVDQU Y8, 36(DI)
	VMOVUPS Y0, 0(R8)
	VMOVUPS Y1, 32(R8)
	VMOVUPS Y2, 64(R8)
	VMOVUPS Y3, 96(R8)
	VMOVUPS Y4, 128(R8)
	VMOVUPS Y5, 160(R8)
	VMOVUPS Y6, 192(R8)
	VMOVUPS Y7, 224(R8)
	JMP     encar_next
