package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// gorun --help is one page, as torchrun's and horovodrun's: what gorun
// does, its usage, a few examples, and its flags in groups, one line each.
// The manual is in help topics: gorun help elastic, gorun help hosts, ...

// flagGroups are the headings of gorun --help's flags, in order, and the
// flags under each, in order. A flag in none of them is listed under
// "Other flags" (TestHelpFlagGroups wants none there).
var flagGroups = []struct {
	title string
	flags []string
}{
	{"Launch flags", []string{"help", "np", "env", "bind-to", "timeout", "start-timeout", "grace", "max-restarts", "config", "checkpoint-replicas"}},
	{"Host flags", []string{"hosts", "hostfile", "launcher", "ssh-port", "ssh-identity-file", "network-interface"}},
	{"Elastic flags", []string{"min-np", "max-np", "host-discovery-script", "discovery-interval", "elastic-timeout",
		"heartbeat-timeout", "blacklist-cooldown", "job-key-file", "rdzv-replicas", "rdzv-backend", "rdzv-endpoints", "rdzv-id", "rdzv-conf"}},
	{"Output flags", []string{"output-dir", "verbose", "timeline"}},
}

// setUpHelp gives gorun's root command its one-page usage and the help
// topics. The topics are commands under gorun help, not under gorun
// itself, so a PROGRAM named elastic still runs as one.
func setUpHelp(root *cobra.Command) {
	// The root's usage is rootUsage's; its commands keep cobra's.
	cobra.AddTemplateFunc("gorunRootUsage", rootUsage)
	root.SetUsageTemplate(`{{if .HasParent}}` + root.UsageTemplate() + `{{else}}{{gorunRootUsage .}}{{end}}`)
	root.InitDefaultHelpCmd()
	for _, help := range root.Commands() {
		if help.Name() != "help" {
			continue
		}
		help.Use = "help [command | topic]"
		help.Short = "Help about any command, or a topic of the manual (gorun help TOPIC)"
		help.Long = "gorun help COMMAND prints a command's help, gorun help TOPIC a topic of\ngorun's manual."
		for _, t := range helpTopics {
			help.AddCommand(&cobra.Command{Use: t.name, Short: t.short, Long: t.text})
		}
	}
}

// rootUsage is gorun's usage: after the description (Long), the usage
// lines, the examples, the flags by group, the commands and the topics.
func rootUsage(c *cobra.Command) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage:\n  %s\n  %s [command]\n", c.UseLine(), c.CommandPath())
	fmt.Fprintf(&b, "\nExamples:\n%s\n", c.Example)
	for _, g := range groupedFlagUsages(c.LocalFlags()) {
		fmt.Fprintf(&b, "\n%s:\n%s", g.title, g.lines)
	}
	fmt.Fprintf(&b, "\nAvailable Commands (%s COMMAND --help says more):\n", c.CommandPath())
	for _, sub := range c.Commands() {
		if sub.IsAvailableCommand() || sub.Name() == "help" {
			fmt.Fprintf(&b, "  %-*s %s\n", sub.NamePadding(), sub.Name(), sub.Short)
		}
		if sub.Name() == "help" {
			names := make([]string, len(helpTopics))
			for i, t := range helpTopics {
				names[i] = t.name
			}
			fmt.Fprintf(&b, "  %-*s TOPIC: %s\n", sub.NamePadding(), "", strings.Join(names, ", "))
		}
	}
	return b.String()
}

