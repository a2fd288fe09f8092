package checkpoint

import (
	"context"
	"testing"

	"github.com/gorun/gorun/collective"
)

// BenchmarkSave64MiB times a barrier checkpoint of 64 MiB of replicated
// float32 state by 4 in-process ranks (each writes a 16 MiB shard, fsyncs,
// and rank 0 commits the manifest and deletes the checkpoint beyond the
// newest 2). b.SetBytes counts the whole state, so MB/s is the job's
// checkpoint bandwidth.
func BenchmarkSave64MiB(b *testing.B) {
	const n, size = 4, 64 << 20
	comms := newJob(b, n)
	dir := b.TempDir()
	states := make([]*State, n)
	mgrs := make([]*Manager, n)
	for r := range n {
		w := make([]float32, size/4)
		for i := range w {
			w[i] = float32(i)
		}
		states[r] = new(State).Tensor("w", w)
		mgrs[r], _ = New(comms[r], dir)
	}
	b.SetBytes(size)
	b.ResetTimer()
	for i := range b.N {
		errs := onEach(comms, func(r int, c *collective.Comm) error {
			return mgrs[r].Save(context.Background(), int64(i+1), states[r])
		})
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
}
