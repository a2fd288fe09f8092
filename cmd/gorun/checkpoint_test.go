package main

import (
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

var (
	ckptprogOnce sync.Once
	ckptprogBin  string
	ckptprogErr  error
)

// ckptprog builds internal/ckptprog next to gorunBin (TestMain removes it).
func ckptprog(t *testing.T) string {
	t.Helper()
	ckptprogOnce.Do(func() {
		bin := filepath.Join(filepath.Dir(gorunBin), "ckptprog")
		args := []string{"build", "-o", bin}
		if raceEnabled {
			args = append(args, "-race")
		}
		out, err := exec.Command("go", append(args, "../../internal/ckptprog")...).CombinedOutput()
		if err != nil {
			ckptprogErr = err
			t.Logf("%s", out)
			return
		}
		ckptprogBin = bin
	})
	if ckptprogErr != nil {
		t.Fatalf("building internal/ckptprog: %v", ckptprogErr)
	}
	return ckptprogBin
}

// A rank killed with SIGKILL at a random step: gorun restarts the job, which
// resumes from its last barrier checkpoint and must end with parameters
// bitwise-identical to an uninterrupted run.
func TestCheckpointKillResumeBitwiseIdentical(t *testing.T) {
	prog := ckptprog(t)
	tmp := t.TempDir()
	const steps, every = 60, 5
	runTrain := func(name string, extra ...string) string {
		out := filepath.Join(tmp, name+".hex")
		env := append([]string{"CKPTPROG_DIR=" + filepath.Join(tmp, name), "CKPTPROG_OUT=" + out,
			"CKPTPROG_STEPS=60", "CKPTPROG_EVERY=5", "CKPTPROG_SEED=7"}, extra...)
		stdout, stderr, code := run(t, env, gorunBin, "-np", "4", "--max-restarts", "3", prog)
		if code != 0 {
			t.Fatalf("%s: exit %d\nstdout:\n%s\nstderr:\n%s", name, code, stdout, stderr)
		}
		if len(extra) > 0 && (!strings.Contains(stdout, "resumed from the checkpoint of step") || !strings.Contains(stderr, "signal: killed")) {
			t.Fatalf("%s: the job was not killed and resumed\nstdout:\n%s\nstderr:\n%s", name, stdout, stderr)
		}
		t.Logf("%s:\n%s", name, stdout)
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	want := runTrain("uninterrupted")
	// After the first checkpoint, so that the restarted job resumes from one
	// rather than starting over (which would prove nothing).
	victim, at := rand.IntN(4), every+1+rand.IntN(steps-every-2)
	t.Logf("killing rank %d before step %d", victim, at)
	got := runTrain("killed", "CKPTPROG_KILL="+strconv.Itoa(victim)+":"+strconv.Itoa(at))
	if got != want {
		t.Fatalf("parameters after kill and resume differ from an uninterrupted run:\n got %s\nwant %s", got, want)
	}

	// gorun checkpoint inspect on what the job wrote, then on a corrupted copy.
	dir := filepath.Join(tmp, "killed")
	stdout, stderr, code := run(t, nil, gorunBin, "checkpoint", "inspect", dir)
	if code != 0 {
		t.Fatalf("inspect: exit %d\n%s\n%s", code, stdout, stderr)
	}
	for _, w := range []string{"step 60 ", "step 55 ", "world size 4", "tensor w ", "float32  shape [17]", "tensor momentum",
		"per-rank state: noise, pos", "status: ok (checksums verified)",
		"restore would pick step 60: step 60 is the newest committed checkpoint and its checksums verify"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("inspect output lacks %q:\n%s", w, stdout)
		}
	}
	shard := filepath.Join(dir, "step-000000000060", "shard-00002-of-00004.bin")
	data, err := os.ReadFile(shard)
	if err != nil {
		t.Fatal(err)
	}
	data[3] ^= 1
	if err := os.WriteFile(shard, data, 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, _, code = run(t, nil, gorunBin, "checkpoint", "inspect", dir)
	t.Logf("inspect with the newest corrupted:\n%s", stdout)
	if w := "restore would pick step 55: step 55 is the newest committed checkpoint that verifies (skipped: step 60 corrupted: shard-00002-of-00004.bin has sha256"; code == 0 || !strings.Contains(stdout, w) {
		t.Errorf("exit %d; inspect output lacks %q:\n%s", code, w, stdout)
	}
	if err := os.Remove(filepath.Join(dir, "step-000000000055", "manifest.json")); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code = run(t, nil, gorunBin, "checkpoint", "inspect", dir)
	t.Logf("inspect of a corrupted directory:\n%s%s", stdout, stderr)
	if code == 0 {
		t.Errorf("inspect exited 0 on a corrupted checkpoint")
	}
	for _, w := range []string{"CORRUPTED: shard-00002-of-00004.bin has sha256", "NOT COMMITTED", "restore would pick nothing: no committed checkpoint verifies: step 60 corrupted"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("inspect output lacks %q:\n%s", w, stdout)
		}
	}
	if !strings.Contains(stderr, "1 committed checkpoint(s) in "+dir+" are corrupted") {
		t.Errorf("stderr: %s", stderr)
	}
}

// inspect of a path that does not exist (a typo) fails and names it; an
// existing directory without checkpoints is not an error.
func TestCheckpointInspectMissingOrEmptyDir(t *testing.T) {
	tmp := t.TempDir()
	missing := filepath.Join(tmp, "no-such-dir")
	stdout, stderr, code := run(t, nil, gorunBin, "checkpoint", "inspect", missing)
	if code == 0 || !strings.Contains(stderr, missing+" does not exist") || strings.Contains(stdout, "no checkpoints") {
		t.Errorf("inspect %s: exit %d\nstdout:\n%s\nstderr:\n%s\nwant a failure naming the path", missing, code, stdout, stderr)
	}
	stdout, stderr, code = run(t, nil, gorunBin, "checkpoint", "inspect", tmp)
	if code != 0 || !strings.Contains(stdout, "no checkpoints in "+tmp) {
		t.Errorf("inspect of an empty directory: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}
