package compress

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand"
	"testing"
)

// These tests compare the codecs as the package runs them (the AVX2/F16C
// kernels when useAsm is set) with the portable Go code that machines
// without those features run, bit for bit: encoded bytes, Info, residuals,
// decoded values, sums and errors. Without the kernels (purego, other
// architectures, old CPUs) both sides are the Go code and the tests are
// trivially true.

// codecPath is one implementation of a codec's operations.
type codecPath struct {
	enc    func(dst []byte, src []float32) Info
	encFB  func(dst []byte, src, res []float32) Info // nil: not a FeedbackEncoder
	encFBA func(dst []byte, src, res []float32) Info // nil: not a FeedbackAddEncoder
	dec    func(dst []float32, src []byte) error
	decAdd func(dst []float32, src []byte) error
}

// fastPath is the codec's exported methods.
func fastPath(c Codec) codecPath {
	p := codecPath{enc: c.Encode, dec: c.Decode, decAdd: c.(AccumulateDecoder).DecodeAdd}
	if fe, ok := c.(FeedbackEncoder); ok {
		p.encFB = fe.EncodeFeedback
	}
	if fa, ok := c.(FeedbackAddEncoder); ok {
		p.encFBA = fa.EncodeFeedbackAdd
	}
	return p
}

// goPath is the portable Go implementation of the same codec.
func goPath(c Codec) codecPath {
	switch c := c.(type) {
	case noneCodec:
		return codecPath{enc: c.Encode, dec: c.Decode, decAdd: noneDecodeAddGeneric}
	case fp16Codec:
		return codecPath{enc: fp16EncodeGeneric, encFB: fp16EncodeFeedbackGeneric, encFBA: fp16EncodeFeedbackAddGeneric, dec: fp16DecodeGeneric, decAdd: fp16DecodeAddGeneric}
	case bf16Codec:
		return codecPath{enc: bf16EncodeGeneric, encFB: bf16EncodeFeedbackGeneric, encFBA: bf16EncodeFeedbackAddGeneric, dec: bf16DecodeGeneric, decAdd: bf16DecodeAddGeneric}
	case *int8Codec:
		return codecPath{
			enc:    func(d []byte, s []float32) Info { return c.encodeGeneric(d, s, nil) },
			encFB:  func(d []byte, s, r []float32) Info { return c.encodeGeneric(d, s, r) },
			encFBA: c.encodeAddGeneric,
			dec:    func(d []float32, s []byte) error { return c.decodeGeneric(d, s, false) },
			decAdd: func(d []float32, s []byte) error { return c.decodeGeneric(d, s, true) },
		}
	}
	panic(fmt.Sprintf("goPath: unknown codec %T", c))
}

func kernelCodecs() []Codec { return []Codec{None(), FP16(), BF16(), Int8()} }

