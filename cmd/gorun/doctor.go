package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gorun/gorun/internal/bench"
	"github.com/gorun/gorun/internal/doctor"
	"github.com/gorun/gorun/launcher"
)

type doctorFlags struct {
	hosts, hostfile string
	sshPort         int
	sshIdentity     string
	checkpointDir   string
	minFree         string
	maxSkew         time.Duration
	timeout         time.Duration
	dialTimeout     time.Duration
	probeBytes      string
	probeTime       time.Duration
	agentDir        string
	launcherKind    string
	verbose         bool
}

func newDoctorCmd() *cobra.Command {
	var f doctorFlags
	cmd := &cobra.Command{
		Use:   "doctor [-H host:slots,... | --hostfile FILE] [flags] [PROGRAM]",
		Short: "Check that the hosts can run a job: ssh, PROGRAM, clocks, ports, links, disk, open files",
		Long: `gorun doctor checks, on every host of -H or --hostfile (inside a Slurm
allocation without them, its nodes, as gorun's jobs take them; else this
host), all hosts at once, what a job needs, and prints one table with a
verdict per check and, for each failure, what to fix:

  ssh               the host answers ssh (BatchMode, as gorun's jobs use it)
  gorun             the doctor agent (this gorun) runs there
  workdir           gorun's working directory exists there (remote ranks start in it)
  program           PROGRAM is at its path there, executable, and the same build
                    (sha256) as on the other hosts
  gorun version     the gorun PROGRAM links is this gorun's (a warning if not)
  clock             the host's clock is within --max-clock-skew of this host's
  checkpoint space  --checkpoint-dir ("{host}" expanded; default the working
                    directory) is writable and has --min-free free
  open files        the hard open-file limit (what Go ranks raise theirs to) is
                    enough for a job of the hosts' slots
  A -> B tcp        host A opens TCP connections to two ephemeral ports of
                    host B (one in each half of its ip_local_port_range),
                    where ranks and the rendezvous listen, then measures the
                    round trip of small messages and the bandwidth of one
                    stream (up to --probe-bytes or for --probe-time), for
                    every pair, both ways

The agent is this gorun's own binary: on this host it runs directly, on the
others over ssh (srun inside a Slurm allocation, as with --launcher for
jobs); a host that does not have it yet in --agent-dir gets it over the
session first, so gorun need not be installed there. What runs from
--agent-dir runs as you: gorun doctor creates it mode 0700, refuses one that
is not yours or that others may write (a failed gorun row), and checks the
agent's sha256 against this gorun's in the session that runs it (a cached
copy that differs is replaced). Every step has a deadline: a host that does
not answer, a dial that a firewall drops, shows as a failed row, not a
hang. Each host dials its peers' ports 16 at a time, then measures them one
after another (about half a second each), so --timeout defaults to 30s plus
1s per host.

Exit status: 0 when every check passed (warnings included), 1 when a check
failed (the table says which), 2 when gorun doctor could not check: a bad
flag or argument, an unreadable --hostfile, or a failure of its own.`,
		Example: `  gorun doctor -H node1:4,node2:4 /shared/bin/train
  gorun doctor --hostfile hosts.txt --checkpoint-dir /scratch/ckpt/{host} ./train
  GORUN_SSH_OPTS="-F ./ssh_config" gorun doctor -H a,b,c`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 1 {
				return doctorMisuse(fmt.Errorf("gorun doctor takes one PROGRAM, got %q: its arguments are not needed (gorun doctor -H ... PROGRAM)", strings.Join(args, " ")))
			}
			return nil
		},
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			program := ""
			if len(args) == 1 {
				program = args[0]
			}
			err := runDoctor(cmd, f, program)
			var exit exitError
			if err == nil || errors.As(err, &exit) {
				return err // the table's verdict, or a signal's status
			}
			return doctorMisuse(err)
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return doctorMisuse(fmt.Errorf("%v (gorun doctor --help lists its flags)", err))
	})
	fl := cmd.Flags()
	fl.StringVarP(&f.hosts, "hosts", "H", "", "hosts to check: host1:2,host2:2 (the slots size the open-file check)")
	fl.StringVar(&f.hostfile, "hostfile", "", "file listing the hosts, one \"host slots=N\" per line")
	fl.IntVar(&f.sshPort, "ssh-port", 0, "ssh port of the remote hosts (default: ssh's, or ~/.ssh/config's)")
	fl.StringVar(&f.sshIdentity, "ssh-identity-file", "", "ssh private key for the remote hosts (ssh -i); more options in GORUN_SSH_OPTS")
	fl.StringVar(&f.checkpointDir, "checkpoint-dir", "", "where the job writes checkpoints, \"{host}\" for each host's name (default: the working directory)")
	fl.StringVar(&f.minFree, "min-free", "1G", "least free space at --checkpoint-dir (K, M, G suffixes)")
	fl.DurationVar(&f.maxSkew, "max-clock-skew", time.Second, "largest clock difference between a host and this one")
	fl.DurationVar(&f.timeout, "timeout", 0, "the whole check; a host that has not answered by then fails (default 30s + 1s per host)")
	fl.DurationVar(&f.dialTimeout, "dial-timeout", 3*time.Second, "one TCP dial between two hosts; no answer within it is a failure (a firewall dropping packets)")
	fl.StringVar(&f.probeBytes, "probe-bytes", "64M", "most bytes one bandwidth probe sends")
	fl.DurationVar(&f.probeTime, "probe-time", 300*time.Millisecond, "longest one bandwidth probe sends")
	fl.StringVar(&f.agentDir, "agent-dir", "", "directory on remote hosts that keeps the agent binary, yours and private (created mode 0700; default ~/.cache/gorun/doctor)")
	fl.StringVar(&f.launcherKind, "launcher", "auto", "how remote hosts are reached, as for a job: ssh, srun (inside a Slurm allocation only), or auto: srun for the allocation's nodes when there is no -H or --hostfile, else ssh")
	fl.BoolVar(&f.verbose, "verbose", false, "say what gorun doctor does and how long each step took")
	return cmd
}

