package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gorun/gorun/launcher"
)

type runFlags struct {
	np           int
	hosts        string
	timeout      time.Duration
	startTimeout time.Duration
	grace        time.Duration
	env          []string
	maxRestarts  int
	verbose      bool
}

func newRootCmd() *cobra.Command {
	var f runFlags
	cmd := &cobra.Command{
		Use:   "gorun -np N [flags] [--] PROGRAM [ARGS...]",
		Short: "Launch a data-parallel job: N ranks of PROGRAM that meet over libp2p",
		Long: `gorun starts N ranks of PROGRAM, gives each its identity and the job's secret
key in the environment (GORUN_RANK, GORUN_SIZE, GORUN_LOCAL_RANK,
GORUN_LOCAL_SIZE, GORUN_RENDEZVOUS, GORUN_JOB_KEY, GORUN_TIMEOUT,
GORUN_RESTART_COUNT), hosts the rendezvous where they find each other,
prefixes every output line with its rank, and fails the job as a whole: when
a rank fails, the others are stopped (SIGTERM, then SIGKILL) and gorun exits
non-zero naming the rank, its exit status and its last stderr lines.

If PROGRAM is a Go package directory (./examples/mnist), gorun builds it once
and runs the binary on every rank.`,
		Example: `  gorun -np 4 ./examples/mnist
  gorun -np 2 --timeout 30s ./train --epochs 3
  gorun -np 4 -x OMP_NUM_THREADS=1 -- ./train -v
  gorun bench -np 4 --sizes 4,1M,64M`,
		Args:          cobra.MinimumNArgs(1),
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runJob(cmd.Context(), f, args)
		},
	}
	cmd.Flags().SetInterspersed(false) // flags after PROGRAM belong to PROGRAM
	fl := cmd.Flags()
	fl.IntVar(&f.np, "np", 1, "number of ranks (also -np N, as in horovodrun and mpirun)")
	fl.StringVarP(&f.hosts, "hosts", "H", "", "hosts and slots, host1:2,host2:2 (this version runs on localhost only)")
	fl.DurationVar(&f.timeout, "timeout", 0, "collective timeout handed to the ranks as GORUN_TIMEOUT (default 60s)")
	fl.DurationVar(&f.startTimeout, "start-timeout", 30*time.Second, "every rank must register within this")
	fl.DurationVar(&f.grace, "grace", 5*time.Second, "time between SIGTERM and SIGKILL when stopping ranks")
	fl.StringArrayVarP(&f.env, "env", "x", nil, "pass NAME=VALUE, or NAME from gorun's environment, to every rank (repeatable)")
	fl.IntVar(&f.maxRestarts, "max-restarts", 0, "relaunch the whole job after a failure, up to this many times")
	fl.BoolVar(&f.verbose, "verbose", false, "say what gorun does")
	cmd.AddCommand(newBenchCmd(), newBenchWorkerCmd())
	return cmd
}

func (f runFlags) validate() error {
	if f.np < 1 {
		return fmt.Errorf("-np must be at least 1, got %d", f.np)
	}
	if f.hosts != "" {
		slots := 0
		for _, h := range strings.Split(f.hosts, ",") {
			name, n, ok := strings.Cut(h, ":")
			k, err := strconv.Atoi(n)
			if !ok || err != nil || k < 1 || name == "" {
				return fmt.Errorf("-H %q: write host:slots[,host:slots...], e.g. -H localhost:4", f.hosts)
			}
			if name != "localhost" && name != "127.0.0.1" {
				return fmt.Errorf("-H %s: launching on other hosts is not supported by this version; use -H localhost:%d", name, k)
			}
			slots += k
		}
		if slots < f.np {
			return fmt.Errorf("-np %d needs %d slots but -H %s has %d", f.np, f.np, f.hosts, slots)
		}
	}
	if f.maxRestarts < 0 {
		return fmt.Errorf("--max-restarts must be 0 or more, got %d", f.maxRestarts)
	}
	return nil
}

func (f runFlags) envPairs() ([]string, error) {
	var out []string
	for _, e := range f.env {
		name, _, hasValue := strings.Cut(e, "=")
		if name == "" {
			return nil, fmt.Errorf("-x %q: write NAME=VALUE or NAME", e)
		}
		if !hasValue {
			v, ok := os.LookupEnv(name)
			if !ok {
				return nil, fmt.Errorf("-x %s: %s is not set in gorun's environment; write -x %s=VALUE", name, name, name)
			}
			e = name + "=" + v
		}
		out = append(out, e)
	}
	return out, nil
}

func runJob(ctx context.Context, f runFlags, args []string) error {
	if err := f.validate(); err != nil {
		return err
	}
	env, err := f.envPairs()
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "gorun-build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	program, err := launcher.BuildIfPackage(ctx, args[0], tmp)
	if err != nil {
		return err
	}
	err = launcher.Run(ctx, launcher.Job{
		NP: f.np, Program: program, Args: args[1:], Env: env,
		Timeout: f.timeout, StartTimeout: f.startTimeout, Grace: f.grace,
		MaxRestarts: f.maxRestarts, Verbose: f.verbose,
	})
	var rankErr *launcher.RankError
	if errors.As(err, &rankErr) {
		fmt.Fprintf(os.Stderr, "gorun: job failed: %v\n", err)
		return exitError(1)
	}
	return err
}