// firstDiff returns the first index where a and b differ as bit patterns
// (so a one-ulp difference, -0 vs +0 or another NaN payload counts), or -1.
func firstDiff(a, b []float32) int {
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// unalignedF32 returns a copy of v whose first element sits one float past
// the start of its allocation, so that vector loads and stores cannot rely
// on 32-byte alignment.
func unalignedF32(v []float32) []float32 {
	b := make([]float32, len(v)+1)[1:]
	copy(b, v)
	return b
}

// diffPaths runs every operation of c through fast and slow on src
// (DecodeAdd adds into a copy of acc, len(acc) >= len(src)) and describes
// the first difference, or returns "".
func diffPaths(c Codec, fast, slow codecPath, src, acc []float32) string {
	n := len(src)
	L := c.EncodedLen(n)
	const guard = 9
	// Encode: the same bytes and Info; nothing written past EncodedLen.
	// The dst slices start at an odd address.
	ef := make([]byte, L+guard+1)[1:]
	eg := make([]byte, L+guard+1)[1:]
	for i := range ef {
		ef[i], eg[i] = 0xA5, 0xA5
	}
	inf, ing := fast.enc(ef, src), slow.enc(eg, src)
	if i := bytes.Compare(ef, eg); i != 0 {
		for j := range ef {
			if ef[j] != eg[j] {
				return fmt.Sprintf("%s n=%d: Encode byte %d: %#02x, Go %#02x", c.Name(), n, j, ef[j], eg[j])
			}
		}
	}
	for j := L; j < len(ef); j++ {
		if ef[j] != 0xA5 {
			return fmt.Sprintf("%s n=%d: Encode wrote byte %d past EncodedLen", c.Name(), n, j)
		}
	}
	if inf != ing {
		return fmt.Sprintf("%s n=%d: Encode Info %+v, Go %+v", c.Name(), n, inf, ing)
	}
	enc := ef[:L]

	if fast.encFB != nil {
		bf := make([]byte, L+1)[1:]
		bg := make([]byte, L+1)[1:]
		rf := unalignedF32(make([]float32, n+1))
		rg := make([]float32, n+1)
		rf[n], rg[n] = 7, 7 // must stay untouched
		i1 := fast.encFB(bf, src, rf[:n])
		i2 := slow.encFB(bg, src, rg[:n])
		if !bytes.Equal(bf, enc) || !bytes.Equal(bg, enc) {
			return fmt.Sprintf("%s n=%d: EncodeFeedback bytes differ from Encode (asm %v, Go %v)", c.Name(), n, bytes.Equal(bf, enc), bytes.Equal(bg, enc))
		}
		if i1 != inf || i2 != inf {
			return fmt.Sprintf("%s n=%d: EncodeFeedback Info %+v / Go %+v, Encode %+v", c.Name(), n, i1, i2, inf)
		}
		if i := firstDiff(rf, rg); i >= 0 {
			return fmt.Sprintf("%s n=%d: residual %d of %#08x: %#08x, Go %#08x", c.Name(), n, i,
				math.Float32bits(src[i]), math.Float32bits(rf[i]), math.Float32bits(rg[i]))
		}
	}
	if d := diffDecode(c, fast, slow, enc, n, acc); d != "" {
		return d
	}
	// DecodeAdd is Decode followed by addF32, bit for bit.
	if n > 0 {
		dec := make([]float32, n)
		sum := unalignedF32(acc[:n])
		if err := fast.dec(dec, enc); err != nil {
			return fmt.Sprintf("%s n=%d: own encoding rejected: %v", c.Name(), n, err)
		}
		if err := fast.decAdd(sum, enc); err != nil {
			return fmt.Sprintf("%s n=%d: DecodeAdd rejected own encoding: %v", c.Name(), n, err)
		}
		for i := range dec {
			if w := addF32(acc[i], dec[i]); math.Float32bits(sum[i]) != math.Float32bits(w) {
				return fmt.Sprintf("%s n=%d: DecodeAdd %d: %#08x + %#08x = %#08x, want %#08x", c.Name(), n, i,
					math.Float32bits(acc[i]), math.Float32bits(dec[i]), math.Float32bits(sum[i]), math.Float32bits(w))
			}
		}
	}
	return ""
}

// diffDecode compares Decode and DecodeAdd of the bytes enc (any content)
// into n values: the same error, and on success the same bits.
func diffDecode(c Codec, fast, slow codecPath, enc []byte, n int, acc []float32) string {
	df := unalignedF32(make([]float32, n))
	dg := make([]float32, n)
	e1, e2 := fast.dec(df, enc), slow.dec(dg, enc)
	if errString(e1) != errString(e2) {
		return fmt.Sprintf("%s n=%d: Decode error %q, Go %q", c.Name(), n, errString(e1), errString(e2))
	}
	if e1 == nil {
		if i := firstDiff(df, dg); i >= 0 {
			return fmt.Sprintf("%s n=%d: Decode %d: %#08x, Go %#08x", c.Name(), n, i, math.Float32bits(df[i]), math.Float32bits(dg[i]))
		}
	}
	af := unalignedF32(acc[:n])
	ag := append([]float32(nil), acc[:n]...)
	e1, e2 = fast.decAdd(af, enc), slow.decAdd(ag, enc)
	if errString(e1) != errString(e2) {
		return fmt.Sprintf("%s n=%d: DecodeAdd error %q, Go %q", c.Name(), n, errString(e1), errString(e2))
	}
	if e1 == nil {
		if i := firstDiff(af, ag); i >= 0 {
			return fmt.Sprintf("%s n=%d: DecodeAdd %d: %#08x + ... = %#08x, Go %#08x", c.Name(), n, i,
				math.Float32bits(acc[i]), math.Float32bits(af[i]), math.Float32bits(ag[i]))
		}
	}
	return ""
}

func checkPaths(t *testing.T, c Codec, src, acc []float32, what string) {
	t.Helper()
	if d := diffPaths(c, fastPath(c), goPath(c), src, acc); d != "" {
		t.Fatalf("%s: %s", what, d)
	}
}

// ---- inputs ----

func gaussScaled(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale)
	}
	return v
}

