package collective

import (
	"context"
	"fmt"
	"time"

	"github.com/gorun/gorun/compress"
	"github.com/gorun/gorun/ring"
)

// Timing the allreduce schedules at start, for what they cost beyond the
// links (links.go).

// calibrationBytes is the allreduce the schedules are timed on: small,
// so the time is the per-call cost the model leaves out, and cheap at
// start; calibrationCalls calls of each, the first not counted.
const (
	calibrationBytes = 4 << 10
	calibrationCalls = 6
)

// timeSchedules times calls of every schedule the model picks from, and
// of the compressed one with codec, on this rank, and returns what each
// took beyond the model's time (ns; indexed by ring.Algorithm, then the
// codec's last).
func timeSchedules(ctx context.Context, mesh ring.Mesh, rank, size int, hosts []int, chunk int, a AgreedLinks, codec compress.Codec) ([]int64, error) {
	over := make([]int64, len(a.CallOverhead)+1)
	buf := make([]byte, calibrationBytes)
	call := ring.Call{Kind: ring.Allreduce, Op: ring.Sum, DType: ring.Float32, Count: calibrationBytes / 4}
	timeCalls := func(run func(ring.Call) error) (time.Duration, error) {
		var took []int64
		for i := range calibrationCalls {
			call.Seq = uint64(i + 1)
			t0 := time.Now()
			if err := run(call); err != nil {
				return 0, err
			}
			if i > 0 {
				took = append(took, time.Since(t0).Nanoseconds())
			}
		}
		return time.Duration(median(took)), nil
	}
	for _, algo := range ring.ModelCandidates(size, hosts) {
		rg, err := ring.New(ring.Config{Rank: rank, Size: size, Hosts: hosts, ChunkBytes: chunk,
			Allreduce: ring.AllreducePolicy{Rules: []ring.AllreduceRule{{MaxBytes: ring.NoLimit, Algo: algo}}}}, mesh)
		if err != nil {
			return nil, err
		}
		took, err := timeCalls(func(c ring.Call) error { return rg.Allreduce(ctx, c, buf) })
		if err != nil {
			return nil, fmt.Errorf("%s: %w", algo, err)
		}
		model, _ := ring.AllreduceCost(algo, calibrationBytes, size, hosts, a.Links, chunk)
		over[algo] = max(0, (took - model).Nanoseconds())
	}
	if cost, ok := a.codecCost(codec); ok {
		rg, err := ring.New(ring.Config{Rank: rank, Size: size, Hosts: hosts, ChunkBytes: chunk}, mesh)
		if err != nil {
			return nil, err
		}
		took, err := timeCalls(func(c ring.Call) error {
			_, err := rg.AllreduceCompressed(ctx, c, buf, codec, nil)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("%s compressed: %w", codec.Name(), err)
		}
		model, _ := ring.CompressedCost(calibrationBytes, size, hosts, a.Links, chunk, cost)
		over[len(over)-1] = max(0, (took - model).Nanoseconds())
	}
	return over, nil
}

// setOverheads takes the agreed overheads (timeSchedules' layout) and,
// last, the longest time a rank spent measuring.
func (a *AgreedLinks) setOverheads(over []int64) {
	for i := range a.CallOverhead {
		a.CallOverhead[i] = time.Duration(over[i])
	}
	a.CodecOverhead = time.Duration(over[len(a.CallOverhead)])
	a.Took = time.Duration(over[len(a.CallOverhead)+1])
}