// groupedFlagUsages returns the heading and the usage lines of each group of
// fl's flags. The lines are cut from fl.FlagUsages(), one per flag, so that
// every group is aligned as one table.
func groupedFlagUsages(fl *pflag.FlagSet) []struct{ title, lines string } {
	lines := map[string]string{}
	var order []string
	for _, line := range strings.SplitAfter(fl.FlagUsages(), "\n") {
		for _, field := range strings.Fields(line) {
			if name, ok := strings.CutPrefix(field, "--"); ok {
				lines[name] = line
				order = append(order, name)
				break
			}
		}
	}
	var groups []struct{ title, lines string }
	for _, g := range flagGroups {
		var b strings.Builder
		for _, name := range g.flags {
			b.WriteString(lines[name])
			delete(lines, name)
		}
		if b.Len() > 0 {
			groups = append(groups, struct{ title, lines string }{g.title, b.String()})
		}
	}
	var other strings.Builder
	for _, name := range order {
		other.WriteString(lines[name])
	}
	if other.Len() > 0 {
		groups = append(groups, struct{ title, lines string }{"Other flags", other.String()})
	}
	return groups
}

// helpTopics are gorun's manual: gorun help NAME prints a topic's text.
var helpTopics = []struct{ name, short, text string }{
	{"job", "How a job starts, fails and stops, and how it is restarted", helpJob},
	{"output", "What gorun prints: rank prefixes, folded lines, live status lines, traces", helpOutput},
	{"hosts", "Jobs on many hosts: -H, --hostfile, ssh, what a host needs, the network", helpHosts},
	{"slurm", "Jobs in a Slurm allocation: its hosts, ranks started with srun, --launcher", helpSlurm},
	{"elastic", "Elastic jobs: --min-np, --max-np, --host-discovery-script, joiners, cooldowns", helpElastic},
	{"environment", "The variables every rank gets, -x, and the ones gorun reads", helpEnvironment},
	{"config", "gorun's flags from a YAML file: --config FILE", helpConfig},
	{"build", "PROGRAM as a Go package: built once, cached", helpBuild},
	{"checkpoints", "Replicated local checkpoints (--checkpoint-replicas), and gorun checkpoint", helpCheckpoints},
}

const helpJob = `gorun starts N ranks of PROGRAM, gives each its identity and the job's secret
key in the environment (gorun help environment), hosts the rendezvous where
they find each other, prefixes every output line with its rank (gorun help
output), and fails the job as a whole: when a rank fails, the others are
stopped (SIGTERM, then SIGKILL after --grace) on every host, and gorun exits
non-zero naming the rank, its host and its exit status (ranks that failed the
same way are named once). Ctrl-C stops every rank the same way, and gorun
exits 130 (143 after SIGTERM, 141 when its output pipe closes, as in
gorun ... | head). An elastic job goes on instead (gorun help elastic).

gorun's own flags come before PROGRAM, the program's after it.

Flags:
  --np N (default 1)
      The number of ranks; -np N works too, as in horovodrun and mpirun. With
      -H or --hostfile and no -np, one rank per slot.
  --timeout DURATION
      The collective timeout, handed to the ranks as GORUN_TIMEOUT (default
      60s).
  --start-timeout DURATION (default 30s)
      Every rank must register with the rendezvous within this; it is also
      the ssh connect timeout (at most 30s).
  --grace DURATION (default 5s)
      The time between SIGTERM and SIGKILL when stopping ranks.
  --max-restarts K
      Relaunch the whole job after a failure, up to K times (ranks see
      GORUN_RESTART_COUNT); not when a rank exits with status 78, which
      says a restart would fail the same way (gorun help checkpoints).
  --bind-to auto|none
      Bind each rank to its share of its host's cores: auto (the default:
      when the host has at least as many cores as ranks, as mpirun's
      --bind-to core) or none. Ranks get it as GORUN_CPU_BIND.

Examples:
  gorun -np 2 --timeout 30s ./train --epochs 3
  gorun -np 8 -H node1:4,node2:4 --output-dir logs --max-restarts 2 ./train`

