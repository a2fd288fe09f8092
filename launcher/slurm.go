// Reaching the hosts of a Slurm allocation with srun instead of ssh.

package launcher

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/gorun/gorun/internal/hostlist"
)

// Srun, set in SSH.Srun, makes gorun start its remote ranks with srun inside
// the Slurm allocation it runs in (an sbatch script, a salloc shell), as
// mpirun and horovodrun do there, instead of ssh: each remote rank is a job
// step of one task on its host. The step runs the same wrapper as ssh would
// (see remoteCommand), with the same environment on stdin, so stopping,
// output and exit statuses are the same; Slurm also ends a step's every
// process when its task ends, and the step's tasks when srun is stopped.
type Srun struct {
	Command string   // "" = "srun"
	Options []string // more srun arguments, e.g. from GORUN_SRUN_OPTS
}

func (s *Srun) command() string {
	if s.Command == "" {
		return "srun"
	}
	return s.Command
}

// srunShell runs on the host a step lands on, before the command line gorun
// hands it ($0). It sets SSH_CONNECTION as sshd would ("client-IP port
// server-IP port"), from the address srun launched the step from
// (SLURM_LAUNCH_NODE_IPADDR) and this host's address on the way back to it,
// so the reachability check and the wrapper learn the addresses the same way
// under srun as under ssh.
const srunShell = `c=${SLURM_LAUNCH_NODE_IPADDR:-}
s=$(ip -o route get "$c" 2>/dev/null | sed -n 's/.* src \([^ ]*\).*/\1/p')
export SSH_CONNECTION="$c 0 ${s:-${SLURMD_NODENAME:-unknown}} 0"
eval "$0"`

// args are srun's arguments for one rank on host, up to the shell that
// takes the command line as its next argument: a step of one task on that
// one node, sharing the allocation's CPUs with the other steps (--overlap),
// not bound to a CPU, whose whole step fails if the task fails, with gorun's
// environment. srun is made quiet twice over: once hides its notices, twice
// also its "task 0: Exited with exit code 137" when a rank fails, which
// would otherwise show as the rank's last stderr line (gorun names the rank
// and its status itself). That also hides srun's word on a step that cannot
// start after the reachability check passed (a node lost in between); the
// rank then fails with srun's "exit status 1", and GORUN_SRUN_OPTS=-v shows
// srun's errors again.
func (s *Srun) args(host string) []string {
	return s.argsQuiet(host, 2)
}

// checkArgs are args for the reachability check, which keeps srun's errors
// (they say why a host cannot be reached) and gives up when the step cannot
// start within timeout (srun would otherwise wait for the allocation's
// resources for ever).
func (s *Srun) checkArgs(host string, timeout time.Duration) []string {
	return slices.Insert(s.argsQuiet(host, 1), 0, "--immediate="+strconv.Itoa(max(1, int((timeout+time.Second-1)/time.Second))))
}

func (s *Srun) argsQuiet(host string, quiet int) []string {
	a := []string{"--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--nodelist=" + host,
		"--overlap", "--kill-on-bad-exit=1", "--cpu-bind=none", "--export=ALL"}
	for range quiet {
		a = append(a, "--quiet")
	}
	a = append(a, s.Options...)
	return append(a, "sh", "-c", srunShell)
}

// SlurmAllocation reads, through getenv, the Slurm allocation gorun runs in:
// its hosts (SLURM_JOB_NODELIST expanded) and their slots, which are the
// tasks Slurm gave each node (SLURM_TASKS_PER_NODE, as mpirun counts them;
// else the CPUs, SLURM_JOB_CPUS_PER_NODE). ok is false outside an
// allocation (SLURM_JOB_ID or SLURM_JOB_NODELIST unset).
func SlurmAllocation(getenv func(string) string) (hosts []Host, ok bool, err error) {
	id, list := getenv("SLURM_JOB_ID"), getenv("SLURM_JOB_NODELIST")
	if id == "" || list == "" {
		return nil, false, nil
	}
	names, err := hostlist.Expand(list)
	if err != nil {
		return nil, true, fmt.Errorf("Slurm job %s: SLURM_JOB_NODELIST: %v", id, err)
	}
	countsVar := "SLURM_TASKS_PER_NODE"
	if getenv(countsVar) == "" {
		countsVar = "SLURM_JOB_CPUS_PER_NODE"
	}
	if getenv(countsVar) == "" {
		return nil, true, fmt.Errorf("Slurm job %s: neither SLURM_TASKS_PER_NODE nor SLURM_JOB_CPUS_PER_NODE is set, so gorun cannot tell the slots of %s; pass -H host:slots,...", id, list)
	}
	counts, err := hostlist.ExpandCounts(getenv(countsVar))
	if err != nil {
		return nil, true, fmt.Errorf("Slurm job %s: %s: %v", id, countsVar, err)
	}
	if len(counts) != len(names) {
		return nil, true, fmt.Errorf("Slurm job %s: %s=%s gives %d counts for the %d nodes of SLURM_JOB_NODELIST=%s", id, countsVar, getenv(countsVar), len(counts), len(names), list)
	}
	for i, n := range names {
		if counts[i] < 1 {
			continue // a node Slurm gave no task
		}
		if err := checkHostName(n); err != nil {
			return nil, true, fmt.Errorf("Slurm job %s: SLURM_JOB_NODELIST=%s: %v", id, list, err)
		}
		hosts = append(hosts, Host{Name: n, Slots: counts[i]})
	}
	if len(hosts) == 0 {
		return nil, true, fmt.Errorf("Slurm job %s: %s=%s gives no node a task", id, countsVar, getenv(countsVar))
	}
	return mergeHosts(hosts), true, nil
}
