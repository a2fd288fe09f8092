package e2e

import (
	"context"
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
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/gorun/gorun/internal/testenv/s3test"
)

// These tests run ckptprog under gorun with its checkpoints in a real S3
// server (versitygw on loopback, internal/testenv/s3test); the ranks get the AWS
// configuration from gorun's environment, as a job on one host does.

// ckptS3Steps and ckptS3Every are the length of the S3 jobs and their
// checkpoint interval: 8 checkpoints.
const ckptS3Steps, ckptS3Every = 40, 5

// ckptS3Env is the environment of gorun running ckptprog with its
// checkpoints in loc on srv and its final parameters written to out.
func ckptS3Env(srv *s3test.Server, loc, out string, extra ...string) []string {
	env := append(srv.Env(), "GORUN_FOLD_WINDOW=0", "CKPTPROG_DIR="+loc, "CKPTPROG_OUT="+out,
		"CKPTPROG_STEPS="+strconv.Itoa(ckptS3Steps), "CKPTPROG_EVERY="+strconv.Itoa(ckptS3Every), "CKPTPROG_SEED=11")
	return append(env, extra...)
}

// ckptS3Run runs gorun -np 3 ckptprog with its checkpoints in loc and
// returns its output, exit code, and the final parameters (hex) when it
// exited 0.
func ckptS3Run(t *testing.T, srv *s3test.Server, loc, out string, gorunArgs []string, extra ...string) (stdout, stderr string, code int, params string) {
	t.Helper()
	os.Remove(out)
	stdout, stderr, code = run(t, ckptS3Env(srv, loc, out, extra...), gorunBin, append(append([]string{"-np", "3"}, gorunArgs...), ckptprog(t))...)
	if code == 0 {
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatalf("gorun exited 0 but %s: %v\nstdout:\n%s\nstderr:\n%s", out, err, stdout, stderr)
		}
		params = strings.TrimSpace(string(b))
	}
	return stdout, stderr, code, params
}

var (
	ckptRefMu     sync.Mutex
	ckptRefParams string        // of an uninterrupted run of the S3 jobs
	ckptRefSave   time.Duration // the median time of its saves to S3
)

// ckptReference returns the final parameters of an uninterrupted run of the
// S3 jobs' configuration (with its checkpoints in s3://ckpt/reference on
// srv), and the median time of its saves; once per test binary.
func ckptReference(t *testing.T, srv *s3test.Server) (string, time.Duration) {
	t.Helper()
	ckptRefMu.Lock()
	defer ckptRefMu.Unlock()
	if ckptRefParams != "" {
		return ckptRefParams, ckptRefSave
	}
	stdout, stderr, code, params := ckptS3Run(t, srv, "s3://ckpt/reference", filepath.Join(t.TempDir(), "ref.hex"), nil)
	m := regexp.MustCompile(`\[0\] saves: (\d+), median (\S+),`).FindStringSubmatch(stdout)
	if code != 0 || !strings.Contains(stdout, "[0] fresh start") || m == nil || m[1] != strconv.Itoa(ckptS3Steps/ckptS3Every) {
		t.Fatalf("uninterrupted run: exit %d, want a fresh start and %d saves\nstdout:\n%s\nstderr:\n%s", code, ckptS3Steps/ckptS3Every, stdout, stderr)
	}
	if len(params) != 2*17*8 { // w and momentum: 2×17 float32, 8 hex digits each
		t.Fatalf("uninterrupted run wrote %d hex digits of parameters, want %d: %q", len(params), 2*17*8, params)
	}
	med, err := time.ParseDuration(m[2])
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("uninterrupted run: %d saves to S3, median %s", ckptS3Steps/ckptS3Every, med)
	ckptRefParams, ckptRefSave = params, med
	return params, med
}

