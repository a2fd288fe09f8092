//go:build openblas

package main

// Built with -tags openblas, the matrix products go to OpenBLAS's
// cblas_sgemm through cgo (Debian: apt-get install libopenblas-dev). The
// default build stays pure Go (gonum's BLAS) and works everywhere.

/*
#cgo LDFLAGS: -lopenblas
#include <cblas.h>
*/
import "C"

import (
	"unsafe"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
	"gorgonia.org/tensor"
)

// openBLAS is gonum's BLAS with Sgemm, the only routine the MLP's matrix
// products use, replaced by OpenBLAS's.
type openBLAS struct{ gonum.Implementation }

func trans(t blas.Transpose) C.enum_CBLAS_TRANSPOSE {
	if t == blas.NoTrans {
		return C.CblasNoTrans
	}
	return C.CblasTrans
}

func (openBLAS) Sgemm(tA, tB blas.Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	C.cblas_sgemm(C.CblasRowMajor, trans(tA), trans(tB), C.blasint(m), C.blasint(n), C.blasint(k),
		C.float(alpha), (*C.float)(unsafe.Pointer(&a[0])), C.blasint(lda),
		(*C.float)(unsafe.Pointer(&b[0])), C.blasint(ldb),
		C.float(beta), (*C.float)(unsafe.Pointer(&c[0])), C.blasint(ldc))
}

func init() {
	tensor.Use(openBLAS{})
	blasName = "OpenBLAS (cgo)"
}
