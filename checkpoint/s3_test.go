package checkpoint

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/gorun/gorun/collective"
)

const (
	vgwAccess = "gorunaccess"
	vgwSecret = "gorunsecret0123456789"
)

// versity is a versitygw S3 server on loopback with a POSIX back end in a
// temporary directory.
type versity struct {
	t        *testing.T
	bin      string
	root     string
	addr     string
	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan error
	endpoint string
}

// versitygwBin finds versitygw in $(go env GOPATH)/bin or PATH.
func versitygwBin(t *testing.T) string {
	var cands []string
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		for _, p := range filepath.SplitList(strings.TrimSpace(string(out))) {
			cands = append(cands, filepath.Join(p, "bin", "versitygw"))
		}
	}
	if home, err := os.UserHomeDir(); err == nil {
		cands = append(cands, filepath.Join(home, "go", "bin", "versitygw"))
	}
	for _, c := range cands {
		if st, err := os.Stat(c); err == nil && !st.IsDir() {
			return c
		}
	}
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p
	}
	t.Skip("versitygw not found in $(go env GOPATH)/bin or PATH: install it with `go install github.com/versity/versitygw/cmd/versitygw@v1.8.0` (.ci/run does)")
	return ""
}

// startVersity starts the server, creates bucket and points the standard
// AWS environment at it for the rest of the test.
func startVersity(t *testing.T, bucket string) *versity {
	v := &versity{t: t, bin: versitygwBin(t), root: t.TempDir()}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	v.addr = l.Addr().String()
	l.Close()
	v.endpoint = "http://" + v.addr
	t.Cleanup(v.kill)
	for k, val := range map[string]string{
		"AWS_ACCESS_KEY_ID": vgwAccess, "AWS_SECRET_ACCESS_KEY": vgwSecret, "AWS_SESSION_TOKEN": "",
		"AWS_ENDPOINT_URL": v.endpoint, "AWS_REGION": "us-east-1", "AWS_S3_FORCE_PATH_STYLE": "true",
		"AWS_PROFILE": "", "AWS_CONFIG_FILE": filepath.Join(v.root, "no-config"),
		"AWS_SHARED_CREDENTIALS_FILE": filepath.Join(v.root, "no-credentials"), "AWS_EC2_METADATA_DISABLED": "true",
		"AWS_ENDPOINT_URL_S3": "",
	} {
		t.Setenv(k, val)
	}
	oldBackoff := s3MaxBackoff
	s3MaxBackoff = 200 * time.Millisecond
	t.Cleanup(func() { s3MaxBackoff = oldBackoff })
	v.start()
	if bucket != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, err := v.client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
			t.Fatalf("creating bucket %s: %v", bucket, err)
		}
	}
	return v
}

func (v *versity) client() *s3.Client {
	return s3.New(s3.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(v.endpoint), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(vgwAccess, vgwSecret, ""),
	})
}

