package compress

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand"
	"slices"
	"testing"
)

// EncodeFeedbackAdd(dst, src, res) must give exactly what the two passes it
// replaces give: m[i] = addF32(src[i], res[i]), then EncodeFeedback(dst, m,
// res). These tests compare the fused call (asm and Go) with the two-pass
// way (asm and Go) bit for bit: bytes (and nothing written past
// EncodedLen), Info, residuals (and nothing written past len(src)).

func fbaCodecs() []Codec {
	var cs []Codec
	for _, c := range kernelCodecs() {
		if _, ok := c.(FeedbackAddEncoder); ok {
			cs = append(cs, c)
		}
	}
	return cs
}

// fbaOut is what one way of encoding produced.
type fbaOut struct {
	name string
	enc  []byte    // EncodedLen bytes and a guard
	res  []float32 // len(src) residuals and a sentinel
	info Info
}

// diffFBA runs the fused call of fast and slow on (src, res0) and the two
// passes of both on the same input, and describes the first difference
// from the Go two-pass result, or returns "". res0 has at least len(src)
// values and is not modified.
func diffFBA(c Codec, fast, slow codecPath, src, res0 []float32) string {
	n := len(src)
	L := c.EncodedLen(n)
	const guard = 9
	m := make([]float32, n)
	for i := range m {
		m[i] = addF32(src[i], res0[i])
	}
	run := func(name string, f func(d []byte, s, r []float32) Info, s []float32) fbaOut {
		d := make([]byte, L+guard+1)[1:] // odd address
		for i := range d {
			d[i] = 0xA5
		}
		r := unalignedF32(append(slices.Clone(res0[:n]), 7))
		info := f(d, s, r[:n])
		return fbaOut{name, d, r, info}
	}
	want := run("two-pass Go", slow.encFB, m)
	srcCopy := slices.Clone(src)
	for _, o := range []fbaOut{
		run("fused asm", fast.encFBA, src),
		run("fused Go", slow.encFBA, src),
		run("two-pass asm", fast.encFB, m),
	} {
		for j := range o.enc {
			if o.enc[j] != want.enc[j] {
				what := "byte"
				if j >= L {
					what = "byte past EncodedLen"
				}
				return fmt.Sprintf("%s n=%d: %s %s %d: %#02x, want %#02x", c.Name(), n, o.name, what, j, o.enc[j], want.enc[j])
			}
		}
		if o.info != want.info {
			return fmt.Sprintf("%s n=%d: %s Info %+v, want %+v", c.Name(), n, o.name, o.info, want.info)
		}
		if i := firstDiff(o.res, want.res); i >= 0 {
			if i == n {
				return fmt.Sprintf("%s n=%d: %s wrote the residual past len(src)", c.Name(), n, o.name)
			}
			return fmt.Sprintf("%s n=%d: %s residual %d of %#08x + %#08x: %#08x, want %#08x", c.Name(), n, o.name, i,
				math.Float32bits(src[i]), math.Float32bits(res0[i]), math.Float32bits(o.res[i]), math.Float32bits(want.res[i]))
		}
	}
	if i := firstDiff(src, srcCopy); i >= 0 {
		return fmt.Sprintf("%s n=%d: src %d modified", c.Name(), n, i)
	}
	return ""
}

func checkFBA(t *testing.T, c Codec, src, res []float32, what string) {
	t.Helper()
	if d := diffFBA(c, fastPath(c), goPath(c), src, res); d != "" {
		t.Fatalf("%s: %s", what, d)
	}
}

