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
		Long: `gorun starts N ranks of PROGRAM, gives each its identity and the job's secret
key in the environment (GORUN_RANK, GORUN_SIZE, GORUN_LOCAL_RANK,
GORUN_LOCAL_SIZE, GORUN_RENDEZVOUS, GORUN_JOB_KEY, GORUN_TIMEOUT,
GORUN_RESTART_COUNT, GORUN_LISTEN_IP, and GORUN_HOST: its host's name as
-H, --hostfile or the discovery script gives it, localhost without them),
hosts the rendezvous where they find each other, prefixes every output
line with its rank ([rank], or [host:rank] when the job spans hosts), and
fails the job as a whole: when a rank fails, the others are stopped
(SIGTERM, then SIGKILL after --grace) on every host, and gorun exits
non-zero naming the rank, its host and its exit status (ranks that failed
the same way are named once). Ctrl-C stops every rank the same way, and
gorun exits 130 (143 after SIGTERM, 141 when its output
pipe closes, as in gorun ... | head).

Identical lines that several ranks print at about the same time (a usage
message, --help) are printed once, prefixed with the ranks: [0-3]. When
gorun's stderr is a terminal, ranks get GORUN_TTY=1, and a status a rank
draws with '\r' (a progress bar) is shown live on the last line of the
screen, below the output lines.

Hosts (-H or --hostfile) are filled in order: the first host takes as many
ranks as it has slots, then the next. Without -np, the job has one rank per
slot. Ranks on this host (localhost, its name or one of its addresses) run
without ssh; the others run through the system ssh client (BatchMode, so keys
or an agent, not passwords; ~/.ssh/config applies; extra ssh options can be
given in GORUN_SSH_OPTS, e.g. GORUN_SSH_OPTS="-F ./ssh_config"). As with
horovodrun, PROGRAM must exist at the same path on every host, and gorun's
working directory must exist on every host: remote ranks start there. Remote
hosts need a POSIX sh and setsid (util-linux); ip (iproute2) is used to find
the address a remote rank listens on.

Inside a Slurm allocation (an sbatch script or a salloc shell: SLURM_JOB_ID
and SLURM_JOB_NODELIST set) and without -H or --hostfile, the hosts are the
allocation's nodes with one slot per task Slurm gave each
(SLURM_TASKS_PER_NODE), and remote ranks start with srun instead of ssh, as
mpirun does there: one job step of one task per rank (srun --nodes=1
--ntasks=1 --nodelist=HOST --overlap --kill-on-bad-exit=1 --cpu-bind=none
--export=ALL --quiet --quiet, plus GORUN_SRUN_OPTS; -v there brings srun's
own messages back). Such ranks see gorun's environment (and
the -x variables and GORUN_* as always). --launcher ssh keeps ssh there;
--launcher srun uses srun for -H hosts too (in an allocation only).

Before starting anything, gorun checks that every remote host can be reached
(all at once); an unreachable host is named with ssh's error and nothing
starts. The job key is sent to remote ranks over the ssh session's stdin,
never on a command line. The rendezvous listens on the address from which
the remote hosts reach this host (--verbose says which; --network-interface
chooses), and every rank listens on its host's address on that network.
Ranks on the same host talk over unix sockets, ranks on different hosts over
TLS.

--checkpoint-replicas k hands every rank GORUN_CHECKPOINT_REPLICAS=k, which
package checkpoint reads; unset, the library's default applies (2 when the
job's checkpoint directories are per host: "{host}" in the directory, which
each rank expands with its GORUN_HOST). A negative k is refused before
anything starts.

--config FILE reads any of these flags from YAML (keys are the long flag
names: np, hosts, hostfile, env: [A=1, B], start-timeout: 60s, ...); flags
on the command line win.

Elastic jobs (Horovod's grammar): with --min-np below -np, --max-np above
it, or --host-discovery-script, a rank that fails (or is killed, or whose
host goes silent for --heartbeat-timeout) does not fail the job: gorun says
which rank was lost and how, the rendezvous forms a new membership epoch
with the ranks left, and gorun says which ranks it has, whom it lost and how
long the reset took. Every rank gets GORUN_ELASTIC=1 and
GORUN_HEARTBEAT_TIMEOUT; the program must follow the membership changes (see
the collective package's elastic API). A host on which a rank failed gets no
new rank for --blacklist-cooldown (10s), doubled with each further failure
in a row up to the maximum (100s), and forgiven after it ran that maximum
without one: never banned for good. Then gorun starts a joiner there
(GORUN_RANK=-1, GORUN_SIZE still -np) in the lost rank's place, so a job on
fixed hosts (-H, --hostfile, or this host) grows back to -np. With
--host-discovery-script, the script is run at start (its hosts replace -H;
without -np, one rank per slot it lists, at most --max-np) and then every
--discovery-interval (3s), each run bounded by 10s; it prints one
host:slots line per host. New slots get joiners while the job has fewer
than --max-np ranks (default: as many as the script lists); the ranks of a
host it no longer lists, or beyond the slots it lists, are stopped (SIGTERM,
then SIGKILL after --grace). A run that fails or prints no host is logged,
and the last list kept. If its first list has only this host, give
--network-interface for remote hosts it may add later to reach the
rendezvous. Below --min-np the job waits --elastic-timeout
(600s) for ranks to join, then fails saying so; it also fails when no rank
is left. Otherwise it succeeds when the ranks left exit 0; once one has,
gorun starts no more joiners. Before every rank of the start has
registered, a failure fails the job as usual. Output prefixes and gorun's
messages number processes in the order gorun starts them (the starting
ranks keep their rank; joiners come after), not by their rank in later
epochs. --max-restarts with an elastic job relaunches it only when it
fails as a whole (with --host-discovery-script, on the hosts the script
lists then). Once a rank has exited 0, a rank that fails fails the job, as
in a fixed-size job; once the rendezvous has no member left, what still
runs is stopped after --grace. With --job-key-file FILE, gorun prints the
environment with which a rank started by hand (GORUN_RANK=-1) joins the
job, up to --max-np.

If PROGRAM is a Go package directory (./examples/mnist, or .), gorun builds
it once, in its own directory (so a package with its own go.mod builds too),
into a cache reused from run to run (~/.cache/gorun/build), and runs the
binary on every rank (on this host; for remote hosts, build it to a shared
path yourself).`,
		Example: `  gorun -np 4 ./examples/mnist
  gorun -np 2 --timeout 30s ./train --epochs 3
  gorun -np 4 -x OMP_NUM_THREADS=1 -x PATH -- ./train -v
  gorun -np 8 -H node1:4,node2:4 /shared/bin/train
  gorun -H node1:4,node2:4 --network-interface eth1 /shared/bin/train
  gorun --hostfile hosts.txt --ssh-port 2222 --ssh-identity-file ~/.ssh/id_ed25519 ./train
        (hosts.txt: one "host slots=N" per line, # comments)
  gorun -np 8 -H node1:4,node2:4 --output-dir logs --max-restarts 2 ./train
  gorun -np 4 --min-np 2 --max-np 6 ./train
        (elastic: goes on with 2 to 6 ranks; a lost rank is replaced after its host's cooldown)
  gorun --min-np 2 --max-np 8 --host-discovery-script ./hosts.sh /shared/bin/train
        (hosts.sh prints "node1:4" lines; polled every 3s)
  gorun --config job.yaml ./train
  gorun bench -np 4 --sizes 4,1M,64M`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errors.New("no program to run: write gorun -np N PROGRAM [ARGS...], e.g. gorun -np 4 ./examples/mnist; gorun --help lists gorun's flags")
			}
			return nil
		},
		SilenceUsage:  true,
		SilenceErrors: true,
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
	fl.IntVar(&f.np, "np", 1, "number of ranks, also -np N as in horovodrun and mpirun; with -H/--hostfile and no -np, one per slot")
	fl.StringVarP(&f.hosts, "hosts", "H", "", "hosts and their slots: host1:2,host2:2 (a host without :N has 1 slot)")
	fl.StringVar(&f.hostfile, "hostfile", "", "file listing hosts, one \"host slots=N\" per line, # comments")
	fl.StringVar(&f.bindTo, "bind-to", "", "bind each rank to its share of its host's cores: auto (the default: when the host has at least as many cores as ranks, as mpirun's --bind-to core) or none")
	fl.StringVar(&f.launcherKind, "launcher", "auto", "how remote ranks start: ssh, srun (a Slurm job step per rank; inside an allocation only), or auto: srun inside a Slurm allocation when the hosts are the allocation's (no -H or --hostfile), else ssh")
	fl.IntVar(&f.sshPort, "ssh-port", 0, "ssh port of the remote hosts (default: ssh's, or ~/.ssh/config's)")
	fl.StringVar(&f.sshIdentity, "ssh-identity-file", "", "ssh private key for the remote hosts (ssh -i)")
	fl.StringVar(&f.netIf, "network-interface", "", "interface NAME or CIDR whose address the rendezvous and ranks on this host listen on and advertise (default: the address the remote hosts reach this host at)")
	fl.DurationVar(&f.timeout, "timeout", 0, "collective timeout handed to the ranks as GORUN_TIMEOUT (default 60s)")
	fl.DurationVar(&f.startTimeout, "start-timeout", 30*time.Second, "every rank must register with the rendezvous within this; also the ssh connect timeout (at most 30s)")
	fl.DurationVar(&f.grace, "grace", 5*time.Second, "time between SIGTERM and SIGKILL when stopping ranks")
	fl.StringVar(&f.outputDir, "output-dir", "", "also write each rank's output to DIR/rank.N/stdout and DIR/rank.N/stderr")
	fl.StringArrayVarP(&f.env, "env", "x", nil, "pass NAME=VALUE, or NAME from gorun's environment, to every rank (repeatable; remote ranks get only these, the GORUN_* gorun sets, and the tuning variables set in gorun's environment: GORUN_ALLREDUCE_ALGORITHMS, GORUN_CHUNK_BYTES, GORUN_DATA_PLANE, GORUN_POLL_US, GORUN_SHM, GORUN_SHM_BYTES)")
	fl.IntVar(&f.maxRestarts, "max-restarts", 0, "relaunch the whole job after a failure, up to this many times (ranks see GORUN_RESTART_COUNT)")
	fl.BoolVar(&f.verbose, "verbose", false, "say what gorun does: hosts checked, addresses chosen, rendezvous, stop times")
	fl.StringVar(&f.config, "config", "", "YAML file of flag values (long flag names as keys); command-line flags win")
	fl.StringVar(&f.timeline, "timeline", "", "write a Chrome trace of every rank's collectives to this file (GORUN_TIMELINE; open in chrome://tracing or Perfetto)")
	fl.Var(&f.ckptReplicas, "checkpoint-replicas", "keep each checkpoint file on `k` more hosts' checkpoint directories than its own (replicated local checkpoints, when hosts do not share the directory; see package checkpoint)")
	fl.IntVar(&f.minNP, "min-np", 0, "elastic: the fewest ranks the job goes on with (default: -np); below -np makes the job elastic")
	fl.IntVar(&f.maxNP, "max-np", 0, "elastic: the most ranks the job runs with (default: -np, or the slots the discovery script lists); above -np makes the job elastic. Without --host-discovery-script gorun itself starts no more than -np ranks: the room above is for ranks started by hand (--job-key-file)")
	fl.StringVar(&f.discovery, "host-discovery-script", "", "elastic: executable printing the job's hosts as host:slots lines, run at start (its hosts replace -H) and every --discovery-interval")
	fl.DurationVar(&f.discoveryInterval, "discovery-interval", launcher.DefaultDiscoveryInterval, "elastic: how often the host discovery script is run")
	fl.DurationVar(&f.elasticTimeout, "elastic-timeout", launcher.DefaultElasticTimeout, "elastic: how long the job may wait below --min-np for ranks to join before it fails")
	fl.DurationVar(&f.heartbeatTimeout, "heartbeat-timeout", launcher.DefaultHeartbeatTimeout, "elastic: a rank (or host) silent this long is lost (GORUN_HEARTBEAT_TIMEOUT)")
	fl.StringVar(&f.jobKeyFile, "job-key-file", "", "elastic: keep the job key in FILE (created mode 0600 if missing) and print the environment with which a rank started by hand joins the job (GORUN_RANK=-1 GORUN_JOB_KEY_FILE=FILE ...)")
	fl.StringVar(&f.cooldown, "blacklist-cooldown", defaultCooldown, "elastic: MIN[,MAX]: a host where a rank failed gets no new rank for MIN, doubled per further failure in a row up to MAX (default MAX: 10×MIN); never a permanent ban")
	cmd.AddCommand(newBenchCmd(), newBenchWorkerCmd())
	cmd.AddCommand(newCheckpointCmd())
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

func (f runFlags) envPairs() ([]string, error) {
	// The tuning variables every rank must agree on go to every rank,
	// remote ones included, as mpirun passes OMPI_MCA_*: a remote rank
	// that picked another allreduce algorithm would fail the first call.
	// -x, which comes after, still wins.
	var out []string
	for _, name := range collective.TuningEnv {
		if v, ok := os.LookupEnv(name); ok {
			out = append(out, name+"="+v)
		}
	}
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
