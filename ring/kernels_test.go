package ring

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// kernelImpls are the two ways a reduction runs: reduceBytes (the AVX2
// assembly where there is a kernel for the pair on this machine) and the Go
// kernels alone, which are the fallback on other CPUs and architectures.
var kernelImpls = []struct {
	name   string
	reduce func(dt DType, op Op, dst, a, b []byte)
}{
	{"reduceBytes", reduceBytes},
	{"reduceGo", reduceGo},
}

// TestKernels checks the kernels against a plain loop for every type, op
// and every length 0..40 (covers the unrolled body and the tail),
// including the aliasing dst == a used by Allreduce.
func TestKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	check := func(impl string, reduce func(DType, Op, []byte, []byte, []byte), dt DType, op Op, n int) {
		a := make([]float64, n)
		b := make([]float64, n)
		for i := range a {
			a[i], b[i] = float64(rng.IntN(21)-10), float64(rng.IntN(21)-10)
		}
		want := reference(dt, op, [][]float64{a, b})
		if op == Avg { // kernels do not divide; Avg reduces as Sum
			want = reference(dt, Sum, [][]float64{a, b})
		}
		ab, bb := encode(dt, a), encode(dt, b)
		dst := growAligned(nil, len(ab))[:len(ab)]
		reduce(dt, op, dst, ab, bb)
		reduce(dt, op, ab, ab, bb) // in place
		for i, w := range want {
			if got := decode(dt, dst)[i]; got != w {
				t.Fatalf("%s: %s %s n=%d [%d]: got %v want %v", impl, dt, op, n, i, got, w)
			}
			if got := decode(dt, ab)[i]; got != w {
				t.Fatalf("%s: %s %s n=%d in place [%d]: got %v want %v", impl, dt, op, n, i, got, w)
			}
		}
	}
	for _, impl := range kernelImpls {
		for _, dt := range reduceTypes {
			for _, op := range allOps {
				for n := 0; n <= 40; n++ {
					check(impl.name, impl.reduce, dt, op, n)
				}
			}
		}
	}
}

// randomElem returns the bits of a random element of dt, biased towards the
// values where a vector kernel could diverge from the Go kernels: for
// floats NaNs with random payloads (quiet and signalling, either sign),
// infinities, signed zeros, subnormals and values whose sum or product
// overflows or underflows; for integers the extremes, so that Sum and Prod
// wrap.
func randomElem(rng *rand.Rand, dt DType) uint64 {
	sign := uint64(rng.IntN(2))
	switch dt {
	case Float32:
		s := sign << 31
		switch rng.IntN(10) {
		case 0: // NaN, quiet or signalling, random payload
			return s | 0x7f800000 | 1 + uint64(rng.Uint32N(0x7fffff))
		case 1:
			return s | 0x7f800000 // ±Inf
		case 2:
			return s // ±0
		case 3:
			return s | uint64(rng.Uint32N(0x800000)) // subnormal
		case 4:
			return s | 0x7f7fffff - uint64(rng.IntN(1000)) // near MaxFloat32
		case 5:
			return s | 0x00800000 + uint64(rng.IntN(1000)) // near the smallest normal
		default:
			return uint64(math.Float32bits(float32(rng.NormFloat64() * 100)))
		}
	case Float64:
		s := sign << 63
		switch rng.IntN(10) {
		case 0:
			return s | 0x7ff0000000000000 | 1 + rng.Uint64N(0xfffffffffffff)
		case 1:
			return s | 0x7ff0000000000000
		case 2:
			return s
		case 3:
			return s | rng.Uint64N(0x10000000000000)
		case 4:
			return s | 0x7fefffffffffffff - uint64(rng.IntN(1000))
		case 5:
			return s | 0x0010000000000000 + uint64(rng.IntN(1000))
		default:
			return math.Float64bits(rng.NormFloat64() * 100)
		}
	case Int32:
		switch rng.IntN(4) {
		case 0:
			return uint64(uint32(math.MaxInt32 - rng.Int32N(3)))
		case 1:
			return uint64(uint32(math.MinInt32 + rng.Int32N(3)))
		default:
			return uint64(rng.Uint32())
		}
	case Int64:
		switch rng.IntN(4) {
		case 0:
			return uint64(math.MaxInt64 - rng.Int64N(3))
		case 1:
			return uint64(math.MinInt64 + rng.Int64N(3))
		default:
			return rng.Uint64()
		}
	}
	panic("ring: no random elements for " + dt.String())
}

// randomElems returns n random elements of dt (see randomElem), encoded.
func randomElems(rng *rand.Rand, dt DType, n int) []byte {
	sz := dt.Size()
	out := make([]byte, n*sz)
	for i := 0; i < n; i++ {
		v := randomElem(rng, dt)
		if sz == 4 {
			binary.LittleEndian.PutUint32(out[i*sz:], uint32(v))
		} else {
			binary.LittleEndian.PutUint64(out[i*sz:], v)
		}
	}
	return out
}

// unalignedCopy returns a copy of src starting off bytes past an aligned
// address, so that off = 1..7 makes it misaligned for every element size.
func unalignedCopy(src []byte, off int) []byte {
	buf := growAligned(nil, len(src)+off)
	out := buf[off : off+len(src) : off+len(src)]
	copy(out, src)
	return out
}

