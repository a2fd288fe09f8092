// Package compress provides the gradient codecs of gorun's ring allreduce:
// ways to send float32 gradients in fewer bytes, plus the error-feedback
// bookkeeping that keeps lossy compression from biasing training.
//
// # Codecs
//
// A [Codec] turns n float32 values into exactly EncodedLen(n) bytes and
// back. The size depends only on n, so a ring can size every chunk buffer
// before it sees any data, and a receiver can tell a truncated or padded
// message from a good one. Four codecs exist, chosen by name with [ByName]:
//
//	name  bytes/value      error on N(0,1) data       notes
//	none  4                exact                      raw little-endian IEEE float32
//	fp16  2                rel RMS ~2e-4              IEEE binary16, clamps at ±65504
//	bf16  2                rel RMS ~1.7e-3            float32 range, 8-bit significand
//	int8  1 + 4/B          rel RMS ~6e-3 (B = 64)     per-block absmax scale
//
// All multi-byte quantities are little-endian regardless of the host.
//
// none ([None]) is the float32 bits as they are: lossless, including NaN
// payloads and the sign of zero.
//
// fp16 ([FP16]) is IEEE 754 binary16 (1 sign, 5 exponent, 10 mantissa bits)
// with round to nearest, ties to even; subnormals (below 2^-14, down to
// 2^-24) are produced and decoded exactly, which matters because small
// gradients live there. binary16 tops out at 65504: finite values beyond it
// and ±Inf encode as ±65504, never Inf, and are counted in [Info].Clamped so
// that a caller doing loss scaling can detect the overflow and skip the step
// (an Inf on the wire would instead turn the whole allreduced sum into Inf or
// NaN on every rank). NaN stays NaN (a quiet NaN with the input's sign).
// Decoding is exact since every binary16 value is a float32.
//
// bf16 ([BF16]) is the upper half of the float32 after round to nearest,
// ties to even: the float32 exponent range, so nothing is clamped, but only
// 8 significant bits. NaN stays NaN (the quiet bit is forced so that a NaN
// whose payload lives in the dropped bits does not become Inf).
//
// int8 ([Int8]) cuts the values into blocks of B (default [DefaultBlockSize]
// = 64; the last block may be shorter). Each block is a float32 scale =
// absmax/127 followed by B signed bytes q = round-half-away(x * (1/scale)),
// clamped to [-127, 127]; a block of zeros has scale 0; decode is q*scale.
// -128 is never written, so the code is symmetric and a receiver can reject
// it as corruption. Scales are capped at 2.6793884e36, the largest s with
// 127*s finite, so decoding never yields ±Inf. Wire size is (4+B)/(4B) of fp32: 0.266 at B = 64.
// Per-block scales bound the damage of an outlier to its own block (one
// huge value forces the small values of its block to 0; error feedback,
// below, carries them into later steps). NaN inputs encode as 0 and ±Inf as
// ±127 (the scale comes from the finite values); both count as clamped.
//
// Accuracy trade-off of int8: quantisation noise is about
// (absmax/127)/sqrt(12) per value, and absmax of a block of B Gaussian
// values grows like sqrt(2 ln B). On N(0,1) data (a property of the
// format, the same on every machine):
//
//	B      16      32      64      128     256
//	ratio  0.3125  0.2812  0.2656  0.2578  0.2539
//	error  0.47%   0.53%   0.59%   0.65%   0.69%
//
// so a wire ratio <= 0.27 (B >= 50) and a relative RMS error below 0.5%
// (B <= ~20) cannot both hold with this format; the default B = 64 keeps the
// ratio bound and is as accurate as that allows. Use [WithBlockSize] to
// move along the curve; every rank must use the same B.
//
// # Determinism
//
// The ring reduces compressed chunks and forwards them, and every rank must
// end with bitwise-identical results, so Encode and Decode are pure
// functions of their input: no randomness (no stochastic rounding), no
// dependence on CPU features or goroutine scheduling, and float arithmetic
// written so that the Go compiler may not fuse it into an FMA (each product
// is explicitly converted to float32 before it is used), which would
// otherwise make arm64 and amd64 disagree. The fp16 and bf16 conversions are
// integer bit manipulation except for one exactly-rounded float32 addition
// for fp16 subnormals.
//
// # Error feedback
//
// Lossy codecs make each step's gradient slightly wrong; unbiased on
// average for random data, but a persistent small component (one below
// half an int8 step, say) is lost every single step. [Residuals] keeps, per
// tensor, what the last encoding lost and adds it to the next gradient
// before encoding (Apply, then Update with the decoded values, which
// [RoundTrip] provides). The total sent over many steps then differs from
// the true total by one step's error instead of growing with the number of
// steps. [RelRMSE] measures relative error for statistics and tests.
//
// Codecs that implement [FeedbackEncoder] encode and compute the residual
// in one pass, and those that implement [FeedbackAddEncoder] (fp16, bf16,
// int8) also add the previous residual in that pass: EncodeFeedbackAdd(dst,
// g, res) is g+res encoded, with res updated in place, bit for bit as the
// addition followed by EncodeFeedback, without storing the sum anywhere.
//
// # Performance
//
// On amd64 CPUs with AVX2 and F16C (detected at start-up) the hot loops run
// as assembly kernels: int8 with the default block size, fp16 (VCVTPS2PH /
// VCVTPH2PS) and bf16 Encode, EncodeFeedback, EncodeFeedbackAdd, Decode
// and DecodeAdd, and none DecodeAdd. They produce exactly the Go code's
// bytes, residuals and sums (no FMA, the same roundings; the tests compare
// both paths bit for bit, including every binary16 and bf16 code), so ranks
// with and without them agree. A kernel stops at the first group it cannot
// handle the same way (an fp16 value to clamp or NaN, an fp16 NaN code,
// which VCVTPH2PS would quiet, an int8 block with NaN, Inf, huge values or
// a subnormal scale, a corrupt int8 block) and the Go code does that group.
// Build with -tags purego to use the Go code only.
//
// The EncodeFeedbackAdd kernels add the residual as they load the values
// (int8 keeps a block's 64 sums in registers through the absmax and the
// quantization) and never store the sums: on gradients far larger than
// the caches, encoded 4096 values at a time as the ring does, that saves
// writing the sums to memory and reading them back, a pass over a buffer
// the size of the gradient (BenchmarkEncodeFeedbackAdd compares the two;
// see BENCHMARKS.md, "Compression kernels").
//
// The Go loops are branch-free in the common case (selects compile to
// conditional moves), unrolled, and written so that the compiler can drop
// bounds checks; rare inputs (values fp16 must clamp, NaN, Inf, tiny int8
// scales) are detected per chunk and re-encoded by a slower exact path.
// Run go test -bench . to measure (sub-benchmarks asm and go compare the
// two paths).
package compress