// s3Keys lists the object keys under prefix in bucket.
func s3Keys(t *testing.T, srv *s3test.Server, bucket, prefix string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var keys []string
	p := s3.NewListObjectsV2Paginator(srv.Client(), &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String(prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			t.Fatalf("listing s3://%s/%s: %v", bucket, prefix, err)
		}
		for _, o := range page.Contents {
			keys = append(keys, aws.ToString(o.Key))
		}
	}
	return keys
}

// A rank of a job checkpointing to S3 is SIGKILLed a random time after a
// step that ends with a save starts (so that in some runs it dies in the
// middle of writing its objects); gorun restarts the job, which resumes
// from the last committed checkpoint and ends bit for bit where an
// uninterrupted run ends, with Save and with SaveAsync. What the jobs leave
// in the bucket verifies.
func TestCheckpointS3KillResumeBitwiseIdentical(t *testing.T) {
	srv := s3test.Start(t)
	srv.MakeBucket("ckpt")
	want, save := ckptReference(t, srv)
	// A step is short next to a save: a kill within two saves' time after
	// a step that ends with one starts lands in that save in some runs
	// (and the save of an async job runs on while the next steps do).
	within := min(max(2*save, 20*time.Millisecond), time.Second)
	tmp := t.TempDir()
	for _, mode := range []struct {
		name string
		env  []string
	}{{"sync", nil}, {"async", []string{"CKPTPROG_ASYNC=1"}}} {
		t.Run(mode.name, func(t *testing.T) {
			loc := "s3://ckpt/job-" + mode.name
			// A step that ends with a save, after the first checkpoint (a
			// resume from none would prove nothing) and before the last two.
			// An async job commits a save only when it starts the next one
			// (or Polls see it written): a kill in the step that ends with
			// the second save may come before the first is committed, when
			// steps are quicker than S3 writes, and the job would rightly
			// start afresh. So async kills come from the third save on.
			first := 1
			if mode.name == "async" {
				first = 2
			}
			// And at least two saves follow the one the kill aims at, so
			// that the kill (within two saves' time) lands before the job
			// ends however quick its steps are.
			victim := rand.IntN(3)
			at := ckptS3Every*(first+rand.IntN(ckptS3Steps/ckptS3Every-2-first)) + ckptS3Every - 1
			kill := fmt.Sprintf("CKPTPROG_KILL=%d:%d:%v", victim, at, within)
			t.Logf("%s: killing rank %d within %v after step %d starts", mode.name, victim, within, at)
			stdout, stderr, code, got := ckptS3Run(t, srv, loc, filepath.Join(tmp, mode.name+".hex"), []string{"--max-restarts", "1"},
				append(mode.env, kill)...)
			if code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
			}
			killed := regexp.MustCompile(`\[\d\] rank \d: SIGKILL (\S+) after step (\d+) started`).FindStringSubmatch(stdout)
			resumed := regexp.MustCompile(`\[0\] resumed from the checkpoint of step (\d+)`).FindStringSubmatch(stdout)
			if killed == nil || resumed == nil || !strings.Contains(stderr, "signal: killed") || !strings.Contains(stderr, "restart 1 of 1") {
				t.Fatalf("the job was not killed and resumed\nstdout:\n%s\nstderr:\n%s", stdout, stderr)
			}
			// Save commits a checkpoint before the next step; SaveAsync
			// commits the save before it first.
			lowest := at + 1 - ckptS3Every
			if mode.name == "async" {
				lowest -= ckptS3Every
			}
			if r, _ := strconv.Atoi(resumed[1]); r < lowest || r%ckptS3Every != 0 {
				t.Errorf("resumed from step %d, want a checkpoint step from %d on", r, lowest)
			}
			// A restarted save of a step that the kill cut short replaces
			// the objects it left.
			midSave := strings.Contains(stderr, "checkpoint: replacing existing "+loc+"/step-")
			t.Logf("killed %s after step %s started; resumed from step %s; the kill left a save's objects behind: %v",
				killed[1], killed[2], resumed[1], midSave)
			if got != want {
				t.Fatalf("parameters after kill and resume differ from an uninterrupted run:\n got %s\nwant %s\nstdout:\n%s\nstderr:\n%s", got, want, stdout, stderr)
			}

			stdout, stderr, code = run(t, srv.Env(), gorunBin, "checkpoint", "verify", loc)
			t.Logf("verify %s:\n%s", loc, stdout)
			wantOut := fmt.Sprintf("step %d  ok (checksums verified)\nstep %d  ok (checksums verified)\n", ckptS3Steps, ckptS3Steps-ckptS3Every) +
				fmt.Sprintf("restore would pick step %d: step %d is the newest committed checkpoint and its checksums verify\n", ckptS3Steps, ckptS3Steps)
			if code != 0 || stdout != wantOut {
				t.Errorf("gorun checkpoint verify %s: exit %d\nstdout:\n%s\nwant:\n%s\nstderr:\n%s", loc, code, stdout, wantOut, stderr)
			}
			// Retention left the two newest checkpoints, and nothing else.
			keys := s3Keys(t, srv, "ckpt", "job-"+mode.name+"/")
			for _, k := range keys {
				if !strings.HasPrefix(k, fmt.Sprintf("job-%s/step-%012d/", mode.name, ckptS3Steps)) &&
					!strings.HasPrefix(k, fmt.Sprintf("job-%s/step-%012d/", mode.name, ckptS3Steps-ckptS3Every)) {
					t.Errorf("object %s left in the bucket", k)
				}
			}
			if len(keys) != 2*(3+3+1) { // per step: 3 shards, 3 rank states, the manifest
				t.Errorf("%d objects in s3://ckpt/job-%s/, want 14: %v", len(keys), mode.name, keys)
			}
		})
	}
}