const helpOutput = `Every output line of a rank is prefixed with its rank: [rank], or
[host:rank] when the job spans hosts. In an elastic job the prefixes number
processes in the order gorun starts them (gorun help elastic).

Identical lines that several ranks print at about the same time (a usage
message, --help) are printed once, prefixed with the ranks: [0-3]. When
gorun's stderr is a terminal, ranks get GORUN_TTY=1, and a status a rank
draws with '\r' (a progress bar) is shown live on the last line of the
screen, below the output lines.

Flags:
  --output-dir DIR
      Also write each rank's output to DIR/rank.N/stdout and
      DIR/rank.N/stderr.
  --verbose
      Say what gorun does: hosts checked, addresses chosen, rendezvous, stop
      times.
  --timeline FILE
      Write a Chrome trace of every rank's collectives to FILE (the ranks get
      GORUN_TIMELINE); open it in chrome://tracing or Perfetto.`

const helpHosts = `-H node1:4,node2:4 (--hosts) gives the hosts and their slots (a host
without :N has 1 slot); --hostfile FILE lists them in a file, one
"host slots=N" per line, with # comments. Hosts are filled in order: the
first host takes as many ranks as it has slots, then the next. Without -np,
the job has one rank per slot.

Ranks on this host (localhost, its name or one of its addresses) run without
ssh; the others run through the system ssh client (BatchMode, so keys or an
agent, not passwords; ~/.ssh/config applies; extra ssh options can be given
in GORUN_SSH_OPTS, e.g. GORUN_SSH_OPTS="-F ./ssh_config"). --ssh-port is the
remote hosts' ssh port (default: ssh's, or ~/.ssh/config's), and
--ssh-identity-file the private key for them (ssh -i). As with horovodrun,
PROGRAM must exist at the same path on every host, and gorun's working
directory must exist on every host: remote ranks start there. Remote hosts
need a POSIX sh and setsid (util-linux); ip (iproute2) is used to find the
address a remote rank listens on.

Before starting anything, gorun checks that every remote host can be reached
(all at once); an unreachable host is named with ssh's error and nothing
starts. The job key is sent to remote ranks over the ssh session's stdin,
never on a command line. The rendezvous listens on the address from which
the remote hosts reach this host (--verbose says which); --network-interface
NAME or CIDR chooses instead the interface whose address the rendezvous and
the ranks on this host listen on and advertise. Every rank listens on its
host's address on that network. Ranks on the same host talk over unix
sockets, ranks on different hosts over TLS.

Inside a Slurm allocation the hosts come from Slurm (gorun help slurm).

Examples:
  gorun -np 8 -H node1:4,node2:4 /shared/bin/train
  gorun -H node1:4,node2:4 --network-interface eth1 /shared/bin/train
  gorun --hostfile hosts.txt --ssh-port 2222 --ssh-identity-file ~/.ssh/id_ed25519 ./train
        (hosts.txt: one "host slots=N" per line, # comments)`

const helpSlurm = `Inside a Slurm allocation (an sbatch script or a salloc shell: SLURM_JOB_ID
and SLURM_JOB_NODELIST set) and without -H or --hostfile, the hosts are the
allocation's nodes with one slot per task Slurm gave each
(SLURM_TASKS_PER_NODE), and remote ranks start with srun instead of ssh, as
mpirun does there: one job step of one task per rank (srun --nodes=1
--ntasks=1 --nodelist=HOST --overlap --kill-on-bad-exit=1 --cpu-bind=none
--export=ALL --quiet --quiet, plus GORUN_SRUN_OPTS; -v there brings srun's
own messages back). Such ranks see gorun's environment (and the -x variables
and GORUN_* as always).

--launcher says how remote ranks start:
  ssh   through ssh, inside an allocation too
  srun  a Slurm job step per rank, for -H hosts too (inside an allocation
        only)
  auto  the default: srun inside a Slurm allocation when the hosts are the
        allocation's (no -H or --hostfile), else ssh`

