package collective

import (
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestCPUBindingChoice(t *testing.T) {
	gorun := func(local, size int) launchEnv {
		return launchEnv{source: "gorun", localRank: local, localSize: size}
	}
	single := func(cpus ...int) [][]int { // one thread per core
		var cores [][]int
		for _, c := range cpus {
			cores = append(cores, []int{c})
		}
		return cores
	}
	eight := single(0, 1, 2, 3, 4, 5, 6, 7)
	// 4 cores of 2 threads, numbered as Linux does: 0-3 first threads,
	// 4-7 their siblings.
	smt := [][]int{{0, 4}, {1, 5}, {2, 6}, {3, 7}}
	cases := []struct {
		name    string
		env     launchEnv
		bind    string
		allowed [][]int
		want    []int
		err     string
	}{
		{"second of two ranks on 8 CPUs", gorun(1, 2), "", eight, []int{4, 5, 6, 7}, ""},
		{"third of three ranks on 8 CPUs (the spare CPU stays unused)", gorun(2, 3), "auto", eight, []int{4, 5}, ""},
		{"one rank per CPU", gorun(3, 4), "", single(2, 3, 6, 7), []int{7}, ""},
		{"second of two ranks on 4 two-thread cores: whole cores", gorun(1, 2), "", smt, []int{2, 6, 3, 7}, ""},
		{"four ranks on 4 two-thread cores: a core each", gorun(2, 4), "", smt, []int{2, 6}, ""},
		{"eight ranks on 4 two-thread cores: a thread each, siblings side by side", gorun(5, 8), "", smt, []int{6}, ""},
		{"more ranks than CPUs: left to the kernel", gorun(0, 4), "", single(0, 1), nil, ""},
		{"alone on its host", gorun(0, 1), "", eight, nil, ""},
		{"none", gorun(0, 2), "none", eight, nil, ""},
		{"started by mpirun", launchEnv{source: "mpirun", localRank: 0, localSize: 2}, "", eight, nil, ""},
		{"started by Slurm", launchEnv{source: "slurm", localRank: 0, localSize: 2}, "", eight, nil, ""},
		{"elastic", launchEnv{source: "gorun", localRank: 0, localSize: 2, elastic: true}, "", eight, nil, ""},
		{"bad value", gorun(0, 2), "cores", eight, nil, `GORUN_CPU_BIND="cores": want auto or none`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := cpuBinding(c.env, func(k string) string {
				if k == EnvCPUBind {
					return c.bind
				}
				return ""
			}, c.allowed)
			if c.err != "" {
				if err == nil || err.Error() != c.err {
					t.Fatalf("error %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %v, %v; want %v", got, err, c.want)
			}
		})
	}
}

func TestCoresOf(t *testing.T) {
	topology := map[int][2]int{0: {0, 0}, 1: {0, 1}, 2: {1, 0}, 3: {1, 1}, 4: {0, 0}, 5: {0, 1}, 6: {1, 0}, 7: {1, 1}}
	got := coresOf([]int{0, 1, 2, 3, 4, 5, 6, 7, 9}, func(cpu int) (int, int, bool) {
		pc, ok := topology[cpu]
		return pc[0], pc[1], ok
	})
	want := [][]int{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {9}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("coresOf = %v, want %v (package 0 core 0 and package 1 core 0 are different cores; CPU 9 has no topology)", got, want)
	}
}

// TestBindProcessBindsEveryThread binds a child process (binding this one
// would bind the other tests) and checks that every thread it has, those
// started before the binding and those started after, runs only on the
// rank's CPUs, and that Go keeps GOMAXPROCS (since 1.25 it lowers it to
// the bound CPUs about a second later unless it was set by hand).
func TestBindProcessBindsEveryThread(t *testing.T) {
	if os.Getenv("GORUN_TEST_BIND_CHILD") == "1" {
		bindChild(t)
		return
	}
	cpus, err := allowedCPUs()
	if err != nil || len(cpus) < 2 {
		t.Skipf("needs 2 CPUs to bind to (have %v, %v)", cpus, err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestBindProcessBindsEveryThread$", "-test.v")
	cmd.Env = append(os.Environ(), "GORUN_TEST_BIND_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	expect, err := cpuBinding(launchEnv{source: "gorun", localRank: 1, localSize: 2}, func(string) string { return "" }, coresOf(cpus, sysfsTopology))
	if err != nil || expect == nil {
		t.Fatalf("no binding for local rank 1 of 2 on CPUs %v: %v", cpus, err)
	}
	want := fmt.Sprintf("bound to CPUs %v", expect)
	if !strings.Contains(string(out), want) || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("child output lacks %q:\n%s", want, out)
	}
}

func bindChild(t *testing.T) {
	// Threads parked in a locked goroutine each, until release.
	release := make(chan struct{})
	var wg sync.WaitGroup
	startThreads := func() {
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				runtime.LockOSThread()
				<-release
			}()
		}
	}
	startThreads() // before the binding
	// The testing package sets GOMAXPROCS by hand, which would hide Go's
	// updates; a program's GOMAXPROCS is Go's default.
	runtime.SetDefaultGOMAXPROCS()
	procs := runtime.GOMAXPROCS(0)
	env := launchEnv{source: "gorun", localRank: 1, localSize: 2}
	desc, warning, err := applyCPUBinding(env, os.Getenv)
	if err != nil || desc == "" || warning != "" {
		t.Fatalf("applyCPUBinding: %q, %q, %v", desc, warning, err)
	}
	t.Log(desc)
	startThreads() // and after it
	allowed, _ := allowedCPUs()
	var set unix.CPUSet
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	if len(tasks) < 5 {
		t.Fatalf("only %d threads: the test did not start the threads it means to check", len(tasks))
	}
	for _, task := range tasks {
		tid, _ := strconv.Atoi(task.Name())
		if err := unix.SchedGetaffinity(tid, &set); err != nil {
			continue // the thread has exited
		}
		var got []int
		for cpu := 0; len(got) < set.Count(); cpu++ {
			if set.IsSet(cpu) {
				got = append(got, cpu)
			}
		}
		if !reflect.DeepEqual(got, allowed) {
			t.Errorf("thread %d may run on CPUs %v, want %v", tid, got, allowed)
		}
	}
	close(release)
	wg.Wait()
	// Work and idle in turns for 3 s, as a training loop does (the
	// runtime's monitor looks about once a second), watching GOMAXPROCS.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		x := 0
		for i := range 1 << 22 {
			x += i
		}
		_ = x
		time.Sleep(100 * time.Millisecond)
		if n := runtime.GOMAXPROCS(0); n != procs {
			t.Fatalf("GOMAXPROCS went from %d to %d after the binding", procs, n)
		}
	}
}