// resKinds returns residuals to add to src: zeros of both signs, typical
// residuals (a fraction of each value), values of every kind, -src (every
// sum is an exact zero), src itself (sums double; huge ones overflow), and
// src shifted by one.
func resKinds(r *rand.Rand, src []float32) []namedVec {
	n := len(src)
	zeros := make([]float32, n)
	for i := range zeros {
		if r.Intn(2) == 0 {
			zeros[i] = math.Float32frombits(0x80000000)
		}
	}
	small := make([]float32, n)
	neg := make([]float32, n)
	shifted := make([]float32, n)
	for i, x := range src {
		small[i] = float32(float64(x) * r.NormFloat64() / 300)
		neg[i] = -x
		if n > 0 {
			shifted[i] = src[(i+1)%n]
		}
	}
	return []namedVec{
		{"zero res", zeros},
		{"small res", small},
		{"any res", accValues(r, n)},
		{"-src res", neg},
		{"src res", slices.Clone(src)},
		{"shifted res", shifted},
	}
}

// TestEncodeFeedbackAddMatches compares the fused call with the two passes
// on the inputs of TestKernelsMatchGo and residuals of every kind, at odd
// alignments and every length from 0 to 300.
func TestEncodeFeedbackAddMatches(t *testing.T) {
	r := rand.New(rand.NewSource(11))
	for _, in := range kernelInputs(r) {
		for _, rk := range resKinds(r, in.v) {
			for _, c := range fbaCodecs() {
				what := in.name + ", " + rk.name
				checkFBA(t, c, in.v, rk.v, what)
				checkFBA(t, c, unalignedF32(in.v[1:]), rk.v[1:], what+", unaligned")
				// The same sums with the roles swapped: ties, specials and
				// huge values in the residual.
				checkFBA(t, c, rk.v, in.v, what+", swapped")
			}
		}
	}
	long := [][]float32{gaussScaled(r, 300, 1e-3), mixedBlocks(r, 5), randBits(r, 300)}
	for k, v := range long {
		kinds := resKinds(r, v)
		for n := 0; n <= 300; n++ {
			for _, rk := range kinds {
				for _, c := range fbaCodecs() {
					checkFBA(t, c, v[:n], rk.v, fmt.Sprintf("length %d input %d %s", n, k, rk.name))
				}
			}
		}
	}
}

// TestEncodeFeedbackAddSpecials puts each special value at various positions
// of a 64-value group, in src, in the residual, and in both (NaN + NaN,
// Inf + -Inf, a huge sum that overflows).
func TestEncodeFeedbackAddSpecials(t *testing.T) {
	r := rand.New(rand.NewSource(12))
	base := gaussScaled(r, 96, 1)
	small := gaussScaled(r, 96, 1e-3)
	sp := specialValues()
	for xi, x := range sp {
		y := sp[(xi*7+3)%len(sp)]
		for pos := 0; pos < 64; pos += 5 {
			s, rs := slices.Clone(base), slices.Clone(small)
			s[pos], s[pos+32] = x, -x
			s2, rs2 := slices.Clone(base), slices.Clone(small)
			rs2[pos], rs2[pos+32] = x, -x
			s3, rs3 := slices.Clone(base), slices.Clone(small)
			s3[pos], rs3[pos] = x, y
			s3[pos+32], rs3[pos+32] = x, x
			for _, c := range fbaCodecs() {
				what := fmt.Sprintf("special %#08x at %d", math.Float32bits(x), pos)
				checkFBA(t, c, s, rs, what+" in src")
				checkFBA(t, c, s2, rs2, what+" in res")
				checkFBA(t, c, s3, rs3, what+fmt.Sprintf(" in src, %#08x in res", math.Float32bits(y)))
			}
		}
	}
	// Every pair of NaNs (quiet, signaling, both signs): the sum must be
	// src's NaN, quieted, on both paths.
	f := math.Float32frombits
	nans := []float32{f(0x7FC00000), f(0xFFC00000), f(0x7F800001), f(0xFF800001), f(0x7FC12345), f(0xFFBFFFFF), f(0x7FFF0000), f(0xFF810000), 1, float32(math.Inf(-1))}
	var s, rs []float32
	for _, a := range nans {
		for _, b := range nans {
			s, rs = append(s, a), append(rs, b)
		}
	}
	for len(s)%64 != 0 {
		s, rs = append(s, 0.25), append(rs, -1)
	}
	for _, c := range fbaCodecs() {
		checkFBA(t, c, s, rs, "NaN + NaN")
	}
}

