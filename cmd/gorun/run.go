package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/membership/etcdlog"
)

type runFlags struct {
	np           int
	hosts        string
	hostfile     string
	sshPort      int
	sshIdentity  string
	netIf        string
	timeout      time.Duration
	startTimeout time.Duration
	grace        time.Duration
	outputDir    string
	env          []string
	maxRestarts  int
	verbose      bool
	config       string
	timeline     string
	// launcherKind is --launcher: ssh, srun or auto; srun is what
	// validate decided (start remote ranks with srun).
	launcherKind string
	srun         bool
	// bindTo is --bind-to (GORUN_CPU_BIND): auto, none, or "" to leave
	// what gorun's environment says.
	bindTo string
	// ckptReplicas is --checkpoint-replicas (GORUN_CHECKPOINT_REPLICAS);
	// unset leaves package checkpoint's default.
	ckptReplicas optionalInt

	// Elastic jobs.
	minNP, maxNP      int
	discovery         string
	discoveryInterval time.Duration
	elasticTimeout    time.Duration
	heartbeatTimeout  time.Duration
	jobKeyFile        string
	rdzvReplicas      int
	rdzvBackend       string
	rdzvEndpoints     string
	rdzvID            string
	etcdEndpoints     []string // --rdzv-endpoints, read
	rdzvConf          string
	etcdTLS           *etcdlog.TLS // --rdzv-conf (or https:// endpoints), read
	cooldown          string
}

// defaultCooldown is --blacklist-cooldown's default: Horovod's
// --blacklist-cooldown-range 10 100.
const defaultCooldown = "10s,100s"

