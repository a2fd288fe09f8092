package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startElasticWith is startElastic with elasticprog flags after
// --until-file.
func startElasticWith(t *testing.T, gorunArgs, progArgs []string) *elasticJob {
	t.Helper()
	dir := t.TempDir()
	stop := filepath.Join(dir, "stop")
	args := append(append(gorunArgs, elasticprogBin, "--until-file", stop), progArgs...)
	return &elasticJob{gorunProc: startGorun(t, dir, nil, args...), dir: dir, stop: stop}
}

// A joiner that registers after the job's last member left is refused by
// the rendezvous (nobody can admit it), and gorun ends, with the job's
// success, instead of waiting for it forever.
func TestElasticJoinerAfterLastMember(t *testing.T) {
	j := startElasticWith(t, []string{"-np", "3", "--min-np", "2", "--blacklist-cooldown", "1s", "--grace", "10s"},
		[]string{"--joiner-delay", "2s"})
	j.waitOutput(t, "elasticprog: epoch 0: ", 3, time.Minute)
	j.kill9(t, "2")
	j.waitErr(t, "gorun: started joiner 3 ", 1, 30*time.Second)
	// The members finish while the joiner is still starting.
	if code := j.finish(t); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
	errOut := j.err.String()
	mustMatch(t, `(?m)^gorun: joiner 3 \(pid \d+\) ended after the job had begun to finish: exit status 1 \(a joiner the rendezvous sent away\)$`, errOut)
	mustMatch(t, `(?m)^\[3\] .*the job has no members left \(its last member finished or was lost\): there is nobody to join`, errOut+j.out.String())
	t.Logf("gorun said:\n%s", errOut)
}

// A member that fails after the job began to finish (every rank finished
// and closed cleanly) fails the elastic job, as it would a fixed-size one,
// and gorun starts no joiner in its slot, whichever exits it handles
// first. "others exit first": ranks 0 and 2 exit 0 before rank 1 fails,
// but their exits may still reach gorun after rank 1's (each process's
// wait hands its exit over on its own; fresh-clone CI once saw a joiner
// then). "it exits first": ranks 0 and 2 exit only once gorun has handled
// rank 1's exit, which forces that order.
func TestElasticFailsAfterFinish(t *testing.T) {
	for _, othersFirst := range []bool{true, false} {
		name := map[bool]string{true: "others exit first", false: "it exits first"}[othersFirst]
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			release, exit := filepath.Join(dir, "release"), filepath.Join(dir, "exit")
			progArgs := []string{"--fail-after-done", "1", "--fail-when", release}
			if !othersFirst {
				progArgs = append(progArgs, "--exit-when", exit)
			}
			j := startElasticWith(t, []string{"-np", "3", "--min-np", "2"}, progArgs)
			j.waitOutput(t, "elasticprog: epoch 0: ", 3, time.Minute)
			if err := os.WriteFile(j.stop, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			j.waitOutput(t, "elasticprog: done at step ", 3, time.Minute)
			pids := j.pids()
			if othersFirst {
				// Rank 1 fails once the others have exited 0 (polled:
				// nothing tells the test when a process has ended).
				for deadline := time.Now().Add(time.Minute); processRunning(pids["0"]) || processRunning(pids["2"]); time.Sleep(10 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("ranks 0 and 2 did not exit")
					}
				}
			}
			if err := os.WriteFile(release, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if !othersFirst {
				// gorun says what became of rank 1 when it handles its
				// exit; ranks 0 and 2 wait for the exit file until then.
				j.waitErr(t, "gorun: rank 1 (pid ", 1, time.Minute)
				if !processRunning(pids["0"]) || !processRunning(pids["2"]) {
					t.Fatal("ranks 0 and 2 exited before the exit file existed")
				}
				if err := os.WriteFile(exit, nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if code := j.end(t); code != 1 {
				t.Errorf("exit %d, want 1", code)
			}
			errOut := j.err.String()
			mustMatch(t, `(?m)^gorun: rank 1 \(pid \d+\) failed after the job had begun to finish: exit status 3; the job fails$`, errOut)
			mustMatch(t, `(?m)^gorun: job failed: rank 1 \(exit status 3\) failed after the job had begun to finish, when 2 ranks had exited 0: as in a fixed-size job, that fails the job \(it started with 3 ranks\)`, errOut)
			if strings.Contains(errOut, "joiner") {
				t.Error("gorun started a joiner in a finishing job")
			}
			t.Logf("gorun said:\n%s", errOut)
		})
	}
}

var handJoinRE = regexp.MustCompile(`(?m)^gorun: to add a rank by hand \(it joins at the next commit boundary, up to --max-np 3\): (GORUN_ELASTIC=1 GORUN_RANK=-1 GORUN_SIZE=2 GORUN_RENDEZVOUS=\S+ GORUN_JOB_KEY_FILE=(.+) GORUN_HEARTBEAT_TIMEOUT=3s .*)$`)

// With --job-key-file, gorun writes the job key to a 0600 file and prints
// the command with which a rank started by hand joins: the environment it
// needs, the job's -x variables, the program and its arguments, quoted for
// a shell. That line, run by sh as printed, starts a rank that is
// admitted (it stops with the others only if it got the job's
// --until-file, whose name needs quoting), and the job (which gorun keeps
// at -np itself) grows to 3.
func TestElasticJoinerByHand(t *testing.T) {
	dir := t.TempDir()
	keyFile, stop := filepath.Join(dir, "job key"), filepath.Join(dir, "it's the stop")
	j := &elasticJob{gorunProc: startGorun(t, dir, nil, "-np", "2", "--min-np", "1", "--max-np", "3", "--job-key-file", keyFile,
		"-x", "ELASTICPROG_NOTE=it's a test", elasticprogBin, "--until-file", stop, "--step-time", "5ms"), dir: dir, stop: stop}
	j.waitOutput(t, "elasticprog: epoch 0: ", 2, time.Minute)
	m := handJoinRE.FindStringSubmatch(j.err.String())
	if m == nil {
		t.Fatalf("no line matching %s in:\n%s", handJoinRE, j.err)
	}
	line := m[1]
	if q := `'` + keyFile + `'`; m[2] != q {
		t.Errorf("key file %s, want %s", m[2], q)
	}
	if !strings.Contains(line, ` ELASTICPROG_NOTE='it'\''s a test' `) {
		t.Errorf("the job's -x variable is not in %s", line)
	}
	if want := ` ` + elasticprogBin + ` --until-file '` + dir + `/it'\''s the stop' --step-time 5ms`; !strings.HasSuffix(line, want) {
		t.Errorf("the program and its arguments: %s\ndo not end with %s", line, want)
	}
	if st, err := os.Stat(keyFile); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v", st, err)
	}
	cmd := exec.Command("sh", "-c", line)
	cmd.Env = os.Environ()
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	// Its own process group: the rank may be sh's child, and goes with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	done := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(done) }()
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); <-done })
	j.waitErr(t, "gorun: membership epoch 1: 3 ranks (joined rank 2 on host ", 1, time.Minute)
	j.waitOutput(t, "elasticprog: epoch 1: ", 2, 30*time.Second)
	if code := j.finish(t); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
	select {
	case <-done:
		if waitErr != nil || !strings.Contains(out.String(), "elasticprog: done at step ") {
			t.Errorf("the rank started by hand: %v\nstdout:\n%s\nstderr:\n%s", waitErr, &out, &errb)
		}
	case <-time.After(30 * time.Second):
		t.Error("the rank started by hand did not end with the job")
	}
	t.Logf("gorun said:\n%s", j.err)
}

