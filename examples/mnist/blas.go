package main

// blasName names the BLAS behind the matrix products: gonum's pure-Go one
// by default, OpenBLAS when built with -tags openblas (blas_openblas.go).
var blasName = "gonum (pure Go)"