func newRootCmd() *cobra.Command {
	var f runFlags
	cmd := &cobra.Command{
		Use:   "gorun -np N [-H host:slots,...] [flags] [--] PROGRAM [ARGS...]",
		Short: "Launch a data-parallel job: N ranks of PROGRAM, on one host or many, that meet over libp2p",
		// gorun --help is one page: these few lines, the examples, and
		// the flags in groups (help.go); the manual is in help topics.
		Long: `gorun runs N ranks of PROGRAM here or on many hosts (ssh, srun): it hosts their
rendezvous, names each in GORUN_* variables, and stops all when one fails.`,
		Example: `  gorun -np 4 ./train --epochs 10               # 4 ranks on this host
  gorun -H node1:4,node2:4 /shared/bin/train    # 8 ranks on two hosts, over ssh
  gorun -np 4 --min-np 2 ./train                # elastic: goes on with 2 to 4 ranks
  gorun --min-np 2 --max-np 8 --host-discovery-script ./hosts.sh /shared/bin/train
  gorun bench -np 4 --sizes 4,1M,64M            # allreduce bandwidth, like nccl-tests`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errors.New("no program to run: write gorun -np N PROGRAM [ARGS...], e.g. gorun -np 4 ./examples/mnist; gorun --help lists gorun's flags")
			}
			return nil
		},
		SilenceUsage:  true,
		SilenceErrors: true,
		// gorun completion still works; its line is left out of the
		// one-page --help, which the flags fill.
		CompletionOptions: cobra.CompletionOptions{HiddenDefaultCmd: true},
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.config != "" {
				if err := applyConfig(cmd.Flags(), f.config); err != nil {
					return err
				}
			}
			return runJob(cmd.Context(), f, cmd.Flags(), args)
		},
	}
	cmd.Flags().SetInterspersed(false) // flags after PROGRAM belong to PROGRAM
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		if c != cmd {
			return err
		}
		return unknownFlagHint(err, os.Args[1:])
	})
	fl := cmd.Flags()
	// One line each in gorun --help, under the headings of flagGroups
	// (help.go); the rest of what a flag does is in a help topic.
	fl.IntVar(&f.np, "np", 1, "run `N` ranks (also written -np N)")
	fl.StringArrayVarP(&f.env, "env", "x", nil, "pass `NAME[=VALUE]` to every rank (repeatable)")
	fl.StringVar(&f.bindTo, "bind-to", "", "bind each rank to its share of its host's cores: auto or none")
	fl.DurationVar(&f.timeout, "timeout", 0, "collective timeout, GORUN_TIMEOUT (default 60s)")
	fl.DurationVar(&f.startTimeout, "start-timeout", 30*time.Second, "time for every rank to reach the rendezvous")
	fl.DurationVar(&f.grace, "grace", 5*time.Second, "time from SIGTERM to SIGKILL when stopping ranks")
	fl.IntVar(&f.maxRestarts, "max-restarts", 0, "relaunch the whole job after a failure, up to `K` times")
	fl.StringVar(&f.config, "config", "", "read flag values from a YAML `FILE`; the command line wins")

	fl.StringVarP(&f.hosts, "hosts", "H", "", "hosts and their slots, e.g. node1:4,node2:4")
	fl.StringVar(&f.hostfile, "hostfile", "", "hosts from a `FILE` of \"host slots=N\" lines (# comments)")
	fl.StringVar(&f.launcherKind, "launcher", "auto", "how remote ranks start: ssh, srun or auto")
	fl.IntVar(&f.sshPort, "ssh-port", 0, "ssh `PORT` of the remote hosts (default: ssh's)")
	fl.StringVar(&f.sshIdentity, "ssh-identity-file", "", "ssh private key `FILE` for the remote hosts (ssh -i)")
	fl.StringVar(&f.netIf, "network-interface", "", "interface `NAME|CIDR` the rendezvous and ranks listen on")

	fl.IntVar(&f.minNP, "min-np", 0, "go on with at least `N` ranks (elastic when below -np)")
	fl.IntVar(&f.maxNP, "max-np", 0, "run at most `N` ranks (elastic when above -np)")
	fl.StringVar(&f.discovery, "host-discovery-script", "", "a `SCRIPT` printing the job's hosts as host:slots lines")
	fl.DurationVar(&f.discoveryInterval, "discovery-interval", launcher.DefaultDiscoveryInterval, "how often the discovery script runs")
	fl.DurationVar(&f.elasticTimeout, "elastic-timeout", launcher.DefaultElasticTimeout, "how long the job may wait below --min-np")
	fl.DurationVar(&f.heartbeatTimeout, "heartbeat-timeout", launcher.DefaultHeartbeatTimeout, "a rank or host silent this long is lost")
	fl.StringVar(&f.cooldown, "blacklist-cooldown", defaultCooldown, "no ranks on a failed host for `MIN[,MAX]`")
	fl.StringVar(&f.jobKeyFile, "job-key-file", "", "keep the job key in `FILE`; print how to join by hand")
	fl.IntVar(&f.rdzvReplicas, "rdzv-replicas", 1, "keep the membership on `N` replicas: 1, 3 or 5 (gorun help elastic)")
	fl.StringVar(&f.rdzvBackend, "rdzv-backend", "gorun", "keep the membership in `BACKEND`: gorun (its rendezvous) or etcd")
	fl.StringVar(&f.rdzvEndpoints, "rdzv-endpoints", "", "the etcd cluster's client addresses, `HOST:PORT,...`")
	fl.StringVar(&f.rdzvID, "rdzv-id", "", "the job's `ID` in etcd (default: a new one for each run)")
	fl.StringVar(&f.rdzvConf, "rdzv-conf", "", "etcd over TLS: `cacert=FILE,cert=FILE,key=FILE`")

	fl.StringVar(&f.outputDir, "output-dir", "", "also write each rank's output to `DIR`/rank.N/{stdout,stderr}")
	fl.BoolVar(&f.verbose, "verbose", false, "say what gorun does: hosts, addresses, rendezvous, stops")
	fl.StringVar(&f.timeline, "timeline", "", "write a Chrome trace of the ranks' collectives to `FILE`")

	fl.Var(&f.ckptReplicas, "checkpoint-replicas", "keep each checkpoint file on `k` more hosts than its own")
	cmd.AddCommand(newBenchCmd(), newBenchWorkerCmd())
	cmd.AddCommand(newCheckpointCmd())
	cmd.AddCommand(newSimCmd())
	setUpHelp(cmd)
	return cmd
}

