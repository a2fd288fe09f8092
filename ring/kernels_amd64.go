//go:build amd64 && !purego

package ring

import "golang.org/x/sys/cpu"

// useAVX2 selects the assembly kernels in kernels_amd64.s. cpu.X86.HasAVX2
// is only set when the OS also saves the YMM registers, so the kernels are
// safe to run whenever it is true.
var useAVX2 = cpu.X86.HasAVX2

// The AVX2 kernels reduce len(dst) bytes (rounded down to whole elements);
// reduceAVX2 guarantees len(a), len(b) >= len(dst) before calling them.

//go:noescape
func sumFloat32AVX2(dst, a, b []byte)

//go:noescape
func sumFloat64AVX2(dst, a, b []byte)

//go:noescape
func sumInt32AVX2(dst, a, b []byte)

//go:noescape
func sumInt64AVX2(dst, a, b []byte)

//go:noescape
func prodFloat32AVX2(dst, a, b []byte)

//go:noescape
func prodFloat64AVX2(dst, a, b []byte)

//go:noescape
func prodInt32AVX2(dst, a, b []byte)

//go:noescape
func minInt32AVX2(dst, a, b []byte)

//go:noescape
func maxInt32AVX2(dst, a, b []byte)

// reduceAVX2 runs the assembly kernel for (dt, op) and reports whether there
// was one; when it returns false the caller runs the Go kernel. It must only
// be called when useAVX2 is true. There is deliberately no kernel where the
// result would not be bitwise identical to the Go kernels or AVX2 has no
// instruction: float Min/Max (VMINPS/VMAXPS differ from Go's min/max on NaN
// and signed zero), int64 Prod and int64 Min/Max. The calls are direct (not
// through a func value) so that the slices do not escape.
func reduceAVX2(dt DType, op Op, dst, a, b []byte) bool {
	n := len(dst)
	a, b = a[:n], b[:n] // the bounds check the assembly relies on
	raceKernelAccess(dst, a, b)
	switch op {
	case Sum, Avg:
		switch dt {
		case Float32:
			sumFloat32AVX2(dst, a, b)
		case Float64:
			sumFloat64AVX2(dst, a, b)
		case Int32:
			sumInt32AVX2(dst, a, b)
		case Int64:
			sumInt64AVX2(dst, a, b)
		default:
			return false
		}
	case Prod:
		switch dt {
		case Float32:
			prodFloat32AVX2(dst, a, b)
		case Float64:
			prodFloat64AVX2(dst, a, b)
		case Int32:
			prodInt32AVX2(dst, a, b)
		default:
			return false
		}
	case Min:
		if dt != Int32 {
			return false
		}
		minInt32AVX2(dst, a, b)
	case Max:
		if dt != Int32 {
			return false
		}
		maxInt32AVX2(dst, a, b)
	default:
		return false
	}
	return true
}
