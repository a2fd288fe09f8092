//go:build amd64 && !purego

package compress

import "golang.org/x/sys/cpu"

// useAsm selects the AVX2 + F16C kernels of kernels_*amd64.s. They produce
// the same bytes, residuals and sums as the Go code for every input (the
// tests compare both paths), so ranks with and without these features
// stay bitwise identical. cpu.X86.HasAVX2 also checks that the OS saves
// the YMM registers.
var useAsm = cpu.X86.HasAVX2 && cpu.X86.HasF16C

// The kernels below take raw pointers and counts; the drivers in kernels.go
// check the slice lengths first. Counts of values are multiples of 8; the
// int8 kernels count blocks of 64 values (68 encoded bytes).

// int8Enc64 encodes up to nblk blocks and returns how many it did; it stops
// before a block whose absmax is >= hugeBits or whose scale is subnormal
// (a scale that rounds to 0 it handles: all values encode as 0).
//
//go:noescape
func int8Enc64(dst *byte, src *float32, nblk int) int

// int8EncRes64 is int8Enc64 that also writes the residuals.
//
//go:noescape
func int8EncRes64(dst *byte, src, res *float32, nblk int) int

// int8Dec64 decodes up to nblk blocks and returns how many it did; it stops
// before a block with a scale above maxScaleBits or a -128 byte.
//
//go:noescape
func int8Dec64(dst *float32, src *byte, nblk int) int

// int8DecAdd64 is int8Dec64 adding into dst.
//
//go:noescape
func int8DecAdd64(dst *float32, src *byte, nblk int) int

// f16Enc converts n values and returns how many it did: it stops at the
// start of a group holding a value with |x| > 65504 or a NaN.
//
//go:noescape
func f16Enc(dst *byte, src *float32, n int) int

// f16EncRes is f16Enc that also writes the residuals.
//
//go:noescape
func f16EncRes(dst *byte, src, res *float32, n int) int

// f16Dec decodes n values and returns how many it did: it stops at the
// start of a group of 8 holding a NaN code.
//
//go:noescape
func f16Dec(dst *float32, src *byte, n int) int

// f16DecAdd is f16Dec adding into dst.
//
//go:noescape
func f16DecAdd(dst *float32, src *byte, n int) int

//go:noescape
func bf16Enc(dst *byte, src *float32, n int)

//go:noescape
func bf16EncRes(dst *byte, src, res *float32, n int)

//go:noescape
func bf16Dec(dst *float32, src *byte, n int)

//go:noescape
func bf16DecAdd(dst *float32, src *byte, n int)

// f32AddK adds n little-endian float32 from src into dst.
//
//go:noescape
func f32AddK(dst *float32, src *byte, n int)

// int8EncAddRes64 is int8EncRes64 of m = src + res (see EncodeFeedbackAdd),
// res read and overwritten in place. It writes nothing (dst or res) for
// the block it stops at.
//
//go:noescape
func int8EncAddRes64(dst *byte, src, res *float32, nblk int) int

// f16EncAddRes is f16EncRes of m = src + res, res read and overwritten in
// place. It writes nothing for the group it stops at.
//
//go:noescape
func f16EncAddRes(dst *byte, src, res *float32, n int) int

// bf16EncAddRes is bf16EncRes of m = src + res, res read and overwritten in
// place.
//
//go:noescape
func bf16EncAddRes(dst *byte, src, res *float32, n int)
