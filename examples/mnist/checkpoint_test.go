package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/internal/testenv/s3test"
)

// rankPrefix is what gorun puts before a rank's line ("[0] ", "[0-1] ");
// a process run alone has none.
const rankPrefix = `(?:\[[0-9,-]+\] )?`

// asyncLineRe matches the line of an asynchronous save of step in dir,
// printed once it is committed.
func asyncLineRe(dir string, step int) *regexp.Regexp {
	return regexp.MustCompile(fmt.Sprintf(`(?m)^%scheckpoint: step %d snapshotted in \d+(\.\d+)?(ms|s|µs|ns) \(training goes on\); committed to %s after \d+(\.\d+)?(ms|s|µs) \([0-9.]+ (KiB|MiB)\)$`,
		rankPrefix, step, regexp.QuoteMeta(stepLoc(dir, int64(step)))))
}

// syncLineRe matches the line of a synchronous save of step in dir.
func syncLineRe(dir string, step int) *regexp.Regexp {
	return regexp.MustCompile(fmt.Sprintf(`(?m)^%scheckpoint: step %d saved to %s \([0-9.]+ (KiB|MiB), \d+(\.\d+)?(ms|s|µs)\)$`,
		rankPrefix, step, regexp.QuoteMeta(stepLoc(dir, int64(step)))))
}

// runCmdEnv is runCmd with more environment (the later value of a
// variable wins).
func runCmdEnv(t *testing.T, env []string, name string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(cleanEnv(), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %v did not finish in time\nstdout:\n%s\nstderr:\n%s", name, args, o.String(), e.String())
	}
	if err != nil && cmd.ProcessState == nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), cmd.ProcessState.ExitCode()
}

// finalHash is the parameter checksum of a run's output.
func finalHash(t *testing.T, out string) string {
	t.Helper()
	m := finalHashRe.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no final checksum in:\n%s", out)
	}
	return m[1]
}

// A job of 2 ranks whose last rank fails at step 120 is relaunched by
// gorun --max-restarts 1 and resumes from its last committed checkpoint,
// then ends with the parameters of an uninterrupted run. By default the
// save of step 120 is asynchronous and is not committed when the rank
// fails right after it (the commit is in a later step's Poll): the job
// resumes from step 80 (or 40, see below). With --checkpoint-sync it is committed before the
// failure: the job resumes from step 120. The synchronous run also keeps
// its checkpoints in DIR/{host}, which gorun's GORUN_HOST makes
// DIR/localhost.
func TestCheckpointResume(t *testing.T) {
	gorun, mnist := binaries(t)
	// The same checksum after a restart needs the same sums: shares
	// balanced by the ranks' measured speed would split them differently.
	args := []string{"--epochs", "2", "--progress", "off", "--balance=false"}
	ref, errOut, code := runCmd(t, gorun, append([]string{"-np", "2", mnist}, args...)...)
	if code != 0 {
		t.Fatalf("uninterrupted run: exit %d\n%s%s", code, ref, errOut)
	}
	want := finalHash(t, ref)
	for _, tc := range []struct {
		name    string
		flags   []string
		host    bool
		resumed []int // the steps it may resume from
	}{
		{"async", nil, false, []int{40, 80}},
		{"sync", []string{"--checkpoint-sync"}, true, []int{120}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ckpt")
			flag, real := dir, dir
			if tc.host {
				flag, real = filepath.Join(dir, "{host}"), filepath.Join(dir, "localhost")
			}
			line := asyncLineRe
			if tc.flags != nil {
				line = syncLineRe
			}
			cmd := append([]string{"-np", "2", "--max-restarts", "1", mnist}, args...)
			cmd = append(cmd, tc.flags...)
			cmd = append(cmd, "--checkpoint-dir", flag, "--checkpoint-every", "40", "--fail-at-step", "120")
			out, errOut, code := runCmd(t, gorun, cmd...)
			t.Logf("%s\n%s", out, errOut)
			if code != 0 {
				t.Fatalf("exit %d", code)
			}
			// Asynchronous: step 80 is the newest save committed when rank
			// 1 fails at step 120, or step 40 when step 80's background
			// writes outlast the 40 steps after it (a loaded machine); the
			// run must end the same either way. The line of the step it
			// resumed from may be missing: the commit finishes in the
			// background and may not have been seen by a Poll yet.
			var resumedLine string
			resumedStep := 0
			for _, step := range tc.resumed {
				l := fmt.Sprintf("mnist: resumed from %s at step %d of 250", stepLoc(real, int64(step)), step)
				if strings.Contains(out, l) {
					resumedLine, resumedStep = l, step
				}
			}
			if resumedLine == "" {
				t.Fatalf("the relaunched job did not resume from step %v", tc.resumed)
			}
			before, after, _ := strings.Cut(out, resumedLine)
			for _, step := range []int{40, 80, 120} {
				got := line(real, step).MatchString(before)
				if step == resumedStep && tc.flags == nil {
					continue
				}
				if want := step <= resumedStep; got != want {
					t.Errorf("first launch: line for the save of step %d: %v, want %v (%s)", step, got, want, line(real, step))
				}
			}
			for _, step := range []int{160, 200, 240} {
				if !line(real, step).MatchString(after) {
					t.Errorf("relaunch: no line for the save of step %d", step)
				}
			}
			if !syncLineRe(real, 250).MatchString(after) {
				t.Errorf("relaunch: no line for the final save of step 250")
			}
			if got := finalHash(t, after); got != want {
				t.Errorf("final checksum %s after the restart, %s uninterrupted", got, want)
			}
			if _, err := os.Stat(filepath.Join(stepLoc(real, 250), "manifest.json")); err != nil {
				t.Errorf("the final checkpoint is not committed: %v", err)
			}
		})
	}
}

