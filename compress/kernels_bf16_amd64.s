//go:build amd64 && !purego

// AVX2 kernels of the bf16 codec: Encode, EncodeFeedback, Decode,
// DecodeAdd and the fused EncodeFeedbackAdd. The rules that keep them bit
// for bit with the Go code are at the top of kernels_amd64.s.

#include "textflag.h"

// BCAST puts the 32-bit constant val in every dword of Y (through X).
#define BCAST(val, Y, X) MOVL $val, DX; VMOVD DX, X; VPBROADCASTD X, Y

// ---- bf16 ----

// BF16R computes bf16Round of the 8 floats in V into the low 16 bits of
// the dwords of R, exactly as the Go code: r = (b + 0x7FFF + lsb) >> 16,
// or, for a NaN (|b| > 0x7F800000), r = b>>16 | 0x40. Y15 = 1, Y14 =
// 0x7FFF, Y13 = 0x7FFFFFFF, Y12 = 0x7F800000, Y11 = 0x40.
#define BF16R(V, T, R, M) \
	VPSRLD    $16, V, T; \
	VPAND     T, Y15, R; \
	VPADDD    V, R, R; \
	VPADDD    R, Y14, R; \
	VPSRLD    $16, R, R; \
	VPAND     V, Y13, M; \
	VPCMPGTD  Y12, M, M; \
	VPOR      T, Y11, T; \
	VPBLENDVB M, T, R, R

// BF16RES stores V - float32(R<<16) at off(R8)(AX*4); clobbers T.
#define BF16RES(off, V, R, T) \
	VPSLLD  $16, R, T; \
	VSUBPS  T, V, T; \
	VMOVUPS T, off(R8)(AX*4)

// BF16PACK stores the 16 codes in A (values 0-7) and B (8-15) at
// off(DI)(AX*2). VPACKUSDW is exact: codes are in [0, 0xFFFF].
#define BF16PACK(A, B, off) \
	VPACKUSDW B, A, A; \
	VPERMQ    $0xD8, A, A; \
	VMOVDQU   A, off(DI)(AX*2)

#define BF16SETUP \
	BCAST(1, Y15, X15); \
	BCAST(0x7FFF, Y14, X14); \
	BCAST(0x7FFFFFFF, Y13, X13); \
	BCAST(0x7F800000, Y12, X12); \
	BCAST(0x40, Y11, X11)

