package collective_test

import (
	"context"
	"fmt"
	"log"
	"sync"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/p2p"
)

// A program started without a launcher is a one-rank job: collectives work
// and return their inputs.
func ExampleInit() {
	ctx := context.Background()
	comm, err := collective.Init(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer comm.Close()
	grads := []float32{1, 2, 3}
	if err := comm.Allreduce(ctx, grads, collective.Avg); err != nil {
		log.Fatal(err)
	}
	fmt.Println(comm.Rank(), comm.Size(), grads)
	// Output: 0 1 [1 2 3]
}

// Three ranks in one process, wired by hand the way gorun wires processes:
// a rendezvous, a job key, and each rank's identity.
func ExampleComm_Allreduce() {
	ctx := context.Background()
	key := p2p.NewJobKey()
	rdv, err := p2p.StartRendezvous(ctx, p2p.RendezvousConfig{ListenAddr: "127.0.0.1:0", Size: 3, JobKey: key})
	if err != nil {
		log.Fatal(err)
	}
	defer rdv.Close()

	results := make([][]float64, 3)
	var wg sync.WaitGroup
	for rank := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			comm, err := collective.Init(ctx, collective.WithRank(rank, 3),
				collective.WithRendezvous(rdv.Addr(), false), collective.WithJobKey(key))
			if err != nil {
				log.Fatal(err)
			}
			defer comm.Close()
			buf := []float64{float64(rank), 10 * float64(rank+1)}
			if err := comm.Allreduce(ctx, buf, collective.Sum); err != nil {
				log.Fatal(err)
			}
			results[rank] = buf
		}()
	}
	wg.Wait()
	fmt.Println(results)
	// Output: [[3 60] [3 60] [3 60]]
}

// A job of three ranks inside this process, as a unit test of a training
// loop would start one.
func ExampleStartLocal() {
	ctx := context.Background()
	job, err := collective.StartLocal(ctx, 3)
	if err != nil {
		log.Fatal(err)
	}
	defer job.Close()

	results := make([][]float32, 3)
	var wg sync.WaitGroup
	for rank, comm := range job.Comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			grad := []float32{float32(rank), 1}
			if err := comm.Allreduce(ctx, grad, collective.Avg); err != nil {
				log.Fatal(err)
			}
			results[rank] = grad
		}()
	}
	wg.Wait()
	fmt.Println(results)
	// Output: [[1 1] [1 1] [1 1]]
}