func randBits(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = math.Float32frombits(r.Uint32())
	}
	return v
}

// specialValues holds the edge cases of every codec.
func specialValues() []float32 {
	f := math.Float32frombits
	v := []float32{
		0, f(0x80000000), 1, -1, 0.5, -0.5,
		// subnormals and the normal boundary
		f(1), f(0x80000001), f(0x007FFFFF), f(0x807FFFFF), f(0x00800000), f(63), f(64), f(190), f(191),
		// fp16 range ends and the clamp boundary
		65504, -65504, 65505, 65519.99, 65520, -65520, 65535, 65536, 1e5,
		f(0x477FE000), f(0x477FE001), f(0x477FEFFF), f(0x477FF000), f(0x477FF001),
		5.9604645e-08, 2.9802322e-08, 2.9802326e-08, 8.940697e-08, 6.097555e-05, 6.1035156e-05,
		// near MaxFloat32 and the int8 hugeBits / maxScaleBits boundaries
		math.MaxFloat32, -math.MaxFloat32, f(0x7F7FFFFE), f(0x7E7FFFFF), f(0x7E800000), f(0xFE7FFFFF), f(0xFE800000),
		f(0x7C010203), f(0x7C010204), 3.3961776e38, -3.3961776e38,
		// infinities and NaNs with payloads, quiet and signaling, both signs
		float32(math.Inf(1)), float32(math.Inf(-1)),
		f(0x7FC00000), f(0xFFC00000), f(0x7F800001), f(0xFF800001), f(0x7FBFFFFF), f(0xFFFFFFFF),
		f(0x7FC12345), f(0xFF812345), f(0x7F802000), f(0xFFFF8000), f(0x7FFF8000), f(0x7F80FFFF),
		// bf16 ties
		f(0x3F808000), f(0x3F818000), f(0x3F808001), f(0x00008000), f(0x7F7F8000), f(0xFF7F8000),
	}
	return v
}

// f16Ties returns float32 values exactly halfway between neighbouring
// binary16 values (and one float32 ulp either side), normal and subnormal.
func f16Ties(r *rand.Rand, n int) []float32 {
	t := f16Decoder()
	v := make([]float32, 0, n)
	for len(v) < n {
		h := uint16(r.Intn(0x7C00)) | uint16(r.Intn(2))<<15
		b := math.Float32bits(t[h])
		var tie uint32
		if h&0x7C00 == 0 { // subnormal: step 2^-24, tie at +2^-25
			tie = math.Float32bits(float32(math.Abs(float64(t[h])) + 0x1p-25))
			tie |= b & 0x80000000
		} else {
			tie = b + 1<<12
		}
		v = append(v, math.Float32frombits(tie), math.Float32frombits(tie-1), math.Float32frombits(tie+1))
	}
	return v[:n]
}

// int8Ties returns blocks of 64 whose scale is a power of two, so that
// x*inv lands exactly on k+0.5 (or one float32 ulp beside it, or on
// ±0.49999997, which must round to 0) and exercises round-half-away.
func int8Ties(r *rand.Rand, nblk int) []float32 {
	v := make([]float32, 0, 64*nblk)
	for b := 0; b < nblk; b++ {
		e := r.Intn(200) - 120
		s := math.Ldexp(1, e)
		v = append(v, float32(127*s))
		for j := 1; j < 64; j++ {
			k := float64(r.Intn(254) - 127)
			t := float32(k + 0.5)
			switch r.Intn(4) {
			case 0:
				t = math.Nextafter32(t, 0)
			case 1:
				t = math.Nextafter32(t, 200)
			case 2:
				t = math.Float32frombits(roundHalf | uint32(r.Intn(2))<<31)
			}
			v = append(v, float32(float64(t)*s))
		}
	}
	return v
}

