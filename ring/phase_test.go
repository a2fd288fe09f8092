package ring

import (
	"strings"
	"sync"
	"testing"
	"time"
)

// Config.Phase hears each collective's phases, in order and without gaps.
func TestPhases(t *testing.T) {
	const n = 3
	ts := NewMemRing(n)
	var mu sync.Mutex
	got := make([][]string, n)
	rs := make([]*Ring, n)
	for i := range rs {
		var last time.Time
		r, err := New(Config{Rank: i, Size: n, Phase: func(c Call, phase string, start, end time.Time) {
			mu.Lock()
			defer mu.Unlock()
			if end.Before(start) || (!last.IsZero() && start.Before(last)) {
				t.Errorf("rank %d: phase %s of %s runs from %v to %v, after %v", i, phase, c, start, end, last)
			}
			last = end
			got[i] = append(got[i], c.Kind.String()+":"+phase)
		}}, ts[i])
		if err != nil {
			t.Fatal(err)
		}
		rs[i] = r
	}
	mustAll(t, parallel(n, func(i int) error {
		if err := rs[i].Allreduce(testCtx(t), Call{Seq: 1, Op: Sum, DType: Float32, Count: 100000}, make([]byte, 400000)); err != nil {
			return err
		}
		if err := rs[i].Allreduce(testCtx(t), Call{Seq: 2, Op: Sum, DType: Float32, Count: 10}, make([]byte, 40)); err != nil {
			return err
		}
		return rs[i].Broadcast(testCtx(t), Call{Seq: 3, DType: Uint8, Count: 10}, make([]byte, 10))
	}))
	want := "allreduce:wait for peers allreduce:reduce-scatter allreduce:allgather allreduce:wait for peers allreduce:gather"
	for i := range n {
		s := strings.Join(got[i], " ")
		if !strings.HasPrefix(s, want) || !strings.Contains(s, "broadcast:") {
			t.Errorf("rank %d phases: %s", i, s)
		}
	}
}
