package compress

import (
	"encoding/binary"
	"math"
	"sync"
	"unsafe"
)

// ---- fp16 ----

const (
	f16MaxBits  = 0x477FE000 // float32 bits of 65504, the largest finite binary16
	f32InfBits  = 0x7F800000
	f16MinNorm  = 0x38800000 // float32 bits of 2^-14, the smallest normal binary16
	half32Bits  = 0x3F000000 // float32 bits of 0.5
	rebias16    = 0xC8000FFF // -(112<<23) (exponent 127->15) + 0xFFF (rounding), mod 2^32
	f16NaN      = 0x7E00     // canonical quiet binary16 NaN
	f16MaxFin   = 0x7BFF     // 65504
	encodeChunk = 64         // values per fp16 fast-path chunk
)

type fp16Codec struct{}

// FP16 returns the IEEE 754 binary16 codec (2 bytes per value, little
// endian). Rounding is to nearest, ties to even; subnormals are produced and
// decoded exactly. Finite values with |x| > 65504 and ±Inf are clamped to
// ±65504 (never Inf) and counted in Info.Clamped. NaN encodes as a quiet NaN
// with the input's sign. Decode is exact: every binary16 is a float32.
func FP16() Codec { return fp16Codec{} }

func (fp16Codec) Name() string         { return "fp16" }
func (fp16Codec) EncodedLen(n int) int { return 2 * n }

// f16Fast converts the absolute float32 bits a (finite, a <= f16MaxBits) to
// binary16 bits with round-to-nearest-even, without branches: both the
// normal and the subnormal results are computed and one is selected.
//
// Normal: rebias the exponent and add 0xFFF plus the lowest kept mantissa
// bit before dropping 13 bits (a carry into the exponent is the correct
// rounding up). Subnormal: adding 0.5 to the value makes the FPU shift the
// mantissa so that its last bit is worth 2^-24, the binary16 subnormal step,
// rounding to nearest even; the low bits are then the binary16 encoding.
// The single float32 addition is exactly rounded on every platform.
func f16Fast(a uint32) uint32 {
	n := (a + rebias16 + (a>>13)&1) >> 13
	s := math.Float32bits(math.Float32frombits(a)+0.5) - half32Bits
	if a < f16MinNorm {
		n = s
	}
	return n
}

// f16Slow handles every float32 bit pattern; it returns the binary16 bits
// and whether the value was clamped.
func f16Slow(b uint32) (uint16, int) {
	a := b & 0x7FFFFFFF
	sign := uint16(b>>16) & 0x8000
	switch {
	case a > f32InfBits:
		return sign | f16NaN, 0
	case a > f16MaxBits:
		return sign | f16MaxFin, 1
	}
	return sign | uint16(f16Fast(a)), 0
}

func (fp16Codec) Encode(dst []byte, src []float32) Info {
	checkDst("fp16", dst, 2*len(src))
	if useAsm {
		return f16Encode(dst, src, nil)
	}
	return fp16EncodeGeneric(dst, src)
}

// EncodeFeedback implements FeedbackEncoder: it encodes src exactly as
// Encode does and sets res[i] = src[i] - decoded[i].
func (fp16Codec) EncodeFeedback(dst []byte, src, res []float32) Info {
	checkDst("fp16", dst, 2*len(src))
	checkRes("fp16", res, len(src))
	if useAsm {
		return f16Encode(dst, src, res)
	}
	return fp16EncodeFeedbackGeneric(dst, src, res)
}

// EncodeFeedbackAdd implements FeedbackAddEncoder: it encodes m = src +
// res as EncodeFeedback(dst, m, res) would and leaves m - decoded in res.
func (fp16Codec) EncodeFeedbackAdd(dst []byte, src, res []float32) Info {
	checkDst("fp16", dst, 2*len(src))
	checkRes("fp16", res, len(src))
	if useAsm {
		return f16EncodeAdd(dst, src, res)
	}
	return fp16EncodeFeedbackAddGeneric(dst, src, res)
}

