//go:build linux

package compress

import "syscall"

// threadCPU returns the CPU time consumed by the calling thread, in
// nanoseconds (RUSAGE_THREAD), so that benchmarks on a shared machine can
// report throughput per core-second of CPU actually received.
func threadCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