// applyConfig sets every flag named in the YAML file that the command line
// did not set.
func applyConfig(fl *pflag.FlagSet, name string) error {
	data, err := os.ReadFile(name)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(data, &m); err != nil {
		return fmt.Errorf("--config %s: not a YAML mapping of flag names to values: %v", name, strings.ReplaceAll(err.Error(), "\n", " "))
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fname := strings.ReplaceAll(k, "_", "-")
		if fname == "x" || fname == "H" {
			fname = map[string]string{"x": "env", "H": "hosts"}[fname]
		}
		f := fl.Lookup(fname)
		if f == nil || fname == "config" || fname == "help" {
			return fmt.Errorf("--config %s: unknown key %q; use long flag names such as np, hosts, hostfile, env, start-timeout", name, k)
		}
		if f.Changed {
			continue // the command line wins
		}
		var vals []string
		switch v := m[k].(type) {
		case []any:
			for _, x := range v {
				vals = append(vals, fmt.Sprint(x))
			}
			if fname == "hosts" {
				vals = []string{strings.Join(vals, ",")}
			}
		case map[string]any:
			if fname != "env" {
				return fmt.Errorf("--config %s: %s: want a value, not a mapping", name, k)
			}
			for _, n := range sortedKeys(v) {
				vals = append(vals, n+"="+fmt.Sprint(v[n]))
			}
		case nil:
			continue
		default:
			s := fmt.Sprint(v)
			if f.Value.Type() == "duration" {
				if _, err := strconv.ParseFloat(s, 64); err == nil {
					s += "s" // plain numbers are seconds
				}
			}
			vals = []string{s}
		}
		for _, s := range vals {
			if err := fl.Set(fname, s); err != nil {
				return fmt.Errorf("--config %s: %s: %v", name, k, err)
			}
		}
		f.Changed = false // still "not from the command line"
	}
	return nil
}

func sortedKeys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// hostList reads -H or --hostfile.
func (f runFlags) hostList() ([]launcher.Host, error) {
	switch {
	case f.hosts != "" && f.hostfile != "":
		return nil, errors.New("-H and --hostfile both given: use one of them")
	case f.hosts != "":
		return launcher.ParseHosts(f.hosts)
	case f.hostfile != "":
		return launcher.ParseHostfile(f.hostfile)
	}
	return nil, nil
}