// The S3 server dies (SIGKILL) in the middle of a job's checkpoints: with
// Save, once the checkpoint of step 10 is committed, so that the save of
// step 15 fails as it starts; with SaveAsync, once the save of step 10 is
// started, so that its background writes or its commit fail. The job fails
// in the time of the S3 client's retries (not hung), with an error naming
// the S3 location of the failed save. A server that freezes instead
// (SIGSTOP) while an asynchronous save is written makes the job fail
// within the storage deadline, with a storage error, not a collective
// timeout. The restarted server still serves the
// checkpoints committed before, which verify, and a rerun resumes from the
// newest of them and ends bit for bit where an uninterrupted run ends.
func TestCheckpointS3ServerKilled(t *testing.T) {
	srv := s3test.Start(t)
	srv.MakeBucket("ckpt")
	want, _ := ckptReference(t, srv)
	tmp := t.TempDir()
	const pauseAt = 2 * ckptS3Every
	for _, mode := range []struct {
		name             string
		env              []string
		failed, restored int    // the step whose save fails, the step a rerun restores
		failure          string // what the failed save says
		stop             bool   // freeze the server (SIGSTOP) instead of killing it
		cause            string // what the failing rank says of the store
	}{
		{"sync", nil, pauseAt + ckptS3Every, pauseAt, "checkpoint: step %d: ", false, "connect: connection refused"},
		{"async", []string{"CKPTPROG_ASYNC=1"}, pauseAt, pauseAt - ckptS3Every, "checkpoint: async save of step %d: ", false, "connect: connection refused"},
		// A server that hangs: nothing fails by itself, and the storage
		// deadline (5 s here) ends the save.
		{"async-stopped", []string{"CKPTPROG_ASYNC=1", "CKPTPROG_IO_TIMEOUT=5s"}, pauseAt, pauseAt - ckptS3Every, "checkpoint: async save of step %d: ", true,
			"not done within the storage deadline (5s, WithIOTimeout)"},
	} {
		t.Run(mode.name, func(t *testing.T) {
			// Most of the time is the S3 client's retries against the dead
			// server: run the modes side by side, each with its own.
			t.Parallel()
			srv := s3test.Start(t)
			srv.MakeBucket("ckpt")
			loc := "s3://ckpt/down"
			fifo := filepath.Join(tmp, mode.name+".fifo")
			if err := syscall.Mkfifo(fifo, 0o600); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(tmp, mode.name+".hex")
			cmd := exec.Command(gorunBin, "-np", "3", ckptprog(t))
			cmd.Env = append(os.Environ(), ckptS3Env(srv, loc, out, append(mode.env, fmt.Sprintf("CKPTPROG_PAUSE=%d:%s", pauseAt, fifo))...)...)
			o, e := newWatchedBuffer(), new(syncBuf)
			cmd.Stdout, cmd.Stderr = o, e
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan struct{})
			go func() { cmd.Wait(); close(exited) }()
			t.Cleanup(func() { // by PID, if a failure left it running
				select {
				case <-exited:
				default:
					cmd.Process.Signal(syscall.SIGTERM)
					select {
					case <-exited:
					case <-time.After(10 * time.Second):
						cmd.Process.Kill()
						<-exited
					}
				}
			})
			if err := o.waitFor(fmt.Sprintf("[0] ckptprog: paused after saving step %d\n", pauseAt), 1, 2*time.Minute, exited); err != nil {
				t.Fatalf("the job did not pause after step %d: stdout %v\nstderr:\n%s", pauseAt, err, e)
			}
			// The objects of the committed checkpoints, apart from what the
			// save that is to fail may have written.
			committed := func() []string {
				var keys []string
				for _, k := range s3Keys(t, srv, "ckpt", "down/") {
					if !strings.HasPrefix(k, fmt.Sprintf("down/step-%012d/", mode.failed)) {
						keys = append(keys, k)
					}
				}
				return keys
			}
			before := committed()
			if len(before) == 0 || !strings.HasPrefix(before[len(before)-1], fmt.Sprintf("down/step-%012d/", mode.restored)) {
				t.Fatalf("objects before the server died: %v, want step %d's last", before, mode.restored)
			}
			if mode.stop {
				srv.Stop()
			} else {
				srv.Kill()
			}
			// Let rank 0 go on: opening the FIFO for writing returns once it
			// has it open for reading, which it does right after the line.
			// If the job died first, a reader of our own unblocks the open.
			opened := make(chan error, 1)
			go func() {
				f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
				if err == nil {
					f.Close()
				}
				opened <- err
			}()
			select {
			case err := <-opened:
				if err != nil {
					t.Fatal(err)
				}
			case <-exited:
				if r, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
					<-opened
					r.Close()
				}
				t.Fatalf("the job ended while paused: exit %d\nstdout:\n%s\nstderr:\n%s", cmd.ProcessState.ExitCode(), o, e)
			}
			resumedAt := time.Now()
			select {
			case <-exited:
			case <-time.After(2 * time.Minute):
				t.Fatalf("the job hung with the S3 server down\nstdout:\n%s\nstderr:\n%s", o, e)
			}
			took := time.Since(resumedAt)
			stdout, stderr, code := o.String(), e.String(), cmd.ProcessState.ExitCode()
			t.Logf("the job failed %v after the server died; gorun said:\n%s", took.Round(time.Millisecond), stderr)
			if code != 1 || strings.Contains(stdout, "done:") {
				t.Fatalf("with the S3 server down: exit %d, want 1 and no rank done\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
			}
			if took > time.Minute {
				t.Errorf("the job took %v to fail with the S3 server down", took)
			}
			for _, w := range []string{fmt.Sprintf(mode.failure, mode.failed), fmt.Sprintf("%s/step-%012d", loc, mode.failed),
				mode.cause, "gorun: job failed: "} {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr lacks %q", w)
				}
			}
			if strings.Contains(stderr, "collective timeout") {
				t.Errorf("a collective timeout, where the store failed")
			}

			if mode.stop {
				srv.Cont()
			}
			srv.Restart()
			if after := committed(); !slices.Equal(after, before) {
				t.Errorf("objects of the committed checkpoints after the restart:\n%v\nbefore the server died:\n%v", after, before)
			}
			stdout, stderr, code = run(t, srv.Env(), gorunBin, "checkpoint", "verify", loc)
			t.Logf("verify after the server restarted:\n%s", stdout)
			w := fmt.Sprintf("restore would pick step %d: step %d is the newest committed checkpoint and its checksums verify", mode.restored, mode.restored)
			if code != 0 || !strings.Contains(stdout, fmt.Sprintf("step %d  ok (checksums verified)\n", mode.restored)) || !strings.Contains(stdout, w) {
				t.Errorf("verify %s: exit %d, stdout lacks step %d ok or %q\nstdout:\n%s\nstderr:\n%s", loc, code, mode.restored, w, stdout, stderr)
			}

			stdout, stderr, code, got := ckptS3Run(t, srv, loc, out, nil, mode.env...)
			if code != 0 || !strings.Contains(stdout, fmt.Sprintf("[0] resumed from the checkpoint of step %d\n", mode.restored)) {
				t.Fatalf("rerun: exit %d, want a resume from step %d\nstdout:\n%s\nstderr:\n%s", code, mode.restored, stdout, stderr)
			}
			if got != want {
				t.Fatalf("parameters after the rerun differ from an uninterrupted run:\n got %s\nwant %s", got, want)
			}
		})
	}
}

