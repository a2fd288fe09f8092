package ring

// Where the hierarchical allreduce (hierarchical.go) runs: the host layout
// that Config.Hosts gives (every host must run the same number of ranks),
// and the size from which the default policy prefers it.

// HierarchicalMinBytes is the smallest allreduce that preferHierarchical
// runs hierarchically (on a Mesh, at least 2 hosts, the same L >= 2 ranks on
// every host) where the ring has no measured links (Config.Links, which
// decide instead: CrossHostPolicy).
//
// Below it the hierarchical schedule mostly loses: a small allreduce is
// bound by latency, and the schedule has four dependent hops, two of them
// across hosts, plus its goroutine hand-offs, while a token-bucket-shaped
// link lets the ring's few hundred KB through in one burst. From 512 KiB
// it wins on slow links between hosts, against the ring and scatter-gather
// alike, tending to the ratio of the bytes each host sends across (S
// instead of 1.5 S for 2 hosts of 2 ranks); on links as fast as memory it
// is level with the ring at 1 MiB (BenchmarkHierarchicalSlowLink in e2e;
// see BENCHMARKS.md, "Hierarchical allreduce").
const HierarchicalMinBytes = 512 << 10

// preferHierarchical reports whether an allreduce of n bytes should run
// the hierarchical schedule on this ring's host layout (Config.Hosts).
func (r *Ring) preferHierarchical(n int) bool {
	if n < HierarchicalMinBytes || r.hosts == nil {
		return false
	}
	if _, ok := r.t.(Mesh); !ok {
		return false
	}
	lay, ok := hierLayoutOf(r.hosts, r.size, r.rank)
	return ok && lay.h >= 2 && lay.l >= 2
}

// hierLayout is the host layout seen from one rank.
type hierLayout struct {
	h, l       int     // hosts, ranks per host
	host, idx  int     // this rank's host position and local index
	members    [][]int // members[g][j]: rank of local index j on host g
	hostOfRank []int
}

// hierLayoutOf groups ranks by host (nil hosts: one rank per host). It
// reports false unless every host has the same number of ranks.
func hierLayoutOf(hosts []int, size, rank int) (hierLayout, bool) {
	var lay hierLayout
	pos := map[int]int{} // host id -> position
	lay.hostOfRank = make([]int, size)
	for r := 0; r < size; r++ {
		id := r
		if hosts != nil {
			id = hosts[r]
		}
		g, ok := pos[id]
		if !ok {
			g = len(lay.members)
			pos[id] = g
			lay.members = append(lay.members, nil)
		}
		lay.hostOfRank[r] = g
		if r == rank {
			lay.host, lay.idx = g, len(lay.members[g])
		}
		lay.members[g] = append(lay.members[g], r)
	}
	lay.h, lay.l = len(lay.members), len(lay.members[0])
	for _, m := range lay.members {
		if len(m) != lay.l {
			return lay, false
		}
	}
	return lay, true
}