// validate checks the flags and returns the hosts (nil: this host only)
// and, for an elastic job, its settings. With a discovery script it runs
// the script once (bounded) for the hosts to start on.
func (f *runFlags) validate(ctx context.Context, fl *pflag.FlagSet) ([]launcher.Host, *launcher.Elastic, error) {
	if err := f.checkElasticFlags(fl); err != nil {
		return nil, nil, err
	}
	if f.ckptReplicas.set && f.ckptReplicas.v < 0 {
		return nil, nil, fmt.Errorf("--checkpoint-replicas must be 0 or more, got %d", f.ckptReplicas.v)
	}
	hosts, err := f.hostList()
	if err != nil {
		return nil, nil, err
	}
	fromSlurm, err := f.chooseLauncher(hosts)
	if err != nil {
		return nil, nil, err
	}
	if fromSlurm != nil {
		hosts = fromSlurm
	}
	if f.discovery != "" {
		if hosts != nil {
			return nil, nil, errors.New("--host-discovery-script and -H/--hostfile both given: the script's hosts replace -H; use one of them")
		}
		if hosts, err = launcher.Discover(ctx, f.discovery, launcher.DefaultDiscoveryTimeout); err != nil {
			return nil, nil, fmt.Errorf("--host-discovery-script %s: %v (nothing was started)", f.discovery, err)
		}
	}
	if hosts != nil && !fl.Changed("np") {
		f.np = launcher.TotalSlots(hosts)
		if f.discovery != "" && f.maxNP > 0 {
			f.np = min(f.np, f.maxNP)
		}
	}
	if f.np < 1 {
		return nil, nil, fmt.Errorf("-np must be at least 1, got %d", f.np)
	}
	if slots := launcher.TotalSlots(hosts); hosts != nil && slots < f.np {
		where := "-H " + f.hosts
		if f.hostfile != "" {
			where = "--hostfile " + f.hostfile
		}
		if fromSlurm != nil {
			where = fmt.Sprintf("the Slurm allocation (%s)", launcher.FormatHosts(hosts))
		}
		if f.discovery != "" {
			where = fmt.Sprintf("--host-discovery-script %s lists %s, which", f.discovery, launcher.FormatHosts(hosts))
		}
		return nil, nil, fmt.Errorf("-np %d needs %d slots but %s has %d: add hosts or slots (host:slots), or lower -np", f.np, f.np, where, slots)
	}
	el, err := f.elastic(fl)
	if err != nil {
		return nil, nil, err
	}
	if f.maxRestarts < 0 {
		return nil, nil, fmt.Errorf("--max-restarts must be 0 or more, got %d", f.maxRestarts)
	}
	if f.sshPort < 0 || f.sshPort > 65535 {
		return nil, nil, fmt.Errorf("--ssh-port %d is not a port number (1-65535)", f.sshPort)
	}
	if f.sshIdentity != "" {
		if _, err := os.Stat(f.sshIdentity); err != nil {
			return nil, nil, fmt.Errorf("--ssh-identity-file: %v", err)
		}
	}
	return hosts, el, nil
}

// chooseLauncher applies --launcher: it sets f.srun, and returns the Slurm
// allocation's hosts when the job is to run on them (no -H, --hostfile or
// discovery script, inside an allocation), else nil.
func (f *runFlags) chooseLauncher(hosts []launcher.Host) ([]launcher.Host, error) {
	switch f.launcherKind {
	case "ssh":
		return nil, nil
	case "srun", "auto":
	default:
		return nil, fmt.Errorf("--launcher %q: want ssh, srun or auto", f.launcherKind)
	}
	alloc, inAllocation, err := launcher.SlurmAllocation(os.Getenv)
	switch {
	case !inAllocation && f.launcherKind == "srun":
		return nil, errors.New("--launcher srun: gorun is not inside a Slurm allocation (SLURM_JOB_ID or SLURM_JOB_NODELIST is not set): run gorun from an sbatch script or a salloc shell, or use --launcher ssh")
	case !inAllocation:
		return nil, nil
	case hosts != nil || f.discovery != "":
		// The user's hosts: srun only if asked for.
		f.srun = f.launcherKind == "srun"
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("%v (or pass -H, or --launcher ssh)", err)
	}
	f.srun = true
	return alloc, nil
}

// tuningEnv is the tuning variables set in gorun's environment, as
// NAME=VALUE pairs for every rank.
func tuningEnv() []string {
	var out []string
	for _, name := range collective.TuningEnv {
		if v, ok := os.LookupEnv(name); ok {
			out = append(out, name+"="+v)
		}
	}
	return out
}

