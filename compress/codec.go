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
// src exactly as Encode does and sets res[i] = src[i] - decoded[i].
type FeedbackEncoder interface {
	EncodeFeedback(dst []byte, src, res []float32) Info
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