// mixedBlocks returns nblk blocks of 64 values, each from a different kind
// of input, so that the kernels stop at odd blocks and resume.
func mixedBlocks(r *rand.Rand, nblk int) []float32 {
	sp := specialValues()
	var v []float32
	for b := 0; b < nblk; b++ {
		var blk []float32
		switch r.Intn(10) {
		case 0:
			blk = randBits(r, 64)
		case 1: // one special among Gaussians
			blk = gaussScaled(r, 64, 1)
			blk[r.Intn(64)] = sp[r.Intn(len(sp))]
		case 2: // huge and tiny mixed
			blk = gaussScaled(r, 64, 1e-38)
			blk[r.Intn(64)] = float32(r.NormFloat64() * 1e38)
		case 3: // zeros, with signs
			blk = make([]float32, 64)
			for j := range blk {
				if r.Intn(2) == 0 {
					blk[j] = math.Float32frombits(0x80000000)
				}
			}
		case 4: // subnormal block: int8 scale 0 or subnormal
			blk = make([]float32, 64)
			lim := []uint32{64, 191, 0x7FFFFF}[r.Intn(3)]
			for j := range blk {
				blk[j] = math.Float32frombits(uint32(r.Int63n(int64(lim))) | uint32(r.Intn(2))<<31)
			}
		case 5: // absmax right at the int8 boundaries
			blk = gaussScaled(r, 64, 1)
			m := []uint32{0x7E7FFFFF, 0x7E800000, 0x03FE0000, 0x03FDFFFF, 0x03FE0001, 0x7F7FFFFF}[r.Intn(6)]
			for j := range blk {
				blk[j] *= math.Float32frombits(m) / 8
			}
			blk[r.Intn(64)] = math.Float32frombits(m | uint32(r.Intn(2))<<31)
		default:
			blk = gaussScaled(r, 64, math.Pow(10, float64(r.Intn(80)-40)))
		}
		v = append(v, blk...)
	}
	return v
}

// accValues returns n starting values for DecodeAdd: mostly ordinary
// numbers, with zeros of both signs, infinities and NaNs of every kind
// mixed in so that NaN + NaN, Inf + -Inf and -0 + +0 all occur.
func accValues(r *rand.Rand, n int) []float32 {
	sp := specialValues()
	v := gaussScaled(r, n, 1)
	for i := range v {
		switch r.Intn(8) {
		case 0:
			v[i] = sp[r.Intn(len(sp))]
		case 1:
			v[i] = math.Float32frombits(r.Uint32())
		}
	}
	return v
}

// ---- tests ----

func TestKernelsAvailable(t *testing.T) {
	t.Logf("useAsm = %v", useAsm)
}

// TestKernelsMatchGo compares both paths on many kinds of input, every
// length from 0 to 300, and odd alignments.
// namedVec is a test input and what to call it in failures.
type namedVec struct {
	name string
	v    []float32
}

// kernelInputs are the vectors the kernels are compared on: Gaussians over
// the whole float32 range, random bit patterns, special values, fp16 and
// int8 ties, blocks mixing magnitudes, zeros.
func kernelInputs(r *rand.Rand) []namedVec {
	var inputs []namedVec
	for _, s := range []float64{1e-42, 1e-38, 1e-30, 1e-10, 1e-7, 1e-5, 1e-3, 1, 1e3, 3e4, 6.5e4, 1e6, 1e10, 1e30, 1e37, 1e38} {
		inputs = append(inputs, namedVec{fmt.Sprintf("gauss %g", s), gaussScaled(r, 1000, s)})
	}
	return append(inputs,
		namedVec{"random bits", randBits(r, 2000)},
		namedVec{"specials", specialValues()},
		namedVec{"fp16 ties", f16Ties(r, 3000)},
		namedVec{"int8 ties", int8Ties(r, 40)},
		namedVec{"mixed blocks", mixedBlocks(r, 200)},
		namedVec{"zeros", make([]float32, 300)},
	)
}

func TestKernelsMatchGo(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for _, in := range kernelInputs(r) {
		acc := accValues(r, len(in.v))
		for _, c := range kernelCodecs() {
			checkPaths(t, c, in.v, acc, in.name)
			checkPaths(t, c, unalignedF32(in.v[1:]), acc, in.name+" unaligned")
		}
	}
	// Every length 0..300: tails of every size after 8-, 16-, 32- and
	// 64-value groups, from several inputs.
	long := [][]float32{gaussScaled(r, 300, 1e-3), mixedBlocks(r, 5), randBits(r, 300)}
	for k, v := range long {
		acc := accValues(r, 300)
		for n := 0; n <= 300; n++ {
			for _, c := range kernelCodecs() {
				checkPaths(t, c, v[:n], acc, fmt.Sprintf("length %d input %d", n, k))
			}
		}
	}
}

