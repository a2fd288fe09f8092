package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// elasticJob is a gorun running elasticprog ranks, which stop (exit 0, all
// at the same step) once the test creates the stop file.
type elasticJob struct {
	*gorunProc
	dir, stop string
}

func startElastic(t *testing.T, args ...string) *elasticJob {
	t.Helper()
	dir := t.TempDir()
	stop := filepath.Join(dir, "stop")
	args = append(args, elasticprogBin, "--until-file", stop)
	return &elasticJob{gorunProc: startGorun(t, dir, nil, args...), dir: dir, stop: stop}
}

// waitErr waits until gorun printed n copies of want on stderr.
func (j *elasticJob) waitErr(t *testing.T, want string, n int, limit time.Duration) {
	t.Helper()
	if err := j.err.waitFor(want, n, limit, j.done); err != nil {
		t.Fatalf("gorun stderr: %v\nstdout:\n%s", err, j.out)
	}
}

var pidRE = regexp.MustCompile(`(?m)^\[([^\]]+)\] elasticprog: pid (\d+),`)

// pids maps each process's output label ("2", "host:4") to its pid.
func (j *elasticJob) pids() map[string]int {
	m := map[string]int{}
	for _, s := range pidRE.FindAllStringSubmatch(j.out.String(), -1) {
		m[s[1]], _ = strconv.Atoi(s[2])
	}
	return m
}

