package main

import (
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/compress"
	"github.com/gorun/gorun/internal/bench"
	"github.com/gorun/gorun/launcher"
)

func newBenchCmd() *cobra.Command {
	var (
		np      int
		sizes   string
		iters   int
		warmup  int
		op      string
		asJSON  bool
		timeout time.Duration
		codec   string
		// reportPolicy: every rank prints its policy (tests check that
		// the ranks agree).
		reportPolicy bool
		where        runFlags // -H, --hostfile and ssh: where the ranks run
	)
	cmd := &cobra.Command{
		Use:   "bench [-np N] [-H host:slots,... | --hostfile FILE] [--sizes 4,1K,1M,64M] [--iters N] [--op allreduce|broadcast|allgather|reducescatter] [--compression int8] [--json]",
		Short: "Measure collective bandwidth and latency, like nccl-tests' all_reduce_perf",
		Long: `gorun bench launches N ranks of itself, on this host or, with -H or
--hostfile, on several (over ssh, as gorun -H does; N defaults to the
slots), and times a collective on float32 data at each size: it warms up, checks every result against the exact
answer, and prints bytes, the median time per op over the iterations (each
iteration's time is that of the slowest rank), algbw = bytes/time and
busbw = algbw*2(N-1)/N for allreduce ((N-1)/N for allgather and
reducescatter, 1 for broadcast), so numbers compare across rank counts,
and the algorithm the op ran at that size. By default it measures 4 bytes
to 256 MiB in powers of 4, one table. Across hosts, the table starts with
the links' latency and bandwidth the ranks measured at start, and the
allreduce policy (and compression threshold) they chose from them.`,
		Example: `  gorun bench -np 4
  gorun bench -np 2 --sizes 4,1048576,67108864 --json
  gorun bench -np 4 --op broadcast --sizes 1M,64M --iters 20
  gorun bench -np 4 --sizes 64M --compression int8 --json
  gorun bench -H node1:2,node2:2 --sizes 4,64K,1M,64M`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := bench.ParseSizes(sizes); err != nil {
				return err
			}
			switch op {
			case "allreduce", "broadcast", "allgather", "reducescatter":
			default:
				return fmt.Errorf("--op %q: use allreduce, broadcast, allgather or reducescatter", op)
			}
			hosts, err := where.hostList()
			if err != nil {
				return err
			}
			if hosts != nil && !cmd.Flags().Changed("np") {
				np = launcher.TotalSlots(hosts)
			}
			if where.sshPort < 0 || where.sshPort > 65535 {
				return fmt.Errorf("--ssh-port %d is not a port number (1-65535)", where.sshPort)
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			args := []string{"bench-worker", "--sizes", sizes, "--op", op,
				"--iters", strconv.Itoa(iters), "--warmup", strconv.Itoa(warmup)}
			if asJSON {
				args = append(args, "--json")
			}
			if reportPolicy {
				args = append(args, "--report-policy")
			}
			if codec != "" && codec != "none" {
				if _, err := compress.ByName(codec); err != nil {
					return fmt.Errorf("--compression: %w", err)
				}
				if op != "allreduce" {
					return fmt.Errorf("--compression applies to --op allreduce only")
				}
				args = append(args, "--compression", codec)
			}
			// Rank 0 prints the report: pass its stdout through unprefixed.
			out := newLineWriter(os.Stdout)
			prefixed := newLineWriter(os.Stderr)
			err = launcher.Run(cmd.Context(), launcher.Job{
				// Remote ranks get the tuning variables as gorun's own
				// ranks do: ranks that disagree on them fail or lose speed.
				NP: np, Program: self, Args: args, Timeout: timeout, Env: tuningEnv(),
				Hosts: hosts, NetworkInterface: where.netIf,
				SSH: launcher.SSH{
					Port: where.sshPort, IdentityFile: where.sshIdentity,
					ConnectTimeout: 30 * time.Second,
					Options:        strings.Fields(os.Getenv("GORUN_SSH_OPTS")),
				},
				Line: func(rank int, isErr bool, line []byte) {
					if rank == 0 && !isErr {
						out.write(line)
						return
					}
					prefixed.write([]byte(fmt.Sprintf("[%d] %s", rank, line)))
				},
			})
			if err != nil {
				return fmt.Errorf("bench failed: %w", err)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&np, "np", 2, "number of ranks")
	fl.StringVar(&sizes, "sizes", bench.DefaultSizes, "message sizes in bytes, comma-separated, K/M/G suffixes allowed")
	fl.IntVar(&iters, "iters", 0, "timed iterations per size (default: as many as take about 0.5 s, 5 to 20000)")
	fl.IntVar(&warmup, "warmup", 0, "untimed iterations per size (default: 10, 2 from 16 MiB)")
	fl.StringVar(&op, "op", "allreduce", "allreduce, broadcast, allgather or reducescatter")
	fl.BoolVar(&asJSON, "json", false, "print one JSON object per size")
	fl.DurationVar(&timeout, "timeout", 0, "collective timeout (default 60s)")
	fl.StringVar(&codec, "compression", "", "compress allreduces: none, fp16, bf16 or int8 (prints wire bytes, ratio and error)")
	fl.StringVarP(&where.hosts, "hosts", "H", "", "hosts and their slots, e.g. node1:2,node2:2 (ranks reached over ssh)")
	fl.StringVar(&where.hostfile, "hostfile", "", "hosts from a `FILE` of \"host slots=N\" lines (# comments)")
	fl.IntVar(&where.sshPort, "ssh-port", 0, "ssh `PORT` of the remote hosts (default: ssh's)")
	fl.StringVar(&where.sshIdentity, "ssh-identity-file", "", "ssh private key `FILE` for the remote hosts (ssh -i)")
	fl.StringVar(&where.netIf, "network-interface", "", "interface `NAME|CIDR` the rendezvous and ranks listen on")
	fl.BoolVar(&reportPolicy, "report-policy", false, "every rank prints the allreduce policy it chose to stderr (to check that they agree)")
	fl.MarkHidden("report-policy")
	return cmd
}

// newBenchWorkerCmd is what each rank of gorun bench runs.
func newBenchWorkerCmd() *cobra.Command {
	var (
		o            bench.Options
		sizes        string
		asJSON       bool
		reportPolicy bool
	)
	cmd := &cobra.Command{
		Use:           "bench-worker",
		Hidden:        true,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Sizes, err = bench.ParseSizes(sizes); err != nil {
				return err
			}
			ctx := cmd.Context()
			var opts []collective.Option
			if o.Compression != "" {
				codec, err := compress.ByName(o.Compression)
				if err != nil {
					return err
				}
				opts = append(opts, collective.WithCompression(codec))
			}
			comm, err := collective.Init(ctx, opts...)
			if err != nil {
				return err
			}
			defer comm.Close()
			// GORUN_CPUPROFILE=path writes each rank's CPU profile to
			// path.rank<N>, to see where a slow collective spends its CPU.
			if path := os.Getenv("GORUN_CPUPROFILE"); path != "" {
				f, err := os.Create(fmt.Sprintf("%s.rank%d", path, comm.Rank()))
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			if err := bench.Run(ctx, comm, o, asJSON, os.Stdout); err != nil {
				return err
			}
			if reportPolicy {
				// After the run: the policy the calls' timings refined.
				fmt.Fprintf(os.Stderr, "rank %d: allreduce policy %s; compression threshold %d\n", comm.Rank(), comm.AllreducePolicy(), comm.CompressionThreshold())
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&sizes, "sizes", "4", "")
	fl.StringVar(&o.Op, "op", "allreduce", "")
	fl.IntVar(&o.Iters, "iters", 0, "")
	fl.IntVar(&o.Warmup, "warmup", 0, "")
	fl.BoolVar(&asJSON, "json", false, "")
	fl.StringVar(&o.Compression, "compression", "", "")
	fl.BoolVar(&reportPolicy, "report-policy", false, "")
	return cmd
}

// lineWriter writes whole lines under a lock, so ranks never interleave
// mid-line.
type lineWriter struct {
	mu sync.Mutex
	f  *os.File
}

func newLineWriter(f *os.File) *lineWriter { return &lineWriter{f: f} }

func (w *lineWriter) write(line []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.f.Write(append(line[:len(line):len(line)], '\n'))
}
