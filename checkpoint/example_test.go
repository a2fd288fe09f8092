package checkpoint_test

import (
	"context"
	"fmt"
	"log"
	"math/rand/v2"
	"os"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/collective"
)

// A training loop registers its state once, restores the newest checkpoint
// (none on a fresh start), and saves every few steps. A run that dies at
// step 5 and is started again resumes from the checkpoint of step 3 and ends
// bit for bit where an uninterrupted run ends.
func Example() {
	ctx := context.Background()
	comm, err := collective.Init(ctx) // a one-rank job when run without gorun
	if err != nil {
		log.Fatal(err)
	}
	defer comm.Close()

	train := func(dir string, dieAt int64) []float32 {
		w := make([]float32, 4)   // replicated parameters
		rng := rand.NewPCG(42, 0) // per-rank RNG
		st := new(checkpoint.State).Tensor("w", w).Binary("rng", rng)
		ckpt, err := checkpoint.New(comm, dir)
		if err != nil {
			log.Fatal(err)
		}
		start, found, err := ckpt.Restore(ctx, st)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("found=%v, starting at step %d\n", found, start)
		r := rand.New(rng)
		for step := start; step < 6; step++ {
			if step == dieAt {
				return nil
			}
			for i := range w {
				w[i] = w[i]*0.5 + float32(r.IntN(10)) // "training"
			}
			if err := comm.Allreduce(ctx, w, collective.Avg); err != nil {
				log.Fatal(err)
			}
			if (step+1)%3 == 0 {
				if err := ckpt.Save(ctx, step+1, st); err != nil {
					log.Fatal(err)
				}
			}
		}
		// Old checkpoints are deleted in the background: let that finish.
		if err := ckpt.Wait(ctx); err != nil {
			log.Fatal(err)
		}
		return w
	}
	a, _ := os.MkdirTemp("", "ckpt-example-")
	b, _ := os.MkdirTemp("", "ckpt-example-")
	defer os.RemoveAll(a)
	defer os.RemoveAll(b)
	fmt.Println("uninterrupted:", train(a, -1))
	train(b, 5)
	fmt.Println("resumed:", train(b, -1))
	// Output:
	// found=false, starting at step 0
	// uninterrupted: [10.0625 10.46875 4.71875 7.1875]
	// found=false, starting at step 0
	// found=true, starting at step 3
	// resumed: [10.0625 10.46875 4.71875 7.1875]
}

// SaveAsync snapshots the state and returns; the files are written in the
// background while training goes on, and Poll, called once per step,
// commits the checkpoint once every rank has written its part. Wait at the
// end commits the last one.
func ExampleManager_SaveAsync() {
	ctx := context.Background()
	comm, err := collective.Init(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer comm.Close()
	dir, _ := os.MkdirTemp("", "ckpt-async-")
	defer os.RemoveAll(dir)

	w := make([]float32, 3)
	st := new(checkpoint.State).Tensor("w", w)
	ckpt, err := checkpoint.New(comm, dir)
	if err != nil {
		log.Fatal(err)
	}
	for step := int64(0); step < 5; step++ {
		for i := range w {
			w[i] += float32(i + 1) // "training"
		}
		if err := ckpt.Poll(ctx); err != nil { // commits a finished save
			log.Fatal(err)
		}
		if (step+1)%2 == 0 {
			// The checkpoint holds w as it is now, whatever the next
			// steps do to it.
			if err := ckpt.SaveAsync(ctx, step+1, st); err != nil {
				log.Fatal(err)
			}
		}
	}
	if err := ckpt.Wait(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("trained:", w)

	restored := make([]float32, 3)
	step, found, err := ckpt.Restore(ctx, new(checkpoint.State).Tensor("w", restored))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("restored step %d (found=%v): %v\n", step, found, restored)
	// Output:
	// trained: [5 10 15]
	// restored step 4 (found=true): [4 8 12]
}
