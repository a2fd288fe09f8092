package ringsim

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gorun/gorun/ring"
)

// Tables: the same allreduce simulated for every algorithm of a list and
// for the one ring's policy picks, over a grid of layouts, sizes and
// bandwidths (what gorun sim prints).

// Grid is what a table covers.
type Grid struct {
	Layouts    []Layout
	Sizes      []int64   // bytes per rank
	Bandwidths []float64 // bits/s between hosts; Network.Bandwidth is replaced by each
	// Algorithms are simulated besides the policy's choice.
	Algorithms []Candidate
	Network    Network
	Memory     int64 // Allreduce.Memory
}

// Candidate is an algorithm a table simulates, up to MaxBytes (0: every
// size): some schedules send so many messages at large sizes (recursive
// doubling: the whole buffer log2 N times) that simulating them there
// takes long, for a time nobody would choose.
type Candidate struct {
	Algorithm ring.Algorithm
	MaxBytes  int64
}

// ParseCandidate reads "NAME" or "NAME:MAXBYTES" (e.g. recursive-doubling:1M).
func ParseCandidate(s string) (Candidate, error) {
	name, size, hasSize := strings.Cut(strings.TrimSpace(s), ":")
	a, err := ring.ParseAlgorithm(name)
	if err != nil {
		return Candidate{}, err
	}
	c := Candidate{Algorithm: a}
	if hasSize {
		n, err := ring.ParseBytes(size)
		if err != nil {
			return Candidate{}, fmt.Errorf("%s: %w", s, err)
		}
		c.MaxBytes = int64(n)
	}
	return c, nil
}

// Row is one point of a grid: what the policy picks there, and the time
// of every algorithm simulated (the policy's choice among them).
type Row struct {
	Layout    Layout
	Bytes     int64
	Bandwidth float64
	Policy    ring.Algorithm
	Times     map[ring.Algorithm]Time
	Scale     int64 // Result.Scale of the policy's run
	Stats     Stats // of the policy's run
}

// Best returns the fastest algorithm of the row, the lower one (in
// ring's numbering) on a tie.
func (r Row) Best() (ring.Algorithm, Time) {
	algos := make([]ring.Algorithm, 0, len(r.Times))
	for a := range r.Times {
		algos = append(algos, a)
	}
	slices.Sort(algos)
	best := algos[0]
	for _, a := range algos[1:] {
		if r.Times[a] < r.Times[best] {
			best = a
		}
	}
	return best, r.Times[best]
}

// Run simulates every point of g, calling row with each as soon as it is
// done, in the order layouts, then sizes, then bandwidths.
func (g Grid) Run(ctx context.Context, row func(Row) error) error {
	for _, lay := range g.Layouts {
		for _, n := range g.Sizes {
			for _, bw := range g.Bandwidths {
				nw := g.Network
				nw.Bandwidth = bw
				policy, err := PolicyChoice(lay, nw, n)
				if err != nil {
					return err
				}
				r := Row{Layout: lay, Bytes: n, Bandwidth: bw, Policy: policy, Times: map[ring.Algorithm]Time{}}
				for _, c := range append([]Candidate{{Algorithm: policy}}, g.Algorithms...) {
					a := c.Algorithm
					if _, done := r.Times[a]; done || !Runs(a, lay) || (c.MaxBytes > 0 && n > c.MaxBytes) {
						continue
					}
					res, err := Simulate(ctx, Allreduce{Layout: lay, Network: nw, Bytes: n, Algorithm: a, Memory: g.Memory})
					if err != nil {
						return err
					}
					r.Times[a] = res.Time
					if a == policy {
						r.Scale, r.Stats = res.Scale, res.Stats
					}
				}
				if err := row(r); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Runs reports whether a applies to the layout: the hierarchical
// allreduce needs several ranks on a host (with one, it is the flat ring
// among hosts).
func Runs(a ring.Algorithm, lay Layout) bool {
	return a != ring.AlgoHierarchical || lay.RanksPerHost > 1
}

// ParseLayout reads "RANKS/HOSTS" (e.g. 4096/1024): RANKS ranks spread
// evenly over HOSTS hosts.
func ParseLayout(s string) (Layout, error) {
	r, h, _ := strings.Cut(strings.TrimSpace(s), "/")
	ranks, err1 := strconv.Atoi(r)
	hosts, err2 := strconv.Atoi(h)
	if err1 != nil || err2 != nil || hosts < 1 || ranks < hosts || ranks%hosts != 0 {
		return Layout{}, fmt.Errorf("layout %q: want RANKS/HOSTS with RANKS a multiple of HOSTS, e.g. 4096/1024", s)
	}
	lay := Layout{Hosts: hosts, RanksPerHost: ranks / hosts}
	return lay, lay.validate()
}
