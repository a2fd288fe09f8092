package ring

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestKernels checks the unrolled kernels against a plain loop for every
// type, op and every length 0..40 (covers the unrolled body and the tail),
// including the aliasing dst == a used by Allreduce.
func TestKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	check := func(dt DType, op Op, n int) {
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
		reduceBytes(dt, op, dst, ab, bb)
		reduceBytes(dt, op, ab, ab, bb) // in place
		for i, w := range want {
			if got := decode(dt, dst)[i]; got != w {
				t.Fatalf("%s %s n=%d [%d]: got %v want %v", dt, op, n, i, got, w)
			}
			if got := decode(dt, ab)[i]; got != w {
				t.Fatalf("%s %s n=%d in place [%d]: got %v want %v", dt, op, n, i, got, w)
			}
		}
	}
	for _, dt := range reduceTypes {
		for _, op := range allOps {
			for n := 0; n <= 40; n++ {
				check(dt, op, n)
			}
		}
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
