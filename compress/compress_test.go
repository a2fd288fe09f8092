package compress

import (
	"bytes"
	"encoding/binary"
	"flag"
	"math"
	"math/rand"
	"strings"
	"sync"
	"testing"
)

func allCodecs() []Codec { return []Codec{None(), FP16(), BF16(), Int8(), Int8(WithBlockSize(7))} }

func roundTrip(t *testing.T, c Codec, src []float32) ([]float32, Info) {
	t.Helper()
	buf := make([]byte, c.EncodedLen(len(src)))
	info := c.Encode(buf, src)
	got := make([]float32, len(src))
	if err := c.Decode(got, buf); err != nil {
		t.Fatalf("%s: decode: %v", c.Name(), err)
	}
	return got, info
}

func TestByName(t *testing.T) {
	for _, name := range Names() {
		c, err := ByName(name)
		if err != nil || c.Name() != name {
			t.Fatalf("ByName(%q) = %v, %v", name, c, err)
		}
	}
	_, err := ByName("zstd")
	if err == nil {
		t.Fatal("ByName(zstd) succeeded")
	}
	for _, name := range Names() {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error %q does not list %q", err, name)
		}
	}
}

func TestEncodedLen(t *testing.T) {
	for _, tc := range []struct {
		c    Codec
		n    int
		want int
	}{
		{None(), 10, 40}, {FP16(), 10, 20}, {BF16(), 10, 20},
		{Int8(), 0, 0}, {Int8(), 1, 5}, {Int8(), 64, 68}, {Int8(), 65, 73},
		{Int8(WithBlockSize(7)), 15, 15 + 12},
	} {
		if got := tc.c.EncodedLen(tc.n); got != tc.want {
			t.Errorf("%s.EncodedLen(%d) = %d, want %d", tc.c.Name(), tc.n, got, tc.want)
		}
	}
	n := 1 << 20
	if r := float64(Int8().EncodedLen(n)) / float64(4*n); r > 0.27 {
		t.Errorf("int8 wire ratio %.4f > 0.27", r)
	}
}

func TestInt8BadBlockSizePanics(t *testing.T) {
	for _, n := range []int{0, -1, MaxBlockSize + 1} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("WithBlockSize(%d) did not panic", n)
				}
			}()
			Int8(WithBlockSize(n))
		}()
	}
}

func TestNoneExact(t *testing.T) {
	src := []float32{0, float32(math.Copysign(0, -1)), 1, -1.5, math.MaxFloat32, math.SmallestNonzeroFloat32,
		float32(math.Inf(1)), float32(math.Inf(-1)), math.Float32frombits(0x7FC00001), math.Float32frombits(0xFF800123)}
	src = append(src, gradients(1001, 3)...)
	got, _ := roundTrip(t, None(), src)
	for i := range src {
		if math.Float32bits(got[i]) != math.Float32bits(src[i]) {
			t.Fatalf("none: value %d: %#x -> %#x", i, math.Float32bits(src[i]), math.Float32bits(got[i]))
		}
	}
	buf := make([]byte, 4*len(src))
	None().Encode(buf, src)
	for i, x := range src {
		if binary.LittleEndian.Uint32(buf[4*i:]) != math.Float32bits(x) {
			t.Fatalf("none: value %d not little-endian float32", i)
		}
	}
}

// refF16 is an independent reference: round |x| (exact in float64) to a
// multiple of the binary16 quantum of its binade with math.RoundToEven,
// clamp at 65504, and build the code from the definition of the format.
func refF16(x float32) (uint16, bool) {
	sign := uint16(math.Float32bits(x)>>16) & 0x8000
	if x != x {
		return sign | 0x7E00, false
	}
	a := math.Abs(float64(x))
	if a > 65504 {
		return sign | 0x7BFF, true
	}
	if a == 0 {
		return sign, false
	}
	_, e := math.Frexp(a) // a = f * 2^e, f in [0.5, 1)
	e--                   // a in [2^e, 2^(e+1))
	q := math.Ldexp(1, max(e, -14)-10)
	v := math.RoundToEven(a/q) * q
	if v == 0 {
		return sign, false
	}
	_, e = math.Frexp(v)
	e--
	if e < -14 {
		return sign | uint16(v/math.Ldexp(1, -24)), false
	}
	return sign | uint16(e+15)<<10 | uint16((v/math.Ldexp(1, e)-1)*1024), false
}