// The command gorun prints to add a rank by hand, run with another
// argument than the job's: the rendezvous refuses that joiner, which says
// why and exits non-zero, and the job goes on and ends as usual.
func TestElasticJoinerWithOtherArgsRefused(t *testing.T) {
	dir := t.TempDir()
	keyFile, stop := filepath.Join(dir, "key"), filepath.Join(dir, "stop")
	j := &elasticJob{gorunProc: startGorun(t, dir, nil, "-np", "2", "--min-np", "1", "--max-np", "3", "--job-key-file", keyFile,
		elasticprogBin, "--until-file", stop, "--step-time", "5ms"), dir: dir, stop: stop}
	j.waitOutput(t, "elasticprog: epoch 0: ", 2, time.Minute)
	m := handJoinRE.FindStringSubmatch(j.err.String())
	if m == nil {
		t.Fatalf("no line matching %s in:\n%s", handJoinRE, j.err)
	}
	line := strings.Replace(m[1], "--step-time 5ms", "--step-time 7ms", 1)
	cmd := exec.Command("sh", "-c", line)
	cmd.Env = os.Environ()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	want := `its program arguments ["--until-file" "` + stop + `" "--step-time" "7ms"] differ from those the job's ranks started with, ["--until-file" "` + stop + `" "--step-time" "5ms"]`
	if err == nil || !strings.Contains(string(out), want) {
		t.Errorf("the joiner with other arguments: %v, output:\n%s\nwant it refused, saying %s", err, out, want)
	}
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := j.finish(t); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
	if strings.Contains(j.err.String(), "membership epoch 1") || !strings.Contains(j.err.String(), "refused joiner") {
		t.Errorf("gorun's stderr: want the refusal and no change of membership:\n%s", j.err)
	}
	t.Logf("the joiner said:\n%s", out)
}
