package ring

import (
	"fmt"
	"strings"
)

// Algorithm names the schedule a collective runs. Every rank must run the
// same one: it is part of the call fingerprint (Call.Algo) and travels in the
// high four bits of header byte 52, so ranks that chose differently (say,
// different thresholds in their environment) fail with *MismatchError naming
// both algorithms instead of misreading each other's messages.
//
// The zero value is the pipelined ring, whose wire id 0 makes its messages
// the bytes they were before algorithms existed.
type Algorithm uint8

// Algorithms.
const (
	// AlgoRing is the chunked, pipelined ring (allreduce.go): 2(N-1)
	// dependent steps, bandwidth-optimal; for large buffers.
	AlgoRing Algorithm = iota
	// AlgoDirect sends the whole buffer to every other rank in one hop;
	// every rank folds the N buffers in rank order. (N-1)*S bytes per
	// rank: for tiny buffers only.
	AlgoDirect
	// AlgoRecursiveDoubling exchanges whole buffers with partners at
	// distance 1, 2, 4, ...: log2(N) hops of S bytes.
	AlgoRecursiveDoubling
	// AlgoRabenseifner is recursive halving (reduce-scatter) followed by
	// recursive doubling (allgather): 2*log2(N) hops, 2(N-1)/N*S bytes.
	AlgoRabenseifner
	// AlgoScatterGather is a direct reduce-scatter (segment j straight to
	// rank j) followed by a direct allgather, over a Mesh: 2 hops,
	// 2(N-1)/N*S bytes.
	AlgoScatterGather
	// AlgoHierarchical reduces within each host, allreduces across hosts
	// and broadcasts within each host, so fewer bytes cross between hosts.
	AlgoHierarchical
	maxAlgo = AlgoHierarchical
)

var algoNames = [...]string{
	AlgoRing:              "ring",
	AlgoDirect:            "direct",
	AlgoRecursiveDoubling: "recursive-doubling",
	AlgoRabenseifner:      "rabenseifner",
	AlgoScatterGather:     "scatter-gather",
	AlgoHierarchical:      "hierarchical",
}

func (a Algorithm) valid() bool { return a <= maxAlgo }

func (a Algorithm) String() string {
	if a.valid() {
		return algoNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// ParseAlgorithm returns the Algorithm named s (as printed by String,
// case-insensitive).
func ParseAlgorithm(s string) (Algorithm, error) {
	for a, n := range algoNames {
		if strings.EqualFold(s, n) {
			return Algorithm(a), nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (want one of %s)", s, strings.Join(algoNames[:], ", "))
}