// f16Value decodes binary16 bits to float64 from the definition.
func f16Value(h uint16) float64 {
	e := int(h>>10) & 0x1F
	m := float64(h & 0x3FF)
	var v float64
	switch e {
	case 0:
		v = math.Ldexp(m, -24)
	case 31:
		if m != 0 {
			v = math.NaN()
		} else {
			v = math.Inf(1)
		}
	default:
		v = math.Ldexp(1+m/1024, e-15)
	}
	if h&0x8000 != 0 {
		v = -v
	}
	return v
}

func f16Specials() []float32 {
	return []float32{
		0, float32(math.Copysign(0, -1)), 1, -1, 65504, -65504, 65519.99, 65520, -70000, 1e30,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), -float32(math.NaN()),
		5.9604645e-08, // smallest subnormal 2^-24
		2.9802322e-08, // 2^-25: tie -> 0
		2.9802326e-08, // just above 2^-25 -> 2^-24
		8.940697e-08,  // 1.5*2^-24: tie -> 2^-23
		6.097555e-05,  // largest subnormal
		6.1035156e-05, // smallest normal 2^-14
		6.1000000e-05, // rounds within subnormals
		1.0009765625,  // 1 + 2^-10
		1.00048828125, // 1 + 2^-11: tie -> 1
		1.00146484375, // 1 + 3*2^-11: tie -> 1+2^-9
		math.SmallestNonzeroFloat32, 1e-10, 3.14159265, 2047.5, 2049, 4097,
	}
}

func TestFP16Specials(t *testing.T) {
	c := FP16()
	src := f16Specials()
	buf, clamped := encodeF16VsReference(t, src)
	if clamped != 6 {
		t.Errorf("Clamped = %d, want 6", clamped)
	}
	dec := make([]float32, len(src))
	if err := c.Decode(dec, buf); err != nil {
		t.Fatal(err)
	}
	for i := range src {
		h := binary.LittleEndian.Uint16(buf[2*i:])
		w := f16Value(h)
		if math.IsNaN(w) {
			if !math.IsNaN(float64(dec[i])) || math.Signbit(float64(dec[i])) != math.Signbit(float64(src[i])) {
				t.Errorf("NaN %d decoded as %v", i, dec[i])
			}
			continue
		}
		if float64(dec[i]) != w || math.Signbit(float64(dec[i])) != (h&0x8000 != 0) {
			t.Errorf("decode %#04x = %g, want %g", h, dec[i], w)
		}
	}
}

// TestFP16AllCodes decodes every binary16 pattern and re-encodes it: decode
// must match the definition and encode(decode(h)) must give back h.
func TestFP16AllCodes(t *testing.T) {
	c := FP16()
	buf := make([]byte, 2*65536)
	for h := 0; h < 65536; h++ {
		binary.LittleEndian.PutUint16(buf[2*h:], uint16(h))
	}
	dec := make([]float32, 65536)
	if err := c.Decode(dec, buf); err != nil {
		t.Fatal(err)
	}
	re := make([]byte, len(buf))
	info := c.Encode(re, dec)
	for h := 0; h < 65536; h++ {
		w := f16Value(uint16(h))
		got := dec[h]
		isInf := h&0x7FFF == 0x7C00
		if math.IsNaN(w) {
			if got == got {
				t.Fatalf("%#04x: decoded %g, want NaN", h, got)
			}
		} else if float64(got) != w || math.Signbit(float64(got)) != (h&0x8000 != 0) {
			t.Fatalf("%#04x: decoded %g, want %g", h, got, w)
		}
		r := binary.LittleEndian.Uint16(re[2*h:])
		switch {
		case math.IsNaN(w):
			if r&0x7C00 != 0x7C00 || r&0x3FF == 0 {
				t.Fatalf("%#04x: NaN re-encoded as %#04x", h, r)
			}
		case isInf:
			if r != uint16(h&0x8000)|0x7BFF {
				t.Fatalf("%#04x: Inf re-encoded as %#04x, want clamp", h, r)
			}
		case r != uint16(h):
			t.Fatalf("%#04x: re-encoded as %#04x", h, r)
		}
	}
	if info.Clamped != 2 {
		t.Errorf("Clamped = %d, want 2 (±Inf)", info.Clamped)
	}
}

// TestFP16RandomVsReference checks random float32 bit patterns in and
// around the binary16 range against the math/big reference, and that the
// fast (chunked) path agrees with the per-value path.
func TestFP16RandomVsReference(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	n := 200000
	src := make([]float32, n)
	for i := range src {
		// exponents from 2^-26 to 2^17, random mantissa and sign
		e := 127 - 26 + r.Intn(44)
		src[i] = math.Float32frombits(uint32(r.Intn(2))<<31 | uint32(e)<<23 | uint32(r.Intn(1<<23)))
	}
	encodeF16VsReference(t, src)
}

