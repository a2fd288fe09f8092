// Command testprog is a small rank program for gorun's multi-process tests.
// It joins the job, runs allreduces whose exact results it checks, and can
// misbehave on purpose:
//
//	TESTPROG_MODE=ok        every rank checks ITERS allreduces and prints "rank R ok"
//	TESTPROG_MODE=exit      rank VICTIM exits with status 3 while an allreduce is in flight
//	TESTPROG_MODE=freeze    rank VICTIM stops itself with SIGSTOP before the allreduce
//	TESTPROG_MODE=fail      rank VICTIM prints to stderr and exits 7 before joining
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"syscall"

	"github.com/gorun/gorun/collective"
)

func main() {
	mode := os.Getenv("TESTPROG_MODE")
	victim, _ := strconv.Atoi(os.Getenv("TESTPROG_VICTIM"))
	iters, _ := strconv.Atoi(os.Getenv("TESTPROG_ITERS"))
	iters = max(iters, 1)
	rankEnv := os.Getenv("GORUN_RANK") + os.Getenv("RANK")
	if mode == "fail" && rankEnv == strconv.Itoa(victim) {
		fmt.Fprintln(os.Stderr, "testprog: failing on purpose")
		os.Exit(7)
	}
	ctx := context.Background()
	comm, err := collective.Init(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer comm.Close()
	rank, n := comm.Rank(), comm.Size()
	buf := make([]float32, 1<<20)
	for it := range iters {
		for i := range buf {
			buf[i] = float32((rank + 1) * (i%7 + it))
		}
		if rank == victim {
			switch mode {
			case "exit":
				h := comm.AllreduceAsync(ctx, buf, collective.Sum)
				_ = h
				os.Exit(3)
			case "freeze":
				syscall.Kill(os.Getpid(), syscall.SIGSTOP)
			}
		}
		if err := comm.Allreduce(ctx, buf, collective.Sum); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		for i, v := range buf {
			if want := float32(n * (n + 1) / 2 * (i%7 + it)); v != want {
				fmt.Fprintf(os.Stderr, "rank %d: element %d = %v, want %v\n", rank, i, v, want)
				os.Exit(4)
			}
		}
	}
	fmt.Printf("rank %d of %d ok (source %s)\n", rank, n, os.Getenv("TESTPROG_SOURCE"))
}
