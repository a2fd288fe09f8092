package collective

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gorun/gorun/ring"
)

// The flight recorder keeps the current call and the last flightCalls
// finished ones, oldest first, with their errors, and records a call
// without allocating.
func TestFlightRecorderKeepsTheLastCalls(t *testing.T) {
	var f flightRecorder
	t0 := time.Unix(1000, 0)
	total := flightCalls + 10
	for i := 1; i <= total; i++ {
		call := ring.Call{Kind: ring.Allreduce, Seq: uint64(i), Op: ring.Sum, DType: ring.Float32, Count: 8, Name: fmt.Sprintf("w%d", i)}
		f.begin(call, t0.Add(time.Duration(i)*time.Second))
		var err error
		if i == total {
			err = errors.New("boom")
		}
		f.end(t0.Add(time.Duration(i)*time.Second+time.Millisecond), err)
	}
	cur, recent := f.snapshot()
	if cur != nil {
		t.Fatalf("current call %+v between calls", cur)
	}
	if len(recent) != flightCalls {
		t.Fatalf("%d calls kept, want %d", len(recent), flightCalls)
	}
	for i, r := range recent {
		seq := uint64(total - flightCalls + 1 + i)
		if r.Seq != seq || r.Name != fmt.Sprintf("w%d", seq) || r.Kind != "allreduce" || !r.Start.Equal(t0.Add(time.Duration(seq)*time.Second)) || r.End.Sub(r.Start) != time.Millisecond {
			t.Fatalf("call %d: %+v, want #%d", i, r, seq)
		}
	}
	if last := recent[len(recent)-1]; last.Err != "boom" || last.Call != `Allreduce(float32[8], Sum, name="w74")` {
		t.Fatalf("last call %+v", last)
	}
	call := ring.Call{Kind: ring.Broadcast, Seq: 99, DType: ring.Float64, Count: 4, Root: 1}
	f.begin(call, t0)
	cur, _ = f.snapshot()
	if cur == nil || cur.Seq != 99 || cur.Kind != "broadcast" || !cur.End.IsZero() {
		t.Fatalf("current call %+v, want broadcast #99 running", cur)
	}
	f.end(t0, nil)
	if allocs := testing.AllocsPerRun(100, func() {
		f.begin(call, t0)
		f.end(t0, nil)
	}); allocs != 0 {
		t.Errorf("recording a call allocates %v times", allocs)
	}
}