// encodeF16VsReference encodes src with FP16 and checks every value and the
// clamp count against the math/big reference; it returns the encoding and
// the number of values clamped.
func encodeF16VsReference(t *testing.T, src []float32) (buf []byte, clamped int) {
	t.Helper()
	c := FP16()
	buf = make([]byte, c.EncodedLen(len(src)))
	info := c.Encode(buf, src)
	for i, x := range src {
		want, cl := refF16(x)
		if cl {
			clamped++
		}
		if got := binary.LittleEndian.Uint16(buf[2*i:]); got != want {
			t.Fatalf("fp16(%g [%#08x]) = %#04x, want %#04x", x, math.Float32bits(x), got, want)
		}
	}
	if info.Clamped != clamped {
		t.Fatalf("Clamped = %d, reference %d", info.Clamped, clamped)
	}
	return buf, clamped
}

func refBF16(x float32) uint16 {
	b := math.Float32bits(x)
	if x != x {
		return uint16(b>>16) | 0x40
	}
	lo, hi := b&^0xFFFF, b&^0xFFFF+0x10000
	d := b & 0xFFFF
	switch {
	case d < 0x8000:
		return uint16(lo >> 16)
	case d > 0x8000:
		return uint16(hi >> 16)
	case (lo>>16)&1 == 0:
		return uint16(lo >> 16)
	}
	return uint16(hi >> 16)
}

func TestBF16VsReference(t *testing.T) {
	src := append(f16Specials(), math.MaxFloat32, -math.MaxFloat32,
		math.Float32frombits(0x7F800001), math.Float32frombits(0xFF812345), math.Float32frombits(0x3F808000),
		math.Float32frombits(0x3F818000), math.Float32frombits(0x3F808001), math.Float32frombits(0x00008000))
	r := rand.New(rand.NewSource(8))
	for i := 0; i < 5000; i++ {
		src = append(src, math.Float32frombits(r.Uint32()))
	}
	// Whole chunks of ordinary values with one NaN that would carry across
	// SWAR lanes (0xFFFF8000 and up) or round to Inf.
	for k, nan := range []uint32{0xFFFF8000, 0xFFFFFFFF, 0x7F800001, 0x7FFFFFFF, 0xFF800001} {
		for len(src)%bf16Chunk != 0 {
			src = append(src, 1)
		}
		for i := 0; i < 2*bf16Chunk; i++ {
			x := float32(r.NormFloat64())
			if i == 5+13*k {
				x = math.Float32frombits(nan)
			}
			src = append(src, x)
		}
	}
	c := BF16()
	buf := make([]byte, c.EncodedLen(len(src)))
	if info := c.Encode(buf, src); info.Clamped != 0 {
		t.Errorf("bf16 Clamped = %d", info.Clamped)
	}
	dec := make([]float32, len(src))
	if err := c.Decode(dec, buf); err != nil {
		t.Fatal(err)
	}
	for i, x := range src {
		want := refBF16(x)
		got := binary.LittleEndian.Uint16(buf[2*i:])
		if got != want {
			t.Fatalf("bf16(%g [%#08x]) = %#04x, want %#04x", x, math.Float32bits(x), got, want)
		}
		if math.Float32bits(dec[i]) != uint32(got)<<16 {
			t.Fatalf("bf16 decode %#04x = %#08x", got, math.Float32bits(dec[i]))
		}
		if x != x && dec[i] == dec[i] {
			t.Fatalf("bf16: NaN %#08x lost", math.Float32bits(x))
		}
	}
}

func gaussian(n int, seed int64) ([]float32, []float64) {
	r := rand.New(rand.NewSource(seed))
	f := make([]float32, n)
	w := make([]float64, n)
	for i := range f {
		f[i] = float32(r.NormFloat64())
		w[i] = float64(f[i])
	}
	return f, w
}

