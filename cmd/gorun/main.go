// Command gorun launches data-parallel jobs and measures their collectives.
//
//	gorun -np 4 ./train --epochs 10     start 4 ranks of ./train on this host
//	gorun -np 4 ./examples/mnist        build a Go package once, run it on 4 ranks
//	gorun -H node1:4,node2:4 /shared/train  8 ranks on two hosts, over ssh
//	gorun bench -np 4 --sizes 4,1M,64M  allreduce bandwidth, like nccl-tests
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"golang.org/x/sys/unix"
)

func main() {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sigs
		// The first signal stops the job in order; a second one, if the
		// stop itself hangs (say, on a terminal that does not take output),
		// ends gorun at once: its local ranks die with it (Pdeathsig) and
		// remote ones when their ssh sessions close.
		signal.Stop(sigs)
		if s, ok := s.(syscall.Signal); ok {
			cancel(stopSignal{s})
		}
	}()
	// gorun ... | head: a write to the closed pipe must fail with EPIPE, so
	// that gorun stops the ranks and cleans up, rather than kill gorun.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	root := newGorunCmd()
	root.SetArgs(horovodArgs(os.Args[1:]))
	if err := root.ExecuteContext(ctx); err != nil {
		var exit exitError
		if errors.As(err, &exit) {
			os.Exit(int(exit))
		}
		// A hidden worker (bench-worker) returns the library's errors,
		// which already start with "gorun: ".
		fmt.Fprintf(os.Stderr, "gorun: %s\n", strings.TrimPrefix(err.Error(), "gorun: "))
		var stop stopSignal
		if errors.As(err, &stop) {
			os.Exit(stop.exitCode())
		}
		os.Exit(1)
	}
}

// newGorunCmd is gorun with every command: the job launcher (newRootCmd)
// and gorun doctor with its agent.
func newGorunCmd() *cobra.Command {
	root := newRootCmd()
	root.AddCommand(newDoctorCmd(), newDoctorAgentCmd())
	return root
}

// stopSignal is why a job stopped when gorun got SIGINT (Ctrl-C) or
// SIGTERM: not a rank's fault.
type stopSignal struct{ sig syscall.Signal }

func (s stopSignal) Error() string {
	if s.sig == syscall.SIGINT {
		return "interrupt"
	}
	return fmt.Sprintf("%v (%s)", s.sig, unix.SignalName(s.sig))
}

// reason says why gorun stopped: "stopped by the user (interrupt)" for
// Ctrl-C, "stopped: terminated (SIGTERM)" for a signal from elsewhere.
func (s stopSignal) reason() string {
	if s.sig == syscall.SIGINT {
		return "stopped by the user (interrupt)"
	}
	return "stopped: " + s.Error()
}

// exitCode is what a shell expects of a program a signal stopped.
func (s stopSignal) exitCode() int { return 128 + int(s.sig) }

// exitError carries an exit status out of a command that already printed
// its message.
type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// horovodArgs accepts horovodrun's and mpirun's single-dash "-np N", which
// the POSIX-style flag parser would read as "-n p". Only gorun's own flags
// are rewritten: everything from the program name on is left alone.
func horovodArgs(args []string) []string {
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" || (!strings.HasPrefix(a, "-") && (i == 0 || !takesValue(args[i-1]))) && a != "bench" {
			return append(out, args[i:]...)
		}
		if a == "-np" || strings.HasPrefix(a, "-np=") {
			a = "-" + a
		}
		out = append(out, a)
	}
	return out
}

// takesValue says whether flag a consumes the next argument: whether it
// names a non-boolean flag of gorun or of one of its commands.
func takesValue(a string) bool {
	if !strings.HasPrefix(a, "-") || strings.Contains(a, "=") {
		return false
	}
	return valueFlags()[strings.TrimLeft(a, "-")]
}

// valueFlags are the names (long and short) of every flag of gorun and its
// commands that takes a value, read from the commands themselves so that a
// new flag can not be forgotten here.
func valueFlags() map[string]bool {
	valueFlagsOnce.Do(func() { valueFlagNames = collectValueFlags() })
	return valueFlagNames
}

var (
	valueFlagsOnce sync.Once
	valueFlagNames map[string]bool
)

func collectValueFlags() map[string]bool {
	names := map[string]bool{}
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if f.Value.Type() != "bool" {
				names[f.Name] = true
				if f.Shorthand != "" {
					names[f.Shorthand] = true
				}
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newGorunCmd())
	return names
}
