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

	"golang.org/x/sys/unix"
)

func TestCPUBindingChoice(t *testing.T) {
	gorun := func(local, size int) launchEnv {
		return launchEnv{source: "gorun", localRank: local, localSize: size}
	}
	eight := []int{0, 1, 2, 3, 4, 5, 6, 7}
	cases := []struct {
		name    string
		env     launchEnv
		bind    string
		allowed []int
		want    []int
		err     string
	}{
		{"second of two ranks on 8 CPUs", gorun(1, 2), "", eight, []int{4, 5, 6, 7}, ""},
		{"third of three ranks on 8 CPUs (the spare CPU stays unused)", gorun(2, 3), "auto", eight, []int{4, 5}, ""},
		{"one rank per CPU", gorun(3, 4), "", []int{2, 3, 6, 7}, []int{7}, ""},
		{"more ranks than CPUs: left to the kernel", gorun(0, 4), "", []int{0, 1}, nil, ""},
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

// TestBindProcessBindsEveryThread binds a child process (binding this one
// would bind the other tests) and checks that every thread it has, those
// started before the binding and those started after, runs only on the
// rank's CPUs.
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
	per := len(cpus) / 2
	want := fmt.Sprintf("bound to CPUs %v", cpus[per:2*per])
	if !strings.Contains(string(out), want) || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("child output lacks %q:\n%s", want, out)
	}
}

func bindChild(t *testing.T) {
	// Threads started before the binding, parked in a locked goroutine each.
	release := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			<-release
		}()
	}
	env := launchEnv{source: "gorun", localRank: 1, localSize: 2}
	desc, err := applyCPUBinding(env, os.Getenv)
	if err != nil || desc == "" {
		t.Fatalf("applyCPUBinding: %q, %v", desc, err)
	}
	t.Log(desc)
	// Threads started after it.
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			<-release
		}()
	}
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
}
