package collective

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// EnvCPUBind chooses whether a rank binds itself to a share of its host's
// CPUs (tuning): "auto" (or unset) binds when gorun started the job and its
// ranks on this host fit on the CPUs this process may use, "none" never
// binds. gorun's --bind-to sets it.
//
// Why: ranks that share a host hand data to each other through shared
// memory, and a rank the kernel moves between cores, or that two ranks
// contend for, waits for its peer far longer than the copy takes. Binding
// each rank to its own slice of CPUs is what mpirun does by default (its
// --bind-to core), and it shortens the allreduces of ranks that share a
// host (see BENCHMARKS.md, "CPU binding"). A rank gets whole cores,
// cores/ranks-per-host of them with all their hardware threads, so a host
// with more cores than ranks still gives each rank several for its own
// compute and no two ranks share a core's threads; with more ranks than
// cores, single hardware threads, siblings side by side.
//
// GOMAXPROCS stays as Go set it from all the host's CPUs (and Go stops
// lowering it to the bound CPUs, as Go 1.25 on would a second later): with
// one P per bound CPU, a goroutine that spins waiting for a peer holds the
// P its sender needs until Go preempts it, so every hand-off waits for a
// preemption; with more Ps than CPUs the kernel time-slices them. A
// binding that fails (a seccomp profile, a cpuset changed under the rank)
// is a warning, not an error. mpirun, Slurm and containers place ranks
// themselves: a rank they started, or one whose allowed CPUs are fewer
// than the ranks of its host, is left as it is.
const EnvCPUBind = "GORUN_CPU_BIND"

// cpuBinding is the CPUs a rank should run on, or nil to leave it alone;
// cores is the allowed CPUs grouped by core (coresOf).
func cpuBinding(env launchEnv, getenv func(string) string, cores [][]int) ([]int, error) {
	switch v := strings.TrimSpace(strings.ToLower(getenv(EnvCPUBind))); v {
	case "", "auto":
	case "none", "off", "0", "false", "no":
		return nil, nil
	default:
		return nil, fmt.Errorf("%s=%q: want auto or none", EnvCPUBind, v)
	}
	// Elastic jobs renumber local ranks as members come and go; a binding
	// made at start would collide with a newcomer's.
	if env.source != "gorun" || env.elastic || env.localSize < 2 || env.localRank < 0 || env.localRank >= env.localSize {
		return nil, nil
	}
	if len(cores) >= env.localSize {
		per := len(cores) / env.localSize
		return slices.Concat(cores[env.localRank*per : (env.localRank+1)*per]...), nil
	}
	threads := slices.Concat(cores...)
	if len(threads) < env.localSize {
		return nil, nil
	}
	per := len(threads) / env.localSize
	return threads[env.localRank*per : (env.localRank+1)*per], nil
}

// coresOf groups cpus by the core they are hardware threads of, as the
// kernel's topology says (package and core id; a CPU it says nothing of is
// a core of its own), cores in order of their first CPU. Linux numbers the
// second thread of every core after all the first ones, so CPU numbers
// alone would put two ranks on one core's two threads.
func coresOf(cpus []int, topology func(cpu int) (pkg, core int, ok bool)) [][]int {
	type key struct{ pkg, core int }
	index := map[key]int{}
	var cores [][]int
	for _, cpu := range cpus {
		pkg, core, ok := topology(cpu)
		if !ok {
			cores = append(cores, []int{cpu})
			continue
		}
		k := key{pkg, core}
		i, seen := index[k]
		if !seen {
			i = len(cores)
			index[k] = i
			cores = append(cores, nil)
		}
		cores[i] = append(cores[i], cpu)
	}
	return cores
}

// sysfsTopology reads a CPU's package and core id from sysfs.
func sysfsTopology(cpu int) (pkg, core int, ok bool) {
	read := func(name string) (int, bool) {
		b, err := os.ReadFile(fmt.Sprintf("/sys/devices/system/cpu/cpu%d/topology/%s", cpu, name))
		if err != nil {
			return 0, false
		}
		v, err := strconv.Atoi(strings.TrimSpace(string(b)))
		return v, err == nil
	}
	pkg, ok1 := read("physical_package_id")
	core, ok2 := read("core_id")
	return pkg, core, ok1 && ok2
}