// sameAsGoKernel checks one element of an assembly kernel's result (got)
// against the Go kernel's (want), given the element's inputs a and b. They
// must be bitwise equal, with one exception: when both inputs are NaN,
// IEEE 754 leaves open which payload the result carries, and so does Go:
// x86 returns its first operand's NaN, and which of a and b the compiler
// makes the first operand of ADDSS/MULSS differs between builds (a in a
// normal build of the Go kernels, b with -race). The assembly always makes
// a the first operand, so there got must be a's NaN, quietened.
func sameAsGoKernel(dt DType, got, want, a, b []byte) error {
	if bytes.Equal(got, want) {
		return nil
	}
	var isNaN func([]byte) bool
	var quiet func([]byte) []byte
	switch dt {
	case Float32:
		le := binary.LittleEndian
		isNaN = func(x []byte) bool { return math.IsNaN(float64(math.Float32frombits(le.Uint32(x)))) }
		quiet = func(x []byte) []byte { return le.AppendUint32(nil, le.Uint32(x)|1<<22) }
	case Float64:
		le := binary.LittleEndian
		isNaN = func(x []byte) bool { return math.IsNaN(math.Float64frombits(le.Uint64(x))) }
		quiet = func(x []byte) []byte { return le.AppendUint64(nil, le.Uint64(x)|1<<51) }
	}
	if isNaN != nil && isNaN(a) && isNaN(b) && bytes.Equal(got, quiet(a)) &&
		(bytes.Equal(want, quiet(a)) || bytes.Equal(want, quiet(b))) {
		return nil
	}
	return fmt.Errorf("got %x, Go kernel gives %x (inputs %x, %x)", got, want, a, b)
}

// TestKernelsAVX2 checks that the assembly kernels give bitwise the same
// result as the Go kernels (reduceGo, on aligned copies; see sameAsGoKernel
// for NaN op NaN) for every
// (type, op) pair that has one, on random data full of NaNs, infinities,
// signed zeros, subnormals and overflowing values, at every length 0..70
// and some large odd ones, with dst, a and b at different misalignments,
// and with dst aliasing a, b or both.
func TestKernelsAVX2(t *testing.T) {
	if !useAVX2 {
		t.Skip("no AVX2 kernels on this machine")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var lengths []int
	for n := 0; n <= 70; n++ {
		lengths = append(lengths, n)
	}
	lengths = append(lengths, 127, 1001, 4099, 40009)
	offsets := [][3]int{{0, 0, 0}, {1, 2, 3}, {3, 0, 5}, {4, 4, 4}, {7, 6, 1}}
	routed := 0
	for _, dt := range reduceTypes {
		sz := dt.Size()
		for _, op := range allOps {
			// A zero-length call does nothing but report whether the
			// pair has a kernel.
			if !reduceAVX2(dt, op, nil, nil, nil) {
				continue // the Go kernels run: covered by TestKernels
			}
			routed++
			for _, n := range lengths {
				a, b := randomElems(rng, dt, n), randomElems(rng, dt, n)
				ref := func(x, y []byte) []byte {
					want := growAligned(nil, len(x))[:len(x)]
					reduceGo(dt, op, want, unalignedCopy(x, 0), unalignedCopy(y, 0))
					return want
				}
				wantAB, wantAA := ref(a, b), ref(a, a)
				for _, off := range offsets {
					ua, ub := unalignedCopy(a, off[1]), unalignedCopy(b, off[2])
					cases := []struct {
						name      string
						dst, x, y []byte
						inA, inB  []byte // the inputs x and y held before the call
						want      []byte
					}{
						{"distinct", unalignedCopy(make([]byte, len(a)), off[0]), ua, ub, a, b, wantAB},
						{"dst=a", ua, ua, unalignedCopy(b, off[2]), a, b, wantAB},
						{"dst=b", ub, unalignedCopy(a, off[1]), ub, a, b, wantAB},
						{"dst=a=b", unalignedCopy(a, off[0]), nil, nil, a, a, wantAA},
					}
					cases[3].x, cases[3].y = cases[3].dst, cases[3].dst
					for _, c := range cases {
						reduceAVX2(dt, op, c.dst, c.x, c.y)
						if bytes.Equal(c.dst, c.want) {
							continue
						}
						for i := 0; i < len(c.dst); i += sz {
							j := i + sz
							if err := sameAsGoKernel(dt, c.dst[i:j], c.want[i:j], c.inA[i:j], c.inB[i:j]); err != nil {
								t.Fatalf("%s %s n=%d offsets=%v %s: element %d: %v", dt, op, n, off, c.name, i/sz, err)
							}
						}
					}
				}
			}
		}
	}
	// Sum and Avg of all four types, Prod of three, Min and Max of int32.
	if want := 4*2 + 3 + 2; routed != want {
		t.Errorf("%d (type, op) pairs have AVX2 kernels, want %d", routed, want)
	}
}

// TestMinMaxNaN documents the float semantics of Min/Max: Go's builtin
// min/max, so a NaN in either operand yields NaN, and -0 < +0.
func TestMinMaxNaN(t *testing.T) {
	nan := math.NaN()
	negz := math.Copysign(0, -1)
	a := encode(Float64, []float64{nan, 1, negz, 0})
	b := encode(Float64, []float64{1, nan, 0, negz})
	dst := make([]byte, len(a))
	reduceBytes(Float64, Min, dst, a, b)
	got := decode(Float64, dst)
	if !math.IsNaN(got[0]) || !math.IsNaN(got[1]) || !math.Signbit(got[2]) || !math.Signbit(got[3]) {
		t.Fatalf("min: %v", got)
	}
	reduceBytes(Float64, Max, dst, a, b)
	got = decode(Float64, dst)
	if !math.IsNaN(got[0]) || !math.IsNaN(got[1]) || math.Signbit(got[2]) || math.Signbit(got[3]) {
		t.Fatalf("max: %v", got)
	}
}
