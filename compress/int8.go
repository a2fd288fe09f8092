package compress

import (
	"encoding/binary"
	"fmt"
	"math"
)

// DefaultBlockSize is the int8 block size used by Int8() and ByName("int8").
// With it the wire size is (4+64)/(4*64) = 0.266 of fp32.
const DefaultBlockSize = 64

// MaxBlockSize is the largest block size WithBlockSize accepts.
const MaxBlockSize = 1 << 20

// Int8Option configures Int8.
type Int8Option func(*int8Codec)

// WithBlockSize sets the number of values sharing one scale. Smaller blocks
// are more accurate and larger on the wire: (4+n)/(4n) of fp32. Every rank
// must use the same block size (Name stays "int8"). Int8 panics if n is not
// in [1, MaxBlockSize].
func WithBlockSize(n int) Int8Option {
	return func(c *int8Codec) { c.block = n }
}

type int8Codec struct{ block int }

// Int8 returns the block-scaled int8 codec. For each block of B values
// (the last may be shorter) it writes a little-endian float32 scale =
// absmax/127 followed by B bytes q = round-half-away(x/scale) clamped to
// [-127,127] (computed as x * (1/scale) in float32, or as x/scale when the
// scale is below the smallest normal float32); a block of zeros has scale
// 0. Decode gives q*scale. NaN inputs encode as 0 and ±Inf as ±127 (the
// scale comes from the finite values only); both are counted in
// Info.Clamped. Scales are capped at 2.6793884e36 so that 127*scale is
// finite. The returned Codec also has a BlockSize() int method.
func Int8(opts ...Int8Option) Codec {
	c := &int8Codec{block: DefaultBlockSize}
	for _, o := range opts {
		o(c)
	}
	if c.block < 1 || c.block > MaxBlockSize {
		panic(fmt.Sprintf("compress: int8 block size %d not in [1, %d]", c.block, MaxBlockSize))
	}
	return c
}

func (c *int8Codec) Name() string { return "int8" }

// BlockSize returns the number of values per scale.
func (c *int8Codec) BlockSize() int { return c.block }

func (c *int8Codec) EncodedLen(n int) int {
	if n <= 0 {
		return 0
	}
	return n + 4*((n+c.block-1)/c.block)
}

const (
	roundHalf  = 0x3EFFFFFF // float32 bits of 0.49999997, the float below 0.5
	minNormF32 = 0x00800000
	// maxScaleBits is the largest scale s with 127*s finite (2.6793884e36).
	// MaxFloat32/127 itself rounds up, so a block whose absmax is near
	// MaxFloat32 gets this scale instead and its largest values clamp to
	// ±127; Decode rejects larger scales, so it never produces ±Inf.
	maxScaleBits = 0x7C010203
	// hugeBits: blocks with absmax at or above 2^126 take the slow path.
	hugeBits = 0x7E800000
)

// roundAway rounds t (|t| < 2^23) half away from zero. Adding the largest
// float32 below 0.5 (not 0.5, which rounds 0.49999997 up to 1) with the
// sign of t and truncating is exact for every float32 in that range.
func roundAway(t float32) int32 {
	h := math.Float32frombits(roundHalf | math.Float32bits(t)&0x80000000)
	return int32(t + h)
}

func clamp127(q int32) int32 { return min(max(q, -127), 127) }

// absmaxBits returns the largest |x| of s as float32 bits (unsigned integer
// order matches float order for non-negative floats; NaN sorts above Inf).
func absmaxBits(s []float32) uint32 {
	var m0, m1, m2, m3 uint32
	for len(s) >= 4 {
		v := s[:4]
		m0 = max(m0, math.Float32bits(v[0])&0x7FFFFFFF)
		m1 = max(m1, math.Float32bits(v[1])&0x7FFFFFFF)
		m2 = max(m2, math.Float32bits(v[2])&0x7FFFFFFF)
		m3 = max(m3, math.Float32bits(v[3])&0x7FFFFFFF)
		s = s[4:]
	}
	for _, x := range s {
		m0 = max(m0, math.Float32bits(x)&0x7FFFFFFF)
	}
	return max(m0, m1, m2, m3)
}

func (c *int8Codec) Encode(dst []byte, src []float32) Info { return c.encode(dst, src, nil) }

// EncodeFeedback implements FeedbackEncoder: it encodes src exactly as
// Encode does and, in the same pass, writes into res what the encoding lost
// (src minus what Decode will return), which error feedback needs.
func (c *int8Codec) EncodeFeedback(dst []byte, src, res []float32) Info {
	checkRes("int8", res, len(src))
	return c.encode(dst, src, res)
}

// EncodeFeedbackAdd implements FeedbackAddEncoder: it encodes m = src +
// res as EncodeFeedback(dst, m, res) would and leaves m - decoded in res.
// With the default block size and AVX2 the kernel adds, finds the absmax
// and quantizes a block of 64 without storing m; blocks it cannot do go to
// int8BlockAdd, as they go to int8Block in EncodeFeedback.
func (c *int8Codec) EncodeFeedbackAdd(dst []byte, src, res []float32) Info {
	checkRes("int8", res, len(src))
	checkDst("int8", dst, c.EncodedLen(len(src)))
	if useAsm && c.block == 64 {
		return int8EncodeAdd64(dst, src, res)
	}
	return c.encodeAddGeneric(dst, src, res)
}