// TestEncodeFeedbackAddFastPath checks that on ordinary gradients the fused
// kernels do all the work, and that where they stop they have written
// nothing (the Go code redoes that group from the residual as it was).
func TestEncodeFeedbackAddFastPath(t *testing.T) {
	if !useAsm {
		t.Skip("no kernels on this build or CPU")
	}
	r := rand.New(rand.NewSource(13))
	src := gaussScaled(r, 64*16, 1e-3)
	res0 := gaussScaled(r, 64*16, 1e-6)
	enc := make([]byte, Int8().EncodedLen(len(src)))
	res := slices.Clone(res0)
	if k := int8EncAddRes64(&enc[0], &src[0], &res[0], 16); k != 16 {
		t.Errorf("int8EncAddRes64 did %d of 16 blocks", k)
	}
	src[64*9+3] = float32(math.Inf(-1)) // block 9 needs the slow path
	res = slices.Clone(res0)
	for i := range enc {
		enc[i] = 0xA5
	}
	if k := int8EncAddRes64(&enc[0], &src[0], &res[0], 16); k != 9 {
		t.Errorf("int8EncAddRes64 stopped after %d blocks, want 9", k)
	}
	if i := firstDiff(res[64*9:], res0[64*9:]); i >= 0 {
		t.Errorf("int8EncAddRes64 wrote residual %d past where it stopped", 64*9+i)
	}
	for i, b := range enc[68*9:] {
		if b != 0xA5 {
			t.Fatalf("int8EncAddRes64 wrote byte %d past where it stopped", 68*9+i)
		}
	}

	src = gaussScaled(r, 1000, 1)
	res0 = gaussScaled(r, 1000, 1e-3)
	h := make([]byte, 2*len(src))
	res = slices.Clone(res0)
	if k := f16EncAddRes(&h[0], &src[0], &res[0], 1000); k != 1000 {
		t.Errorf("f16EncAddRes did %d of 1000 values", k)
	}
	// src and res fit, their sum needs clamping: stops at its 32-group.
	src[700], res0[700] = 60000, 10000
	res = slices.Clone(res0)
	for i := range h {
		h[i] = 0xA5
	}
	if k := f16EncAddRes(&h[0], &src[0], &res[0], 1000); k != 672 {
		t.Errorf("f16EncAddRes stopped at %d, want 672", k)
	}
	if i := firstDiff(res[672:], res0[672:]); i >= 0 {
		t.Errorf("f16EncAddRes wrote residual %d past where it stopped", 672+i)
	}
	for i, b := range h[2*672:] {
		if b != 0xA5 {
			t.Fatalf("f16EncAddRes wrote byte %d past where it stopped", 2*672+i)
		}
	}
}

// TestEncodeFeedbackAddCatchOneULP makes sure the comparison can fail: a
// fused call off by one ulp in one residual, one bit in the bytes, one in
// Info, or reading one input one ulp off, must be reported.
func TestEncodeFeedbackAddCatchOneULP(t *testing.T) {
	r := rand.New(rand.NewSource(14))
	src := gaussScaled(r, 200, 1)
	res := gaussScaled(r, 200, 1e-3)
	bump := func(v []float32, i int) { v[i] = math.Float32frombits(math.Float32bits(v[i]) + 1) }
	for _, c := range fbaCodecs() {
		slow := goPath(c)
		if d := diffFBA(c, fastPath(c), slow, src, res); d != "" {
			t.Fatalf("unperturbed: %s", d)
		}
		fused := fastPath(c).encFBA
		broken := map[string]func(d []byte, s, r []float32) Info{
			"residual": func(d []byte, s, r []float32) Info { info := fused(d, s, r); bump(r, 3); return info },
			"bytes": func(d []byte, s, r []float32) Info {
				info := fused(d, s, r)
				d[c.EncodedLen(len(s))/2] ^= 1
				return info
			},
			"Info": func(d []byte, s, r []float32) Info { info := fused(d, s, r); info.Clamped++; return info },
			"input": func(d []byte, s, r []float32) Info {
				s = slices.Clone(s)
				bump(s, 150)
				return fused(d, s, r)
			},
		}
		for what, f := range broken {
			p := fastPath(c)
			p.encFBA = f
			if d := diffFBA(c, p, slow, src, res); d == "" {
				t.Errorf("%s: a one-ulp error in the %s went unnoticed", c.Name(), what)
			}
		}
	}
}