const helpElastic = `Elastic jobs (Horovod's grammar): with --min-np below -np, --max-np above
it, or --host-discovery-script, a rank that fails (or is killed, or whose
host goes silent for --heartbeat-timeout) does not fail the job: gorun says
which rank was lost and how, the rendezvous forms a new membership epoch
with the ranks left, and gorun says which ranks it has, whom it lost and how
long the reset took. Every rank gets GORUN_ELASTIC=1 and
GORUN_HEARTBEAT_TIMEOUT; the program must follow the membership changes (see
the collective package's elastic API).

A host on which a rank failed gets no new rank for --blacklist-cooldown
(10s), doubled with each further failure in a row up to the maximum (100s),
and forgiven after it ran that maximum without one: never banned for good.
Then gorun starts a joiner there (GORUN_RANK=-1, GORUN_SIZE still -np) in
the lost rank's place, so a job on fixed hosts (-H, --hostfile, or this
host) grows back to -np.

A rank sent SIGTERM (a deleted pod, a preempted job, a slot the discovery
script dropped) leaves gracefully when the program leaves on it
(collective's Comm.LeaveOnSignal): it finishes its step and leaves at its
commit, handing its state over, and the others go on from there without
running a step again. gorun says "rank 2 (pid N) left the job (SIGTERM):
the job goes on with 3 ranks; no step lost"; a rank that left is neither
finished nor lost, and its host cools down as after a failure. A second
SIGTERM, or SIGKILL after the grace period, is a loss like kill -9.

A host cut off by the network (or down) costs the job its ranks there: only
the side with gorun's rendezvous goes on, and the ranks on the other side
stop by themselves. gorun's ssh sessions give up on a host silent for twice
--heartbeat-timeout; gorun then says in one line that the host is
unreachable, which of its ranks were cut off, and to check the network, and
it never waits for that host at the end of the job.

With --rdzv-replicas 3 (or 5), the membership is kept by a group of
replicas, gorun's and those of ranks on other hosts (GORUN_RDZV_REPLICA=1,
the first rank of each remote host), replicated with raft. gorun hands the
group's lead to a rank's replica once the group is complete. When the
leader's process or host is lost, another replica leads within
--heartbeat-timeout, the ranks reconnect to it, and the job loses only the
ranks that were there (no step, if none was). As many more ranks host a
spare that takes the place of a replica whose rank is lost. Only a side
holding a majority of the replicas goes on: with 3 replicas on 3 hosts, any
one host but gorun's may be lost; a partition leaves the side with two.

With --rdzv-backend etcd --rdzv-endpoints h1:2379,h2:2379,h3:2379, the
membership is kept in an etcd cluster instead: its log and the election of
the replica that leads are etcd keys (under /gorun/ID/, --rdzv-id; etcdctl
get --prefix /gorun/ID/ shows the job), and each replica's liveness an etcd
lease. Ranks on other hosts (as with --rdzv-replicas 3, or 5) stand for
leader; gorun's replica only follows and reports, so gorun's loss or pause
costs nothing once the ranks registered. The leader's process lost: the
next rank's replica leads once its lease expires (--heartbeat-timeout, at
least 3s; the etcd backend needs --heartbeat-timeout 2s or more) and the
job loses that rank only. An etcd member lost, short of the etcd cluster's
majority: nothing. Every rank gets GORUN_RDZV_BACKEND, GORUN_RDZV_ENDPOINTS
and GORUN_RDZV_ID, and finds the leader in etcd. An etcd cluster that serves
TLS: https:// endpoints, or --rdzv-conf cacert=ca.pem,cert=c.pem,key=k.pem
(GORUN_RDZV_CONF; files at the same paths on every host).

With --host-discovery-script, the script is run at start (its hosts replace
-H; without -np, one rank per slot it lists, at most --max-np) and then every
--discovery-interval (3s), each run bounded by 10s; it prints one host:slots
line per host. New slots get joiners while the job has fewer than --max-np
ranks (default: as many as the script lists); the ranks of a host it no
longer lists, or beyond the slots it lists, are stopped (SIGTERM, then
SIGKILL after --grace): programs that leave on SIGTERM cost no step. A
run that fails or prints no host is logged, and
the last list kept. If its first list has only this host, give
--network-interface for remote hosts it may add later to reach the
rendezvous.

Below --min-np the job waits --elastic-timeout (600s) for ranks to join,
then fails saying so; it also fails when no rank is left. Otherwise it
succeeds when the ranks left exit 0; once one has, gorun starts no more
joiners. Before every rank of the start has registered, a failure fails the
job as usual. Once a rank has exited 0, a rank that fails fails the job, as
in a fixed-size job; once the rendezvous has no member left, what still runs
is stopped after --grace. --max-restarts with an elastic job relaunches it
only when it fails as a whole (with --host-discovery-script, on the hosts
the script lists then).

Output prefixes and gorun's messages number processes in the order gorun
starts them (the starting ranks keep their rank; joiners come after), not by
their rank in later epochs.

With --job-key-file FILE, gorun prints the whole command with which a rank
started by hand (GORUN_RANK=-1) joins the job, up to --max-np; the
rendezvous refuses a joiner whose arguments differ from the job's ranks'.
A joiner that registers other state, or later calls a collective the job's
ranks do not, leaves the job and the others go on from their last commit.

Flags:
  --min-np N
      The fewest ranks the job goes on with (default: -np); below -np makes
      the job elastic.
  --max-np N
      The most ranks the job runs with (default: -np, or the slots the
      discovery script lists); above -np makes the job elastic. Without
      --host-discovery-script gorun itself starts no more than -np ranks: the
      room above is for ranks started by hand (--job-key-file).
  --host-discovery-script SCRIPT
      An executable printing the job's hosts as host:slots lines, run at
      start (its hosts replace -H) and every --discovery-interval.
  --discovery-interval DURATION (default 3s)
      How often the host discovery script is run.
  --elastic-timeout DURATION (default 10m0s)
      How long the job may wait below --min-np for ranks to join before it
      fails.
  --heartbeat-timeout DURATION (default 3s)
      A rank (or host) silent this long is lost (GORUN_HEARTBEAT_TIMEOUT).
  --blacklist-cooldown MIN[,MAX] (default 10s,100s)
      A host where a rank failed gets no new rank for MIN, doubled per
      further failure in a row up to MAX (default MAX: 10×MIN); never a
      permanent ban.
  --job-key-file FILE
      Keep the job key in FILE (created mode 0600 if missing) and print the
      environment with which a rank started by hand joins the job
      (GORUN_RANK=-1 GORUN_JOB_KEY_FILE=FILE ...).
  --rdzv-replicas N (default 1)
      Keep the membership on N replicas (1, 3 or 5): 1 is gorun's
      rendezvous alone; 3 or 5 adds replicas in ranks on other hosts, so
      that losing the leader's process or host does not end the job.
  --rdzv-backend gorun|etcd (default gorun)
      Where the membership is kept: gorun's rendezvous, or an etcd
      cluster (GORUN_RDZV_BACKEND; torchrun's PET_RDZV_BACKEND=etcd too).
  --rdzv-endpoints HOST:PORT,...
      The etcd cluster's client addresses (GORUN_RDZV_ENDPOINTS).
  --rdzv-id ID (default: a new one for each run)
      The job's name in etcd: its keys are under /gorun/ID/ (GORUN_RDZV_ID).
  --rdzv-conf cacert=FILE,cert=FILE,key=FILE
      etcd over TLS: its CA, and a client certificate if it checks clients
      (GORUN_RDZV_CONF; torchrun's --rdzv-conf).

Examples:
  gorun -np 4 --min-np 2 --max-np 6 ./train
        (goes on with 2 to 6 ranks; a lost rank is replaced after its host's cooldown)
  gorun --min-np 2 --max-np 8 --host-discovery-script ./hosts.sh /shared/bin/train
        (hosts.sh prints "node1:4" lines; polled every 3s)`