// fp16EncodeFeedbackAddGeneric is the portable EncodeFeedbackAdd: the sum
// goes into res, 256 values at a time (L1-resident), which are then
// encoded with their residual in place. fp16 encodes value by value, so
// where the pieces start does not change the result.
func fp16EncodeFeedbackAddGeneric(dst []byte, src, res []float32) Info {
	n := len(src)
	checkDst("fp16", dst, 2*n)
	checkRes("fp16", res, n)
	const piece = 4 * encodeChunk
	clamped := 0
	for lo := 0; lo < n; lo += piece {
		hi := min(lo+piece, n)
		r := res[lo:hi]
		for i, x := range src[lo:hi] {
			r[i] = addF32(x, r[i])
		}
		clamped += fp16EncodeFeedbackGeneric(dst[2*lo:2*hi], r, r).Clamped
	}
	return Info{Clamped: clamped}
}

// fp16EncodeFeedbackGeneric is the portable EncodeFeedback: Encode, then the
// residual against the exact decoding of what was written.
func fp16EncodeFeedbackGeneric(dst []byte, src, res []float32) Info {
	info := fp16EncodeGeneric(dst, src)
	t := f16Decoder()
	res = res[:len(src)]
	for i, x := range src {
		res[i] = x - t[binary.LittleEndian.Uint16(dst[2*i:])]
	}
	return info
}

// fp16EncodeGeneric is the portable Encode: the reference the assembly is
// tested against, and what runs on CPUs without AVX2 and F16C. Its result
// is f16Slow applied to each value; the chunks only decide where the
// branch-free fast path may be used.
func fp16EncodeGeneric(dst []byte, src []float32) Info {
	n := len(src)
	checkDst("fp16", dst, 2*n)
	dst = dst[:2*n]
	clamped := 0
	if littleEndian && n >= encodeChunk {
		// Read two float32 per 64-bit load: cheaper than moving each float
		// from a vector register to an integer one.
		m := n &^ (encodeChunk - 1)
		in := unsafe.Slice((*byte)(unsafe.Pointer(&src[0])), 4*m)
		for len(in) >= 4*encodeChunk {
			s := in[:4*encodeChunk]
			d := dst[:2*encodeChunk]
			var mx uint32
			for i := 0; i < 4*encodeChunk; i += 8 {
				v := binary.LittleEndian.Uint64(s[i:])
				a0 := uint32(v) & 0x7FFFFFFF
				a1 := uint32(v>>32) & 0x7FFFFFFF
				mx = max(mx, a0, a1)
				sg := uint32(v>>16)&0x8000 | uint32(v>>32)&0x80000000
				binary.LittleEndian.PutUint32(d[i/2:], f16Fast(a0)|f16Fast(a1)<<16|sg)
			}
			if mx > f16MaxBits { // rare: something to clamp or a NaN; redo exactly
				clamped += f16SlowChunk(d, src[:encodeChunk])
			}
			in = in[4*encodeChunk:]
			dst = dst[2*encodeChunk:]
			src = src[encodeChunk:]
		}
	}
	for len(src) >= encodeChunk {
		s := src[:encodeChunk]
		d := dst[:2*encodeChunk]
		var m uint32
		// Two values per step: wider unrolling makes the register
		// allocator spill, which costs more than the loop overhead saved.
		for i := 0; i < encodeChunk; i += 2 {
			b0 := math.Float32bits(s[i])
			b1 := math.Float32bits(s[i+1])
			a0, a1 := b0&0x7FFFFFFF, b1&0x7FFFFFFF
			m = max(m, a0, a1)
			h0 := f16Fast(a0) | (b0>>16)&0x8000
			h1 := f16Fast(a1) | (b1>>16)&0x8000
			binary.LittleEndian.PutUint32(d[2*i:], h0|h1<<16)
		}
		if m > f16MaxBits {
			clamped += f16SlowChunk(d, s)
		}
		src = src[encodeChunk:]
		dst = dst[2*encodeChunk:]
	}
	clamped += f16SlowChunk(dst, src)
	return Info{Clamped: clamped}
}

