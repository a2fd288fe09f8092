package compress

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"unsafe"
)

// Codec turns float32 gradients into fewer bytes and back. Encode and Decode
// are deterministic and pure (same input -> same bytes on every machine),
// which the ring relies on so that every rank ends with bitwise-identical
// results.
//
// A Codec is stateless and safe for concurrent use.
type Codec interface {
	// Name is "none", "fp16", "bf16" or "int8".
	Name() string
	// EncodedLen is the number of bytes needed for n float32 values,
	// headers and scales included. It depends only on n (and, for int8,
	// the block size), never on the values.
	EncodedLen(n int) int
	// Encode writes the encoding of src into dst[:EncodedLen(len(src))].
	// It panics if len(dst) < EncodedLen(len(src)) (a programming error);
	// bytes past EncodedLen are left untouched.
	Encode(dst []byte, src []float32) Info
	// Decode reads len(dst) values from src. It returns an error, never
	// panics, if len(src) != EncodedLen(len(dst)) or if src holds something
	// Encode never writes (for int8: a negative, NaN or Inf scale, a
	// scale so large that 127*scale overflows, or the byte -128). On error the contents of dst are unspecified.
	Decode(dst []float32, src []byte) error
}

// FeedbackEncoder is implemented by codecs that can encode and compute the
// error-feedback residual in one pass: EncodeFeedback(dst, src, res) encodes
// src exactly as Encode does and sets res[i] = src[i] - decoded[i]. It
// panics if len(res) < len(src). FP16, BF16 and Int8 implement it.
type FeedbackEncoder interface {
	EncodeFeedback(dst []byte, src, res []float32) Info
}

// FeedbackAddEncoder is implemented by codecs that can also add the
// error-feedback residual in the same pass, which is what error feedback
// does before every encoding: EncodeFeedbackAdd(dst, src, res) encodes
// m[i] = src[i] + res[i] (one float32 addition; where both are NaN, m[i] is
// src[i]'s NaN with the quiet bit set, as for the first operand of an x86
// addition) exactly as EncodeFeedback(dst, m, res) would: the same bytes
// and the same Info. res is both an input and the output: afterwards
// res[i] = m[i] - decoded[i]. The addition and every later product are
// rounded to float32 separately (nothing is fused into a multiply-add), so
// the result is bit for bit that of the two passes it replaces, on every
// CPU. It panics if len(res) < len(src) or dst is too short (like
// EncodeFeedback); dst must not overlap src or res. FP16, BF16 and Int8
// implement it.
type FeedbackAddEncoder interface {
	EncodeFeedbackAdd(dst []byte, src, res []float32) Info
}

// AccumulateDecoder is implemented by codecs that can decode and add in one
// pass, as a reduction (sum of decoded chunks) wants: DecodeAdd(dst, src)
// sets dst[i] += v[i], where v is what Decode(v, src) would produce, and
// gives exactly the float32 that Decode into a temporary followed by
// dst[i] + v[i] gives (for int8 the product q*scale is rounded to float32
// before the addition; nothing is fused into a multiply-add). Where both
// dst[i] and v[i] are NaN the result is dst[i]'s NaN, quieted (Go leaves
// that choice to the compiler; see addF32). It checks src like Decode and
// returns the same errors; on error, dst may have been partly updated.
// None, FP16, BF16 and Int8 implement it.
type AccumulateDecoder interface {
	DecodeAdd(dst []float32, src []byte) error
}

// Info reports what Encode had to give up.
type Info struct {
	// Clamped counts the input values that did not fit the format and were
	// replaced by the nearest representable value: for fp16, finite values
	// with |x| > 65504 and ±Inf (all encoded as ±65504); for int8, NaN
	// (encoded as 0) and ±Inf (encoded as ±127·scale). Always 0 for none
	// and bf16.
	Clamped int
}

var names = []string{"none", "fp16", "bf16", "int8"}

