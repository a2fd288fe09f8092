//go:build !amd64

package ring

// Only amd64 has assembly kernels; elsewhere reduceBytes always runs the Go
// kernels in kernels.go.

const useAVX2 = false

func reduceAVX2(dt DType, op Op, dst, a, b []byte) bool { return false }