// doctorMisuse prints why gorun doctor could not check the hosts and
// makes it exit 2, so that a script tells that from a failed check (1).
func doctorMisuse(err error) error {
	fmt.Fprintf(os.Stderr, "gorun doctor: %v\n", err)
	return exitError(2)
}

func runDoctor(cmd *cobra.Command, f doctorFlags, program string) error {
	rf := runFlags{hosts: f.hosts, hostfile: f.hostfile, launcherKind: f.launcherKind}
	hosts, err := rf.hostList()
	if err != nil {
		return err
	}
	// Inside a Slurm allocation the hosts (and how they are reached) are
	// chosen as for a job: see runFlags.chooseLauncher.
	fromSlurm, err := rf.chooseLauncher(hosts)
	if err != nil {
		return err
	}
	if fromSlurm != nil {
		hosts = fromSlurm
	}
	var srun *launcher.Srun
	via := "ssh"
	if rf.srun {
		srun = &launcher.Srun{Options: strings.Fields(os.Getenv("GORUN_SRUN_OPTS"))}
		via = "srun"
	}
	if hosts == nil {
		hosts = []launcher.Host{{Name: "localhost", Slots: 1}}
	}
	if f.sshPort < 0 || f.sshPort > 65535 {
		return fmt.Errorf("--ssh-port %d is not a port number (1-65535)", f.sshPort)
	}
	if f.sshIdentity != "" {
		if _, err := os.Stat(f.sshIdentity); err != nil {
			return fmt.Errorf("--ssh-identity-file: %v", err)
		}
	}
	minFree, err := oneSize("--min-free", f.minFree)
	if err != nil {
		return err
	}
	probeBytes, err := oneSize("--probe-bytes", f.probeBytes)
	if err != nil {
		return err
	}
	if f.timeout < 0 || f.timeout == 0 && cmd.Flags().Changed("timeout") {
		return fmt.Errorf("--timeout must be positive, got %s", f.timeout)
	}
	if f.timeout == 0 {
		f.timeout = doctorTimeout(len(hosts))
	}
	for name, d := range map[string]time.Duration{"--dial-timeout": f.dialTimeout, "--probe-time": f.probeTime, "--max-clock-skew": f.maxSkew} {
		if d <= 0 {
			return fmt.Errorf("%s must be positive, got %s", name, d)
		}
	}
	if launcher.IsPackage(program) {
		return fmt.Errorf("%s is a Go package: jobs run a binary at the same path on every host; build it to a shared path (go build -o /shared/bin/NAME %s) and check that", program, program)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this gorun's executable (the doctor agent): %w", err)
	}
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	names := make([]string, len(hosts))
	for i, h := range hosts {
		names[i] = h.Name
	}
	var logf func(string, ...any)
	if f.verbose {
		logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, "gorun doctor: "+format+"\n", args...) }
	}
	expect := doctor.Expect{
		Program: program, Version: doctor.Version(), Slots: launcher.TotalSlots(hosts),
		MinFree: uint64(minFree), MaxSkew: f.maxSkew,
		SSHFlagsHelp: "; pass --ssh-port, --ssh-identity-file, or ssh options in GORUN_SSH_OPTS (e.g. \"-F ./ssh_config\")",
		Via:          via,
	}
	res, pairs, err := doctor.Run(cmd.Context(), doctor.Config{
		Hosts: names, Local: launcher.IsLocalHost, Expect: expect,
		WorkDir: wd, CheckpointDir: f.checkpointDir, AgentDir: f.agentDir, Self: self,
		SSH: launcher.SSH{
			Port: f.sshPort, IdentityFile: f.sshIdentity,
			ConnectTimeout: min(f.timeout/3, 10*time.Second), // leaves time for the probes after a dead host
			Options:        strings.Fields(os.Getenv("GORUN_SSH_OPTS")),
			Srun:           srun,
		},
		Timeout: f.timeout, DialTimeout: f.dialTimeout, ProbeBytes: probeBytes, ProbeTime: f.probeTime,
		Logf: logf,
	})
	if err != nil {
		return fmt.Errorf("could not check the hosts: %w", err)
	}
	var stop stopSignal
	if ctx := cmd.Context(); ctx.Err() != nil && errors.As(context.Cause(ctx), &stop) {
		fmt.Fprintf(os.Stderr, "gorun: %s during gorun doctor\n", stop.reason())
		return exitError(stop.exitCode())
	}
	rows := doctor.Evaluate(res, pairs, expect)
	if err := doctor.WriteTable(os.Stdout, rows); err != nil {
		return err
	}
	if n := doctor.Failed(rows); n > 0 {
		fmt.Fprintf(os.Stderr, "gorun doctor: %d of %d checks failed on %s: each says what to fix under it\n", n, len(rows), countOf(len(hosts), "host"))
		return exitError(1)
	}
	fmt.Fprintf(os.Stderr, "gorun doctor: all %d checks passed on %s (%s)\n", len(rows), countOf(len(hosts), "host"), countOf(len(pairs), "link"))
	return nil
}

