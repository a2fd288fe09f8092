//go:build !amd64 || purego

package ring

// Only amd64 has assembly kernels; elsewhere, and with the purego build
// tag, reduceBytes always runs the Go kernels in kernels.go.

const useAVX2 = false

func reduceAVX2(dt DType, op Op, dst, a, b []byte) bool { return false }