// allowedCPUs lists the CPUs this process may run on, in order.
func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, err
	}
	var cpus []int
	for cpu := 0; len(cpus) < set.Count(); cpu++ {
		if set.IsSet(cpu) {
			cpus = append(cpus, cpu)
		}
	}
	return cpus, nil
}

// bindProcess binds every thread of this process to cpus. Go starts new
// threads from its existing ones, and a thread inherits its creator's
// binding, so once every thread is bound all later ones are too; a thread
// created while the list was read is caught by reading it again until a
// pass binds nothing new.
func bindProcess(cpus []int) error {
	var set unix.CPUSet
	for _, cpu := range cpus {
		set.Set(cpu)
	}
	bound := map[int]bool{}
	for pass := 0; pass < 10; pass++ {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		fresh := 0
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil || bound[tid] {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
				return fmt.Errorf("binding thread %d to CPUs %v: %w", tid, cpus, err)
			}
			bound[tid] = true
			fresh++
		}
		if fresh == 0 {
			return nil
		}
	}
	return nil
}

// applyCPUBinding binds this rank as EnvCPUBind says. It returns a
// description for the verbose log ("" when nothing was done), a warning
// when the binding failed (the rank runs unbound), and an error only for
// a value of EnvCPUBind it does not know.
func applyCPUBinding(env launchEnv, getenv func(string) string) (done, warning string, err error) {
	allowed, err := allowedCPUs()
	if err != nil {
		return "", "", nil // no affinity on this system: nothing to do
	}
	cpus, err := cpuBinding(env, getenv, coresOf(allowed, sysfsTopology))
	if err != nil || cpus == nil {
		return "", "", err
	}
	// Keep GOMAXPROCS where it is: set by hand, Go no longer lowers it to
	// the CPUs a binding leaves (see EnvCPUBind).
	runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	if err := bindProcess(cpus); err != nil {
		return "", fmt.Sprintf("local rank %d of %d runs unbound: %v (set %s=none to stop trying)", env.localRank, env.localSize, err, EnvCPUBind), nil
	}
	return fmt.Sprintf("local rank %d of %d bound to CPUs %v", env.localRank, env.localSize, cpus), "", nil
}

// fitGOMAXPROCS gives this rank's process one P when ranks of other hosts
// share its machine's CPUs (network namespaces or containers on the same
// kernel: machineRanks counts them with the hostRanks of its own host) and
// the ranks outnumber the CPUs, unless GOMAXPROCS is set. Such a rank gets
// less than a CPU, so a second P adds no compute, only the runtime's
// spinning threads, which look for work whenever a goroutine is readied
// (as a socket poll's Gosched does) and take the CPU a peer of another
// host waits for: a small allreduce across 2 namespace hosts that share 2
// cores took twice as long with 2 Ps (BENCHMARKS.md, "Across hosts,
// against OpenMPI and Gloo"). Ranks of one host that outnumber its CPUs
// keep GOMAXPROCS (see EnvCPUBind): their links are shared memory, whose
// waits did better with more Ps than CPUs.
func fitGOMAXPROCS(machineRanks, hostRanks int, getenv func(string) string, logf func(string, ...any), rank int) {
	if machineRanks <= runtime.NumCPU() || machineRanks == hostRanks || getenv("GOMAXPROCS") != "" || runtime.GOMAXPROCS(0) == 1 {
		return
	}
	runtime.GOMAXPROCS(1)
	logf("gorun: rank %d: %d ranks share this machine's %d CPUs, %d of them of other hosts (network namespaces, containers): GOMAXPROCS 1 (set GOMAXPROCS to choose)",
		rank, machineRanks, runtime.NumCPU(), machineRanks-hostRanks)
}