func TestGaussianError(t *testing.T) {
	src, want := gaussian(1<<16+13, 11)
	for _, tc := range []struct {
		c   Codec
		max float64
	}{
		{None(), 0},
		{FP16(), 3e-4},   // 11-bit significand: ~2^-11/sqrt(3)
		{BF16(), 2.5e-3}, // 8-bit significand: ~2^-8/sqrt(3)
		// Default block 64: step = absmax/127 with absmax ~2.4σ gives
		// ~0.59% (see doc.go); smaller blocks trade wire size for accuracy.
		{Int8(), 6.5e-3},
		{Int8(WithBlockSize(16)), 5e-3},
	} {
		got, _ := roundTrip(t, tc.c, src)
		e := RelRMSE(got, want)
		t.Logf("%s rel RMSE %.3g", tc.c.Name(), e)
		if e > tc.max {
			t.Errorf("%s: rel RMSE %.4g > %.4g", tc.c.Name(), e, tc.max)
		}
	}
}

func TestInt8Format(t *testing.T) {
	c := Int8(WithBlockSize(4))
	src := []float32{1, -0.5, 0.25, 0.0039370079 /* block 2 */, 0, 0, 0, 0 /* block 3 partial */, -254, 1.5}
	buf := make([]byte, c.EncodedLen(len(src)))
	c.Encode(buf, src)
	want := new(bytes.Buffer)
	put := func(scale float32, q ...int8) {
		binary.Write(want, binary.LittleEndian, scale)
		binary.Write(want, binary.LittleEndian, q)
	}
	put(float32(1)/127, 127, -64, 32, 1) // -63.5 -> -64 (half away), 31.75 -> 32
	put(0, 0, 0, 0, 0)
	put(2, -127, 1) // 1.5/2 = 0.75 -> 1
	if !bytes.Equal(buf, want.Bytes()) {
		t.Fatalf("int8 bytes\n got %x\nwant %x", buf, want.Bytes())
	}
	dec := make([]float32, len(src))
	if err := c.Decode(dec, buf); err != nil {
		t.Fatal(err)
	}
	if dec[8] != -254 || dec[9] != 2 || dec[4] != 0 || dec[0] != 1 {
		t.Errorf("decoded %v", dec)
	}
}

func TestRoundAway(t *testing.T) {
	r := rand.New(rand.NewSource(5))
	check := func(x float32) {
		if want := int32(math.Round(float64(x))); roundAway(x) != want {
			t.Fatalf("roundAway(%v [%#08x]) = %d, want %d", x, math.Float32bits(x), roundAway(x), want)
		}
	}
	for _, x := range []float32{0, 0.5, -0.5, 0.49999997, -0.49999997, 1.5, 2.5, -2.5, 126.5, 127.49999, 0.50000006} {
		check(x)
	}
	for i := 0; i < 200000; i++ {
		check(math.Float32frombits(r.Uint32()%0x43000000 | uint32(r.Intn(2))<<31))
	}
}

func TestInt8NonFiniteAndTiny(t *testing.T) {
	c := Int8(WithBlockSize(4))
	inf := float32(math.Inf(1))
	src := []float32{2, float32(math.NaN()), -inf, 1 /**/, inf, float32(math.NaN()), 0, 0 /**/, 1e-42, -3e-43, 1e-45, 0 /**/, 1e-38, -2e-39, 0, 0}
	got, info := roundTrip(t, c, src)
	if info.Clamped != 4 {
		t.Errorf("Clamped = %d, want 4", info.Clamped)
	}
	want := []float32{2, 0, -2, 1, 0, 0, 0, 0}
	for i, w := range want {
		if math.Abs(float64(got[i]-w)) > 0.01 {
			t.Errorf("value %d: got %v want %v", i, got[i], w)
		}
	}
	for i := 8; i < len(src); i++ {
		if math.IsNaN(float64(got[i])) || math.IsInf(float64(got[i]), 0) || math.Abs(float64(got[i]-src[i])) > 1e-40 {
			t.Errorf("tiny value %d: got %v want %v", i, got[i], src[i])
		}
	}
}

func TestInt8Huge(t *testing.T) {
	c := Int8(WithBlockSize(4))
	m := float32(math.MaxFloat32)
	src := []float32{m, -m, m / 2, 1e30, 2e38, -3e38, 1, 0}
	got, info := roundTrip(t, c, src)
	if info.Clamped != 0 {
		t.Errorf("Clamped = %d", info.Clamped)
	}
	want := []float64{float64(m), -float64(m), float64(m) / 2, 0, 2e38, -3e38, 0, 0}
	for i, w := range want {
		g := float64(got[i])
		if math.IsInf(g, 0) || math.Abs(g-w) > 0.51*float64(m)/127 {
			t.Errorf("value %d: got %g, want %g", i, g, w)
		}
	}
}