// The store stops answering deletions (a proxy drops every DELETE, as a
// server that went away would, while writes still work) for a whole job
// whose rank 0 deletes old checkpoints after every save: training goes on
// under a collective timeout of 5 s, every save commits, the job ends
// where an uninterrupted run ends, and rank 0 logs each retention that
// failed, naming the location. Nothing was deleted: every step is left.
func TestCheckpointS3RetentionOutage(t *testing.T) {
	srv := s3test.Start(t)
	srv.MakeBucket("ckpt")
	want, _ := ckptReference(t, srv)
	proxy := srv.StartProxy()
	proxy.Set("DELETE", s3test.Drop)
	tmp := t.TempDir()
	for _, mode := range []struct {
		name string
		env  []string
	}{{"sync", nil}, {"async", []string{"CKPTPROG_ASYNC=1"}}} {
		t.Run(mode.name, func(t *testing.T) {
			loc := "s3://ckpt/ret-" + mode.name
			out := filepath.Join(tmp, mode.name+".hex")
			env := append(ckptS3Env(srv, loc, out, mode.env...), proxy.Env()...)
			start := time.Now()
			stdout, stderr, code := run(t, env, gorunBin, "-np", "3", "--timeout", "5s", ckptprog(t))
			t.Logf("%s: exit %d after %v\nstderr:\n%s", mode.name, code, time.Since(start).Round(time.Millisecond), stderr)
			if code != 0 {
				t.Fatalf("exit %d with deletions failing\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
			}
			b, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSpace(string(b)); got != want {
				t.Fatalf("parameters differ from an uninterrupted run:\n got %s\nwant %s", got, want)
			}
			re := regexp.MustCompile(`\[0\] .*checkpoint: retention of step (\d+) at ` + regexp.QuoteMeta(loc) + `: step-\d+/manifest.json: deleting: [^\n]*; training goes on\n`)
			logged := map[string]int{}
			for _, m := range re.FindAllStringSubmatch(stderr, -1) {
				logged[m[1]]++
			}
			// Every retention from the third save on deletes a step; the
			// last one fails in the final Wait.
			last := strconv.Itoa(ckptS3Steps)
			if len(logged) == 0 || logged[last] != 1 {
				t.Errorf("retentions logged %v, want the last one, of step %s, once among them", logged, last)
			}
			for s, n := range logged {
				if n != 1 {
					t.Errorf("the retention of step %s was logged %d times", s, n)
				}
			}
			if steps := len(s3Keys(t, srv, "ckpt", "ret-"+mode.name+"/")) / (3 + 3 + 1); steps != ckptS3Steps/ckptS3Every {
				t.Errorf("%d steps left, want all %d", steps, ckptS3Steps/ckptS3Every)
			}
		})
	}
}

// A save cut off in the middle of a big object leaves a multipart upload
// that no listing of objects shows (made here with the S3 API directly, as
// a rank that died would leave it: one part stored, under step 45, which
// has nothing else, and under step 40, which is committed). gorun
// checkpoint ls and verify show both with their step, part count, size and
// age; rm of each step aborts its upload, which ListMultipartUploads then
// no longer lists.
func TestCheckpointS3IncompleteUploads(t *testing.T) {
	srv := s3test.Start(t)
	srv.MakeBucket("ckpt")
	loc := "s3://ckpt/up"
	if _, stderr, code, _ := ckptS3Run(t, srv, loc, filepath.Join(t.TempDir(), "up.hex"), nil); code != 0 {
		t.Fatalf("the job that writes the checkpoints: exit %d\n%s", code, stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := srv.Client()
	for _, step := range []int{40, 45} {
		key := fmt.Sprintf("up/step-%012d/shard-00001-of-00003.bin", step)
		up, err := cl.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("ckpt"), Key: aws.String(key)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cl.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("ckpt"), Key: aws.String(key), UploadId: up.UploadId,
			PartNumber: aws.Int32(1), Body: strings.NewReader(strings.Repeat("x", 5<<20)), ContentLength: aws.Int64(5 << 20)}); err != nil {
			t.Fatal(err)
		}
	}
	uploads := func() []string {
		out, err := cl.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String("ckpt")})
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, u := range out.Uploads {
			keys = append(keys, aws.ToString(u.Key))
		}
		return keys
	}
	upload := `  incomplete upload of shard-00001-of-00003\.bin: 1 part\(s\), 5\.0 MiB, started \d+s ago\n`
	footer := `2 incomplete upload\(s\) hold 10\.0 MiB that no object shows \(saves cut off in a big object\): gorun checkpoint rm STEP aborts a step's; the job's next save those up to its step, and later ones after an hour\n`

	stdout, stderr, code := run(t, srv.Env(), gorunBin, "checkpoint", "ls", loc)
	t.Logf("ls:\n%s", stdout)
	mustMatch(t, `^step 45  NOT COMMITTED  \(no manifest\.json: [^\n]*\)\n`+upload+
		`step 40  committed      world size 3  [^\n]*\n`+upload+
		`step 35  committed      world size 3  [^\n]*\n`+footer+`$`, stdout)
	if code != 0 || stderr != "" {
		t.Errorf("ls: exit %d, stderr %q", code, stderr)
	}

	stdout, stderr, code = run(t, srv.Env(), gorunBin, "checkpoint", "verify", loc)
	t.Logf("verify:\n%s", stdout)
	mustMatch(t, `^step 40  ok \(checksums verified\)\nstep 35  ok \(checksums verified\)\n`+
		`not verified, NOT COMMITTED \(a restore skips them\): step 45\n`+
		`step 45  incomplete upload of shard-00001-of-00003\.bin: [^\n]*\n`+
		`step 40  incomplete upload of shard-00001-of-00003\.bin: [^\n]*\n`+footer+
		`restore would pick step 40: [^\n]*\n$`, stdout)
	if code != 0 || stderr != "" {
		t.Errorf("verify: exit %d, stderr %q", code, stderr)
	}

	stdout, stderr, code = run(t, srv.Env(), gorunBin, "checkpoint", "rm", loc, "45", "40")
	t.Logf("rm:\n%s%s", stdout, stderr)
	want := "removed step 45 (s3://ckpt/up/step-000000000045), and aborted its 1 incomplete upload(s)\n" +
		"removed step 40 (s3://ckpt/up/step-000000000040), and aborted its 1 incomplete upload(s)\n"
	if code != 0 || stdout != want {
		t.Errorf("rm: exit %d\n%s%s\nwant:\n%s", code, stdout, stderr, want)
	}
	if left := uploads(); len(left) != 0 {
		t.Errorf("uploads after rm: %v", left)
	}
}
