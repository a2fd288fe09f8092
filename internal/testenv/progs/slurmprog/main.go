// Command slurmprog is the rank program of gorun's Slurm tests. It joins the
// job with collective.Init, whoever started it (srun directly, or gorun
// inside an allocation), prints the identity it got and where it runs:
//
//	rank R of N local L of LS on HOST (SLURM_PROCID=P SLURM_NODEID=I SLURM_STEP_ID=S)
//
// then makes SLURMPROG_ITERS (default 3) allreduces of real values and
// checks every element against the closed form, printing "rank R of N ok"
// at the end. SLURMPROG_LOOP=1 then goes on making small allreduces until
// it is stopped, printing "rank R looping (pid PID)" after the first.
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/gorun/gorun/collective"
)

func main() {
	ctx := context.Background()
	comm, err := collective.Init(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "slurmprog:", err)
		os.Exit(1)
	}
	defer comm.Close()
	rank, n := comm.Rank(), comm.Size()
	host, _ := os.Hostname()
	fmt.Printf("rank %d of %d local %d of %d on %s (SLURM_PROCID=%s SLURM_NODEID=%s SLURM_STEP_ID=%s)\n", rank, n, comm.LocalRank(), comm.LocalSize(), host,
		os.Getenv("SLURM_PROCID"), os.Getenv("SLURM_NODEID"), os.Getenv("SLURM_STEP_ID"))
	iters, _ := strconv.Atoi(os.Getenv("SLURMPROG_ITERS"))
	if iters < 1 {
		iters = 3
	}
	buf := make([]float64, 1<<16)
	for it := range iters {
		for i := range buf {
			buf[i] = float64((rank + 1) * (i%11 + it))
		}
		if err := comm.Allreduce(ctx, buf, collective.Sum); err != nil {
			fmt.Fprintf(os.Stderr, "slurmprog: rank %d: allreduce %d: %v\n", rank, it, err)
			os.Exit(2)
		}
		// Sum over ranks r of (r+1)*(i%11+it) = n(n+1)/2 * (i%11+it).
		for i, v := range buf {
			if want := float64(n*(n+1)/2) * float64(i%11+it); v != want {
				fmt.Fprintf(os.Stderr, "slurmprog: rank %d: allreduce %d: element %d = %v, want %v\n", rank, it, i, v, want)
				os.Exit(4)
			}
		}
	}
	if os.Getenv("SLURMPROG_LOOP") == "1" {
		small := make([]float64, 256)
		for it := 0; ; it++ {
			if err := comm.Allreduce(ctx, small, collective.Sum); err != nil {
				fmt.Fprintf(os.Stderr, "slurmprog: rank %d: %v\n", rank, err)
				os.Exit(2)
			}
			if it == 0 {
				fmt.Printf("rank %d looping (pid %d)\n", rank, os.Getpid())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	fmt.Printf("rank %d of %d ok\n", rank, n)
}