func TestDeterminism(t *testing.T) {
	src := gradients(10007, 4)
	src[17] = float32(math.NaN())
	src[300] = 1e6
	for _, c := range allCodecs() {
		a := make([]byte, c.EncodedLen(len(src)))
		b := make([]byte, c.EncodedLen(len(src)))
		for i := range b {
			b[i] = 0xAA // garbage must be overwritten
		}
		ia, ib := c.Encode(a, src), c.Encode(b, src)
		if !bytes.Equal(a, b) || ia != ib {
			t.Errorf("%s: two encodings differ", c.Name())
		}
		// Concurrent use gives the same bytes too.
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d := make([]byte, len(a))
				c.Encode(d, src)
				if !bytes.Equal(a, d) {
					t.Errorf("%s: concurrent encoding differs", c.Name())
				}
			}()
		}
		wg.Wait()
	}
}

func TestTailLengths(t *testing.T) {
	base := gradients(300, 9)
	for _, c := range allCodecs() {
		ref := make([]byte, c.EncodedLen(len(base)))
		_ = ref
		for n := 0; n <= 140; n++ {
			src := base[:n]
			got, _ := roundTrip(t, c, src)
			// Each value must round-trip like it does alone in a full-size
			// encoding for elementwise codecs.
			if c.Name() == "fp16" || c.Name() == "bf16" || c.Name() == "none" {
				one, _ := roundTrip(t, c, src)
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(one[i]) {
						t.Fatalf("%s n=%d: value %d differs", c.Name(), n, i)
					}
				}
			}
			want := make([]float64, n)
			for i, x := range src {
				want[i] = float64(x)
			}
			if e := RelRMSE(got, want); e > 0.02 {
				t.Fatalf("%s n=%d: rel error %g", c.Name(), n, e)
			}
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	for _, c := range allCodecs() {
		n := 20
		buf := make([]byte, c.EncodedLen(n))
		c.Encode(buf, gradients(n, 1))
		dst := make([]float32, n)
		for _, l := range []int{0, len(buf) - 1} {
			if err := c.Decode(dst, buf[:l]); err == nil {
				t.Errorf("%s: Decode accepted %d bytes", c.Name(), l)
			}
		}
		if err := c.Decode(dst, append(buf, 0)); err == nil {
			t.Errorf("%s: Decode accepted an extra byte", c.Name())
		}
		if err := c.Decode(dst[:n-1], buf); err == nil {
			t.Errorf("%s: Decode accepted n-1 values", c.Name())
		}
	}
	c := Int8()
	n := 100
	buf := make([]byte, c.EncodedLen(n))
	c.Encode(buf, gradients(n, 1))
	dst := make([]float32, n)
	for _, bad := range []uint32{0x7FC00000, 0x7F800000, 0xFF800000, 0xBF800000, 0x80000000, maxScaleBits + 1, 0x7E303030} {
		for _, blk := range []int{0, 1} { // a full and the partial block
			b := bytes.Clone(buf)
			binary.LittleEndian.PutUint32(b[blk*68:], bad)
			if err := c.Decode(dst, b); err == nil {
				t.Errorf("int8: accepted scale %#08x in block %d", bad, blk)
			}
		}
	}
	for _, pos := range []int{4, 11, 67, 72, 103} {
		b := bytes.Clone(buf)
		b[pos] = 0x80
		if err := c.Decode(dst, b); err == nil {
			t.Errorf("int8: accepted -128 at byte %d", pos)
		}
	}
}

func TestEncodeShortDstPanics(t *testing.T) {
	for _, c := range allCodecs() {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: Encode into a short dst did not panic", c.Name())
				}
			}()
			c.Encode(make([]byte, c.EncodedLen(10)-1), make([]float32, 10))
		}()
	}
}

func TestRelRMSE(t *testing.T) {
	if e := RelRMSE([]float32{1, 2}, []float64{1, 2}); e != 0 {
		t.Errorf("exact: %g", e)
	}
	if e := RelRMSE([]float32{0, 0}, []float64{3, 4}); e != 1 {
		t.Errorf("zero: %g", e)
	}
	if e := RelRMSE([]float32{1}, []float64{0}); !math.IsInf(e, 1) {
		t.Errorf("zero want: %g", e)
	}
	if e := RelRMSE([]float32{1}, nil); !math.IsNaN(e) {
		t.Errorf("length mismatch: %g", e)
	}
}