// func bf16Enc(dst *byte, src *float32, n int)
TEXT ·bf16Enc(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	XORQ AX, AX
	BF16SETUP
	LEAQ -16(CX), BX

bf16e_loop16:
	CMPQ AX, BX
	JGT  bf16e_tail
	VMOVUPS 0(SI)(AX*4), Y0
	VMOVUPS 32(SI)(AX*4), Y4
	BF16R(Y0, Y1, Y2, Y3)
	BF16R(Y4, Y5, Y6, Y7)
	BF16PACK(Y2, Y6, 0)
	ADDQ $16, AX
	JMP  bf16e_loop16

bf16e_tail:
	CMPQ AX, CX
	JGE  bf16e_done
	VMOVUPS 0(SI)(AX*4), Y0
	BF16R(Y0, Y1, Y2, Y3)
	VEXTRACTI128 $1, Y2, X6
	VPACKUSDW X6, X2, X2
	VMOVDQU X2, 0(DI)(AX*2)

bf16e_done:
	VZEROUPPER
	RET

// func bf16EncRes(dst *byte, src *float32, res *float32, n int)
TEXT ·bf16EncRes(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ res+16(FP), R8
	MOVQ n+24(FP), CX
	XORQ AX, AX
	BF16SETUP
	LEAQ -16(CX), BX

bf16r_loop16:
	CMPQ AX, BX
	JGT  bf16r_tail
	VMOVUPS 0(SI)(AX*4), Y0
	VMOVUPS 32(SI)(AX*4), Y4
	BF16R(Y0, Y1, Y2, Y3)
	BF16R(Y4, Y5, Y6, Y7)
	BF16RES(0, Y0, Y2, Y1)
	BF16RES(32, Y4, Y6, Y5)
	BF16PACK(Y2, Y6, 0)
	ADDQ $16, AX
	JMP  bf16r_loop16

bf16r_tail:
	CMPQ AX, CX
	JGE  bf16r_done
	VMOVUPS 0(SI)(AX*4), Y0
	BF16R(Y0, Y1, Y2, Y3)
	BF16RES(0, Y0, Y2, Y1)
	VEXTRACTI128 $1, Y2, X6
	VPACKUSDW X6, X2, X2
	VMOVDQU X2, 0(DI)(AX*2)

bf16r_done:
	VZEROUPPER
	RET

// func bf16Dec(dst *float32, src *byte, n int)
TEXT ·bf16Dec(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	XORQ AX, AX
	LEAQ -32(CX), BX

bf16d_loop32:
	CMPQ AX, BX
	JGT  bf16d_loop8
	VPMOVZXWD 0(SI)(AX*2), Y0
	VPMOVZXWD 16(SI)(AX*2), Y1
	VPMOVZXWD 32(SI)(AX*2), Y2
	VPMOVZXWD 48(SI)(AX*2), Y3
	VPSLLD    $16, Y0, Y0
	VPSLLD    $16, Y1, Y1
	VPSLLD    $16, Y2, Y2
	VPSLLD    $16, Y3, Y3
	VMOVDQU   Y0, 0(DI)(AX*4)
	VMOVDQU   Y1, 32(DI)(AX*4)
	VMOVDQU   Y2, 64(DI)(AX*4)
	VMOVDQU   Y3, 96(DI)(AX*4)
	ADDQ      $32, AX
	JMP       bf16d_loop32

bf16d_loop8:
	CMPQ AX, CX
	JGE  bf16d_done
	VPMOVZXWD 0(SI)(AX*2), Y0
	VPSLLD    $16, Y0, Y0
	VMOVDQU   Y0, 0(DI)(AX*4)
	ADDQ      $8, AX
	JMP       bf16d_loop8

bf16d_done:
	VZEROUPPER
	RET

// func bf16DecAdd(dst *float32, src *byte, n int)
TEXT ·bf16DecAdd(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	XORQ AX, AX
	LEAQ -32(CX), BX

bf16a_loop32:
	CMPQ AX, BX
	JGT  bf16a_loop8
	VPMOVZXWD 0(SI)(AX*2), Y0
	VPMOVZXWD 16(SI)(AX*2), Y1
	VPMOVZXWD 32(SI)(AX*2), Y2
	VPMOVZXWD 48(SI)(AX*2), Y3
	VPSLLD    $16, Y0, Y0
	VPSLLD    $16, Y1, Y1
	VPSLLD    $16, Y2, Y2
	VPSLLD    $16, Y3, Y3
	VMOVUPS   0(DI)(AX*4), Y4
	VMOVUPS   32(DI)(AX*4), Y5
	VMOVUPS   64(DI)(AX*4), Y6
	VMOVUPS   96(DI)(AX*4), Y7
	VADDPS    Y0, Y4, Y4 // dst first
	VADDPS    Y1, Y5, Y5
	VADDPS    Y2, Y6, Y6
	VADDPS    Y3, Y7, Y7
	VMOVUPS   Y4, 0(DI)(AX*4)
	VMOVUPS   Y5, 32(DI)(AX*4)
	VMOVUPS   Y6, 64(DI)(AX*4)
	VMOVUPS   Y7, 96(DI)(AX*4)
	ADDQ      $32, AX
	JMP       bf16a_loop32

bf16a_loop8:
	CMPQ AX, CX
	JGE  bf16a_done
	VPMOVZXWD 0(SI)(AX*2), Y0
	VPSLLD    $16, Y0, Y0
	VMOVUPS   0(DI)(AX*4), Y4
	VADDPS    Y0, Y4, Y4
	VMOVUPS   Y4, 0(DI)(AX*4)
	ADDQ      $8, AX
	JMP       bf16a_loop8

bf16a_done:
	VZEROUPPER
	RET

// ---- bf16: fused residual add + encode with feedback (see kernels_amd64.s) ----

// func bf16EncAddRes(dst *byte, src *float32, res *float32, n int)
//
// bf16EncRes of m = src + res; both groups of 8 are loaded before their
// residuals are stored.
TEXT ·bf16EncAddRes(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ res+16(FP), R8
	MOVQ n+24(FP), CX
	XORQ AX, AX
	BF16SETUP
	LEAQ -16(CX), BX

bf16ar_loop16:
	CMPQ AX, BX
	JGT  bf16ar_tail
	VMOVUPS 0(SI)(AX*4), Y0
	VMOVUPS 32(SI)(AX*4), Y4
	VADDPS  0(R8)(AX*4), Y0, Y0
	VADDPS  32(R8)(AX*4), Y4, Y4
	BF16R(Y0, Y1, Y2, Y3)
	BF16R(Y4, Y5, Y6, Y7)
	BF16RES(0, Y0, Y2, Y1)
	BF16RES(32, Y4, Y6, Y5)
	BF16PACK(Y2, Y6, 0)
	ADDQ $16, AX
	JMP  bf16ar_loop16

bf16ar_tail:
	CMPQ AX, CX
	JGE  bf16ar_done
	VMOVUPS 0(SI)(AX*4), Y0
	VADDPS  0(R8)(AX*4), Y0, Y0
	BF16R(Y0, Y1, Y2, Y3)
	BF16RES(0, Y0, Y2, Y1)
	VEXTRACTI128 $1, Y2, X6
	VPACKUSDW X6, X2, X2
	VMOVDQU X2, 0(DI)(AX*2)

bf16ar_done:
	VZEROUPPER
	RET
