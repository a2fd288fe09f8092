// Command testprog is a small rank program for gorun's multi-process tests.
// It joins the job, runs allreduces whose exact results it checks, and can
// misbehave on purpose:
//
//	TESTPROG_MODE=ok        every rank checks ITERS allreduces and prints "rank R ok"
//	TESTPROG_MODE=exit      rank VICTIM exits with status 3 while an allreduce is in flight
//	TESTPROG_MODE=freeze    rank VICTIM stops itself with SIGSTOP before the allreduce
//	TESTPROG_MODE=fail      rank VICTIM prints to stderr and exits 7 before joining
//	TESTPROG_MODE=noinit    rank VICTIM sleeps a minute instead of joining
//	TESTPROG_MODE=leave     rank VICTIM makes ITERS-1 allreduces, closes its Comm (printing
//	                        Close's error, if any, to stderr) and exits 0; the others
//	                        make ITERS
//	TESTPROG_MODE=failall   every rank makes ITERS allreduces, closes its Comm, prints
//	                        "testprog: rank R failing after Close" to stderr and exits 6
//	TESTPROG_MODE=loop      every rank runs allreduces until it is stopped, printing
//	                        "rank R looping" after the first one
//	TESTPROG_FAIL_ONCE=R    rank R exits 5 on the first launch (GORUN_RESTART_COUNT=0)
//	TESTPROG_SHOWENV=1      every rank prints its GORUN_* identity and listen address
//	TESTPROG_STAMP=1        every rank prints the time its first allreduce finished
//	TESTPROG_LINES=N        every rank prints N long lines (to check they are never cut)
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

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
	if mode == "noinit" && rankEnv == strconv.Itoa(victim) {
		time.Sleep(time.Minute) // never registers
	}
	if once := os.Getenv("TESTPROG_FAIL_ONCE"); once != "" && once == rankEnv && os.Getenv("GORUN_RESTART_COUNT") == "0" {
		fmt.Fprintf(os.Stderr, "testprog: rank %s failing once on purpose\n", rankEnv)
		os.Exit(5)
	}
	ctx := context.Background()
	comm, err := collective.Init(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer comm.Close()
	rank, n := comm.Rank(), comm.Size()
	if os.Getenv("TESTPROG_SHOWENV") != "" {
		fmt.Printf("rank %d env local_rank=%s local_size=%s listen_ip=%s restart=%s\n", rank,
			os.Getenv("GORUN_LOCAL_RANK"), os.Getenv("GORUN_LOCAL_SIZE"), os.Getenv("GORUN_LISTEN_IP"), os.Getenv("GORUN_RESTART_COUNT"))
	}
	if k, _ := strconv.Atoi(os.Getenv("TESTPROG_LINES")); k > 0 {
		line := strings.Repeat(strconv.Itoa(rank), 3000)
		for i := range k {
			fmt.Printf("line %d %s end\n", i, line)
		}
	}
	buf := make([]float32, 1<<20)
	for it := range iters {
		for i := range buf {
			buf[i] = float32((rank + 1) * (i%7 + it))
		}
		if rank == victim {
			switch mode {
			case "leave":
				if it == iters-1 {
					if err := comm.Close(); err != nil {
						fmt.Fprintln(os.Stderr, err)
					}
					fmt.Printf("rank %d closed after %d allreduces\n", rank, it)
					os.Exit(0)
				}
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
		if it == 0 && os.Getenv("TESTPROG_STAMP") != "" {
			fmt.Printf("rank %d first allreduce done at %d\n", rank, time.Now().UnixNano())
		}
		for i, v := range buf {
			if want := float32(n * (n + 1) / 2 * (i%7 + it)); v != want {
				fmt.Fprintf(os.Stderr, "rank %d: element %d = %v, want %v\n", rank, i, v, want)
				os.Exit(4)
			}
		}
	}
	if mode == "failall" {
		comm.Close()
		fmt.Fprintf(os.Stderr, "testprog: rank %d failing after Close\n", rank)
		os.Exit(6)
	}
	if mode == "loop" {
		for it := 0; ; it++ {
			if err := comm.Allreduce(ctx, buf[:1024], collective.Sum); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
			if it == 0 {
				fmt.Printf("rank %d looping\n", rank)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	fmt.Printf("rank %d of %d ok (source %s)\n", rank, n, os.Getenv("TESTPROG_SOURCE"))
}