// TestEncodeFeedbackAddPanics: like EncodeFeedback, a short residual or dst
// is a programming error.
func TestEncodeFeedbackAddPanics(t *testing.T) {
	for _, c := range fbaCodecs() {
		for _, p := range []codecPath{fastPath(c), goPath(c)} {
			for _, tc := range []struct {
				dst int
				res int
			}{{c.EncodedLen(100), 99}, {c.EncodedLen(100) - 1, 100}} {
				func() {
					defer func() {
						if recover() == nil {
							t.Errorf("%s: EncodeFeedbackAdd with dst %d, res %d for 100 values did not panic", c.Name(), tc.dst, tc.res)
						}
					}()
					p.encFBA(make([]byte, tc.dst), make([]float32, 100), make([]float32, tc.res))
				}()
			}
		}
	}
}

func fuzzFBA(f *testing.F, c Codec) {
	r := rand.New(rand.NewSource(15))
	add := func(s, res []float32) {
		b := make([]byte, 4*(len(s)+len(res)))
		for i, x := range append(slices.Clone(s), res...) {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
		}
		f.Add(b, uint8(0))
	}
	g := gaussScaled(r, 200, 1e-3)
	add(g, gaussScaled(r, 200, 1e-6))
	add(specialValues(), accValues(r, len(specialValues())))
	add(mixedBlocks(r, 3), gaussScaled(r, 192, 1e-3))
	add(f16Ties(r, 100), make([]float32, 100))
	add(int8Ties(r, 2), make([]float32, 128))
	add(g, g)
	fast, slow := fastPath(c), goPath(c)
	f.Fuzz(func(t *testing.T, data []byte, shift uint8) {
		data = data[min(int(shift%4), len(data)):]
		n := len(data) / 8
		raw := make([]float32, 2*n)
		tamed := make([]float32, 2*n)
		lo, span := uint32(127-40), uint32(60)
		if c.Name() == "fp16" {
			lo, span = 127-26, 44
		}
		for i := range raw {
			b := binary.LittleEndian.Uint32(data[4*i:])
			raw[i] = math.Float32frombits(b)
			if i < n {
				tamed[i] = tame(b, lo, span)
			} else { // residuals: smaller than the values, as in training
				tamed[i] = tame(b, lo-10, span)
			}
			if shift&0x80 != 0 && i%61 == 7 {
				tamed[i] = raw[i]
			}
		}
		for _, v := range [][]float32{raw, tamed} {
			if d := diffFBA(c, fast, slow, v[:n], v[n:]); d != "" {
				t.Fatal(d)
			}
		}
		// Tamed values with raw residuals (specials in the residual only).
		if d := diffFBA(c, fast, slow, tamed[:n], raw[n:]); d != "" {
			t.Fatal(d)
		}
	})
}

func FuzzEncodeFeedbackAddInt8(f *testing.F) { fuzzFBA(f, Int8()) }
func FuzzEncodeFeedbackAddFP16(f *testing.F) { fuzzFBA(f, FP16()) }
func FuzzEncodeFeedbackAddBF16(f *testing.F) { fuzzFBA(f, BF16()) }