// TestErrorFeedback: sending the int8 encoding of the same vector 200
// times, with error feedback the running total tracks the exact total to
// 1e-3; without it every step repeats the same rounding error.
func TestErrorFeedback(t *testing.T) {
	const steps = 200
	n := 4096
	v, _ := gaussian(n, 21)
	c := Int8()
	exact := make([]float64, n)
	for i, x := range v {
		exact[i] = steps * float64(x)
	}
	run := func(feedback bool) float64 {
		res := NewResiduals()
		total := make([]float64, n)
		meant := make([]float32, n)
		sent := make([]float32, n)
		var buf []byte
		for s := 0; s < steps; s++ {
			copy(meant, v)
			if feedback {
				res.Apply("w", meant)
			}
			var err error
			_, buf, err = RoundTrip(c, sent, meant, buf)
			if err != nil {
				t.Fatal(err)
			}
			if feedback {
				res.Update("w", meant, sent)
			}
			for i, x := range sent {
				total[i] += float64(x)
			}
		}
		got := make([]float32, n)
		for i := range total {
			got[i] = float32(total[i])
		}
		return RelRMSE(got, exact)
	}
	with, without := run(true), run(false)
	t.Logf("rel error of the total: %.3g with feedback, %.3g without", with, without)
	if with > 1e-3 {
		t.Errorf("with error feedback: rel error %g > 1e-3", with)
	}
	if without < 3e-3 || without < 20*with {
		t.Errorf("without error feedback: rel error %g, not clearly worse than %g", without, with)
	}
}

func TestResiduals(t *testing.T) {
	r := NewResiduals()
	g := []float32{1, 2, 3}
	r.Apply("a", g) // none stored: no-op
	if g[0] != 1 || g[2] != 3 {
		t.Fatal("Apply without residual changed grad")
	}
	r.Update("a", []float32{1, 2, 3}, []float32{0.5, 2, 4})
	r.Apply("a", g)
	if g[0] != 1.5 || g[1] != 2 || g[2] != 2 {
		t.Fatalf("after Apply: %v", g)
	}
	r.Apply("b", g) // other name untouched
	if g[0] != 1.5 {
		t.Fatal("Apply of another name changed grad")
	}
	long := []float32{1, 1, 1, 1}
	r.Apply("a", long) // length differs: reset, no-op
	if long[0] != 1 {
		t.Fatal("Apply with a different length changed grad")
	}
	g = []float32{0, 0, 0}
	r.Apply("a", g)
	if g[0] != 0 {
		t.Fatal("residual not reset after length change")
	}
	r.Update("a", []float32{1, float32(math.Inf(1))}, []float32{0, 0})
	g2 := []float32{0, 0}
	r.Apply("a", g2)
	if g2[0] != 1 || g2[1] != 0 {
		t.Fatalf("non-finite residual kept: %v", g2)
	}
	r.Reset("a")
	g2 = []float32{0, 0}
	r.Apply("a", g2)
	if g2[0] != 0 {
		t.Fatal("Reset did not forget")
	}
	r.Update("x", []float32{1}, []float32{0})
	r.Update("y", []float32{1}, []float32{0})
	r.ResetAll()
	one := []float32{0}
	r.Apply("x", one)
	r.Apply("y", one)
	if one[0] != 0 {
		t.Fatal("ResetAll did not forget")
	}
}

func TestResidualsConcurrent(t *testing.T) {
	r := NewResiduals()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := []string{"a", "b", "c"}[g%3]
			v := make([]float32, 64)
			for i := 0; i < 200; i++ {
				r.Apply(name, v)
				r.Update(name, v, make([]float32, 64))
				if i%50 == 0 {
					r.Reset(name)
				}
				if i == 100 && g == 0 {
					r.ResetAll()
				}
			}
		}()
	}
	wg.Wait()
}

// fuzzDecode checks that Decode never panics and that a successful decode
// of int8 data gives finite values.
func fuzzDecode(f *testing.F, c Codec) {
	for _, n := range []int{0, 1, 5, 64, 65, 200} {
		buf := make([]byte, c.EncodedLen(n))
		c.Encode(buf, gradients(n, int64(n)))
		f.Add(buf, uint16(n))
	}
	f.Fuzz(func(t *testing.T, data []byte, n uint16) {
		dst := make([]float32, int(n)%4096)
		err := c.Decode(dst, data)
		if err == nil && len(data) != c.EncodedLen(len(dst)) {
			t.Fatalf("accepted %d bytes for %d values", len(data), len(dst))
		}
		if err == nil && c.Name() == "int8" {
			for _, x := range dst {
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
					t.Fatalf("int8 decoded non-finite %v", x)
				}
			}
			// Re-encoding the decoded values is stable (idempotent).
			re := make([]byte, len(data))
			c.Encode(re, dst)
			again := make([]float32, len(dst))
			if err := c.Decode(again, re); err != nil {
				t.Fatalf("re-encoded data rejected: %v", err)
			}
		}
		// Always exercise the exact-length path too.
		exact := make([]byte, c.EncodedLen(len(dst)))
		copy(exact, data)
		_ = c.Decode(dst, exact)
	})
}

