package collective_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"

	"github.com/gorun/gorun/collective"
)

// An elastic job of three ranks in one process loses rank 2 in the middle
// of its fourth step, as kill -9 would do it. The two survivors re-form
// the ring, resume from the last commit, and re-partition the samples:
// every sample of both epochs is used exactly once, and the result is that
// of an uninterrupted run.
func ExampleRunElastic() {
	ctx := context.Background()
	job, err := collective.StartLocal(ctx, 3, collective.WithElastic(0))
	if err != nil {
		log.Fatal(err)
	}
	defer job.Close()

	const epochs, datasetLen, globalBatch = 2, 30, 6
	killed := errors.New("killed")
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, comm := range job.Comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The "model": the sum of the sample indices trained on, and
			// how many samples that was.
			sum, seen := []int64{0}, []int64{0}
			sampler := collective.NewElasticSampler(datasetLen, 1)
			st := collective.NewElasticState(comm)
			if err := st.Register("sum", sum, "seen", seen, "sampler", sampler); err != nil {
				log.Fatal(err)
			}
			st.OnReset(func(ctx context.Context, ev collective.ElasticEvent) error {
				if comm.Rank() == 0 {
					mu.Lock()
					fmt.Printf("reset: %d -> %d ranks, lost rank %d\n", ev.OldSize, ev.NewSize, ev.Lost[0].Rank)
					mu.Unlock()
				}
				return nil
			})
			steps := 0
			err := collective.RunElastic(ctx, comm, st, func(ctx context.Context) error {
				for sampler.Epoch() < epochs {
					for !sampler.EpochDone() {
						steps++
						if steps == 4 && comm.Rank() == 2 && comm.Epoch() == 0 {
							job.Crash(comm)
							return killed
						}
						grad := []int64{0, 0}
						for _, i := range sampler.Next(globalBatch, comm.Rank(), comm.Size()) {
							grad[0] += int64(i)
							grad[1]++
						}
						if err := comm.Allreduce(ctx, grad, collective.Sum); err != nil {
							return err
						}
						sum[0] += grad[0]
						seen[0] += grad[1]
						if err := st.Commit(ctx); err != nil {
							return err
						}
					}
					sampler.NextEpoch()
				}
				return nil
			})
			if errors.Is(err, killed) {
				return
			}
			if err != nil {
				log.Fatal(err)
			}
			if comm.Rank() == 0 {
				mu.Lock()
				fmt.Printf("%d ranks: sum %d over %d samples\n", comm.Size(), sum[0], seen[0])
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	// Output:
	// reset: 3 -> 2 ranks, lost rank 2
	// 2 ranks: sum 870 over 60 samples
}
