//go:build !linux

package compress

func threadCPU() int64 { return 0 }
