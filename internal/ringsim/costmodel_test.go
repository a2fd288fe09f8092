package ringsim

import (
	"testing"
	"time"

	"github.com/gorun/gorun/ring"
)

// linksOf is nw as the ring's cost model (ring.Links) takes it, with a
// reduction so fast it costs nothing, as in the simulation.
func linksOf(nw Network) ring.Links {
	return ring.Links{
		Local:                ring.LinkCost{Latency: nw.LocalLatency, BytesPerSecond: int64(nw.LocalBandwidth / 8)},
		Cross:                ring.LinkCost{Latency: nw.Latency, BytesPerSecond: int64(nw.Bandwidth / 8)},
		ReduceBytesPerSecond: 1e15,
	}
}

// TestCostModelMatchesSimulation: the cost model the allreduce policy of
// a job across hosts is chosen by (ring.CrossHostPolicy) is this
// simulator's model: for the schedules whose time it gives in closed form
// (the ring, and Rabenseifner on a power of two), the two agree to within
// the rounding of their units. With several ranks on a host, so do the
// ring, whose path runs over both kinds of link, and the exchange
// schedules, whose ranks queue their messages at the host's NIC.
func TestCostModelMatchesSimulation(t *testing.T) {
	for _, c := range []struct {
		algo      ring.Algorithm
		p         int
		n         int64
		bandwidth float64
		perHost   int // ranks per host (0: 1)
	}{
		{ring.AlgoRing, 2, 1 << 10, 10e9, 0},
		{ring.AlgoRing, 4, 1 << 20, 10e9, 0},
		{ring.AlgoRing, 5, 5 << 16, 1e9, 0},
		{ring.AlgoRabenseifner, 8, 1 << 18, 25e9, 0},
		{ring.AlgoRabenseifner, 4, 1 << 16, 1e9, 0},
		{ring.AlgoRing, 8, 1 << 20, 100e9, 8},
		{ring.AlgoRing, 8, 32 << 20, 10e9, 8},
		{ring.AlgoRabenseifner, 8, 1 << 20, 100e9, 8},
		{ring.AlgoRecursiveDoubling, 8, 1 << 18, 100e9, 4},
	} {
		nw := DefaultNetwork(c.bandwidth)
		lay := Layout{Hosts: c.p, RanksPerHost: max(1, c.perHost)}
		// Scaled down (doc.go, "Large buffers"): the same messages, less data.
		sim := simulate(t, Allreduce{Layout: lay, Network: nw, Bytes: c.n, Algorithm: c.algo, Memory: 1 << 20}).Time.Duration()
		model, ok := ring.AllreduceCost(c.algo, c.n, lay.Size(), lay.ringHosts(), linksOf(nw), 0)
		if !ok {
			t.Fatalf("%v on %v: the model does not apply", c.algo, lay)
		}
		if diff := (model - sim).Abs(); diff > sim/1000+time.Microsecond/10 {
			t.Errorf("%v of %d bytes on %v at %g bit/s: model %v, simulation %v", c.algo, c.n, lay, c.bandwidth, model, sim)
		}
	}
}