// start runs versitygw and waits until it answers a signed ListBuckets.
func (v *versity) start() {
	t := v.t
	data := filepath.Join(v.root, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(v.bin, "--access", vgwAccess, "--secret", vgwSecret, "--port", v.addr, "posix", data)
	logf, err := os.OpenFile(filepath.Join(v.root, "versitygw.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	v.mu.Lock()
	v.cmd, v.exited = cmd, exited
	v.mu.Unlock()
	deadline := time.Now().Add(20 * time.Second)
	cl := v.client()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cl.ListBuckets(ctx, &s3.ListBucketsInput{})
		cancel()
		if err == nil {
			return
		}
		select {
		case werr := <-exited:
			exited <- werr
			log, _ := os.ReadFile(filepath.Join(v.root, "versitygw.log"))
			t.Fatalf("versitygw exited before it was ready (%v):\n%s", werr, log)
		default:
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(v.root, "versitygw.log"))
			t.Fatalf("versitygw at %s not ready after 20s: %v\n%s", v.addr, err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill stops the server by its PID (SIGKILL) and waits for it.
func (v *versity) kill() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cmd != nil && v.cmd.Process != nil {
		v.cmd.Process.Kill()
		select { // Wait runs in start's goroutine
		case <-v.exited:
		case <-time.After(10 * time.Second):
			v.t.Errorf("versitygw (pid %d) did not exit after SIGKILL", v.cmd.Process.Pid)
		}
		v.cmd = nil
	}
}

func (v *versity) keys(t *testing.T, bucket, prefix string) []string {
	t.Helper()
	s, err := openS3(context.Background(), "s3://"+bucket+"/"+prefix)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := s.List(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

func TestS3SaveRestoreRoundTrip(t *testing.T) {
	startVersity(t, "ckpt")
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprint("np", n), func(t *testing.T) {
			loc := fmt.Sprintf("s3://ckpt/job-np%d", n)
			comms := newJob(t, n)
			mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
				m, err := New(c, loc)
				if err != nil {
					return err
				}
				if step, found, err := m.Restore(context.Background(), newRankState(r).st); err != nil || found {
					return fmt.Errorf("rank %d: restore of an empty prefix: step %d found=%v err=%v, want a fresh start", r, step, found, err)
				}
				return nil
			}))
			mustAll(t, save(t, comms, loc, 10, 1.5))
			mustAll(t, save(t, comms, loc, 20, 2.5))
			restore(t, comms, loc, 20, 2.5)
			r, err := Scan(loc)
			if err != nil {
				t.Fatal(err)
			}
			if r.Pick != 20 || len(r.Entries) != 2 || r.Entries[0].Manifest == nil || r.Entries[0].Manifest.WorldSize != n {
				t.Fatalf("Scan: pick %d, %d entries, reason %s", r.Pick, len(r.Entries), r.Reason)
			}
		})
	}
	// A job of another size restores the tensors written by 3 ranks.
	comms := newJob(t, 2)
	restore(t, comms, "s3://ckpt/job-np3", 20, 2.5)
}

func TestS3RestorePicksNewestCommitted(t *testing.T) {
	startVersity(t, "ckpt")
	loc := "s3://ckpt/a/b"
	comms := newJob(t, 2)
	mustAll(t, save(t, comms, loc, 5, 1, WithKeep(5)))
	mustAll(t, save(t, comms, loc, 7, 2, WithKeep(5)))
	// An uncommitted newer step (a save that died before its manifest).
	crash(t, comms, loc, 9, 3, "manifest", 0, WithKeep(5))
	comms = newJob(t, 2)
	restore(t, comms, loc, 7, 2)
	r, err := Scan(loc)
	if err != nil {
		t.Fatal(err)
	}
	if r.Pick != 7 || len(r.Entries) != 3 || r.Entries[0].Committed {
		t.Fatalf("Scan: pick %d, entries %+v", r.Pick, r.Entries)
	}
}

// The server is killed by its PID in the middle of a save: the save fails
// on every rank, leaves no manifest, the previous checkpoint restores once
// the server is back, and the next save succeeds.
func TestS3ServerKilledMidSave(t *testing.T) {
	v := startVersity(t, "ckpt")
	loc := "s3://ckpt/job"
	comms := newJob(t, 3)
	mustAll(t, save(t, comms, loc, 1, 1))
	testHook = func(p string, rank int) error {
		if p == "write" && rank == 1 {
			v.kill() // after rank 1's shard, before its blob
		}
		return nil
	}
	errs := save(t, comms, loc, 2, 2)
	testHook = nil
	for r, err := range errs {
		if err == nil {
			t.Fatalf("rank %d: save succeeded although the server was killed", r)
		}
	}
	t.Logf("save with the server killed: %v", errs[1])
	if !strings.Contains(errs[1].Error(), loc) {
		t.Errorf("error does not name the location %s: %v", loc, errs[1])
	}
	v.start()
	for _, k := range v.keys(t, "ckpt", "job") {
		if k == stepKey(2)+"/"+ManifestName {
			t.Fatalf("the failed save left a manifest: %v", k)
		}
	}
	restore(t, comms, loc, 1, 1)
	mustAll(t, save(t, comms, loc, 3, 3))
	restore(t, comms, loc, 3, 3)
}

func TestS3CorruptObjectFallsBack(t *testing.T) {
	startVersity(t, "ckpt")
	loc := "s3://ckpt/job"
	comms := newJob(t, 2)
	mustAll(t, save(t, comms, loc, 1, 1))
	mustAll(t, save(t, comms, loc, 2, 2))
	s, err := openS3(context.Background(), loc)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(context.Background(), stepKey(2)+"/"+shardName(1, 2), []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	restore(t, comms, loc, 1, 1)
	if r, err := Scan(loc); err != nil || r.Pick != 1 || !strings.Contains(r.Entries[0].Problem, "corrupted") {
		t.Fatalf("Scan: %v %+v", err, r)
	}
}

func TestS3WrongCredentials(t *testing.T) {
	startVersity(t, "ckpt")
	comms := newJob(t, 1)
	mustAll(t, save(t, comms, "s3://ckpt/job", 1, 1))
	t.Setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
	_, err := New(comms[0], "s3://ckpt/job")
	if err == nil {
		t.Fatal("New succeeded with a wrong secret key")
	}
	t.Log(err)
	for _, want := range []string{"s3://ckpt/job", "refused the credentials", "AWS_SECRET_ACCESS_KEY"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if _, err := Scan("s3://ckpt/job"); err == nil || !strings.Contains(err.Error(), "refused the credentials") {
		t.Errorf("Scan: %v", err)
	}
	t.Setenv("AWS_SECRET_ACCESS_KEY", vgwSecret)
	restore(t, comms, "s3://ckpt/job", 1, 1)
}

func TestS3MissingBucket(t *testing.T) {
	startVersity(t, "ckpt")
	comms := newJob(t, 1)
	_, err := New(comms[0], "s3://no-such-bucket/job")
	if err == nil {
		t.Fatal("New succeeded on a missing bucket")
	}
	t.Log(err)
	for _, want := range []string{"s3://no-such-bucket/job", `bucket "no-such-bucket" does not exist`, "create it"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

func TestS3RetentionDeletesManifestFirst(t *testing.T) {
	v := startVersity(t, "ckpt")
	loc := "s3://ckpt/job"
	comms := newJob(t, 2)
	for step := int64(1); step <= 4; step++ {
		mustAll(t, save(t, comms, loc, step, float32(step)))
	}
	got := map[string]bool{}
	for _, k := range v.keys(t, "ckpt", "job") {
		got[strings.SplitN(k, "/", 2)[0]] = true
	}
	if len(got) != 2 || !got[stepKey(3)] || !got[stepKey(4)] {
		t.Fatalf("after 4 saves with keep 2: %v", got)
	}
	// A crash right after the manifest of step 3 is deleted leaves it
	// uncommitted, never broken.
	crash(t, comms, loc, 5, 5, "retention", 0)
	s, err := openS3(context.Background(), loc)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := storeSteps(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	var states []string
	for _, e := range entries {
		states = append(states, fmt.Sprintf("%d:%v", e.Step, e.Committed))
	}
	if strings.Join(states, " ") != "5:true 4:true 3:false" {
		t.Fatalf("after a crash during retention: %v", states)
	}
	comms = newJob(t, 2)
	restore(t, comms, loc, 5, 5)
}

// The Store code paths also run on a directory (DirStore), as a check of
// the generic code against the files Save writes itself.
func TestDirStoreReadsDirectoryCheckpoints(t *testing.T) {
	dir := t.TempDir()
	comms := newJob(t, 2)
	mustAll(t, save(t, comms, dir, 3, 1))
	entries, err := storeSteps(context.Background(), DirStore(dir))
	if err != nil || len(entries) != 1 || !entries[0].Committed || entries[0].Step != 3 {
		t.Fatalf("storeSteps: %v %+v", err, entries)
	}
	if _, err := storeVerify(context.Background(), DirStore(dir), 3, nil); err != nil {
		t.Fatal(err)
	}
	if err := storeDeleteStep(context.Background(), DirStore(dir), 3, nil); err != nil {
		t.Fatal(err)
	}
	if entries, _ := listSteps(dir); len(entries) != 0 {
		t.Fatalf("left %+v", entries)
	}
}