// TestFitGOMAXPROCS: a rank runs one P when ranks of other hosts share
// its machine's CPUs and the ranks outnumber them, unless GOMAXPROCS was
// set; otherwise GOMAXPROCS stays.
func TestFitGOMAXPROCS(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	cpus := runtime.NumCPU()
	env := func(v string) func(string) string {
		return func(name string) string {
			if name == "GOMAXPROCS" {
				return v
			}
			return ""
		}
	}
	var logged []string
	logf := func(f string, a ...any) { logged = append(logged, fmt.Sprintf(f, a...)) }
	for _, c := range []struct {
		machine, host int
		setenv        string
		want          int
	}{
		{cpus, 1, "", 3},                // a CPU per rank: left as it is
		{cpus + 1, cpus + 1, "", 3},     // one host's ranks, more than CPUs: left
		{cpus + 1, 1, "3", 3},           // set by the user: left
		{cpus + 1, 1, "", 1},            // other hosts' ranks too, more than CPUs: one P
		{4*cpus + 3, 2*cpus + 1, "", 1}, // the same
	} {
		runtime.GOMAXPROCS(3)
		logged = nil
		fitGOMAXPROCS(c.machine, c.host, env(c.setenv), logf, 5)
		if got := runtime.GOMAXPROCS(0); got != c.want {
			t.Errorf("%d ranks (%d of this host) on %d CPUs, GOMAXPROCS=%q: GOMAXPROCS %d, want %d", c.machine, c.host, cpus, c.setenv, got, c.want)
		}
		want := fmt.Sprintf("rank 5: %d ranks share this machine's %d CPUs, %d of them of other hosts", c.machine, cpus, c.machine-c.host)
		if (c.want == 1) != (len(logged) == 1) || (len(logged) == 1 && !strings.Contains(logged[0], want)) {
			t.Errorf("%d ranks: logged %q", c.machine, logged)
		}
	}
}