// f16SlowChunk encodes src into dst value by value, handling everything,
// and returns the number of clamped values.
func f16SlowChunk(dst []byte, src []float32) int {
	clamped := 0
	for i, x := range src {
		h, c := f16Slow(math.Float32bits(x))
		binary.LittleEndian.PutUint16(dst[2*i:], h)
		clamped += c
	}
	return clamped
}

// f16ToF32 converts binary16 bits to float32 bits exactly, without branches.
func f16ToF32(h uint32) uint32 {
	o := (h & 0x7FFF) << 13
	e := o & 0x0F800000
	o += 0x38000000 // exponent 15 -> 127
	if e == 0x0F800000 {
		o += 0x38000000 // Inf/NaN: exponent -> 255
	}
	// Zero/subnormal: make it 2^-14 * (1 + m/1024) and subtract 2^-14, exact.
	s := math.Float32bits(math.Float32frombits(o+0x00800000) - math.Float32frombits(f16MinNorm))
	if e == 0 {
		o = s
	}
	return o | (h&0x8000)<<16
}

// f16Table maps every binary16 code to its float32 value. One load per
// value is several times faster than converting arithmetically; the table
// (256 KiB) is built on first use from f16ToF32, so it is exact.
var (
	f16TableOnce sync.Once
	f16Table     *[65536]float32
)

func f16Decoder() *[65536]float32 {
	f16TableOnce.Do(func() {
		t := new([65536]float32)
		for h := range t {
			t[h] = math.Float32frombits(f16ToF32(uint32(h)))
		}
		f16Table = t
	})
	return f16Table
}

func (fp16Codec) Decode(dst []float32, src []byte) error {
	if len(src) != 2*len(dst) {
		return errLen("fp16", len(dst), len(src), 2*len(dst))
	}
	if useAsm {
		f16Decode(dst, src, false)
		return nil
	}
	return fp16DecodeGeneric(dst, src)
}

// DecodeAdd implements AccumulateDecoder: dst[i] += decoded value.
func (fp16Codec) DecodeAdd(dst []float32, src []byte) error {
	if len(src) != 2*len(dst) {
		return errLen("fp16", len(dst), len(src), 2*len(dst))
	}
	if useAsm {
		f16Decode(dst, src, true)
		return nil
	}
	return fp16DecodeAddGeneric(dst, src)
}

// fp16DecodeAddGeneric is the portable DecodeAdd.
func fp16DecodeAddGeneric(dst []float32, src []byte) error {
	n := len(dst)
	if len(src) != 2*n {
		return errLen("fp16", n, len(src), 2*n)
	}
	t := f16Decoder()
	src = src[:2*n]
	for i := range dst {
		dst[i] = addF32(dst[i], t[binary.LittleEndian.Uint16(src[2*i:])])
	}
	return nil
}

// fp16DecodeGeneric is the portable Decode.
func fp16DecodeGeneric(dst []float32, src []byte) error {
	n := len(dst)
	if len(src) != 2*n {
		return errLen("fp16", n, len(src), 2*n)
	}
	t := f16Decoder()
	for len(dst) >= 4 {
		d := dst[:4]
		v := binary.LittleEndian.Uint64(src)
		d[0] = t[uint16(v)]
		d[1] = t[uint16(v>>16)]
		d[2] = t[uint16(v>>32)]
		d[3] = t[uint16(v>>48)]
		dst = dst[4:]
		src = src[8:]
	}
	for i := range dst {
		dst[i] = t[binary.LittleEndian.Uint16(src[2*i:])]
	}
	return nil
}

// ---- bf16 ----

type bf16Codec struct{}

// BF16 returns the bfloat16 codec (2 bytes per value, little endian): the
// upper 16 bits of the float32 after rounding to nearest, ties to even. NaN
// stays NaN (sign and top payload kept, quiet bit set); like any correct
// rounding, finite values within half a bf16 ulp of MaxFloat32 or beyond
// round to ±Inf (|x| >= 3.3961776e38), and are not counted as clamped.
// Decode is exact.
func BF16() Codec { return bf16Codec{} }