// doctorTimeout is --timeout's default for n hosts: each host measures its
// peers one after another, about half a second each, after up to half the
// run for the agents to start (see doctor.Run).
func doctorTimeout(n int) time.Duration { return 30*time.Second + time.Duration(n)*time.Second }

// countOf writes "1 host", "3 hosts".
func countOf(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// oneSize reads one byte count such as 16M.
func oneSize(flag, s string) (int64, error) {
	v, err := bench.ParseSizes(s)
	if err != nil || len(v) != 1 {
		return 0, fmt.Errorf("%s %q: want one byte count such as 512M or 2G", flag, s)
	}
	return v[0], nil
}

// newDoctorAgentCmd is what gorun doctor runs on every host.
func newDoctorAgentCmd() *cobra.Command {
	var o doctor.AgentOptions
	cmd := &cobra.Command{
		Use:           "doctor-agent",
		Hidden:        true,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return doctor.RunAgent(cmd.Context(), os.Stdin, os.Stdout, o)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.Host, "host", "", "")
	fl.StringVar(&o.Program, "program", "", "")
	fl.StringVar(&o.WorkDir, "workdir", "", "")
	fl.StringVar(&o.CheckpointDir, "checkpoint-dir", "", "")
	fl.DurationVar(&o.Lifetime, "lifetime", 5*time.Minute, "")
	return cmd
}