// TestKernelsSpecialsEverywhere puts each special value at every position
// of a 64-value group of ordinary values, so that each lane of the vector
// code sees it.
func TestKernelsSpecialsEverywhere(t *testing.T) {
	r := rand.New(rand.NewSource(2))
	base := gaussScaled(r, 96, 1)
	acc := accValues(r, 96)
	for _, x := range specialValues() {
		for pos := 0; pos < 64; pos += 7 {
			v := append([]float32(nil), base...)
			v[pos] = x
			v[pos+32] = -x
			for _, c := range kernelCodecs() {
				checkPaths(t, c, v, acc, fmt.Sprintf("special %#08x at %d", math.Float32bits(x), pos))
			}
		}
	}
}

// TestKernelsFP16AllCodes decodes every binary16 code (NaNs included) and
// adds it to values of every kind; encodes every code's value, its float32
// neighbours and the ties between codes.
func TestKernelsFP16AllCodes(t *testing.T) {
	c := FP16()
	r := rand.New(rand.NewSource(3))
	enc := make([]byte, 2*65536)
	for h := 0; h < 65536; h++ {
		binary.LittleEndian.PutUint16(enc[2*h:], uint16(h))
	}
	acc := accValues(r, 65536)
	if d := diffDecode(c, fastPath(c), goPath(c), enc, 65536, acc); d != "" {
		t.Fatal(d)
	}
	// Decode must agree with the definition for every code: the Go table
	// is checked against f16Value in TestFP16AllCodes.
	dec := make([]float32, 65536)
	if err := c.Decode(dec, enc); err != nil {
		t.Fatal(err)
	}
	tb := f16Decoder()
	if i := firstDiff(dec, tb[:]); i >= 0 {
		t.Fatalf("code %#04x decodes to %#08x, table %#08x", i, math.Float32bits(dec[i]), math.Float32bits(tb[i]))
	}
	src := make([]float32, 0, 5*65536)
	for _, x := range dec {
		b := math.Float32bits(x)
		src = append(src, x, math.Float32frombits(b+1), math.Float32frombits(b-1))
	}
	src = append(src, f16Ties(r, 2*65536)...)
	checkPaths(t, c, src, accValues(r, len(src)), "fp16 codes and neighbours")
}

// TestKernelsBF16AllCodes decodes every bf16 pattern and encodes every
// upper half with the low halves that matter for rounding.
func TestKernelsBF16AllCodes(t *testing.T) {
	c := BF16()
	r := rand.New(rand.NewSource(4))
	enc := make([]byte, 2*65536)
	for h := 0; h < 65536; h++ {
		binary.LittleEndian.PutUint16(enc[2*h:], uint16(h))
	}
	if d := diffDecode(c, fastPath(c), goPath(c), enc, 65536, accValues(r, 65536)); d != "" {
		t.Fatal(d)
	}
	dec := make([]float32, 65536)
	if err := c.Decode(dec, enc); err != nil {
		t.Fatal(err)
	}
	for h, x := range dec {
		if math.Float32bits(x) != uint32(h)<<16 {
			t.Fatalf("bf16 %#04x decodes to %#08x", h, math.Float32bits(x))
		}
	}
	src := make([]float32, 0, 7*65536)
	for hi := uint32(0); hi < 65536; hi++ {
		for _, lo := range []uint32{0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, r.Uint32() & 0xFFFF} {
			src = append(src, math.Float32frombits(hi<<16|lo))
		}
	}
	checkPaths(t, c, src, accValues(r, len(src)), "bf16 patterns")
}

