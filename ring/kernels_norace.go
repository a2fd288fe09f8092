//go:build !race

package ring

// raceKernelAccess annotates assembly kernels' memory accesses for the
// race detector; see kernels_race.go.
func raceKernelAccess(dst, a, b []byte) {}