// encodeAddGeneric is the portable EncodeFeedbackAdd, block by block.
func (c *int8Codec) encodeAddGeneric(dst []byte, src, res []float32) Info {
	checkRes("int8", res, len(src))
	checkDst("int8", dst, c.EncodedLen(len(src)))
	clamped := 0
	B := c.block
	for len(src) > 0 {
		k := min(B, len(src))
		clamped += int8BlockAdd(dst[:4+k], src[:k], res[:k])
		src, res, dst = src[k:], res[k:], dst[4+k:]
	}
	return Info{Clamped: clamped}
}

// int8BlockAdd sets r = s + r (addF32) and encodes that block into hdr,
// leaving the residual in r. int8Block reads each value before it writes
// the same index of the residual, so s and r may be the same slice there.
func int8BlockAdd(hdr []byte, s, r []float32) int {
	r = r[:len(s)]
	for j, x := range s {
		r[j] = addF32(x, r[j])
	}
	return int8Block(hdr, r, r)
}

// encode is Encode, and with res != nil also the residual src - decoded.
// Blocks of 64 go to the AVX2 kernels when the CPU has them (see
// kernels.go); they give the same bytes and residuals as encodeGeneric.
func (c *int8Codec) encode(dst []byte, src, res []float32) Info {
	checkDst("int8", dst, c.EncodedLen(len(src)))
	if useAsm && c.block == 64 {
		return int8Encode64(dst, src, res)
	}
	return c.encodeGeneric(dst, src, res)
}

// encodeGeneric is the portable encoder: the reference the assembly is
// tested against, and what runs on CPUs without AVX2.
func (c *int8Codec) encodeGeneric(dst []byte, src, res []float32) Info {
	checkDst("int8", dst, c.EncodedLen(len(src)))
	clamped := 0
	B := c.block
	for len(src) > 0 {
		k := min(B, len(src))
		var r []float32
		if res != nil {
			r, res = res[:k], res[k:]
		}
		clamped += int8Block(dst[:4+k], src[:k], r)
		src = src[k:]
		dst = dst[4+k:]
	}
	return Info{Clamped: clamped}
}

// int8Block encodes one block s into hdr (scale, then len(s) values) and,
// if r != nil, writes the residual s - decoded into r. It returns the
// number of clamped values.
func int8Block(hdr []byte, s, r []float32) int {
	q := hdr[4:]
	m := absmaxBits(s)
	if m >= hugeBits { // NaN, ±Inf, or near MaxFloat32
		clamped := int8Slow(hdr, s)
		int8Residual(r, s, hdr)
		return clamped
	}
	scale := math.Float32frombits(m) / 127
	binary.LittleEndian.PutUint32(hdr, math.Float32bits(scale))
	if scale < math.Float32frombits(minNormF32) {
		// Tiny block: 1/scale could overflow; use the exact division.
		int8Div(q, s, scale)
		int8Residual(r, s, hdr)
		return 0
	}
	// No clamp is needed here: with scale = RN(a/127) and inv =
	// RN(1/scale), |x*inv| <= RN(a*inv) <= 127*(1+3*2^-24) < 127.5, so
	// |q| <= 127 (FuzzEncode checks the output never holds -128).
	inv := 1 / scale
	if r != nil {
		r = r[:len(s)]
		for j, x := range s {
			v := roundAway(float32(x * inv))
			q[j] = uint8(v)
			// float32(...) keeps the product unfused, as in Decode.
			r[j] = x - float32(float32(int8(v))*scale)
		}
		return 0
	}
	for len(s) >= 8 {
		v := s[:8]
		o := q[:8]
		// Unrolled by hand: the Go compiler does not unroll loops.
		o[0] = uint8(roundAway(float32(v[0] * inv)))
		o[1] = uint8(roundAway(float32(v[1] * inv)))
		o[2] = uint8(roundAway(float32(v[2] * inv)))
		o[3] = uint8(roundAway(float32(v[3] * inv)))
		o[4] = uint8(roundAway(float32(v[4] * inv)))
		o[5] = uint8(roundAway(float32(v[5] * inv)))
		o[6] = uint8(roundAway(float32(v[6] * inv)))
		o[7] = uint8(roundAway(float32(v[7] * inv)))
		s = s[8:]
		q = q[8:]
	}
	for j, x := range s {
		q[j] = uint8(roundAway(float32(x * inv)))
	}
	return 0
}

// int8Residual sets r = s - Decode(block) for a block encoded in hdr (scale
// then values); r == nil means no residual is wanted.
func int8Residual(r, s []float32, hdr []byte) {
	if r == nil {
		return
	}
	scale := math.Float32frombits(binary.LittleEndian.Uint32(hdr))
	for j, x := range s {
		r[j] = x - float32(float32(int8(hdr[4+j]))*scale)
	}
}

