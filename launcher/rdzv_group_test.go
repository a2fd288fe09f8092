package launcher

import (
	"maps"
	"slices"
	"testing"
)

// The ranks that host replicas: the first of each remote host first, then
// gorun's own host, then more ranks of hosts already chosen, and as many
// spares picked the same way; none for a lone rendezvous.
func TestReplicaRanks(t *testing.T) {
	for _, tc := range []struct {
		name   string
		hosts  []string
		host   []int // rank -> host
		n      int
		want   []int
		spares []int
	}{
		{"three hosts", []string{"localhost", "h1", "h2"}, []int{0, 1, 1, 2}, 3, []int{1, 3}, []int{0, 2}},
		{"spares on hosts without one first", []string{"localhost", "h1", "h2", "h3", "h4"}, []int{0, 1, 1, 2, 3, 4}, 3, []int{1, 3}, []int{4, 5}},
		{"gorun's host remote too", []string{"h0", "h1", "h2"}, []int{0, 1, 2}, 3, []int{0, 1}, []int{2}},
		{"two hosts", []string{"localhost", "h1"}, []int{0, 1, 1}, 3, []int{0, 1}, []int{2}},
		{"five on two hosts", []string{"localhost", "h1"}, []int{0, 0, 1, 1}, 5, []int{0, 1, 2, 3}, nil},
		{"one host", []string{"localhost"}, []int{0, 0, 0}, 3, []int{0, 1}, []int{2}},
		{"lone", []string{"localhost", "h1"}, []int{0, 1}, 1, nil, nil},
	} {
		lay := &layout{pl: placement{host: tc.host}}
		for _, h := range tc.hosts {
			lay.hosts = append(lay.hosts, Host{Name: h})
		}
		group, spares := replicaRanks(lay, tc.n)
		got := slices.Sorted(maps.Keys(group))
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: the group's replicas on ranks %v, want %v", tc.name, got, tc.want)
		}
		got = slices.Sorted(maps.Keys(spares))
		if !slices.Equal(got, tc.spares) {
			t.Errorf("%s: spares on ranks %v, want %v", tc.name, got, tc.spares)
		}
	}
}
