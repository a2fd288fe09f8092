package compress

// Drivers for the vector kernels (kernels_*amd64.s). They run only when
// useAsm is true; each kernel handles the common case over whole groups of
// values and stops at the first group it cannot do bit for bit like the Go
// code (a NaN, a value to clamp, a tiny or huge int8 block, a corrupt int8
// block), which the driver then hands to the Go code before resuming the
// kernel. The output is therefore the same as the generic functions' for
// every input; the tests compare the two.

import (
	"encoding/binary"
	"math"
)

// int8Encode64 is int8 Encode/EncodeFeedback for block size 64. The kernel
// takes blocks whose scale is 0 or normal and whose absmax is below
// hugeBits; int8Block does the others and a short last block.
func int8Encode64(dst []byte, src, res []float32) Info {
	clamped := 0
	for len(src) >= 64 {
		nb := len(src) / 64
		_ = dst[68*nb-1]
		var k int
		if res == nil {
			k = int8Enc64(&dst[0], &src[0], nb)
		} else {
			_ = res[64*nb-1]
			k = int8EncRes64(&dst[0], &src[0], &res[0], nb)
			res = res[64*k:]
		}
		src, dst = src[64*k:], dst[68*k:]
		if k == nb {
			break
		}
		var r []float32
		if res != nil {
			r, res = res[:64], res[64:]
		}
		clamped += int8Block(dst[:68], src[:64], r)
		src, dst = src[64:], dst[68:]
	}
	if len(src) > 0 {
		var r []float32
		if res != nil {
			r = res[:len(src)]
		}
		clamped += int8Block(dst[:4+len(src)], src, r)
	}
	return Info{Clamped: clamped}
}

// int8Decode64 is int8 Decode (add false) or DecodeAdd for block size 64;
// the caller has checked len(src). The kernel stops before a block with a
// bad scale or a -128 byte without writing it, and int8DecodeBlock then
// builds the same error the generic decoder returns.
func int8Decode64(dst []float32, src []byte, add bool) error {
	blk := 0
	for len(dst) >= 64 {
		nb := len(dst) / 64
		_ = src[68*nb-1]
		var k int
		if add {
			k = int8DecAdd64(&dst[0], &src[0], nb)
		} else {
			k = int8Dec64(&dst[0], &src[0], nb)
		}
		blk += k
		dst, src = dst[64*k:], src[68*k:]
		if k == nb {
			break
		}
		if err := int8DecodeBlock(dst[:64], src[:68], blk, add); err != nil {
			return err
		}
		blk++
		dst, src = dst[64:], src[68:]
	}
	if len(dst) > 0 {
		return int8DecodeBlock(dst, src[:4+len(dst)], blk, add)
	}
	return nil
}

// f16Encode is fp16 Encode (res nil) or EncodeFeedback. The kernel converts
// with VCVTPS2PH (round to nearest even), which equals f16Slow for every
// |x| <= 65504; it stops at the first group of 8 or 32 values holding
// something larger (a value to clamp, ±Inf, NaN), and that chunk is redone
// by f16SlowChunk, whose result does not depend on where chunks start.
func f16Encode(dst []byte, src, res []float32) Info {
	n := len(src)
	dst = dst[:2*n]
	if res != nil {
		res = res[:n]
	}
	clamped := 0
	for len(src) >= 8 {
		m := len(src) &^ 7
		var k int
		if res == nil {
			k = f16Enc(&dst[0], &src[0], m)
		} else {
			k = f16EncRes(&dst[0], &src[0], &res[0], m)
			res = res[k:]
		}
		src, dst = src[k:], dst[2*k:]
		if k == m {
			break
		}
		g := min(encodeChunk, len(src))
		clamped += f16SlowChunk(dst[:2*g], src[:g])
		if res != nil {
			f16Residual(res[:g], src[:g], dst)
			res = res[g:]
		}
		src, dst = src[g:], dst[2*g:]
	}
	clamped += f16SlowChunk(dst, src)
	if res != nil {
		f16Residual(res, src, dst)
	}
	return Info{Clamped: clamped}
}

// f16Residual sets r[i] = s[i] - decoded fp16 value i of enc.
func f16Residual(r, s []float32, enc []byte) {
	t := f16Decoder()
	for i, x := range s {
		r[i] = x - t[binary.LittleEndian.Uint16(enc[2*i:])]
	}
}

// f16Decode is fp16 Decode or DecodeAdd; the caller has checked len(src).
// The kernel stops at a group of 8 codes holding a NaN (VCVTPH2PS quiets a
// signaling NaN, the Go decoder keeps it as it is); the table does those.
func f16Decode(dst []float32, src []byte, add bool) {
	t := f16Decoder()
	for len(dst) >= 8 {
		m := len(dst) &^ 7
		_ = src[2*m-1]
		var k int
		if add {
			k = f16DecAdd(&dst[0], &src[0], m)
		} else {
			k = f16Dec(&dst[0], &src[0], m)
		}
		dst, src = dst[k:], src[2*k:]
		if k == m {
			break
		}
		d := dst[:8]
		for i := range d {
			v := t[binary.LittleEndian.Uint16(src[2*i:])]
			if add {
				v = addF32(d[i], v)
			}
			d[i] = v
		}
		dst, src = dst[8:], src[16:]
	}
	src = src[:2*len(dst)]
	for i := range dst {
		v := t[binary.LittleEndian.Uint16(src[2*i:])]
		if add {
			v = addF32(dst[i], v)
		}
		dst[i] = v
	}
}