// TestKernelsNaNPlusNaN: DecodeAdd where dst and the decoded value are
// both NaN (quiet and signaling, both signs) must keep dst's NaN in both
// paths, and so must a NaN added to a number.
func TestKernelsNaNPlusNaN(t *testing.T) {
	f := math.Float32frombits
	nans := []float32{f(0x7FC00000), f(0xFFC00000), f(0x7F800001), f(0xFF800001), f(0x7FC12345), f(0xFFBFFFFF), f(0x7FFF0000), f(0xFF810000)}
	var src, acc []float32
	for _, a := range nans {
		for _, b := range nans {
			src = append(src, b)
			acc = append(acc, a)
		}
		src = append(src, 1, a, float32(math.Inf(1)))
		acc = append(acc, a, 2, float32(math.Inf(-1)))
	}
	for len(src)%64 != 0 {
		src, acc = append(src, src[len(src)%7]), append(acc, acc[len(acc)%5])
	}
	for _, c := range kernelCodecs() {
		checkPaths(t, c, src, acc, "NaN + NaN")
		// Raw NaN codes too (fp16 and bf16 Encode never write some of them).
		enc := make([]byte, c.EncodedLen(len(src)))
		for i, x := range src {
			b := math.Float32bits(x)
			switch c.EncodedLen(1) {
			case 2:
				binary.LittleEndian.PutUint16(enc[2*i:], uint16(b>>16)|uint16(b>>13)&1)
			case 4:
				binary.LittleEndian.PutUint32(enc[4*i:], b)
			}
		}
		if c.Name() != "int8" {
			if d := diffDecode(c, fastPath(c), goPath(c), enc, len(src), acc); d != "" {
				t.Fatal(d)
			}
		}
	}
	// The rule itself: dst's NaN, quieted.
	for _, a := range nans {
		for _, b := range nans {
			if g, w := math.Float32bits(addF32(a, b)), math.Float32bits(a)|0x00400000; g != w {
				t.Fatalf("addF32(%#08x, %#08x) = %#08x, want %#08x", math.Float32bits(a), math.Float32bits(b), g, w)
			}
		}
	}
}

// TestKernelsInt8Corrupt decodes int8 data with bad scales and -128 bytes
// in various blocks: both paths must return the same error.
func TestKernelsInt8Corrupt(t *testing.T) {
	c := Int8()
	r := rand.New(rand.NewSource(5))
	n := 64*10 + 17
	enc := make([]byte, c.EncodedLen(n))
	c.Encode(enc, gaussScaled(r, n, 1))
	acc := accValues(r, n)
	for blk := 0; blk <= 10; blk++ {
		for _, bad := range []uint32{0x7FC00000, 0x7F800000, 0xFF800000, 0x80000000, 0xBF800000, maxScaleBits + 1, maxScaleBits} {
			b := bytes.Clone(enc)
			binary.LittleEndian.PutUint32(b[68*blk:], bad)
			if d := diffDecode(c, fastPath(c), goPath(c), b, n, acc); d != "" {
				t.Fatal(d)
			}
		}
		for _, pos := range []int{4, 5, 35, 36, 67} {
			p := 68*blk + pos
			if p >= len(enc) {
				continue
			}
			b := bytes.Clone(enc)
			b[p] = 0x80
			if d := diffDecode(c, fastPath(c), goPath(c), b, n, acc); d != "" {
				t.Fatal(d)
			}
			// A bad scale in the same block takes precedence.
			binary.LittleEndian.PutUint32(b[68*blk:], 0xFFFFFFFF)
			if d := diffDecode(c, fastPath(c), goPath(c), b, n, acc); d != "" {
				t.Fatal(d)
			}
		}
	}
	for i := 0; i < 300; i++ {
		b := bytes.Clone(enc)
		for k := r.Intn(4); k >= 0; k-- {
			b[r.Intn(len(b))] = byte(r.Intn(256))
		}
		if d := diffDecode(c, fastPath(c), goPath(c), b, n, acc); d != "" {
			t.Fatal(d)
		}
	}
}

