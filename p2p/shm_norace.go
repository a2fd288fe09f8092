//go:build !race

package p2p

// The race detector's view of shm rings, in builds without it: nothing.

// See shm_race.go: only race-enabled builds need the order made visible.

func raceReleaseIO() {}
func raceAcquireIO() {}
