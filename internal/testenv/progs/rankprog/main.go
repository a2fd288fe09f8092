// Command rankprog is a rank program for gorun's output tests. It needs no
// rendezvous: it never calls collective.Init. Its flags are parsed with the
// flag package, so a bad flag prints the usage and exits 2, and --help
// prints it and exits 0, on every rank. RANKPROG_MODE says what it does:
//
//	(unset)  print "rank R ok"
//	loop     print "rank R looping" and wait; on SIGTERM, print an abort
//	         error that blames a peer to stderr (as a real rank would) and
//	         exit 1
//	chatty   print "rank R line I" every few milliseconds until stopped
//	status   print "tty=$GORUN_TTY", then draw a status on stderr ("\rstep
//	         I/N", in pieces) while printing result lines on stdout (in
//	         pieces), and lines after clearing the status on stderr
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	flag.Float64("lr", 0.1, "learning rate")
	flag.Int("epochs", 1, "passes over the data")
	flag.Int("batch", 32, "samples per step and rank")
	flag.Parse()
	rank, _ := strconv.Atoi(os.Getenv("GORUN_RANK"))
	size, _ := strconv.Atoi(os.Getenv("GORUN_SIZE"))
	size = max(size, 1)
	switch os.Getenv("RANKPROG_MODE") {
	case "loop":
		term := make(chan os.Signal, 1)
		signal.Notify(term, syscall.SIGTERM)
		fmt.Printf("rank %d looping\n", rank)
		<-term
		fmt.Fprintf(os.Stderr, "rank %d: rank %d aborted: recv from rank %d: terminated signal received\n", rank, (rank+1)%size, (rank+size-1)%size)
		os.Exit(1)
	case "chatty":
		for i := 0; ; i++ {
			fmt.Printf("rank %d line %d\n", rank, i)
			time.Sleep(2 * time.Millisecond)
		}
	case "status":
		fmt.Printf("tty=%s\n", os.Getenv("GORUN_TTY"))
		const n = 50
		for i := 1; i <= n; i++ {
			fmt.Fprintf(os.Stderr, "\rste")
			fmt.Fprintf(os.Stderr, "p %d/%d", i, n)
			fmt.Print("resu")
			fmt.Printf("lt %d\n", i)
			if i%10 == 0 {
				// Clear the status, then a line on the same stream, as a
				// progress bar library does.
				fmt.Fprintf(os.Stderr, "\r\x1b[Kcheckpoint %d\n", i)
			}
			if i%25 == 0 {
				fmt.Fprintf(os.Stderr, "\r%30s\rhalf %d\n", "", i)
			}
			time.Sleep(time.Millisecond)
		}
		fmt.Fprintf(os.Stderr, "\rstep %d/%d done", n, n) // a last status, never ended
	default:
		fmt.Printf("rank %d ok\n", rank)
	}
}