// A background write that fails ends the run with an error that names the
// save, on the step whose Poll finds it, and keeps the previous checkpoint.
// The write is made to fail by a directory where the shard file goes.
func TestCheckpointAsyncSaveFails(t *testing.T) {
	_, mnist := binaries(t)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(stepLoc(dir, 100), "shard-00000-of-00001.bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runCmd(t, mnist, "--epochs", "1", "--progress", "off", "--checkpoint-dir", dir, "--checkpoint-every", "50")
	t.Logf("%s\n%s", out, errOut)
	want := regexp.MustCompile(`(?m)^mnist: checkpoint: async save of step 100: .*shard-00000-of-00001\.bin.*; previous checkpoint kept$`)
	if code != 1 || !want.MatchString(errOut) {
		t.Errorf("exit %d; want exit 1 and an error matching %s", code, want)
	}
	if !asyncLineRe(dir, 50).MatchString(out) || strings.Contains(out, "epoch 1/1") || strings.Contains(out, "final:") {
		t.Errorf("want the save of step 50 committed, and the run stopped before the end of the epoch")
	}
}

// --checkpoint-dir s3://bucket/prefix, against a real S3 server: a job of
// 2 ranks saves there, and when its last rank fails gorun --max-restarts 1
// relaunches it: it resumes from its last committed checkpoint and ends
// with the parameters of an uninterrupted run. A missing bucket and
// refused credentials fail before training, with one line.
func TestCheckpointS3(t *testing.T) {
	gorun, mnist := binaries(t)
	srv := s3test.Start(t)
	srv.MakeBucket("ckpt")
	env := srv.Env()
	loc := "s3://ckpt/mnist/run1"
	args := []string{"-np", "2", "--max-restarts", "1", mnist, "--epochs", "1", "--progress", "off", "--balance=false"}
	ref, errOut, code := runCmd(t, gorun, args...)
	if code != 0 {
		t.Fatalf("uninterrupted run: exit %d\n%s%s", code, ref, errOut)
	}
	out, errOut, code := runCmdEnv(t, env, gorun, append(args, "--checkpoint-dir", loc, "--checkpoint-every", "40", "--fail-at-step", "100")...)
	t.Logf("%s%s", out, errOut)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	// The newest save committed when rank 1 fails at step 100 is step 80,
	// or step 40 if step 80's writes (to S3, in the background) outlast
	// the 20 steps that follow it: both are right, and the run must end
	// the same. Step 80's line may be missing even when it was committed:
	// its commit finishes in the background, and rank 1 may fail before a
	// Poll on rank 0 has seen it.
	m := regexp.MustCompile(`mnist: resumed from ` + regexp.QuoteMeta(loc) + `/step-0+(\d+) at step (\d+) of 125`).FindStringSubmatch(out)
	if m == nil || m[1] != m[2] || (m[1] != "40" && m[1] != "80") {
		t.Fatalf("the relaunched job did not resume from step 40 or 80: %q", m)
	}
	before, after, _ := strings.Cut(out, m[0])
	if !asyncLineRe(loc, 40).MatchString(before) {
		t.Errorf("no line for the save of step 40 (%s)", asyncLineRe(loc, 40))
	}
	if !asyncLineRe(loc, 120).MatchString(after) || !syncLineRe(loc, 125).MatchString(after) {
		t.Errorf("no lines for the saves of steps 120 and 125 after the restart")
	}
	if got, want := finalHash(t, after), finalHash(t, ref); got != want {
		t.Errorf("final checksum %s after the restart, %s uninterrupted", got, want)
	}

	// A missing bucket and refused credentials fail before training, and
	// would fail a restart the same way: exit checkpoint.ExitNoRestart,
	// after a line saying so (for gorun --max-restarts).
	for _, tc := range []struct {
		name, loc string
		env       []string
		want, why string
	}{
		{"no bucket", "s3://nosuchbucket/mnist", nil, `bucket "nosuchbucket" does not exist on ` + srv.Endpoint(), `has no bucket "nosuchbucket"`},
		{"bad secret", loc, []string{"AWS_SECRET_ACCESS_KEY=wrong"}, "refused the credentials", "refuses the credentials ("},
	} {
		out, errOut, code := runCmdEnv(t, append(env[:len(env):len(env)], tc.env...), mnist, "--epochs", "1", "--progress", "off", "--checkpoint-dir", tc.loc)
		t.Logf("%s: %s", tc.name, errOut)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if code != checkpoint.ExitNoRestart || len(lines) != 2 || !strings.HasPrefix(lines[0], "mnist: --checkpoint-dir: checkpoint: "+tc.loc) ||
			!strings.Contains(lines[0], tc.want) || strings.Contains(out, "epoch 1/1") ||
			!strings.HasPrefix(lines[1], "mnist: checkpoint storage at "+tc.loc+" "+tc.why) || !strings.HasSuffix(lines[1], "; a restart would fail the same way") {
			t.Errorf("%s: exit %d, stderr:\n%s\nwant exit %d before training, a line naming %s and saying %q, and one saying it %s",
				tc.name, code, errOut, checkpoint.ExitNoRestart, tc.loc, tc.want, tc.why)
		}
	}
}

// stepLoc names the checkpoint of step in a directory or s3:// location,
// as Manager.StepLocation does.
func stepLoc(dir string, step int64) string {
	if checkpoint.IsRemote(dir) {
		return strings.TrimSuffix(dir, "/") + "/" + filepath.Base(checkpoint.StepDir("", step))
	}
	return checkpoint.StepDir(dir, step)
}