// TestKernelsCatchOneULP makes sure the comparison can fail: a fast path
// that is off by one ulp (or one bit) in one place must be reported.
func TestKernelsCatchOneULP(t *testing.T) {
	r := rand.New(rand.NewSource(6))
	src := gaussScaled(r, 200, 1)
	acc := accValues(r, 200)
	bump := func(v []float32, i int) { v[i] = math.Float32frombits(math.Float32bits(v[i]) + 1) }
	for _, c := range kernelCodecs() {
		slow := goPath(c)
		if d := diffPaths(c, fastPath(c), slow, src, acc); d != "" {
			t.Fatalf("unperturbed: %s", d)
		}
		broken := map[string]codecPath{}
		p := fastPath(c)
		p.enc = func(d []byte, s []float32) Info { info := fastPath(c).enc(d, s); d[len(d)/2] ^= 1; return info }
		broken["Encode"] = p
		p = fastPath(c)
		p.dec = func(d []float32, s []byte) error { err := fastPath(c).dec(d, s); bump(d, 77); return err }
		broken["Decode"] = p
		p = fastPath(c)
		p.decAdd = func(d []float32, s []byte) error { err := fastPath(c).decAdd(d, s); bump(d, 150); return err }
		broken["DecodeAdd"] = p
		if p.encFB != nil {
			p = fastPath(c)
			p.encFB = func(d []byte, s, res []float32) Info { info := fastPath(c).encFB(d, s, res); bump(res, 3); return info }
			broken["EncodeFeedback"] = p
		}
		for op, p := range broken {
			if d := diffPaths(c, p, slow, src, acc); d == "" {
				t.Errorf("%s: a one-ulp error in %s went unnoticed", c.Name(), op)
			}
		}
	}
}

// ---- fuzzing ----

// tame maps arbitrary bits to a float32 whose exponent lies in [lo, lo+span)
// (keeping sign and mantissa), so that fuzzed inputs mostly take the
// kernels' fast paths instead of being NaN or huge.
func tame(b uint32, lo, span uint32) float32 {
	e := lo + (b>>23&0xFF)%span
	return math.Float32frombits(b&0x807FFFFF | e<<23)
}

func fuzzKernels(f *testing.F, c Codec) {
	r := rand.New(rand.NewSource(7))
	add := func(v []float32) {
		b := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
		}
		f.Add(b, uint8(0))
	}
	add(gaussScaled(r, 200, 1e-3))
	add(specialValues())
	add(mixedBlocks(r, 4))
	add(f16Ties(r, 100))
	add(int8Ties(r, 2))
	fast, slow := fastPath(c), goPath(c)
	f.Fuzz(func(t *testing.T, data []byte, shift uint8) {
		data = data[min(int(shift%4), len(data)):]
		n := len(data) / 4
		raw := make([]float32, n)
		tamed := make([]float32, n)
		lo, span := uint32(127-40), uint32(60)
		if c.Name() == "fp16" {
			lo, span = 127-26, 44
		}
		for i := range raw {
			b := binary.LittleEndian.Uint32(data[4*i:])
			raw[i] = math.Float32frombits(b)
			tamed[i] = tame(b, lo, span)
			if shift&0x80 != 0 && i%61 == 7 {
				tamed[i] = raw[i] // sprinkle the raw (special) values in
			}
		}
		acc := make([]float32, len(data)/2+1)
		for i := range acc {
			var b uint32
			if n > 0 {
				b = binary.LittleEndian.Uint32(data[4*(i%n):])
			}
			acc[i] = math.Float32frombits(b ^ uint32(i)*0x9E3779B9)
		}
		for _, src := range [][]float32{raw, tamed} {
			if d := diffPaths(c, fast, slow, src, acc[:n]); d != "" {
				t.Fatal(d)
			}
		}
		// The bytes themselves as encoded data, of the right length.
		m := 0
		for c.EncodedLen(m+1) <= len(data) && m+1 < len(acc) {
			m++
		}
		if d := diffDecode(c, fast, slow, data[:c.EncodedLen(m)], m, acc[:m]); d != "" {
			t.Fatal(d)
		}
		if c.Name() == "int8" && m > 0 {
			// Mostly valid int8 data: clear the sign and top exponent bit
			// of each scale (so it is <= maxScaleBits) and, unless shift
			// says otherwise, replace -128 bytes.
			b := bytes.Clone(data[:c.EncodedLen(m)])
			for off := 0; off < len(b); off += 68 {
				binary.LittleEndian.PutUint32(b[off:], binary.LittleEndian.Uint32(b[off:])&0x7BFFFFFF)
				for j := off + 4; j < min(off+68, len(b)); j++ {
					if b[j] == 0x80 && shift&0x40 == 0 {
						b[j] = 0x81
					}
				}
			}
			if d := diffDecode(c, fast, slow, b, m, acc[:m]); d != "" {
				t.Fatal(d)
			}
		}
	})
}

func FuzzKernelsInt8(f *testing.F) { fuzzKernels(f, Int8()) }
func FuzzKernelsFP16(f *testing.F) { fuzzKernels(f, FP16()) }
func FuzzKernelsBF16(f *testing.F) { fuzzKernels(f, BF16()) }
func FuzzKernelsNone(f *testing.F) { fuzzKernels(f, None()) }