func (bf16Codec) Name() string         { return "bf16" }
func (bf16Codec) EncodedLen(n int) int { return 2 * n }

func bf16Round(b uint32) uint32 {
	r := (b + 0x7FFF + (b>>16)&1) >> 16
	if b&0x7FFFFFFF > f32InfBits {
		r = b>>16 | 0x40
	}
	return r
}

// bf16Chunk is the number of values per bf16 SWAR chunk.
const bf16Chunk = 32

func (bf16Codec) Encode(dst []byte, src []float32) Info {
	checkDst("bf16", dst, 2*len(src))
	if useAsm {
		bf16Encode(dst, src, nil)
		return Info{}
	}
	return bf16EncodeGeneric(dst, src)
}

// EncodeFeedback implements FeedbackEncoder: it encodes src exactly as
// Encode does and sets res[i] = src[i] - decoded[i].
func (bf16Codec) EncodeFeedback(dst []byte, src, res []float32) Info {
	checkDst("bf16", dst, 2*len(src))
	checkRes("bf16", res, len(src))
	if useAsm {
		bf16Encode(dst, src, res)
		return Info{}
	}
	return bf16EncodeFeedbackGeneric(dst, src, res)
}

// EncodeFeedbackAdd implements FeedbackAddEncoder: it encodes m = src +
// res as EncodeFeedback(dst, m, res) would and leaves m - decoded in res.
func (bf16Codec) EncodeFeedbackAdd(dst []byte, src, res []float32) Info {
	checkDst("bf16", dst, 2*len(src))
	checkRes("bf16", res, len(src))
	if useAsm {
		bf16EncodeAdd(dst, src, res)
		return Info{}
	}
	return bf16EncodeFeedbackAddGeneric(dst, src, res)
}

// bf16EncodeFeedbackAddGeneric is the portable EncodeFeedbackAdd.
func bf16EncodeFeedbackAddGeneric(dst []byte, src, res []float32) Info {
	checkDst("bf16", dst, 2*len(src))
	checkRes("bf16", res, len(src))
	bf16AddLoop(dst, src, res)
	return Info{}
}

// bf16AddLoop encodes m = src + res (addF32) value by value into dst and
// leaves m - decoded in res.
func bf16AddLoop(dst []byte, src, res []float32) {
	n := len(src)
	dst = dst[:2*n]
	res = res[:n]
	for i, x := range src {
		m := addF32(x, res[i])
		h := bf16Round(math.Float32bits(m))
		binary.LittleEndian.PutUint16(dst[2*i:], uint16(h))
		res[i] = m - math.Float32frombits(h<<16)
	}
}

// bf16EncodeFeedbackGeneric is the portable EncodeFeedback.
func bf16EncodeFeedbackGeneric(dst []byte, src, res []float32) Info {
	n := len(src)
	checkDst("bf16", dst, 2*n)
	dst = dst[:2*n]
	res = res[:n]
	for i, x := range src {
		h := bf16Round(math.Float32bits(x))
		binary.LittleEndian.PutUint16(dst[2*i:], uint16(h))
		res[i] = x - math.Float32frombits(h<<16)
	}
	return Info{}
}