// int8Div quantizes a block whose scale is 0 or subnormal by dividing.
func int8Div(q []byte, s []float32, scale float32) {
	for j, x := range s {
		var v int32
		if scale != 0 {
			v = clamp127(roundAway(x / scale))
		}
		q[j] = uint8(v)
	}
}

// int8Slow encodes a block holding NaN, ±Inf or values of 2^126 or more;
// hdr is scale then values.
func int8Slow(hdr []byte, s []float32) int {
	var m uint32
	bad := 0
	for _, x := range s {
		a := math.Float32bits(x) & 0x7FFFFFFF
		if a >= f32InfBits {
			bad++
			continue
		}
		m = max(m, a)
	}
	scale := min(math.Float32frombits(m)/127, math.Float32frombits(maxScaleBits))
	binary.LittleEndian.PutUint32(hdr, math.Float32bits(scale))
	q := hdr[4:]
	for j, x := range s {
		var v int32
		switch a := math.Float32bits(x) & 0x7FFFFFFF; {
		case a > f32InfBits: // NaN
			v = 0
		case a == f32InfBits:
			v = 127
			if scale == 0 {
				v = 0
			}
			if x < 0 {
				v = -v
			}
		case scale != 0:
			v = clamp127(roundAway(x / scale))
		}
		q[j] = uint8(v)
	}
	return bad
}

// has80 reports (as a non-zero value) whether any byte of v is 0x80 (-128),
// using the SWAR "has zero byte" test on v^0x80...80.
func has80(v uint64) uint64 {
	x := v ^ 0x8080808080808080
	return (x - 0x0101010101010101) &^ x & 0x8080808080808080
}

func (c *int8Codec) Decode(dst []float32, src []byte) error {
	if useAsm && c.block == 64 && len(src) == c.EncodedLen(len(dst)) {
		return int8Decode64(dst, src, false)
	}
	return c.decodeGeneric(dst, src, false)
}

// DecodeAdd implements AccumulateDecoder: dst[i] += the value Decode would
// give, with the product q*scale rounded to float32 before the addition.
func (c *int8Codec) DecodeAdd(dst []float32, src []byte) error {
	if useAsm && c.block == 64 && len(src) == c.EncodedLen(len(dst)) {
		return int8Decode64(dst, src, true)
	}
	return c.decodeGeneric(dst, src, true)
}

// decodeGeneric is the portable Decode (add == false) or DecodeAdd.
func (c *int8Codec) decodeGeneric(dst []float32, src []byte, add bool) error {
	n := len(dst)
	if want := c.EncodedLen(n); len(src) != want {
		return errLen("int8", n, len(src), want)
	}
	B := c.block
	for blk := 0; len(dst) > 0; blk++ {
		k := min(B, len(dst))
		if err := int8DecodeBlock(dst[:k], src[:4+k], blk, add); err != nil {
			return err
		}
		dst = dst[k:]
		src = src[4+k:]
	}
	return nil
}

// int8DecodeBlock decodes block number blk, hdr (scale then len(d)
// values), into d, or adds it to d if add is set.
func int8DecodeBlock(d []float32, hdr []byte, blk int, add bool) error {
	q := hdr[4:]
	q = q[:len(d)]
	sb := binary.LittleEndian.Uint32(hdr)
	if sb > maxScaleBits { // too large, NaN, Inf, or sign bit set
		return fmt.Errorf("compress: int8: block %d has invalid scale %v (bits %#08x)", blk, math.Float32frombits(sb), sb)
	}
	scale := math.Float32frombits(sb)
	var bad uint64
	if add {
		// Check the whole block before touching d, so that a rejected
		// block leaves its part of d as it was.
		for j := 0; j+8 <= len(q); j += 8 {
			bad |= has80(binary.LittleEndian.Uint64(q[j:]))
		}
		for _, b := range q[len(q)&^7:] {
			if b == 0x80 {
				bad = 1
			}
		}
		if bad != 0 {
			return errMinus128(blk)
		}
		for j, b := range q {
			// float32(...) rounds the product before the sum, as Decode
			// followed by an addition would; a fused multiply-add would not.
			d[j] = d[j] + float32(float32(int8(b))*scale)
		}
		return nil
	}
	for len(d) >= 8 {
		v := binary.LittleEndian.Uint64(q)
		bad |= has80(v)
		e := d[:8]
		e[0] = float32(int8(v)) * scale
		e[1] = float32(int8(v>>8)) * scale
		e[2] = float32(int8(v>>16)) * scale
		e[3] = float32(int8(v>>24)) * scale
		e[4] = float32(int8(v>>32)) * scale
		e[5] = float32(int8(v>>40)) * scale
		e[6] = float32(int8(v>>48)) * scale
		e[7] = float32(int8(v>>56)) * scale
		d = d[8:]
		q = q[8:]
	}
	for j := range d {
		if q[j] == 0x80 {
			bad = 1
		}
		d[j] = float32(int8(q[j])) * scale
	}
	if bad != 0 {
		return errMinus128(blk)
	}
	return nil
}

func errMinus128(blk int) error {
	return fmt.Errorf("compress: int8: block %d holds the value -128, which Encode never writes", blk)
}
