// Command hangprog is a rank program that hangs on purpose, for the hang
// diagnosis tests. Every rank makes three allreduces, "layer1.w" to
// "layer3.w" (calls #1 to #3), except rank HANGPROG_VICTIM, which after
// call #2:
//
//	HANGPROG_MODE=skip     skips call #3 and waits in waitForShutdown, as a
//	                       rank whose loop ran one step fewer does
//	HANGPROG_MODE=spin     spins in spinInUserCode (an endless loop) before call #3
//	HANGPROG_MODE=syscall  blocks in blockInSyscall, a read(2) on a pipe
//	                       nobody writes, before call #3
//
// It only ends when it is stopped (gorun's SIGTERM).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/gorun/gorun/collective"
)

func main() {
	mode := os.Getenv("HANGPROG_MODE")
	victim, _ := strconv.Atoi(os.Getenv("HANGPROG_VICTIM"))
	ctx := context.Background()
	comm, err := collective.Init(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer comm.Close()
	buf := make([]float32, 1024)
	for step := 1; step <= 3; step++ {
		if comm.Rank() == victim && step == 3 {
			switch mode {
			case "skip":
				waitForShutdown()
				return
			case "spin":
				spinInUserCode()
			case "syscall":
				blockInSyscall()
			}
		}
		if err := comm.Allreduce(ctx, buf, collective.Sum, collective.Name(fmt.Sprintf("layer%d.w", step))); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		fmt.Printf("rank %d: call #%d done\n", comm.Rank(), step)
	}
}

// waitForShutdown waits for SIGTERM, as a program does that has finished
// its work (here: one step early) and waits to be stopped.
func waitForShutdown() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	<-sig
	os.Exit(0)
}

// spin is global, so the loop in spinInUserCode can not be optimised away.
var spin uint64

// spinInUserCode never returns: an endless loop in user code.
//
//go:noinline
func spinInUserCode() {
	for {
		spin++
	}
}

// blockInSyscall never returns: it reads a pipe whose write end nobody
// writes, with read(2) itself, so the goroutine sits in the system call.
func blockInSyscall() {
	var p [2]int
	if err := syscall.Pipe(p[:]); err != nil {
		fmt.Fprintln(os.Stderr, "pipe:", err)
		os.Exit(3)
	}
	b := make([]byte, 1)
	for {
		if _, err := syscall.Read(p[0], b); err != nil && err != syscall.EINTR {
			fmt.Fprintln(os.Stderr, "read:", err)
			os.Exit(3)
		}
	}
}
