package ring

import "unsafe"

// Reduction kernels: dst[i] = a[i] op b[i] over typed views of byte slices.
//
// In the ring, a is the local contribution (dst may alias a: Allreduce
// reduces in place) and b is the chunk just received from the previous rank.
// The kernels are the hot path of Allreduce, so on amd64 with AVX2,
// reduceBytes runs the assembly kernels in kernels_amd64.s (256-bit vector
// ops, eight float32 at a time; the Go compiler does not vectorise; see
// BENCHMARKS.md, "Reduction kernels") for Sum/Avg of every type, Prod of
// float32, float64 and int32, and Min/Max of int32. Their results are
// bitwise identical to the Go kernels (element-wise IEEE add/mul in the
// same rounding mode, wrapping integer add/mul), so ranks with and without
// AVX2 agree; TestKernelsAVX2 checks this on NaNs, infinities, signed
// zeros, subnormals and overflow.
// The one thing neither IEEE 754 nor Go fixes is the payload of NaN op NaN:
// x86 returns the first operand's, the assembly always makes that a, and
// so does a normal build of the Go kernels (a -race build makes it b).
// Float Min/Max stay in Go because VMINPS/VMAXPS treat NaN and -0/+0
// differently from Go's min/max, and AVX2 has no int64 multiply or min/max.
//
// The Go kernels below are the fallback and the reference. Each loop is
// unrolled by 8 over fixed-size subslices (d := dst[i:i+8:i+8]) which lets
// the compiler drop every bounds check inside the unrolled body, leaving two
// slice checks per 8 elements (verified with -gcflags=-d=ssa/check_bce); the
// generic functions are instantiated separately for float32, float64, int32
// and int64 (distinct GC shapes), so there is no dictionary indirection.
// BenchmarkReduce* compares them with a naive element loop.

type number interface {
	~float32 | ~float64 | ~int32 | ~int64
}

func sumK[T number](dst, a, b []T) {
	n := len(dst)
	a, b = a[:n], b[:n]
	i := 0
	for ; i <= n-8; i += 8 {
		d, x, y := dst[i:i+8:i+8], a[i:i+8:i+8], b[i:i+8:i+8]
		d[0] = x[0] + y[0]
		d[1] = x[1] + y[1]
		d[2] = x[2] + y[2]
		d[3] = x[3] + y[3]
		d[4] = x[4] + y[4]
		d[5] = x[5] + y[5]
		d[6] = x[6] + y[6]
		d[7] = x[7] + y[7]
	}
	for ; i < n; i++ {
		dst[i] = a[i] + b[i]
	}
}

func prodK[T number](dst, a, b []T) {
	n := len(dst)
	a, b = a[:n], b[:n]
	i := 0
	for ; i <= n-8; i += 8 {
		d, x, y := dst[i:i+8:i+8], a[i:i+8:i+8], b[i:i+8:i+8]
		d[0] = x[0] * y[0]
		d[1] = x[1] * y[1]
		d[2] = x[2] * y[2]
		d[3] = x[3] * y[3]
		d[4] = x[4] * y[4]
		d[5] = x[5] * y[5]
		d[6] = x[6] * y[6]
		d[7] = x[7] * y[7]
	}
	for ; i < n; i++ {
		dst[i] = a[i] * b[i]
	}
}

func minK[T number](dst, a, b []T) {
	n := len(dst)
	a, b = a[:n], b[:n]
	i := 0
	for ; i <= n-8; i += 8 {
		d, x, y := dst[i:i+8:i+8], a[i:i+8:i+8], b[i:i+8:i+8]
		d[0] = min(x[0], y[0])
		d[1] = min(x[1], y[1])
		d[2] = min(x[2], y[2])
		d[3] = min(x[3], y[3])
		d[4] = min(x[4], y[4])
		d[5] = min(x[5], y[5])
		d[6] = min(x[6], y[6])
		d[7] = min(x[7], y[7])
	}
	for ; i < n; i++ {
		dst[i] = min(a[i], b[i])
	}
}

func maxK[T number](dst, a, b []T) {
	n := len(dst)
	a, b = a[:n], b[:n]
	i := 0
	for ; i <= n-8; i += 8 {
		d, x, y := dst[i:i+8:i+8], a[i:i+8:i+8], b[i:i+8:i+8]
		d[0] = max(x[0], y[0])
		d[1] = max(x[1], y[1])
		d[2] = max(x[2], y[2])
		d[3] = max(x[3], y[3])
		d[4] = max(x[4], y[4])
		d[5] = max(x[5], y[5])
		d[6] = max(x[6], y[6])
		d[7] = max(x[7], y[7])
	}
	for ; i < n; i++ {
		dst[i] = max(a[i], b[i])
	}
}

// divK divides every element by n (truncating for integers).
func divK[T number](dst []T, n T) {
	for i := range dst {
		dst[i] /= n
	}
}

func reduceT[T number](op Op, dst, a, b []T) {
	switch op {
	case Sum, Avg:
		sumK(dst, a, b)
	case Prod:
		prodK(dst, a, b)
	case Min:
		minK(dst, a, b)
	case Max:
		maxK(dst, a, b)
	default:
		panic("ring: bad op " + op.String())
	}
}

// view reinterprets b as a []T. b must be aligned for T (see aligned).
func view[T number](b []byte) []T {
	if len(b) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/int(unsafe.Sizeof(z)))
}

// aligned reports whether b can be viewed as a slice of elements of size sz.
func aligned(b []byte, sz int) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))%uintptr(sz) == 0
}

// reduceBytes computes dst = a op b elementwise for dtype dt. dst, a and b
// must have equal lengths, a multiple of dt.Size(), and be aligned for dt
// (the Ring realigns user buffers through scratch space when they are not).
// dst may alias a or b exactly.
func reduceBytes(dt DType, op Op, dst, a, b []byte) {
	if useAVX2 && reduceAVX2(dt, op, dst, a, b) {
		return
	}
	reduceGo(dt, op, dst, a, b)
}

// reduceGo is reduceBytes with the Go kernels only: the fallback, and the
// reference the assembly kernels are tested against.
func reduceGo(dt DType, op Op, dst, a, b []byte) {
	switch dt {
	case Float32:
		reduceT(op, view[float32](dst), view[float32](a), view[float32](b))
	case Float64:
		reduceT(op, view[float64](dst), view[float64](a), view[float64](b))
	case Int32:
		reduceT(op, view[int32](dst), view[int32](a), view[int32](b))
	case Int64:
		reduceT(op, view[int64](dst), view[int64](a), view[int64](b))
	default:
		panic("ring: cannot reduce " + dt.String())
	}
}

// divBytes divides every element of dst by n (the Avg finalisation).
func divBytes(dt DType, dst []byte, n int) {
	switch dt {
	case Float32:
		divK(view[float32](dst), float32(n))
	case Float64:
		divK(view[float64](dst), float64(n))
	case Int32:
		divK(view[int32](dst), int32(n))
	case Int64:
		divK(view[int64](dst), int64(n))
	default:
		panic("ring: cannot average " + dt.String())
	}
}