const helpEnvironment = `Every rank gets its identity and the job's secret key in the environment:
  GORUN_RANK           its rank (-1 for a joiner of an elastic job)
  GORUN_SIZE           the number of ranks
  GORUN_LOCAL_RANK     its rank among the ranks on its host
  GORUN_LOCAL_SIZE     the number of ranks on its host
  GORUN_RENDEZVOUS     host:port of the rendezvous gorun hosts
  GORUN_JOB_KEY        the job's secret key
  GORUN_TIMEOUT        the collective timeout (--timeout, default 60s)
  GORUN_RESTART_COUNT  how many times gorun relaunched the job (--max-restarts)
  GORUN_LISTEN_IP      the address it listens on and advertises
  GORUN_HOST           its host's name as -H, --hostfile or the discovery
                       script gives it, localhost without them
and, when they apply, GORUN_ELASTIC=1 and GORUN_HEARTBEAT_TIMEOUT (gorun help
elastic), GORUN_TTY=1 (gorun help output), GORUN_TIMELINE (--timeline),
GORUN_CPU_BIND (--bind-to) and GORUN_CHECKPOINT_REPLICAS (gorun help
checkpoints).

-x NAME=VALUE (--env) passes a variable to every rank, and -x NAME passes
NAME from gorun's environment; it is repeatable. Ranks on this host see
gorun's environment too; remote ranks get only the -x variables, the GORUN_*
gorun sets, and the tuning variables set in gorun's environment:
GORUN_ALLREDUCE_ALGORITHMS, GORUN_CHUNK_BYTES, GORUN_DATA_PLANE,
GORUN_POLL_US, GORUN_SHM, GORUN_SHM_BYTES, GORUN_HANDSHAKE_TIMEOUT. Ranks
started with srun see gorun's environment (gorun help slurm).

gorun itself reads GORUN_SSH_OPTS, extra options for ssh (gorun help hosts),
and GORUN_SRUN_OPTS, extra options for srun (gorun help slurm).

Example:
  gorun -np 4 -x OMP_NUM_THREADS=1 -x PATH -- ./train -v`

