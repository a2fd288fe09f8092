package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/collective"
)

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

// makeCheckpoints saves a checkpoint of each step in dir from an in-process
// job of np ranks (collective.StartLocal): real checkpoints, written by the
// library as a job writes them, without starting processes. It returns the
// step directories by step.
func makeCheckpoints(t *testing.T, dir string, np int, steps ...int64) map[int64]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	job, err := collective.StartLocal(ctx, np)
	if err != nil {
		t.Fatal(err)
	}
	defer job.Close()
	errs := make([]error, np)
	var wg sync.WaitGroup
	for r, comm := range job.Comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := make([]float32, 300)
			pos := int64(r)
			st := new(checkpoint.State).Tensor("w", w).Int64("pos", &pos)
			m, err := checkpoint.New(comm, dir, checkpoint.WithKeep(len(steps)), checkpoint.WithLogger(func(string, ...any) {}))
			if err != nil {
				errs[r] = err
				return
			}
			for _, step := range steps {
				for i := range w {
					w[i] = float32(step) + float32(i)/7
				}
				pos += 8
				if err := m.Save(ctx, step, st); err != nil {
					errs[r] = fmt.Errorf("rank %d, step %d: %w", r, step, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	out := map[int64]string{}
	for _, step := range steps {
		out[step] = filepath.Join(dir, fmt.Sprintf("step-%012d", step))
		if _, err := os.Stat(filepath.Join(out[step], "manifest.json")); err != nil {
			t.Fatalf("step %d was not committed: %v", step, err)
		}
	}
	return out
}

// uncommittedCopy copies the files of step from but its manifest to step to:
// what a save cut short leaves.
func uncommittedCopy(t *testing.T, from string, to string) {
	t.Helper()
	des, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(to, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, de := range des {
		if de.Name() == "manifest.json" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(from, de.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, de.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// flipByte corrupts one byte of a file in place.
func flipByte(t *testing.T, file string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 1
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// oneLineError checks that a failed command printed one line on stderr, the
// CLI's "gorun: ..." error, containing want.
func oneLineError(t *testing.T, what string, stdout, stderr string, code int, want string) {
	t.Helper()
	if code != 1 || !strings.HasPrefix(stderr, "gorun: ") || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, want) {
		t.Errorf("%s: exit %d, stderr %q (stdout %q); want exit 1 and one line \"gorun: ...\" containing %q", what, code, stderr, stdout, want)
	}
}

// gorun checkpoint ls: one line per step, newest first, from the manifests
// alone (a damaged shard does not show, nor slow it down).
func TestCheckpointLs(t *testing.T) {
	dir := t.TempDir()
	steps := makeCheckpoints(t, dir, 2, 10, 20, 30)
	uncommittedCopy(t, steps[30], filepath.Join(dir, "step-000000000040"))
	flipByte(t, filepath.Join(steps[20], "shard-00001-of-00002.bin"))
	if err := os.Remove(filepath.Join(steps[10], "shard-00000-of-00002.bin")); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := run(t, nil, gorunBin, "checkpoint", "ls", dir)
	t.Logf("ls:\n%s", stdout)
	if code != 0 || stderr != "" {
		t.Fatalf("ls: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	want := []*regexp.Regexp{
		regexp.MustCompile(`^step 40  NOT COMMITTED  \(no manifest\.json: a save that did not finish, or a deletion in progress\)$`),
		regexp.MustCompile(`^step 30  committed      world size 2  [0-9.]+ (B|KiB) in 4 files$`),
		regexp.MustCompile(`^step 20  committed      world size 2  [0-9.]+ (B|KiB) in 4 files$`),
		regexp.MustCompile(`^step 10  committed      world size 2  [0-9.]+ (B|KiB) in 4 files$`),
	}
	if len(lines) != len(want) {
		t.Fatalf("ls printed %d lines, want %d:\n%s", len(lines), len(want), stdout)
	}
	for i, re := range want {
		if !re.MatchString(lines[i]) {
			t.Errorf("ls line %d is %q, want it to match %s", i+1, lines[i], re)
		}
	}
	// 300 float32 (1200 bytes) in two shards and two 8-byte counters in
	// per-rank files, plus what the blob encoding adds.
	if !strings.Contains(lines[1], "KiB") {
		t.Errorf("ls: size of step 30 not in KiB: %q", lines[1])
	}

	// A manifest that is not JSON: committed, said unreadable.
	if err := os.WriteFile(filepath.Join(steps[30], "manifest.json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, _, code = run(t, nil, gorunBin, "checkpoint", "ls", dir)
	if w := "step 30  committed      manifest unreadable: manifest.json is not valid JSON"; code != 0 || !strings.Contains(stdout, w) {
		t.Errorf("ls with a broken manifest: exit %d, output lacks %q:\n%s", code, w, stdout)
	}

	empty := t.TempDir()
	stdout, stderr, code = run(t, nil, gorunBin, "checkpoint", "ls", empty)
	if code != 0 || stdout != "no checkpoints in "+empty+"\n" || stderr != "" {
		t.Errorf("ls of an empty directory: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	missing := filepath.Join(empty, "no-such-dir")
	stdout, stderr, code = run(t, nil, gorunBin, "checkpoint", "ls", missing)
	oneLineError(t, "ls of a missing directory", stdout, stderr, code, "checkpoint: "+missing+" does not exist")
	stdout, stderr, code = run(t, nil, gorunBin, "checkpoint", "ls", dir, empty)
	oneLineError(t, "ls of two locations", stdout, stderr, code, "checkpoint ls takes one LOCATION")
	stdout, stderr, code = run(t, nil, gorunBin, "checkpoint", "ls")
	oneLineError(t, "ls without a location", stdout, stderr, code, "checkpoint ls takes one LOCATION")

	// "{host}" stands for $GORUN_HOST, as in checkpoint.New.
	hostDir := filepath.Join(empty, "node7")
	makeCheckpoints(t, hostDir, 1, 5)
	stdout, stderr, code = run(t, []string{"GORUN_HOST=node7"}, gorunBin, "checkpoint", "ls", filepath.Join(empty, "{host}"))
	if code != 0 || !strings.HasPrefix(stdout, "step 5  committed      world size 1  ") {
		t.Errorf("ls of {host} with GORUN_HOST=node7: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}

// gorun checkpoint verify: a line per committed checkpoint, ok or CORRUPTED
// naming the file; exit 1 when one is corrupted or none verifies.
func TestCheckpointVerify(t *testing.T) {
	dir := t.TempDir()
	steps := makeCheckpoints(t, dir, 2, 10, 20, 30)
	uncommittedCopy(t, steps[30], filepath.Join(dir, "step-000000000040"))
	stdout, stderr, code := run(t, nil, gorunBin, "checkpoint", "verify", dir)
	t.Logf("verify:\n%s", stdout)
	want := "step 30  ok (checksums verified)\nstep 20  ok (checksums verified)\nstep 10  ok (checksums verified)\n" +
		"not verified, NOT COMMITTED (a restore skips them): step 40\n" +
		"restore would pick step 30: step 30 is the newest committed checkpoint and its checksums verify\n"
	if code != 0 || stdout != want || stderr != "" {
		t.Errorf("verify: exit %d\nstdout:\n%s\nwant:\n%s\nstderr:\n%s", code, stdout, want, stderr)
	}

	flipByte(t, filepath.Join(steps[30], "shard-00001-of-00002.bin"))
	stdout, stderr, code = run(t, nil, gorunBin, "checkpoint", "verify", dir)
	t.Logf("verify with step 30 corrupted:\n%s%s", stdout, stderr)
	for _, w := range []string{"step 30  CORRUPTED: shard-00001-of-00002.bin has sha256 ", "(bit rot or a torn write)\n",
		"step 20  ok (checksums verified)\n",
		"restore would pick step 20: step 20 is the newest committed checkpoint that verifies (skipped: step 30 corrupted: shard-00001-of-00002.bin has sha256"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("verify output lacks %q:\n%s", w, stdout)
		}
	}
	oneLineError(t, "verify with a corrupted checkpoint", "", stderr, code, "1 committed checkpoint(s) in "+dir+" are corrupted")

	// None verifies: every committed one corrupted or truncated.
	for _, s := range []int64{10, 20} {
		if err := os.Truncate(filepath.Join(steps[s], "rank-00000.state"), 1); err != nil {
			t.Fatal(err)
		}
	}
	stdout, stderr, code = run(t, nil, gorunBin, "checkpoint", "verify", dir)
	if w := "step 10  CORRUPTED: rank-00000.state is 1 bytes, manifest says"; !strings.Contains(stdout, w) || !strings.Contains(stdout, "restore would pick nothing: no committed checkpoint verifies") {
		t.Errorf("verify with everything corrupted lacks %q or the pick:\n%s", w, stdout)
	}
	oneLineError(t, "verify with everything corrupted", "", stderr, code, "3 committed checkpoint(s) in "+dir+" are corrupted")

	empty := t.TempDir()
	stdout, stderr, code = run(t, nil, gorunBin, "checkpoint", "verify", empty)
	if !strings.Contains(stdout, "no checkpoints in "+empty+"\n") {
		t.Errorf("verify of an empty directory: stdout:\n%s", stdout)
	}
	oneLineError(t, "verify of an empty directory", "", stderr, code, "no committed checkpoint in "+empty+" verifies: no committed checkpoint")
	missing := filepath.Join(empty, "typo")
	stdout, stderr, code = run(t, nil, gorunBin, "checkpoint", "verify", missing)
	oneLineError(t, "verify of a missing directory", stdout, stderr, code, "checkpoint: "+missing+" does not exist")
}

// gorun checkpoint rm: removes the given steps (or --all) and says so;
// refuses bad or absent steps before removing anything; what is left still
// verifies.
func TestCheckpointRm(t *testing.T) {
	dir := t.TempDir()
	steps := makeCheckpoints(t, dir, 2, 10, 20, 30)
	uncommittedCopy(t, steps[30], filepath.Join(dir, "step-000000000040"))
	exists := func(step int64) bool {
		_, err := os.Stat(filepath.Join(dir, fmt.Sprintf("step-%012d", step)))
		return err == nil
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"rm", dir, "20", "abc"}, `checkpoint rm: STEP "abc" is not a step number (a non-negative integer, as gorun checkpoint ls prints): nothing was removed`},
		{[]string{"rm", dir, "20", "-5"}, `STEP "-5" is not a step number`},
		{[]string{"rm", dir, "1.5"}, `STEP "1.5" is not a step number`},
		{[]string{"rm", dir, "20", "99"}, "checkpoint: no step 99 in " + dir + " (steps there: 40, 30, 20, 10): nothing was removed"},
		{[]string{"rm", dir}, "checkpoint rm: no step to remove"},
		{[]string{"rm", "--all", dir, "20"}, "--all and steps (20) both given"},
		{[]string{"rm"}, "checkpoint rm: no LOCATION"},
		{[]string{"rm", "--bogus", dir}, "unknown flag: --bogus"},
		{[]string{"rm", filepath.Join(dir, "typo"), "20"}, "checkpoint: " + filepath.Join(dir, "typo") + " does not exist"},
	} {
		stdout, stderr, code := run(t, nil, gorunBin, append([]string{"checkpoint"}, tc.args...)...)
		oneLineError(t, fmt.Sprint(tc.args), stdout, stderr, code, tc.want)
	}
	for _, s := range []int64{10, 20, 30, 40} {
		if !exists(s) {
			t.Fatalf("step %d was removed by a refused rm", s)
		}
	}

	stdout, stderr, code := run(t, nil, gorunBin, "checkpoint", "rm", dir, "30", "40", "30")
	want := fmt.Sprintf("removed step 30 (%s)\nremoved step 40 (%s)\n", steps[30], filepath.Join(dir, "step-000000000040"))
	if code != 0 || stdout != want || stderr != "" {
		t.Errorf("rm 30 40: exit %d\nstdout:\n%s\nwant:\n%s\nstderr:\n%s", code, stdout, want, stderr)
	}
	if exists(30) || exists(40) || !exists(20) || !exists(10) {
		t.Errorf("after rm 30 40: steps 30 40 20 10 exist: %v %v %v %v", exists(30), exists(40), exists(20), exists(10))
	}
	stdout, stderr, code = run(t, nil, gorunBin, "checkpoint", "verify", dir)
	if code != 0 || !strings.Contains(stdout, "restore would pick step 20: step 20 is the newest committed checkpoint and its checksums verify") {
		t.Errorf("verify after rm: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}

	stdout, stderr, code = run(t, nil, gorunBin, "checkpoint", "rm", "--all", dir)
	if want := fmt.Sprintf("removed step 10 (%s)\nremoved step 20 (%s)\n", steps[10], steps[20]); code != 0 || stdout != want {
		t.Errorf("rm --all: exit %d\nstdout:\n%s\nwant:\n%s\nstderr:\n%s", code, stdout, want, stderr)
	}
	stdout, _, code = run(t, nil, gorunBin, "checkpoint", "ls", dir)
	if code != 0 || stdout != "no checkpoints in "+dir+"\n" {
		t.Errorf("ls after rm --all: exit %d\n%s", code, stdout)
	}
	if des, _ := os.ReadDir(dir); len(des) != 0 {
		t.Errorf("rm --all left %v in %s", des, dir)
	}
	stdout, _, code = run(t, nil, gorunBin, "checkpoint", "rm", "--all", dir)
	if code != 0 || stdout != "no checkpoints in "+dir+": nothing to remove\n" {
		t.Errorf("rm --all of an empty directory: exit %d\n%s", code, stdout)
	}
}

// rm removes a checkpoint's manifest first: when it cannot remove one of its
// files, the step is left uncommitted (a restore skips it), and the steps
// left verify.
func TestCheckpointRmManifestFirst(t *testing.T) {
	dir := t.TempDir()
	steps := makeCheckpoints(t, dir, 2, 10, 20)
	// A file rm cannot remove, sorted before manifest.json.
	stuck := filepath.Join(steps[20], "aaa-stuck")
	if os.Geteuid() == 0 {
		if err := os.WriteFile(stuck, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("chattr", "+i", stuck).CombinedOutput(); err != nil {
			t.Skipf("cannot make a file undeletable as root (chattr +i: %v %s)", err, out)
		}
		t.Cleanup(func() { exec.Command("chattr", "-i", stuck).Run() })
	} else {
		if err := os.MkdirAll(stuck, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(stuck, "f"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		os.Chmod(stuck, 0o555)
		t.Cleanup(func() { os.Chmod(stuck, 0o755) })
	}
	stdout, stderr, code := run(t, nil, gorunBin, "checkpoint", "rm", dir, "20")
	t.Logf("rm with a file that cannot be removed:\n%s%s", stdout, stderr)
	oneLineError(t, "rm with a file that cannot be removed", stdout, stderr, code, "checkpoint: removing step 20 from "+dir+": ")
	if !strings.Contains(stderr, "aaa-stuck") {
		t.Errorf("the error does not name the file: %s", stderr)
	}
	if _, err := os.Stat(filepath.Join(steps[20], "manifest.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("manifest.json of step 20 is still there (%v): the step is still committed", err)
	}
	if _, err := os.Stat(filepath.Join(steps[20], "shard-00000-of-00002.bin")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a shard of step 20 is still there (%v)", err)
	}
	stdout, _, code = run(t, nil, gorunBin, "checkpoint", "ls", dir)
	if code != 0 || !strings.HasPrefix(stdout, "step 20  NOT COMMITTED") {
		t.Errorf("ls after the failed rm: exit %d\n%s", code, stdout)
	}
	stdout, stderr, code = run(t, nil, gorunBin, "checkpoint", "verify", dir)
	if code != 0 || !strings.Contains(stdout, "restore would pick step 10: step 10 is the newest committed checkpoint and its checksums verify") {
		t.Errorf("verify after the failed rm: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}

// Every rank sees GORUN_HOST, its host as -H names it, and with
// --checkpoint-replicas k, GORUN_CHECKPOINT_REPLICAS=k; in elastic jobs too.
func TestCheckpointHostEnvAndReplicasFlag(t *testing.T) {
	show := []string{"/bin/sh", "-c", `echo "host=$GORUN_HOST replicas=$GORUN_CHECKPOINT_REPLICAS"`}
	unfolded := []string{"GORUN_FOLD_WINDOW=0", "GORUN_HOST=", "GORUN_CHECKPOINT_REPLICAS="}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"-np", "2"}, []string{"[0] host=localhost replicas=\n", "[1] host=localhost replicas=\n"}},
		// Both hosts are this one, reached without ssh, but named apart.
		{[]string{"-H", "localhost:2,127.0.0.1:1", "--checkpoint-replicas", "1", "-x", "GORUN_HOST=ignored"},
			[]string{"[localhost:0] host=localhost replicas=1\n", "[localhost:1] host=localhost replicas=1\n", "[127.0.0.1:2] host=127.0.0.1 replicas=1\n"}},
		{[]string{"-np", "2", "--min-np", "1", "-H", "127.0.0.1:2", "--checkpoint-replicas=0"},
			[]string{"[0] host=127.0.0.1 replicas=0\n", "[1] host=127.0.0.1 replicas=0\n"}},
	} {
		out, errOut, code := run(t, unfolded, gorunBin, append(tc.args, show...)...)
		for _, w := range tc.want {
			if code != 0 || !strings.Contains(out, w) {
				t.Errorf("gorun %v: exit %d, stdout lacks %q\nstdout:\n%s\nstderr:\n%s", tc.args, code, w, out, errOut)
			}
		}
	}

	// From --config too.
	cfg := filepath.Join(t.TempDir(), "job.yaml")
	os.WriteFile(cfg, []byte("checkpoint-replicas: 3\n"), 0o644)
	out, errOut, code := run(t, unfolded, gorunBin, append([]string{"--config", cfg}, show...)...)
	if code != 0 || out != "[0] host=localhost replicas=3\n" {
		t.Errorf("--config with checkpoint-replicas: 3: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}

// A negative --checkpoint-replicas is refused in one line before any rank
// starts; --help lists the flag and gorun help checkpoints explains it.
func TestCheckpointReplicasFlagRefused(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "started")
	prog := []string{"/bin/sh", "-c", "touch " + marker}
	cfg := filepath.Join(dir, "job.yaml")
	os.WriteFile(cfg, []byte("checkpoint-replicas: -2\n"), 0o644)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--checkpoint-replicas", "-1"}, "gorun: --checkpoint-replicas must be 0 or more, got -1\n"},
		{[]string{"-np", "2", "--min-np", "1", "--checkpoint-replicas=-3"}, "gorun: --checkpoint-replicas must be 0 or more, got -3\n"},
		{[]string{"--config", cfg}, "gorun: --checkpoint-replicas must be 0 or more, got -2\n"},
		{[]string{"--checkpoint-replicas", "two"}, `gorun: invalid argument "two" for "--checkpoint-replicas" flag: "two" is not an integer`},
	} {
		stdout, stderr, code := run(t, nil, gorunBin, append(tc.args, prog...)...)
		if code != 1 || !strings.HasPrefix(stderr, tc.want) || strings.Count(stderr, "\n") != 1 || stdout != "" {
			t.Errorf("gorun %v: exit %d\nstdout:\n%s\nstderr:\n%s\nwant exit 1 and one line starting %q", tc.args, code, stdout, stderr, tc.want)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Fatalf("gorun %v started a rank", tc.args)
		}
	}
	out, _, _ := run(t, nil, gorunBin, "--help")
	if w := "--checkpoint-replicas k keep each checkpoint file on k more hosts than its own"; !strings.Contains(strings.Join(strings.Fields(out), " "), w) {
		t.Errorf("--help lacks %q:\n%s", w, out)
	}
	out, _, _ = run(t, nil, gorunBin, "help", "checkpoints")
	if w := "--checkpoint-replicas k keeps each checkpoint file on k more hosts' checkpoint directories than its own: replicated local checkpoints, when hosts do not share the directory (see package checkpoint)"; !strings.Contains(strings.Join(strings.Fields(out), " "), w) {
		t.Errorf("gorun help checkpoints lacks %q:\n%s", w, out)
	}
}

// makeReplicated saves checkpoints of each step from an in-process job of
// len(hostOf) ranks, rank r in base/host<hostOf[r]> (one directory per
// host, as "{host}" gives), each file kept on k more hosts. It returns the
// hosts' directories.
func makeReplicated(t *testing.T, base string, k int, hostOf []int, steps ...int64) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	np := len(hostOf)
	job, err := collective.StartLocal(ctx, np)
	if err != nil {
		t.Fatal(err)
	}
	defer job.Close()
	var hosts []string
	for h := range slices.Max(hostOf) + 1 {
		hosts = append(hosts, filepath.Join(base, fmt.Sprintf("host%d", h)))
	}
	errs := make([]error, np)
	var wg sync.WaitGroup
	for r, comm := range job.Comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := make([]float32, 300)
			pos := int64(r)
			st := new(checkpoint.State).Tensor("w", w).Int64("pos", &pos)
			m, err := checkpoint.New(comm, hosts[hostOf[r]], checkpoint.WithReplicas(k), checkpoint.WithKeep(len(steps)), checkpoint.WithLogger(func(string, ...any) {}))
			if err != nil {
				errs[r] = err
				return
			}
			for _, step := range steps {
				for i := range w {
					w[i] = float32(step) + float32(i)/7
				}
				if err := m.Save(ctx, step, st); err != nil {
					errs[r] = fmt.Errorf("rank %d, step %d: %w", r, step, err)
					return
				}
			}
			errs[r] = m.Wait(ctx) // retention, in the background
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return hosts
}

// restoreReplicated restores what makeReplicated saved, with an in-process
// job of len(hostOf) ranks, and returns the step restored and what the
// ranks logged.
func restoreReplicated(t *testing.T, hosts []string, k int, hostOf []int) (int64, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	np := len(hostOf)
	job, err := collective.StartLocal(ctx, np)
	if err != nil {
		t.Fatal(err)
	}
	defer job.Close()
	var mu sync.Mutex
	var log strings.Builder
	logf := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(&log, format+"\n", args...)
	}
	steps := make([]int64, np)
	errs := make([]error, np)
	var wg sync.WaitGroup
	for r, comm := range job.Comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := make([]float32, 300)
			var pos int64
			st := new(checkpoint.State).Tensor("w", w).Int64("pos", &pos)
			m, err := checkpoint.New(comm, hosts[hostOf[r]], checkpoint.WithReplicas(k), checkpoint.WithLogger(logf))
			if err == nil {
				steps[r], _, err = m.Restore(ctx, st)
			}
			errs[r] = err
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return steps[0], log.String()
}

// On one host's directory of a replicated checkpoint (3 hosts, k=1) ls,
// inspect and verify show what that directory holds; a file missing there
// is DEGRADED (exit 2), not corrupted, when another host's copy verifies,
// which they check in the directories beside it when given "{host}".
func TestCheckpointReplicatedHostView(t *testing.T) {
	base := t.TempDir()
	hosts := makeReplicated(t, base, 1, []int{0, 1, 2}, 10, 20)
	env := []string{"GORUN_HOST=host1"}
	loc := filepath.Join(base, "{host}")

	stdout, stderr, code := run(t, env, gorunBin, "checkpoint", "ls", loc)
	t.Logf("ls %s:\n%s", hosts[1], stdout)
	re := regexp.MustCompile(`^step 20  committed      world size 3  [0-9.]+ (B|KiB) of [0-9.]+ (B|KiB) here, 4 of 6 files \(host 1 of 3; each file is on 2 hosts\)\nstep 10  committed      world size 3  .* here, 4 of 6 files \(host 1 of 3; each file is on 2 hosts\)\n$`)
	if code != 0 || stderr != "" || !re.MatchString(stdout) {
		t.Errorf("ls: exit %d\nstdout:\n%s\nstderr:\n%s\nwant it to match %s", code, stdout, stderr, re)
	}

	stdout, stderr, code = run(t, env, gorunBin, "checkpoint", "inspect", loc)
	t.Logf("inspect %s:\n%s", hosts[1], stdout)
	for _, w := range []string{
		"step 20  " + filepath.Join(hosts[1], "step-000000000020") + "\n",
		"  status: ok (checksums verified; this directory holds 4 of 6 files, host 1 of 3; each file is on 2 hosts)\n",
		"  world size 3, 1200 bytes of tensors, ",
		" of which this directory holds ",
		"restore would pick step 20: step 20 is the newest committed checkpoint and its checksums verify, here and in the other hosts' directories\n",
	} {
		if code != 0 || stderr != "" || !strings.Contains(stdout, w) {
			t.Errorf("inspect: exit %d, stdout lacks %q\nstdout:\n%s\nstderr:\n%s", code, w, stdout, stderr)
		}
	}

	// Host 1 keeps the files of ranks 0 and 1; rank 1's shard goes.
	if err := os.Remove(filepath.Join(hosts[1], "step-000000000020", "shard-00001-of-00003.bin")); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code = run(t, env, gorunBin, "checkpoint", "verify", loc)
	t.Logf("verify with a file missing:\n%s%s", stdout, stderr)
	want := "step 20  DEGRADED (this directory holds 4 of 6 files, host 1 of 3; each file is on 2 hosts): shard-00001-of-00003.bin is missing here (its copy in " + hosts[2] + " verifies); the next restore reads it from another host and writes it back here\n" +
		"step 10  ok (checksums verified; this directory holds 4 of 6 files, host 1 of 3; each file is on 2 hosts)\n" +
		"restore would pick step 20: step 20 is the newest committed checkpoint and the files this directory holds verify but for those it lacks or holds damaged, whose copies on other hosts verify: a restore reads them from there\n"
	if stdout != want {
		t.Errorf("verify:\n%s\nwant:\n%s", stdout, want)
	}
	if w := "gorun: 1 committed checkpoint(s) in " + hosts[1] + " are DEGRADED: files this directory should hold are missing or damaged, and other hosts keep copies (see above)\n"; code != 2 || stderr != w {
		t.Errorf("verify: exit %d, stderr %q; want exit 2 and %q", code, stderr, w)
	}
	stdout, _, code = run(t, env, gorunBin, "checkpoint", "inspect", hosts[1])
	if code != 2 || !strings.Contains(stdout, "  status: DEGRADED (this directory holds 4 of 6 files") {
		t.Errorf("inspect with a file missing: exit %d\n%s", code, stdout)
	}
	// Host 2 is intact.
	stdout, stderr, code = run(t, nil, gorunBin, "checkpoint", "verify", hosts[2])
	if code != 0 || !strings.Contains(stdout, "step 20  ok (checksums verified; this directory holds 4 of 6 files, host 2 of 3; each file is on 2 hosts)") {
		t.Errorf("verify of host 2: exit %d\n%s%s", code, stdout, stderr)
	}
}

// A shard lost on both hosts that keep it (3 hosts, k=1): gorun checkpoint
// verify of any host's directory, given with {host}, checks the other
// hosts' copies, finds none left, says the step is CORRUPTED and that a
// restore would pick the step before, and the restore does. Given one
// host's directory alone, it does not claim the other copy is there: it
// says it was not checked.
func TestCheckpointReplicatedVerifyAgreesWithRestore(t *testing.T) {
	base := t.TempDir()
	hostOf := []int{0, 1, 2}
	hosts := makeReplicated(t, base, 1, hostOf, 10, 20)
	for _, h := range hosts[1:] {
		if err := os.Remove(filepath.Join(h, "step-000000000020", "shard-00001-of-00003.bin")); err != nil {
			t.Fatal(err)
		}
	}
	loc := filepath.Join(base, "{host}")
	for host, lost := range map[string]string{
		"host1": "missing here; missing in " + hosts[2],
		"host0": "missing in " + hosts[1] + "; missing in " + hosts[2],
	} {
		stdout, stderr, code := run(t, []string{"GORUN_HOST=" + host}, gorunBin, "checkpoint", "verify", loc)
		t.Logf("verify as %s:\n%s%s", host, stdout, stderr)
		want := "step 20  CORRUPTED: no intact copy of shard-00001-of-00003.bin is left (" + lost + ")\n"
		pick := "restore would pick step 10: step 10 is the newest committed checkpoint that verifies (skipped: step 20 corrupted: no intact copy of shard-00001-of-00003.bin is left"
		if code != 1 || !strings.HasPrefix(stdout, want) || !strings.Contains(stdout, pick) {
			t.Errorf("verify as %s: exit %d\n%s\nwant exit 1, %q and %q", host, code, stdout, want, pick)
		}
	}
	stdout, _, code := run(t, nil, gorunBin, "checkpoint", "verify", hosts[1])
	t.Logf("verify of %s alone:\n%s", hosts[1], stdout)
	for _, w := range []string{
		"shard-00001-of-00003.bin is missing here (host 2 should keep another copy: not checked)",
		"restore would pick step 20: step 20 is the newest committed checkpoint and the files this directory holds verify but for those it lacks or holds damaged; the copies on hosts 0 and 2 were not checked (give the location with {host} where the other hosts' directories are reachable, or verify on every host), and a restore needs them\n",
	} {
		if code != 2 || !strings.Contains(stdout, w) {
			t.Errorf("verify of one directory: exit %d, stdout lacks %q", code, w)
		}
	}
	step, log := restoreReplicated(t, hosts, 1, hostOf)
	if step != 10 || !strings.Contains(log, "skipping the checkpoint of step 20") {
		t.Errorf("restore: step %d, want 10 after skipping step 20; log:\n%s", step, log)
	}
}