// TestKernelsTakeFastPath checks that on ordinary gradients the kernels do
// all the work (they do not hand everything back to Go, which would make
// the comparisons above vacuous) and stop exactly where they should.
func TestKernelsTakeFastPath(t *testing.T) {
	if !useAsm {
		t.Skip("no kernels on this build or CPU")
	}
	r := rand.New(rand.NewSource(8))
	src := gaussScaled(r, 64*16, 1e-3)
	enc := make([]byte, Int8().EncodedLen(len(src)))
	res := make([]float32, len(src))
	if k := int8Enc64(&enc[0], &src[0], 16); k != 16 {
		t.Errorf("int8Enc64 did %d of 16 blocks", k)
	}
	if k := int8EncRes64(&enc[0], &src[0], &res[0], 16); k != 16 {
		t.Errorf("int8EncRes64 did %d of 16 blocks", k)
	}
	dec := make([]float32, len(src))
	if k := int8Dec64(&dec[0], &enc[0], 16); k != 16 {
		t.Errorf("int8Dec64 did %d of 16 blocks", k)
	}
	if k := int8DecAdd64(&dec[0], &enc[0], 16); k != 16 {
		t.Errorf("int8DecAdd64 did %d of 16 blocks", k)
	}
	enc[68*5+30] = 0x80 // block 5 is corrupt
	if k := int8Dec64(&dec[0], &enc[0], 16); k != 5 {
		t.Errorf("int8Dec64 stopped after %d blocks, want 5", k)
	}
	src[64*9+3] = float32(math.Inf(-1)) // block 9 needs the slow path
	if k := int8Enc64(&enc[0], &src[0], 16); k != 9 {
		t.Errorf("int8Enc64 stopped after %d blocks, want 9", k)
	}

	src = gaussScaled(r, 1000, 1)
	h := make([]byte, 2*len(src))
	if k := f16Enc(&h[0], &src[0], 1000); k != 1000 {
		t.Errorf("f16Enc did %d of 1000 values", k)
	}
	if k := f16EncRes(&h[0], &src[0], &res[0], 1000); k != 1000 {
		t.Errorf("f16EncRes did %d of 1000 values", k)
	}
	if k := f16Dec(&dec[0], &h[0], 1000); k != 1000 {
		t.Errorf("f16Dec did %d of 1000 values", k)
	}
	if k := f16DecAdd(&dec[0], &h[0], 1000); k != 1000 {
		t.Errorf("f16DecAdd did %d of 1000 values", k)
	}
	binary.LittleEndian.PutUint16(h[2*333:], 0x7C01) // NaN code in group 328..335
	if k := f16Dec(&dec[0], &h[0], 1000); k != 328 {
		t.Errorf("f16Dec stopped at %d, want 328", k)
	}
	src[517] = 70000 // clamp: stops at the start of its 32-group
	if k := f16Enc(&h[0], &src[0], 1000); k != 512 {
		t.Errorf("f16Enc stopped at %d, want 512", k)
	}
}

// TestDecodeAddErrors: DecodeAdd rejects what Decode rejects, with the same
// error, and EncodeFeedback panics on a short residual slice.
func TestDecodeAddErrors(t *testing.T) {
	for _, c := range allCodecs() {
		for _, n := range []int{1, 20, 64, 200} {
			buf := make([]byte, c.EncodedLen(n))
			c.Encode(buf, gradients(n, 1))
			for _, b := range [][]byte{buf[:0], buf[:len(buf)-1], append(bytes.Clone(buf), 0)} {
				e1 := c.Decode(make([]float32, n), b)
				e2 := c.(AccumulateDecoder).DecodeAdd(make([]float32, n), b)
				if e1 == nil || errString(e1) != errString(e2) {
					t.Errorf("%s n=%d len %d: Decode %v, DecodeAdd %v", c.Name(), n, len(b), e1, e2)
				}
			}
		}
		fe, ok := c.(FeedbackEncoder)
		if !ok {
			continue
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: EncodeFeedback with a short residual did not panic", c.Name())
				}
			}()
			fe.EncodeFeedback(make([]byte, c.EncodedLen(10)), make([]float32, 10), make([]float32, 9))
		}()
	}
}