func (f runFlags) envPairs() ([]string, error) {
	// The tuning variables every rank must agree on go to every rank,
	// remote ones included, as mpirun passes OMPI_MCA_*: a remote rank
	// that picked another allreduce algorithm would fail the first call.
	// -x, which comes after, still wins.
	out := tuningEnv()
	switch f.bindTo {
	case "":
	case "auto", "none":
		out = append(out, collective.EnvCPUBind+"="+f.bindTo)
	default:
		return nil, fmt.Errorf("--bind-to %q: want auto or none", f.bindTo)
	}
	for _, e := range f.env {
		name, _, hasValue := strings.Cut(e, "=")
		if name == "" || strings.ContainsAny(name, " \t\n") {
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

func runJob(ctx context.Context, f runFlags, fl *pflag.FlagSet, args []string) error {
	hosts, el, err := f.validate(ctx, fl)
	if err != nil {
		return err
	}
	env, err := f.envPairs()
	if err != nil {
		return err
	}
	if launcher.IsPackage(args[0]) {
		for _, h := range hosts {
			if !launcher.IsLocalHost(h.Name) {
				return fmt.Errorf("%s is a Go package: gorun would build it into this host's cache (%s), which host %s does not see; build it to a path every host shares (go build -o /shared/bin/NAME %s) and pass the binary", args[0], launcher.BuildCacheDir(), h.Name, args[0])
			}
		}
	}
	foldWindow, err := foldWindowFromEnv()
	if err != nil {
		return err
	}
	con := launcher.NewConsole(os.Stdout, os.Stderr)
	program, err := launcher.BuildIfPackage(ctx, args[0], con)
	if err != nil {
		var stop stopSignal
		if errors.As(err, &stop) {
			con.Logf("%s while building %s", stop.reason(), args[0])
			return exitError(stop.exitCode())
		}
		return err
	}
	if f.ckptReplicas.set {
		env = append(env, checkpoint.EnvReplicas+"="+strconv.Itoa(f.ckptReplicas.v))
	}
	if f.timeline != "" {
		if f.timeline, err = filepath.Abs(f.timeline); err != nil {
			return err
		}
		env = append(env, collective.EnvTimeline+"="+f.timeline)
		defer mergeTimeline(f.timeline, f.np)
	}
	var srun *launcher.Srun
	if f.srun {
		srun = &launcher.Srun{Options: strings.Fields(os.Getenv("GORUN_SRUN_OPTS"))}
	}
	err = launcher.Run(ctx, launcher.Job{
		NP: f.np, Program: program, Args: args[1:], Env: env,
		Timeout: f.timeout, StartTimeout: f.startTimeout, Grace: f.grace,
		MaxRestarts: f.maxRestarts, Verbose: f.verbose, Elastic: el,
		Hosts: hosts, NetworkInterface: f.netIf, OutputDir: f.outputDir,
		SSH: launcher.SSH{
			Port: f.sshPort, IdentityFile: f.sshIdentity,
			ConnectTimeout: min(f.startTimeout, 30*time.Second),
			Options:        strings.Fields(os.Getenv("GORUN_SSH_OPTS")),
			Srun:           srun,
		},
		Console: con, FoldWindow: foldWindow,
	})
	var rankErr *launcher.RankError
	var elasticErr *launcher.ElasticError
	var hostErr *launcher.HostError
	var stopped *launcher.StoppedError
	var stop stopSignal
	switch {
	case errors.As(err, &stopped):
		con.Logf("%s; %s", stopReason(stopped.Cause), stopped.Outcome())
		return exitError(stopExitCode(stopped.Cause))
	case errors.As(err, &stop): // while checking the hosts
		con.Logf("%s before any rank started", stop.reason())
		return exitError(stop.exitCode())
	case errors.As(err, &rankErr), errors.As(err, &elasticErr):
		con.Logf("job failed: %v", err)
		return exitError(1)
	case errors.As(err, &hostErr):
		con.Logf("%v", err)
		return exitError(1)
	}
	return err
}

// foldWindowFromEnv reads GORUN_FOLD_WINDOW: how long a line waits for the
// same line from other ranks (default 100ms; 0 turns folding off).
func foldWindowFromEnv() (time.Duration, error) {
	v := os.Getenv("GORUN_FOLD_WINDOW")
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("GORUN_FOLD_WINDOW=%s: want a duration such as 100ms or 1s, or 0 to print every rank's lines unfolded", v)
	}
	if d == 0 {
		return -1, nil
	}
	return d, nil
}

// stopReason says why the job was stopped from outside.
func stopReason(cause error) string {
	var sig stopSignal
	if errors.As(cause, &sig) {
		return sig.reason()
	}
	return "stopped: " + cause.Error()
}

// stopExitCode is 128+N after signal N, as a shell reports a program a
// signal ended: 130 after Ctrl-C, 143 after SIGTERM, 141 when the output
// pipe closed (SIGPIPE).
func stopExitCode(cause error) int {
	var sig stopSignal
	var closed *launcher.OutputClosedError
	switch {
	case errors.As(cause, &sig):
		return sig.exitCode()
	case errors.As(cause, &closed):
		return 128 + int(syscall.SIGPIPE)
	}
	return 1
}

// unknownFlagHint turns cobra's "unknown flag: --epochs" into a hint that
// the program's flags go after PROGRAM, with the command line fixed: args
// are gorun's arguments as the user gave them.
func unknownFlagHint(err error, args []string) error {
	msg := err.Error()
	var flag string
	switch {
	case strings.HasPrefix(msg, "unknown flag: "):
		flag = strings.TrimPrefix(msg, "unknown flag: ")
	case strings.HasPrefix(msg, "unknown shorthand flag: ") && strings.Contains(msg, " in "):
		flag = msg[strings.LastIndex(msg, " in ")+len(" in "):]
	default:
		return fmt.Errorf("%v (gorun --help lists gorun's flags)", err)
	}
	i := slices.IndexFunc(args, func(a string) bool { return a == flag || strings.HasPrefix(a, flag+"=") })
	if i < 0 {
		return fmt.Errorf("unknown flag %s: gorun's own flags come before PROGRAM, the program's after it: gorun -np N PROGRAM %s (gorun --help lists gorun's flags)", flag, flag)
	}
	moved, rest := []string{args[i]}, args[i+1:]
	// "--epochs 3 ./train": 3 is the flag's value when something follows it,
	// or when it is all that follows and names no program.
	if !strings.Contains(args[i], "=") && len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		if _, err := os.Stat(rest[0]); len(rest) >= 2 || err != nil && !strings.Contains(rest[0], "/") {
			moved, rest = append(moved, rest[0]), rest[1:]
		}
	}
	// PROGRAM is the first argument that is neither a flag of gorun's nor
	// its value.
	j := 0
	for j < len(rest) && strings.HasPrefix(rest[j], "-") {
		if rest[j] == "--" {
			j++
			break
		}
		if takesValue(rest[j]) {
			j++
		}
		j++
	}
	fixed := slices.Clone(args[:i])
	if j < len(rest) {
		fixed = append(append(append(fixed, rest[:j+1]...), moved...), rest[j+1:]...)
	} else {
		fixed = append(append(append(fixed, rest...), "PROGRAM"), moved...)
	}
	return fmt.Errorf("unknown flag %s: gorun's own flags come before PROGRAM, the program's after it: gorun %s (gorun --help lists gorun's flags)", flag, shellJoin(fixed))
}

// shellJoin writes args as a shell command line.
func shellJoin(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a != "" && !strings.ContainsFunc(a, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=@%+,", r))
		}) {
			out[i] = a
		} else {
			out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(out, " ")
}

// mergeTimeline joins the ranks' trace files (PATH.rankN, written as the job
// ran, so they hold what happened even if it failed) into PATH.
func mergeTimeline(path string, np int) {
	if np <= 1 {
		return // a one-rank job writes PATH itself
	}
	var parts []string
	for r := range np {
		p := fmt.Sprintf("%s.rank%d", path, r)
		if _, err := os.Stat(p); err == nil {
			parts = append(parts, p)
		}
	}
	if len(parts) == 0 {
		fmt.Fprintf(os.Stderr, "gorun: --timeline: no rank wrote a trace (do the ranks call collective.Init?)\n")
		return
	}
	if err := collective.MergeTimelines(path, parts...); err != nil {
		fmt.Fprintf(os.Stderr, "gorun: --timeline: %v\n", err)
		return
	}
	for _, p := range parts {
		os.Remove(p)
	}
	fmt.Fprintf(os.Stderr, "gorun: timeline of %d ranks written to %s\n", len(parts), path)
}