// bf16EncodeGeneric is the portable Encode: the reference the assembly is
// tested against, and what runs on CPUs without AVX2.
func bf16EncodeGeneric(dst []byte, src []float32) Info {
	n := len(src)
	checkDst("bf16", dst, 2*n)
	dst = dst[:2*n]
	if littleEndian && n >= bf16Chunk {
		// SWAR: round two float32 lanes per uint64. Adding 0x7FFF plus the
		// kept low bit cannot carry out of the low lane except for negative
		// NaNs (0xFFFF8000 and up), and a chunk holding any NaN is redone
		// by the scalar loop below, so the lanes stay independent.
		m := n &^ (bf16Chunk - 1)
		in := unsafe.Slice((*byte)(unsafe.Pointer(&src[0])), 4*m)
		out := dst[:2*m]
		for len(in) >= 4*bf16Chunk {
			s := in[:4*bf16Chunk]
			d := out[:2*bf16Chunk]
			var nan uint64
			for i := 0; i < 4*bf16Chunk; i += 16 {
				v0 := binary.LittleEndian.Uint64(s[i:])
				v1 := binary.LittleEndian.Uint64(s[i+8:])
				// Lane bit 31 ends up set iff |lane| > Inf bits, i.e. NaN.
				nan |= v0&0x7FFFFFFF7FFFFFFF + 0x007FFFFF007FFFFF
				nan |= v1&0x7FFFFFFF7FFFFFFF + 0x007FFFFF007FFFFF
				r0 := v0 + 0x00007FFF00007FFF + (v0>>16)&0x0000000100000001
				r1 := v1 + 0x00007FFF00007FFF + (v1>>16)&0x0000000100000001
				p0 := (r0>>16)&0xFFFF | (r0>>32)&0xFFFF0000
				p1 := (r1>>16)&0xFFFF | (r1>>32)&0xFFFF0000
				binary.LittleEndian.PutUint64(d[i/2:], p0|p1<<32)
			}
			if nan&0x8000000080000000 != 0 {
				v := src[:bf16Chunk]
				for j, x := range v {
					binary.LittleEndian.PutUint16(d[2*j:], uint16(bf16Round(math.Float32bits(x))))
				}
			}
			in = in[4*bf16Chunk:]
			out = out[2*bf16Chunk:]
			src = src[bf16Chunk:]
		}
		dst = dst[2*m:]
	}
	for len(src) >= 4 {
		s := src[:4]
		r0 := bf16Round(math.Float32bits(s[0]))
		r1 := bf16Round(math.Float32bits(s[1]))
		r2 := bf16Round(math.Float32bits(s[2]))
		r3 := bf16Round(math.Float32bits(s[3]))
		binary.LittleEndian.PutUint64(dst, uint64(r0)|uint64(r1)<<16|uint64(r2)<<32|uint64(r3)<<48)
		src = src[4:]
		dst = dst[8:]
	}
	for i, x := range src {
		binary.LittleEndian.PutUint16(dst[2*i:], uint16(bf16Round(math.Float32bits(x))))
	}
	return Info{}
}

func (bf16Codec) Decode(dst []float32, src []byte) error {
	if len(src) != 2*len(dst) {
		return errLen("bf16", len(dst), len(src), 2*len(dst))
	}
	if useAsm {
		bf16Decode(dst, src, false)
		return nil
	}
	return bf16DecodeGeneric(dst, src)
}

// DecodeAdd implements AccumulateDecoder: dst[i] += decoded value.
func (bf16Codec) DecodeAdd(dst []float32, src []byte) error {
	if len(src) != 2*len(dst) {
		return errLen("bf16", len(dst), len(src), 2*len(dst))
	}
	if useAsm {
		bf16Decode(dst, src, true)
		return nil
	}
	return bf16DecodeAddGeneric(dst, src)
}

// bf16DecodeAddGeneric is the portable DecodeAdd.
func bf16DecodeAddGeneric(dst []float32, src []byte) error {
	n := len(dst)
	if len(src) != 2*n {
		return errLen("bf16", n, len(src), 2*n)
	}
	src = src[:2*n]
	for i := range dst {
		dst[i] = addF32(dst[i], math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:]))<<16))
	}
	return nil
}

// bf16DecodeGeneric is the portable Decode.
func bf16DecodeGeneric(dst []float32, src []byte) error {
	n := len(dst)
	if len(src) != 2*n {
		return errLen("bf16", n, len(src), 2*n)
	}
	for len(dst) >= 4 {
		d := dst[:4]
		v := binary.LittleEndian.Uint64(src)
		d[0] = math.Float32frombits(uint32(v) << 16)
		d[1] = math.Float32frombits(uint32(v>>16) << 16)
		d[2] = math.Float32frombits(uint32(v>>32) << 16)
		d[3] = math.Float32frombits(uint32(v>>48) << 16)
		dst = dst[4:]
		src = src[8:]
	}
	for i := range dst {
		dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
	}
	return nil
}