const helpConfig = `--config FILE reads any of gorun's flags from YAML (keys are the long flag
names: np, hosts, hostfile, env: [A=1, B], start-timeout: 60s, ...); flags
on the command line win.

Example:
  gorun --config job.yaml ./train
with job.yaml:
  np: 8
  hosts: [node1:4, node2:4]
  env: [OMP_NUM_THREADS=1, PATH]
  start-timeout: 60s`

const helpBuild = `If PROGRAM is a Go package directory (./examples/mnist, or .), gorun builds
it once, in its own directory (so a package with its own go.mod builds too),
into a cache reused from run to run (~/.cache/gorun/build), and runs the
binary on every rank (on this host; for remote hosts, build it to a shared
path yourself).

Examples:
  gorun -np 4 ./examples/mnist
  gorun -np 2 .`

const helpCheckpoints = `--checkpoint-replicas k keeps each checkpoint file on k more hosts'
checkpoint directories than its own: replicated local checkpoints, when hosts
do not share the directory (see package checkpoint). It hands every rank
GORUN_CHECKPOINT_REPLICAS=k, which package checkpoint reads; unset, the
library's default applies (2 when the job's checkpoint directories are per
host: "{host}" in the directory, which each rank expands with its
GORUN_HOST). A negative k is refused before anything starts.

gorun checkpoint (inspect, ls, verify, rm) looks at, verifies and removes
the checkpoints a job wrote: gorun checkpoint --help.

A rank whose checkpoint storage fails in a way a restart would meet again
(full, over its quota, read-only, refusing access or the S3 credentials,
no bucket: checkpoint.NoRestart) exits with status 78
(checkpoint.ExitNoRestart) after a line that says so; gorun --max-restarts
then ends the job without restarting it, quoting that line.`