// Names returns the valid codec names, in order of decreasing wire size.
func Names() []string { return append([]string(nil), names...) }

// ByName returns the codec with the given name ("none", "fp16", "bf16",
// "int8"; int8 uses the default block size). The error lists the valid names.
func ByName(name string) (Codec, error) {
	switch name {
	case "none":
		return None(), nil
	case "fp16":
		return FP16(), nil
	case "bf16":
		return BF16(), nil
	case "int8":
		return Int8(), nil
	}
	return nil, fmt.Errorf("compress: unknown codec %q (valid: %s)", name, strings.Join(names, ", "))
}

// littleEndian reports whether the host stores integers little-endian, in
// which case the none codec is a plain memory copy.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// errLen builds the error Decode returns for a wrong src length.
func errLen(codec string, n, got, want int) error {
	return fmt.Errorf("compress: %s: cannot decode %d values from %d bytes (want %d)", codec, n, got, want)
}

func checkDst(codec string, dst []byte, need int) {
	if len(dst) < need {
		panic(fmt.Sprintf("compress: %s: Encode dst has %d bytes, need %d", codec, len(dst), need))
	}
}

// addF32 returns d + v. When both are NaN it returns d's NaN with the quiet
// bit set, which is what the x86 SSE/AVX addition gives with d as its first
// operand and what the assembly kernels do; Go itself does not say which
// NaN a sum carries, and its compiler may swap the operands of an addition,
// so the generic DecodeAdd code pins it down here. For every other input
// this is exactly d + v.
func addF32(d, v float32) float32 {
	s := d + v
	if v != v && d != d {
		s = math.Float32frombits(math.Float32bits(d) | 0x00400000)
	}
	return s
}

// checkRes panics if an EncodeFeedback residual is too short for n values.
func checkRes(codec string, res []float32, n int) {
	if len(res) < n {
		panic(fmt.Sprintf("compress: %s: residual holds %d values, want %d", codec, len(res), n))
	}
}

// ---- none ----

type noneCodec struct{}

// None returns the identity codec: raw little-endian IEEE float32, 4 bytes
// per value. Decode is exact, including NaN payloads.
func None() Codec { return noneCodec{} }

func (noneCodec) Name() string         { return "none" }
func (noneCodec) EncodedLen(n int) int { return 4 * n }

func (noneCodec) Encode(dst []byte, src []float32) Info {
	n := len(src)
	checkDst("none", dst, 4*n)
	if n == 0 {
		return Info{}
	}
	dst = dst[:4*n]
	if littleEndian {
		copy(dst, unsafe.Slice((*byte)(unsafe.Pointer(&src[0])), 4*n))
		return Info{}
	}
	for i, x := range src {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(x))
	}
	return Info{}
}

func (noneCodec) Decode(dst []float32, src []byte) error {
	n := len(dst)
	if len(src) != 4*n {
		return errLen("none", n, len(src), 4*n)
	}
	if n == 0 {
		return nil
	}
	if littleEndian {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*n), src)
		return nil
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
	return nil
}

// DecodeAdd implements AccumulateDecoder: dst[i] += the float32 stored in
// src (NaN payloads propagate as the hardware addition does).
func (noneCodec) DecodeAdd(dst []float32, src []byte) error {
	n := len(dst)
	if len(src) != 4*n {
		return errLen("none", n, len(src), 4*n)
	}
	if useAsm && littleEndian {
		f32Add(dst, src)
		return nil
	}
	return noneDecodeAddGeneric(dst, src)
}

// noneDecodeAddGeneric is the portable DecodeAdd.
func noneDecodeAddGeneric(dst []float32, src []byte) error {
	n := len(dst)
	if len(src) != 4*n {
		return errLen("none", n, len(src), 4*n)
	}
	src = src[:4*n]
	for i := range dst {
		dst[i] = addF32(dst[i], math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:])))
	}
	return nil
}