// kill9 kills the process labelled label with SIGKILL.
func (j *elasticJob) kill9(t *testing.T, label string) int {
	t.Helper()
	pid := j.pids()[label]
	if pid == 0 {
		t.Fatalf("no pid for [%s] in:\n%s", label, j.out)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	return pid
}

// finish creates the stop file and waits for gorun's exit code; it checks
// that no process of the job is left.
func (j *elasticJob) finish(t *testing.T) int {
	t.Helper()
	if err := os.WriteFile(j.stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return j.end(t)
}

func (j *elasticJob) end(t *testing.T) int {
	t.Helper()
	code := j.wait(t, time.Minute)
	if left := ranksAlive(t, j.cmd.Process.Pid); len(left) > 0 {
		t.Errorf("processes left running: %v", left)
	}
	for label, pid := range j.pids() {
		if processRunning(pid) {
			t.Errorf("[%s] (pid %d) still runs", label, pid)
		}
	}
	return code
}

// kill -9 of one rank of an elastic job: gorun says which rank it lost and
// how, the rendezvous' new epoch of 3 (who was lost, how long the reset
// took), the job goes on with 3 ranks and succeeds when they exit 0.
func TestElasticRankKilled(t *testing.T) {
	j := startElastic(t, "-np", "4", "--min-np", "2", "--blacklist-cooldown", "1m")
	j.waitOutput(t, "elasticprog: epoch 0: ", 4, time.Minute)
	pid := j.kill9(t, "2")
	j.waitErr(t, "gorun: membership epoch 1: 3 ranks (lost rank 2 on host ", 1, 30*time.Second)
	j.waitOutput(t, "elasticprog: epoch 1: ", 3, 30*time.Second)
	if code := j.finish(t); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
	errOut, out := j.err.String(), j.out.String()
	mustMatch(t, `(?m)^gorun: rank 2 \(pid `+strconv.Itoa(pid)+`\) was lost: killed by signal 9 \(SIGKILL\); the job goes on without it \(3 still running, --min-np 2\)$`, errOut)
	mustMatch(t, `(?m)^gorun: no new rank on host localhost for 1m0s \(its 1st failure in a row; the cooldown doubles with each, up to 10m0s\)$`, errOut)
	// The host is named as gorun names it (not by the host's own name).
	mustMatch(t, `(?m)^gorun: membership epoch 1: 3 ranks \(lost rank 2 on host localhost \(proc 2, pid \d+\): disconnected\), reset took [0-9.]+(µs|ms|s)$`, errOut)
	mustMatch(t, `(?m)^gorun: elastic job done: 3 ranks finished; 4 processes started in all, 1 lost \(rank 2: killed by signal 9 \(SIGKILL\)\)$`, errOut)
	for _, r := range []int{0, 1, 3} {
		mustMatch(t, `(?m)^\[`+strconv.Itoa(r)+`\] elasticprog: done at step \d+ in epoch 1 as rank \d of 3$`, out)
	}
	if strings.Contains(errOut, "joiner") {
		t.Errorf("a joiner was started within the 1m cooldown:\n%s", errOut)
	}
	t.Logf("gorun said:\n%s", errOut)
}

// After its host's cooldown, a lost rank's slot gets a joiner, and the job
// on fixed hosts grows back to -np.
func TestElasticRefillsAfterCooldown(t *testing.T) {
	j := startElastic(t, "-np", "3", "--min-np", "2", "--blacklist-cooldown", "300ms")
	j.waitOutput(t, "elasticprog: epoch 0: ", 3, time.Minute)
	j.kill9(t, "1")
	j.waitErr(t, "gorun: membership epoch 2: 3 ranks (joined rank 2 on host ", 1, 30*time.Second)
	j.waitOutput(t, "[3] elasticprog: epoch 2: rank 2 of 3", 1, 30*time.Second)
	if code := j.finish(t); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
	errOut := j.err.String()
	mustMatch(t, `(?m)^gorun: no new rank on host localhost for 300ms \(its 1st failure in a row; the cooldown doubles with each, up to 3s\)$`, errOut)
	mustMatch(t, `(?m)^gorun: started joiner 3 \(pid \d+, GORUN_RANK=-1\) in a free slot: 3 of the job's 3 processes run \(it joins when the ranks admit it\)$`, errOut)
	mustMatch(t, `(?m)^\[3\] elasticprog: pid \d+, GORUN_RANK=-1$`, j.out.String())
	if n := strings.Count(j.out.String(), "elasticprog: done at step"); n != 3 {
		t.Errorf("%d ranks finished, want 3:\n%s", n, j.out)
	}
	t.Logf("gorun said:\n%s", errOut)
}

// Below --min-np for longer than --elastic-timeout, the job fails saying
// so and how many ranks it had.
func TestElasticBelowMinNP(t *testing.T) {
	j := startElastic(t, "-np", "3", "--min-np", "2", "--elastic-timeout", "1500ms", "--blacklist-cooldown", "1m")
	j.waitOutput(t, "elasticprog: epoch 0: ", 3, time.Minute)
	j.kill9(t, "1")
	j.kill9(t, "2")
	code := j.end(t)
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	errOut := j.err.String()
	mustMatch(t, `(?m)^gorun: job failed: the rendezvous aborted the elastic job: job below --min-np 2 for 1.5s: 1 member left \(rank 0 on [^/ ]+\) after losing .*\(it started with 3 ranks\); lost: rank \d: killed by signal 9 \(SIGKILL\); rank \d: killed by signal 9 \(SIGKILL\)$`, errOut)
	mustMatch(t, `below --min-np 2: the job waits up to --elastic-timeout 1.5s for ranks to join, then fails`, errOut)
	t.Logf("gorun said:\n%s", errOut)
}

// A host the discovery script adds gets a joiner, which the ranks admit
// (the job grows to 3); a host it removes has its rank stopped (the job
// shrinks); a failing script changes nothing.
func TestElasticDiscoveryScript(t *testing.T) {
	dir := t.TempDir()
	list := filepath.Join(dir, "hosts")
	// The script may run at any moment: the list is replaced whole.
	setList := func(hosts string) {
		tmp := list + ".tmp"
		if err := os.WriteFile(tmp, []byte(hosts), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, list); err != nil {
			t.Fatal(err)
		}
	}
	setList("localhost:2\n")
	scriptPath := filepath.Join(dir, "hosts.sh")
	os.WriteFile(scriptPath, []byte("#!/bin/sh\ncat "+list+"\n"), 0o755)
	j := startElastic(t, "--min-np", "1", "--max-np", "3", "--host-discovery-script", scriptPath, "--discovery-interval", "100ms")
	j.waitOutput(t, "elasticprog: epoch 0: ", 2, time.Minute)
	setList("localhost:2\n127.0.0.1:1\n")
	j.waitErr(t, "gorun: membership epoch 1: 3 ranks (joined rank 2 on host 127.0.0.1 (proc 2, pid ", 1, 30*time.Second)
	j.waitOutput(t, "[127.0.0.1:2] elasticprog: epoch 1: rank 2 of 3", 1, 30*time.Second)
	setList("localhost:2\n")
	j.waitErr(t, "gorun: membership epoch 2: 2 ranks (lost rank 2 on host 127.0.0.1 (proc 2, pid ", 1, 30*time.Second)
	setList("localhost:two\n")
	j.waitErr(t, "failed: line 1", 1, 30*time.Second)
	j.waitOutput(t, "elasticprog: epoch 2: ", 2, 30*time.Second)
	if code := j.finish(t); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
	errOut, out := j.err.String(), j.out.String()
	for _, re := range []string{
		`(?m)^gorun: --host-discovery-script lists localhost:2,127\.0\.0\.1:1 \(was localhost:2\)$`,
		`(?m)^gorun: started joiner 2 on host 127\.0\.0\.1 \(pid \d+, GORUN_RANK=-1\) in a free slot: 3 of the job's 3 processes run`,
		`(?m)^gorun: stopping joiner 2 on host 127\.0\.0\.1 \(pid \d+\): it no longer lists host 127\.0\.0\.1 \(the job goes on without it\)$`,
		`(?m)^gorun: --host-discovery-script \S+ failed: line 1 "localhost:two": "two" is not a slot count \(a positive integer\): print one host:slots per line, e\.g\. node1:4; keeping the hosts it listed last \(localhost:2\) and trying again every 100ms$`,
	} {
		mustMatch(t, re, errOut)
	}
	for _, l := range []string{"localhost:0", "localhost:1"} {
		mustMatch(t, `(?m)^\[`+l+`\] elasticprog: done at step \d+ in epoch 2 as rank \d of 2$`, out)
	}
	mustMatch(t, `(?m)^gorun: elastic job done: 2 ranks finished; 3 processes started in all, 1 stopped as the discovery script dropped their hosts$`, errOut)
	if strings.Count(errOut, "failed: line 1") != 1 {
		t.Errorf("the failing script is reported more than once:\n%s", errOut)
	}
	if strings.Contains(errOut, "was lost") {
		t.Errorf("a rank gorun stopped is reported as lost:\n%s", errOut)
	}
	t.Logf("gorun said:\n%s", errOut)
}

// A rank stopped with SIGSTOP is lost within the heartbeat bound; the job
// goes on without it, and gorun ends it (it would keep the job from
// ending).
func TestElasticRankFrozen(t *testing.T) {
	const collectiveTimeout = 20 * time.Second
	j := startElastic(t, "-np", "3", "--min-np", "2", "--heartbeat-timeout", "1s", "--blacklist-cooldown", "1m", "--timeout", collectiveTimeout.String())
	j.waitOutput(t, "elasticprog: epoch 0: ", 3, time.Minute)
	pid := j.pids()["1"]
	start := time.Now()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	j.waitErr(t, "gorun: membership epoch 1: 2 ranks (lost rank 1 on host ", 1, 30*time.Second)
	lostAfter := time.Since(start)
	// The heartbeat noticed it, not a collective timing out: well before
	// the collective timeout (a bound on the mechanism, not a timing
	// benchmark).
	if lostAfter >= collectiveTimeout {
		t.Errorf("lost %v after SIGSTOP: not within the heartbeat bound (1s), but only after the collective timeout %v", lostAfter, collectiveTimeout)
	}
	j.waitErr(t, "was lost: stopped (SIGSTOP) until the rendezvous lost it, then ended by gorun", 1, 30*time.Second)
	j.waitOutput(t, "elasticprog: epoch 1: ", 2, 30*time.Second)
	if code := j.finish(t); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
	errOut := j.err.String()
	mustMatch(t, `(?m)^gorun: membership epoch 1: 2 ranks \(lost rank 1 on host \S+ \(proc 1, pid \d+\): stopped responding: no heartbeat within 1s\), reset took `, errOut)
	mustMatch(t, `(?m)^gorun: rank 1 \(pid `+strconv.Itoa(pid)+`\) is stopped \(SIGSTOP\) and the rendezvous went on without it: ending it$`, errOut)
	t.Logf("lost %v after SIGSTOP (--heartbeat-timeout 1s); gorun said:\n%s", lostAfter.Round(time.Millisecond), errOut)
}

// Ctrl-C stops an elastic job as any other: every rank, nobody blamed,
// exit 130, and nothing reported as lost.
func TestElasticInterrupted(t *testing.T) {
	j := startElastic(t, "-np", "3", "--min-np", "2")
	j.waitOutput(t, "elasticprog: epoch 0: ", 3, time.Minute)
	j.cmd.Process.Signal(syscall.SIGINT)
	if code := j.end(t); code != 130 {
		t.Errorf("exit %d, want 130", code)
	}
	if errOut := j.err.String(); !strings.HasPrefix(errOut, "gorun: stopped by the user (interrupt); all 3 ranks stopped") || strings.Count(errOut, "\n") != 1 {
		t.Errorf("stderr:\n%s\nwant one line: gorun: stopped by the user (interrupt); all 3 ranks stopped", errOut)
	}
}

// An elastic job's ranks get GORUN_ELASTIC and GORUN_HEARTBEAT_TIMEOUT; a
// fixed-size job's do not (it runs exactly as before).
func TestElasticEnvironment(t *testing.T) {
	show := []string{"/bin/sh", "-c", `echo "elastic=$GORUN_ELASTIC hb=$GORUN_HEARTBEAT_TIMEOUT"`}
	unfolded := []string{"GORUN_FOLD_WINDOW=0"} // each rank's line, however loaded the machine
	out, errOut, code := run(t, unfolded, gorunBin, append([]string{"-np", "2", "--min-np", "1", "--heartbeat-timeout", "2s"}, show...)...)
	if code != 0 || !strings.Contains(out, "[0] elastic=1 hb=2s\n") || !strings.Contains(out, "[1] elastic=1 hb=2s\n") {
		t.Errorf("elastic job: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	out, errOut, code = run(t, unfolded, gorunBin, append([]string{"-np", "2"}, show...)...)
	if code != 0 || !strings.Contains(out, "[0] elastic= hb=\n") || !strings.Contains(out, "[1] elastic= hb=\n") || errOut != "" {
		t.Errorf("fixed job: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}

func TestElasticBadFlags(t *testing.T) {
	dir := t.TempDir()
	notExec := filepath.Join(dir, "hosts.sh")
	os.WriteFile(notExec, []byte("#!/bin/sh\necho a:1\n"), 0o644)
	failing := filepath.Join(dir, "failing.sh")
	os.WriteFile(failing, []byte("#!/bin/sh\necho 'inventory down' >&2\nexit 2\n"), 0o755)
	small := filepath.Join(dir, "small.sh")
	os.WriteFile(small, []byte("#!/bin/sh\necho localhost:2\n"), 0o755)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-np", "4", "--min-np", "0", "true"}, "--min-np must be at least 1, got 0"},
		{[]string{"-np", "4", "--min-np", "5", "true"}, "--min-np 5 is above -np 4: the job could never start; lower --min-np or raise -np"},
		{[]string{"-np", "4", "--min-np", "2", "--max-np", "3", "true"}, "--max-np 3 is below -np 4"},
		{[]string{"-np", "4", "--min-np", "3", "--max-np", "2", "true"}, "--min-np 3 is above --max-np 2"},
		{[]string{"-np", "4", "--elastic-timeout", "10s", "true"}, "--elastic-timeout applies to elastic jobs only: make the job elastic with --min-np below -np (4), --max-np above it, or --host-discovery-script"},
		{[]string{"-np", "4", "--blacklist-cooldown", "5s", "true"}, "--blacklist-cooldown applies to elastic jobs only"},
		{[]string{"-np", "4", "--min-np", "2", "--blacklist-cooldown", "10s,5s", "true"}, "MAX is below MIN"},
		{[]string{"-np", "4", "--min-np", "2", "--blacklist-cooldown", "soon", "true"}, `--blacklist-cooldown "soon": "soon" is not a positive duration: write MIN[,MAX], e.g. 10s,100s`},
		{[]string{"-np", "4", "--min-np", "2", "--heartbeat-timeout", "10ms", "true"}, "--heartbeat-timeout 10ms is too short for a rank to answer in (pings go out every quarter of it, and a GC pause must not look like a lost rank): use at least 100ms"},
		// Given, even at its default value: refused alike.
		{[]string{"-np", "2", "--heartbeat-timeout", "3s", "true"}, "--heartbeat-timeout applies to elastic jobs only"},
		{[]string{"-np", "2", "--blacklist-cooldown", "10s", "true"}, "--blacklist-cooldown applies to elastic jobs only"},
		{[]string{"-np", "2", "--job-key-file", filepath.Join(dir, "k"), "true"}, "--job-key-file applies to elastic jobs only"},
		{[]string{"--min-np", "3", "--host-discovery-script", small, "true"}, "--min-np 3 is above the 2 slots --host-discovery-script " + small + " lists: the job could never start; list more slots, or lower --min-np"},
		{[]string{"-np", "4", "--min-np", "2", "--elastic-timeout", "0s", "true"}, "--elastic-timeout must be a positive duration"},
		{[]string{"--host-discovery-script", notExec, "true"}, "is not executable: chmod +x " + notExec},
		{[]string{"--host-discovery-script", filepath.Join(dir, "none.sh"), "true"}, "no such file or directory"},
		{[]string{"--host-discovery-script", small, "-H", "a:2", "true"}, "--host-discovery-script and -H/--hostfile both given"},
		{[]string{"--host-discovery-script", failing, "true"}, "--host-discovery-script " + failing + ": exit status 2: inventory down (nothing was started)"},
		{[]string{"-np", "3", "--host-discovery-script", small, "true"}, "-np 3 needs 3 slots but --host-discovery-script " + small + " lists localhost:2, which has 2"},
	} {
		_, errOut, code := run(t, nil, gorunBin, tc.args...)
		if code == 0 || !strings.Contains(errOut, tc.want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("gorun %v: exit %d, stderr %q; want one line containing %q", tc.args, code, errOut, tc.want)
		}
	}
}