// bf16Encode is bf16 Encode (res nil) or EncodeFeedback. The kernel
// implements bf16Round exactly (NaNs included), so it never stops early.
func bf16Encode(dst []byte, src, res []float32) {
	n := len(src)
	dst = dst[:2*n]
	m := n &^ 7
	if m > 0 {
		if res == nil {
			bf16Enc(&dst[0], &src[0], m)
		} else {
			res = res[:n]
			bf16EncRes(&dst[0], &src[0], &res[0], m)
			res = res[m:]
		}
	}
	for i, x := range src[m:] {
		h := bf16Round(math.Float32bits(x))
		binary.LittleEndian.PutUint16(dst[2*(m+i):], uint16(h))
		if res != nil {
			res[i] = x - math.Float32frombits(h<<16)
		}
	}
}

// bf16Decode is bf16 Decode or DecodeAdd; the caller has checked len(src).
func bf16Decode(dst []float32, src []byte, add bool) {
	n := len(dst)
	src = src[:2*n]
	m := n &^ 7
	if m > 0 {
		if add {
			bf16DecAdd(&dst[0], &src[0], m)
		} else {
			bf16Dec(&dst[0], &src[0], m)
		}
	}
	for i := m; i < n; i++ {
		v := math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
		if add {
			v = addF32(dst[i], v)
		}
		dst[i] = v
	}
}

// f32Add is none DecodeAdd; the caller has checked len(src).
func f32Add(dst []float32, src []byte) {
	n := len(dst)
	src = src[:4*n]
	m := n &^ 7
	if m > 0 {
		f32AddK(&dst[0], &src[0], m)
	}
	for i := m; i < n; i++ {
		dst[i] = addF32(dst[i], math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:])))
	}
}

// int8EncodeAdd64 is int8 EncodeFeedbackAdd for block size 64. A block the
// kernel stops at (or a short last block) is left untouched by it and
// int8BlockAdd does it from src and the residual as they were.
func int8EncodeAdd64(dst []byte, src, res []float32) Info {
	res = res[:len(src)]
	clamped := 0
	for len(src) >= 64 {
		nb := len(src) / 64
		_ = dst[68*nb-1]
		_ = res[64*nb-1]
		k := int8EncAddRes64(&dst[0], &src[0], &res[0], nb)
		src, res, dst = src[64*k:], res[64*k:], dst[68*k:]
		if k == nb {
			break
		}
		clamped += int8BlockAdd(dst[:68], src[:64], res[:64])
		src, res, dst = src[64:], res[64:], dst[68:]
	}
	if len(src) > 0 {
		clamped += int8BlockAdd(dst[:4+len(src)], src, res)
	}
	return Info{Clamped: clamped}
}

// f16EncodeAdd is fp16 EncodeFeedbackAdd. The kernel stops, without
// writing it, at the first group holding an m to clamp or a NaN; that
// chunk goes to f16AddSlowChunk.
func f16EncodeAdd(dst []byte, src, res []float32) Info {
	n := len(src)
	dst = dst[:2*n]
	res = res[:n]
	clamped := 0
	for len(src) >= 8 {
		m := len(src) &^ 7
		k := f16EncAddRes(&dst[0], &src[0], &res[0], m)
		src, res, dst = src[k:], res[k:], dst[2*k:]
		if k == m {
			break
		}
		g := min(encodeChunk, len(src))
		clamped += f16AddSlowChunk(dst[:2*g], src[:g], res[:g])
		src, res, dst = src[g:], res[g:], dst[2*g:]
	}
	return Info{Clamped: clamped + f16AddSlowChunk(dst, src, res)}
}

// f16AddSlowChunk sets r = s + r (addF32), encodes it into dst value by
// value and leaves the residual in r; it returns the clamped count.
func f16AddSlowChunk(dst []byte, s, r []float32) int {
	r = r[:len(s)]
	for i, x := range s {
		r[i] = addF32(x, r[i])
	}
	clamped := f16SlowChunk(dst, r)
	f16Residual(r, r, dst)
	return clamped
}

// bf16EncodeAdd is bf16 EncodeFeedbackAdd; the kernel never stops early.
func bf16EncodeAdd(dst []byte, src, res []float32) {
	n := len(src)
	dst = dst[:2*n]
	res = res[:n]
	m := n &^ 7
	if m > 0 {
		bf16EncAddRes(&dst[0], &src[0], &res[0], m)
	}
	bf16AddLoop(dst[2*m:], src[m:], res[m:])
}