func FuzzDecodeInt8(f *testing.F) { fuzzDecode(f, Int8(WithBlockSize(16))) }
func FuzzDecodeFP16(f *testing.F) { fuzzDecode(f, FP16()) }
func FuzzDecodeBF16(f *testing.F) { fuzzDecode(f, BF16()) }
func FuzzDecodeNone(f *testing.F) { fuzzDecode(f, None()) }

// FuzzEncode checks, for arbitrary float32 bit patterns, that every codec
// encodes deterministically, decodes its own output, and stays within its
// error bound for finite in-range values.
func FuzzEncode(f *testing.F) {
	f.Add([]byte{0, 0, 0x80, 0x7F, 1, 2, 3, 4, 0, 0, 0xC0, 0xFF})
	f.Fuzz(func(t *testing.T, data []byte) {
		src := make([]float32, len(data)/4)
		for i := range src {
			src[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
		for _, c := range allCodecs() {
			a := make([]byte, c.EncodedLen(len(src)))
			b := make([]byte, len(a))
			if c.Encode(a, src) != c.Encode(b, src) || !bytes.Equal(a, b) {
				t.Fatalf("%s: nondeterministic", c.Name())
			}
			dst := make([]float32, len(src))
			if err := c.Decode(dst, a); err != nil {
				t.Fatalf("%s: own output rejected: %v", c.Name(), err)
			}
			if c.Name() == "fp16" {
				for i, x := range src {
					want, _ := refF16(x)
					if got := binary.LittleEndian.Uint16(a[2*i:]); got != want {
						t.Fatalf("fp16(%#08x) = %#04x, want %#04x", math.Float32bits(x), got, want)
					}
				}
			}
			if c.Name() == "bf16" {
				for i, x := range src {
					if got, want := binary.LittleEndian.Uint16(a[2*i:]), refBF16(x); got != want {
						t.Fatalf("bf16(%#08x) = %#04x, want %#04x", math.Float32bits(x), got, want)
					}
				}
			}
		}
	})
}

// TestInt8AbsmaxIs127 checks, over the whole range of block maxima that
// take the fast path, that the largest value encodes as exactly ±127 (and
// never overflows to -128), as the no-clamp argument in Encode claims.
func TestInt8AbsmaxIs127(t *testing.T) {
	r := rand.New(rand.NewSource(13))
	c := Int8(WithBlockSize(8))
	src := make([]float32, 8)
	buf := make([]byte, c.EncodedLen(8))
	for i := 0; i < 100000; i++ {
		a := math.Float32frombits(0x01000000 + uint32(r.Int63n(0x7F7FFFFF-0x01000000)))
		src[0], src[1] = a, -a
		for j := 2; j < 8; j++ {
			src[j] = a * float32(r.Float64()*2-1)
		}
		c.Encode(buf, src)
		if buf[4] != 127 || buf[5] != 0x81 {
			t.Fatalf("absmax %g encoded as %d, %d", a, int8(buf[4]), int8(buf[5]))
		}
		for _, b := range buf[4:] {
			if b == 0x80 {
				t.Fatalf("absmax %g: -128 written", a)
			}
		}
	}
}

var exhaustive = flag.Bool("exhaustive", false, "check fp16 and bf16 Encode on all 2^32 float32 values (minutes)")

// TestExhaustive compares Encode with the references on every float32 bit
// pattern. It takes minutes, so it only runs with -exhaustive.
func TestExhaustive(t *testing.T) {
	if !*exhaustive {
		t.Skip("run with -exhaustive")
	}
	const chunk = 1 << 16
	src := make([]float32, chunk)
	h16 := make([]byte, 2*chunk)
	b16 := make([]byte, 2*chunk)
	// With the assembly kernels, also compare them with the Go code,
	// residuals included.
	gh, gb := make([]byte, 2*chunk), make([]byte, 2*chunk)
	rf, rg := make([]float32, chunk), make([]float32, chunk)
	for base := uint64(0); base < 1<<32; base += chunk {
		for i := range src {
			src[i] = math.Float32frombits(uint32(base) + uint32(i))
		}
		FP16().Encode(h16, src)
		BF16().Encode(b16, src)
		if useAsm {
			for _, c := range []Codec{FP16(), BF16()} {
				enc := h16
				if c.Name() == "bf16" {
					enc = b16
				}
				g := goPath(c)
				if g.enc(gh, src) != c.Encode(gb, src) || !bytes.Equal(gh, enc) || !bytes.Equal(gb, enc) {
					t.Fatalf("%s: kernels and Go differ in chunk %#08x", c.Name(), base)
				}
				c.(FeedbackEncoder).EncodeFeedback(gb, src, rf)
				g.encFB(gh, src, rg)
				if i := firstDiff(rf, rg); i >= 0 || !bytes.Equal(gb, enc) {
					t.Fatalf("%s: EncodeFeedback of %#08x: residual %#08x, Go %#08x", c.Name(), math.Float32bits(src[max(i, 0)]), math.Float32bits(rf[max(i, 0)]), math.Float32bits(rg[max(i, 0)]))
				}
			}
		}
		for i, x := range src {
			if g, w := binary.LittleEndian.Uint16(h16[2*i:]), first(refF16(x)); g != w {
				t.Fatalf("fp16(%#08x) = %#04x, want %#04x", math.Float32bits(x), g, w)
			}
			if g, w := binary.LittleEndian.Uint16(b16[2*i:]), refBF16(x); g != w {
				t.Fatalf("bf16(%#08x) = %#04x, want %#04x", math.Float32bits(x), g, w)
			}
		}
	}
}

func first(h uint16, _ bool) uint16 { return h }

// TestPortablePaths runs the loops used on big-endian hosts (selected by
// littleEndian) and checks they give the same bytes as the fast paths.
func TestPortablePaths(t *testing.T) {
	src := append(gradients(1000, 17), f16Specials()...)
	src = append(src, gradients(300, 18)...)
	src[100] = math.Float32frombits(0xFFFF8000)
	src[200] = 1e6
	if !littleEndian {
		t.Skip("host is big-endian: the portable paths are the only ones")
	}
	var want [][]byte
	for _, c := range allCodecs() {
		b := make([]byte, c.EncodedLen(len(src)))
		c.Encode(b, src)
		want = append(want, b)
	}
	littleEndian = false
	defer func() { littleEndian = true }()
	for i, c := range allCodecs() {
		b := make([]byte, c.EncodedLen(len(src)))
		c.Encode(b, src)
		if !bytes.Equal(b, want[i]) {
			t.Errorf("%s: portable Encode differs", c.Name())
		}
		got := make([]float32, len(src))
		if err := c.Decode(got, b); err != nil {
			t.Fatal(err)
		}
		if c.Name() == "none" {
			for i := range src {
				if math.Float32bits(got[i]) != math.Float32bits(src[i]) {
					t.Fatalf("none: portable Decode differs at %d", i)
				}
			}
		}
	}
}

// EncodeFeedback writes the same bytes as Encode and exactly the residual
// src - Decode(Encode(src)), including blocks that take the slow paths.
func TestInt8EncodeFeedback(t *testing.T) {
	c := Int8()
	fe := c.(FeedbackEncoder)
	src := make([]float32, 1000)
	rng := rand.New(rand.NewSource(5))
	for i := range src {
		src[i] = float32(rng.NormFloat64())
	}
	copy(src[64:128], make([]float32, 64)) // zero block
	src[200] = float32(math.Inf(1))        // slow block
	src[300], src[301] = 1e-40, -2e-41     // tiny block
	for i := 384; i < 448; i++ {
		src[i] = 1e-39 * float32(i-400)
	}
	want := make([]byte, c.EncodedLen(len(src)))
	wantInfo := c.Encode(want, src)
	got := make([]byte, len(want))
	res := make([]float32, len(src))
	gotInfo := fe.EncodeFeedback(got, src, res)
	if string(got) != string(want) || gotInfo != wantInfo {
		t.Fatalf("EncodeFeedback bytes or info differ from Encode (%v vs %v)", gotInfo, wantInfo)
	}
	dec := make([]float32, len(src))
	if err := c.Decode(dec, want); err != nil {
		t.Fatal(err)
	}
	for i := range src {
		w := src[i] - dec[i]
		if math.IsInf(float64(src[i]), 0) {
			continue // Inf - finite is Inf either way
		}
		if math.Float32bits(res[i]) != math.Float32bits(w) {
			t.Fatalf("residual %d = %v, want %v", i, res[i], w)
		}
	}
}
