package ringsim

import (
	"fmt"
	"testing"
	"time"

	"github.com/gorun/gorun/ring"
)

// TestLinksChoiceAtScale: at scales no test machine reaches, the allreduce
// a job across hosts chooses from its links (PolicyChoice, that is
// ring.CrossHostPolicy's cost model) is the fastest simulated algorithm,
// or within the policy's margin of it: the policy keeps the measured
// defaults' choice unless the model's best beats it by 5/4, so a miss up
// to that factor is the margin at work, not the model. The cells cover
// both sides: where the hierarchical allreduce is the fastest, its L
// rings sharing each NIC so that one ring's α passes while the NIC sends
// the others' bytes (64 ranks on 8 hosts at 1 MiB, 16 on 8 at 32 MiB),
// which a model adding every hop's α to the NIC's bytes misses; and
// where its 2(H-1) dependent hops make it the slower one (256 ranks on
// 32 hosts at 1 MiB).
// Every candidate's model time is also checked against its simulation:
// within 15 %, the model's goroutine hand-offs, which the simulator does
// not have, included. The runs are scaled down to a few hundred KiB of
// buffers (doc.go, "Large buffers"), which gives these cells the same
// times as full-size runs in a fraction of the time.
func TestLinksChoiceAtScale(t *testing.T) {
	const marginNum, marginDen = 5, 4 // ring's margin (policy_links.go)
	const modelTolerance = 0.15
	const memory = 256 << 10
	for _, c := range []struct {
		lay   Layout
		bytes int64
		gbps  float64
	}{
		{Layout{8, 2}, 1 << 20, 100},
		{Layout{8, 2}, 32 << 20, 100},
		{Layout{8, 8}, 1 << 20, 10},
		{Layout{8, 8}, 1 << 20, 100},
		{Layout{8, 8}, 1 << 20, 400},
		{Layout{8, 8}, 32 << 20, 10},
		{Layout{8, 8}, 32 << 20, 400},
		{Layout{32, 8}, 1 << 20, 100},
	} {
		name := fmt.Sprintf("%d/%d %dMiB %gGbit", c.lay.Size(), c.lay.Hosts, c.bytes>>20, c.gbps)
		nw := DefaultNetwork(c.gbps * 1e9)
		choice, err := PolicyChoice(c.lay, nw, c.bytes)
		if err != nil {
			t.Fatal(err)
		}
		times := map[ring.Algorithm]time.Duration{}
		best := choice
		for _, a := range []ring.Algorithm{choice, ring.AlgoRabenseifner, ring.AlgoRing, ring.AlgoHierarchical} {
			if _, done := times[a]; done {
				continue
			}
			sim := simulate(t, Allreduce{Layout: c.lay, Network: nw, Bytes: c.bytes, Algorithm: a, Memory: memory}).Time.Duration()
			times[a] = sim
			if sim < times[best] {
				best = a
			}
			model, ok := ring.AllreduceCost(a, c.bytes, c.lay.Size(), c.lay.ringHosts(), NetworkLinks(nw), 0)
			if off := float64(model)/float64(sim) - 1; !ok || off > modelTolerance || off < -modelTolerance {
				t.Errorf("%s, %v: model %v, simulated %v", name, a, model, sim)
			}
		}
		if times[choice]*marginDen > times[best]*marginNum {
			t.Errorf("%s: the links choose %v, %v; %v takes %v, %.2f× faster", name, choice, times[choice], best, times[best],
				float64(times[choice])/float64(times[best]))
		}
	}
}
