package launcher

import (
	"maps"
	"slices"
	"testing"
)

// The ranks that host replicas: the first of each remote host first, then
// gorun's own host, then more ranks of hosts already chosen; none for a
// lone rendezvous.
func TestReplicaRanks(t *testing.T) {
	for _, tc := range []struct {
		name  string
		hosts []string
		host  []int // rank -> host
		n     int
		want  []int
	}{
		{"three hosts", []string{"localhost", "h1", "h2"}, []int{0, 1, 1, 2}, 3, []int{1, 3}},
		{"gorun's host remote too", []string{"h0", "h1", "h2"}, []int{0, 1, 2}, 3, []int{0, 1}},
		{"two hosts", []string{"localhost", "h1"}, []int{0, 1, 1}, 3, []int{0, 1}},
		{"five on two hosts", []string{"localhost", "h1"}, []int{0, 0, 1, 1}, 5, []int{0, 1, 2, 3}},
		{"one host", []string{"localhost"}, []int{0, 0, 0}, 3, []int{0, 1}},
		{"lone", []string{"localhost", "h1"}, []int{0, 1}, 1, nil},
	} {
		lay := &layout{pl: placement{host: tc.host}}
		for _, h := range tc.hosts {
			lay.hosts = append(lay.hosts, Host{Name: h})
		}
		got := slices.Sorted(maps.Keys(replicaRanks(lay, tc.n)))
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: replicas on ranks %v, want %v", tc.name, got, tc.want)
		}
	}
}
