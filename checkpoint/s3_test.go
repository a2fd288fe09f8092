package checkpoint

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"math/rand/v2"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/internal/testenv/s3test"
)

// startVersity starts a versitygw server (internal/testenv/s3test), creates bucket
// and points the standard AWS environment at it for the rest of the test.
func startVersity(t *testing.T, bucket string) *s3test.Server {
	v := s3test.Start(t)
	v.Setenv(t)
	oldBackoff := s3MaxBackoff
	s3MaxBackoff = 200 * time.Millisecond
	t.Cleanup(func() { s3MaxBackoff = oldBackoff })
	if bucket != "" {
		v.MakeBucket(bucket)
	}
	return v
}

// keys lists the objects under s3://bucket/prefix.
func keys(t *testing.T, bucket, prefix string) []string {
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
			v.Kill() // after rank 1's shard, before its blob
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
	v.Restart()
	for _, k := range keys(t, "ckpt", "job") {
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
	if why, ok := NoRestart(err); !ok || !strings.HasPrefix(why, "checkpoint storage at s3://ckpt/job refuses the credentials (") {
		t.Errorf("NoRestart: %q, %v", why, ok)
	}
	if _, err := Scan("s3://ckpt/job"); err == nil || !strings.Contains(err.Error(), "refused the credentials") {
		t.Errorf("Scan: %v", err)
	}
	t.Setenv("AWS_SECRET_ACCESS_KEY", s3test.SecretKey)
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
	if why, ok := NoRestart(err); !ok || why != `checkpoint storage at s3://no-such-bucket/job has no bucket "no-such-bucket"` {
		t.Errorf("NoRestart: %q, %v", why, ok)
	}
}

func TestS3RetentionDeletesManifestFirst(t *testing.T) {
	startVersity(t, "ckpt")
	loc := "s3://ckpt/job"
	comms := newJob(t, 2)
	for step := int64(1); step <= 4; step++ {
		mustAll(t, save(t, comms, loc, step, float32(step)))
	}
	got := map[string]bool{}
	for _, k := range keys(t, "ckpt", "job") {
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
	if err := storeCheck(context.Background(), DirStore(dir), &Entry{Step: 3}, nil); err != nil {
		t.Fatal(err)
	}
	if err := storeDeleteStep(context.Background(), DirStore(dir), 3, nil, false); err != nil {
		t.Fatal(err)
	}
	if entries, _ := listSteps(dir); len(entries) != 0 {
		t.Fatalf("left %+v", entries)
	}
}

// withMultipart lowers the multipart threshold and part size for a test.
func withMultipart(t *testing.T, threshold, partSize int64) {
	oldT, oldP := s3MultipartThreshold, s3PartSize
	s3MultipartThreshold, s3PartSize = threshold, partSize
	t.Cleanup(func() { s3MultipartThreshold, s3PartSize = oldT, oldP })
}

// watchParts makes s's client call before as each UploadPart starts and
// after as it ends (after the SDK's retries), with its part number.
func watchParts(s *s3Store, before func(part int32), after func(part int32, err error)) {
	s.client = s3.New(s.client.Options(), func(o *s3.Options) {
		o.APIOptions = append(o.APIOptions, func(st *middleware.Stack) error {
			return st.Initialize.Add(middleware.InitializeMiddlewareFunc("watchParts",
				func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
					p, ok := in.Parameters.(*s3.UploadPartInput)
					if ok && before != nil {
						before(aws.ToInt32(p.PartNumber))
					}
					out, md, err := next.HandleInitialize(ctx, in)
					if ok && after != nil {
						after(aws.ToInt32(p.PartNumber), err)
					}
					return out, md, err
				}), middleware.After)
		})
	})
}

// randomChunks returns chunks of random bytes of the given sizes.
func randomChunks(seed uint64, sizes ...int) [][]byte {
	rng := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)})
	var out [][]byte
	for _, n := range sizes {
		b := make([]byte, n)
		rng.Read(b)
		out = append(out, b)
	}
	return out
}

func getAll(t *testing.T, s *s3Store, key string) []byte {
	t.Helper()
	rc, size, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(b)) != size {
		t.Fatalf("Get %s: read %d bytes, size %d", key, len(b), size)
	}
	return b
}

// multipartUploads lists the multipart uploads in progress in bucket.
func multipartUploads(t *testing.T, v *s3test.Server, bucket string) []types.MultipartUpload {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := v.Client().ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String(bucket)})
	if err != nil {
		t.Fatal(err)
	}
	return out.Uploads
}

// An object above the threshold is uploaded in parts, several at a time,
// read from chunks whose boundaries fall inside parts, and reads back
// identical; an object below it is one PutObject and replaces it.
func TestS3MultipartRoundTrip(t *testing.T) {
	v := startVersity(t, "ckpt")
	withMultipart(t, 5<<20, 5<<20)
	s, err := openS3(context.Background(), "s3://ckpt/job")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var started []int32
	inFlight, maxInFlight := 0, 0
	watchParts(s, func(p int32) {
		mu.Lock()
		started = append(started, p)
		inFlight++
		maxInFlight = max(maxInFlight, inFlight)
		mu.Unlock()
	}, func(int32, error) {
		mu.Lock()
		inFlight--
		mu.Unlock()
	})

	// 23 MiB + 9 bytes: 5 parts, the chunk boundaries inside parts 2 and 4.
	chunks := randomChunks(1, 7<<20+3, 9<<20+11, 7<<20-5)
	want := bytes.Join(chunks, nil)
	key := stepKey(1) + "/" + shardName(0, 1)
	start := time.Now()
	if err := s.Put(context.Background(), key, chunks...); err != nil {
		t.Fatal(err)
	}
	t.Logf("multipart Put of %d bytes: %v, parts started %v, at most %d in flight", len(want), time.Since(start), started, maxInFlight)
	if len(started) != 5 {
		t.Errorf("%d UploadPart calls, want 5", len(started))
	}
	if maxInFlight > s3PartsInFlight || maxInFlight < 2 {
		t.Errorf("at most %d parts in flight, want 2 to %d", maxInFlight, s3PartsInFlight)
	}
	if got := getAll(t, s, key); !bytes.Equal(got, want) {
		t.Fatalf("Get returned %d bytes that differ from the %d put", len(got), len(want))
	}
	head, err := v.Client().HeadObject(context.Background(), &s3.HeadObjectInput{Bucket: aws.String("ckpt"), Key: aws.String("job/" + key)})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ETag of the multipart object: %s", aws.ToString(head.ETag))
	if ups := multipartUploads(t, v, "ckpt"); len(ups) != 0 {
		t.Errorf("uploads left in progress after a successful Put: %d", len(ups))
	}

	small := randomChunks(2, 1<<20, 3, 2<<20)
	started = nil
	if err := s.Put(context.Background(), key, small...); err != nil {
		t.Fatal(err)
	}
	if len(started) != 0 {
		t.Errorf("%d UploadPart calls for an object below the threshold", len(started))
	}
	if got := getAll(t, s, key); !bytes.Equal(got, bytes.Join(small, nil)) {
		t.Fatalf("Get after a single PutObject returned %d bytes that differ", len(got))
	}
}

var partRE = regexp.MustCompile(`part \d+ of 7 `)

// A save cancelled in the middle of a multipart upload aborts it: the error
// names the key, the part and the cause, and the server keeps neither the
// object nor the upload's parts. (The parts in flight at the cancel are let
// finish before the abort: else versitygw may store one after the abort, in
// a directory that ListMultipartUploads does not show.)
func TestS3MultipartCancelAborts(t *testing.T) {
	v := startVersity(t, "ckpt")
	withMultipart(t, 5<<20, 5<<20)
	s, err := openS3(context.Background(), "s3://ckpt/job")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var once sync.Once
	watchParts(s, nil, func(_ int32, err error) {
		if err == nil {
			once.Do(cancel) // once the first part is acknowledged
		}
	})
	key := stepKey(1) + "/" + shardName(0, 1)
	err = s.Put(ctx, key, randomChunks(3, 31<<20)...) // 7 parts
	if err == nil {
		t.Fatal("Put succeeded although its context was cancelled")
	}
	t.Log(err)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error does not wrap context.Canceled: %v", err)
	}
	for _, want := range []string{"s3://ckpt/job/" + key + ": writing part ", v.Endpoint()} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if !partRE.MatchString(err.Error()) {
		t.Errorf("error does not name the part: %v", err)
	}
	if strings.Contains(err.Error(), "abort") || strings.HasPrefix(err.Error(), "checkpoint: ") {
		t.Errorf("unexpected error wording: %v", err)
	}
	if ups := multipartUploads(t, v, "ckpt"); len(ups) != 0 {
		t.Errorf("the cancelled upload was not aborted: %d uploads in progress, first %s", len(ups), aws.ToString(ups[0].UploadId))
	}
	if _, _, err := s.Get(context.Background(), key); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Get of the object of a cancelled upload: %v, want not found", err)
	}
	// versitygw keeps the parts of an upload in progress in files of its
	// POSIX back end: the abort removed them.
	filepath.WalkDir(filepath.Join(v.Root(), "data"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			t.Errorf("the aborted upload left %s", p)
		}
		return nil
	})
}

// The server is killed by its PID once the first part is acknowledged: Put
// fails with an error that names the key, the part and the cause. The abort
// cannot reach the dead server either, so the error says so, and what
// aborts the upload left in progress once the server is back.
// (That an abort does remove an upload is TestS3MultipartCancelAborts.)
func TestS3MultipartServerKilled(t *testing.T) {
	v := startVersity(t, "ckpt")
	withMultipart(t, 5<<20, 5<<20)
	s, err := openS3(context.Background(), "s3://ckpt/job")
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	watchParts(s, nil, func(_ int32, err error) {
		if err == nil {
			once.Do(v.Kill)
		}
	})
	key := stepKey(2) + "/" + shardName(0, 1)
	data := randomChunks(4, 11<<20, 20<<20) // 7 parts
	start := time.Now()
	err = s.Put(context.Background(), key, data...)
	if err == nil {
		t.Fatal("Put succeeded although the server was killed")
	}
	t.Logf("Put failed after %v: %v", time.Since(start), err)
	for _, want := range []string{"s3://ckpt/job/" + key + ": writing part ", v.Endpoint(), "aborting the multipart upload also failed"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if !partRE.MatchString(err.Error()) {
		t.Errorf("error does not name the part: %v", err)
	}

	v.Restart()
	ups := multipartUploads(t, v, "ckpt")
	if len(ups) != 1 || aws.ToString(ups[0].Key) != "job/"+key {
		t.Fatalf("uploads in progress after the restart: %d, want the one of the key the error names", len(ups))
	}
	if _, _, err := s.Get(context.Background(), key); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Get of the object of a failed upload: %v, want not found", err)
	}
	// The leftover upload can be aborted, and the next Put succeeds.
	if _, err := v.Client().AbortMultipartUpload(context.Background(), &s3.AbortMultipartUploadInput{
		Bucket: aws.String("ckpt"), Key: ups[0].Key, UploadId: ups[0].UploadId,
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(context.Background(), key, data...); err != nil {
		t.Fatal(err)
	}
	if got := getAll(t, s, key); !bytes.Equal(got, bytes.Join(data, nil)) {
		t.Fatal("Get after the server came back returned different bytes")
	}
	if ups := multipartUploads(t, v, "ckpt"); len(ups) != 0 {
		t.Errorf("uploads in progress at the end: %d", len(ups))
	}
}

// chunkReader reads and seeks in a range of the concatenation of chunks.
func TestS3ChunkReader(t *testing.T) {
	chunks := randomChunks(5, 7, 0, 1, 13, 0, 5)
	all := bytes.Join(chunks, nil)
	for lo := 0; lo <= len(all); lo++ {
		for hi := lo; hi <= len(all); hi++ {
			r := newChunkReader(chunks, int64(lo), int64(hi))
			if r.Len() != hi-lo {
				t.Fatalf("[%d,%d): Len %d", lo, hi, r.Len())
			}
			if err := iotest.TestReader(r, all[lo:hi]); err != nil {
				t.Fatalf("[%d,%d): %v", lo, hi, err)
			}
		}
	}
}

func TestS3PartLayout(t *testing.T) {
	for _, c := range []struct {
		size, part int64
		n          int
	}{
		{64<<20 + 1, 16 << 20, 5},
		{64 << 20, 16 << 20, 4},
		{10000 * 16 << 20, 16 << 20, 10000},
		{10000*16<<20 + 1, 17 << 20, 9412},
		{1 << 40, 105 << 20, 9987},
	} {
		if part, n := s3PartLayout(c.size); part != c.part || n != c.n || int64(n)*part < c.size || n > s3MaxParts {
			t.Errorf("s3PartLayout(%d) = %d, %d, want %d, %d", c.size, part, n, c.part, c.n)
		}
	}
}

// hookMultipart makes s's client call complete at each
// CompleteMultipartUpload and abort at each AbortMultipartUpload (each
// call, with the SDK's retries inside), and attempt at each attempt of a
// CompleteMultipartUpload, as the request is sent.
func hookMultipart(s *s3Store,
	complete func(in *s3.CompleteMultipartUploadInput, call func() error) error,
	abort func(call func() error) error,
	attempt func(send func() error) error,
) {
	type completing struct{}
	s.client = s3.New(s.client.Options(), func(o *s3.Options) {
		o.APIOptions = append(o.APIOptions, func(st *middleware.Stack) error {
			err := st.Initialize.Add(middleware.InitializeMiddlewareFunc("hookMultipart",
				func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (out middleware.InitializeOutput, md middleware.Metadata, err error) {
					call := func() error {
						out, md, err = next.HandleInitialize(ctx, in)
						return err
					}
					switch p := in.Parameters.(type) {
					case *s3.CompleteMultipartUploadInput:
						ctx = context.WithValue(ctx, completing{}, true)
						if complete != nil {
							return out, md, complete(p, call)
						}
					case *s3.AbortMultipartUploadInput:
						if abort != nil {
							return out, md, abort(call)
						}
					}
					call()
					return out, md, err
				}), middleware.After)
			if err != nil || attempt == nil {
				return err
			}
			// Last in the Finalize step: after the retryer and the signer.
			return st.Finalize.Add(middleware.FinalizeMiddlewareFunc("hookMultipartAttempt",
				func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (out middleware.FinalizeOutput, md middleware.Metadata, err error) {
					if ctx.Value(completing{}) == nil {
						return next.HandleFinalize(ctx, in)
					}
					err = attempt(func() error {
						out, md, err = next.HandleFinalize(ctx, in)
						return err
					})
					return out, md, err
				}), middleware.After)
		})
	})
}

func errorCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return fmt.Sprint(err)
}

// The server completes the upload but the response is lost (the connection
// resets as it comes), and the SDK retries CompleteMultipartUpload. Some
// servers answer the retry with NoSuchUpload, the upload being gone
// (versitygw completes it again: the retries are answered as those servers
// do); or every response is lost. Put finds the object, whole, and
// succeeds.
func TestS3MultipartCompleteResponseLost(t *testing.T) {
	v := startVersity(t, "ckpt")
	withMultipart(t, 5<<20, 5<<20)
	reset := &smithyhttp.RequestSendError{Err: &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}}
	data := randomChunks(6, 13<<20, 18<<20) // 7 parts
	for i, mode := range []string{"retry gets NoSuchUpload", "every response lost"} {
		t.Run(strings.ReplaceAll(mode, " ", "_"), func(t *testing.T) {
			s, err := openS3(context.Background(), "s3://ckpt/job")
			if err != nil {
				t.Fatal(err)
			}
			var (
				mu       sync.Mutex
				attempts []string // what each attempt of CompleteMultipartUpload got
				final    error    // what the call got, after the SDK's retries
				aborts   int
			)
			hookMultipart(s, func(_ *s3.CompleteMultipartUploadInput, call func() error) error {
				err := call()
				mu.Lock()
				final = err
				mu.Unlock()
				return err
			}, func(call func() error) error {
				mu.Lock()
				aborts++
				mu.Unlock()
				return call()
			}, func(send func() error) error {
				mu.Lock()
				defer mu.Unlock()
				if len(attempts) > 0 && mode == "retry gets NoSuchUpload" {
					attempts = append(attempts, "NoSuchUpload")
					return &types.NoSuchUpload{Message: aws.String("The specified multipart upload does not exist.")}
				}
				err := send()
				if err != nil {
					attempts = append(attempts, errorCode(err))
					return err
				}
				attempts = append(attempts, "completed, response lost")
				return reset
			})
			key := stepKey(int64(i+1)) + "/" + shardName(0, 1)
			if err := s.Put(context.Background(), key, data...); err != nil {
				t.Fatalf("Put: %v (attempts of CompleteMultipartUpload: %q)", err, attempts)
			}
			t.Logf("attempts of CompleteMultipartUpload: %q; the call returned %v", attempts, final)
			if len(attempts) < 2 || final == nil {
				t.Fatalf("CompleteMultipartUpload was not retried, or did not fail: attempts %q, error %v", attempts, final)
			}
			if aborts != 0 {
				t.Errorf("%d AbortMultipartUpload calls after a completed upload", aborts)
			}
			if got, want := getAll(t, s, key), bytes.Join(data, nil); !bytes.Equal(got, want) {
				t.Fatalf("Get returned %d bytes that differ from the %d put", len(got), len(want))
			}
			if ups := multipartUploads(t, v, "ckpt"); len(ups) != 0 {
				t.Errorf("uploads left in progress: %d", len(ups))
			}
		})
	}

	// An object of another size, part count or checksum at the key is not
	// taken for the upload's, nor is a missing one.
	s, err := openS3(context.Background(), "s3://ckpt/job")
	if err != nil {
		t.Fatal(err)
	}
	key := stepKey(1) + "/" + shardName(0, 1)
	head, err := v.Client().HeadObject(context.Background(), &s3.HeadObjectInput{
		Bucket: aws.String("ckpt"), Key: aws.String("job/" + key), ChecksumMode: types.ChecksumModeEnabled,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the object: ETag %s, CRC32 %s", aws.ToString(head.ETag), aws.ToString(head.ChecksumCRC32))
	partSums := func(data [][]byte) []types.CompletedPart { // of 5 MiB parts
		all := bytes.Join(data, nil)
		var parts []types.CompletedPart
		for lo := 0; lo < len(all); lo += 5 << 20 {
			c := crc32.ChecksumIEEE(all[lo:min(lo+5<<20, len(all))])
			parts = append(parts, types.CompletedPart{ChecksumCRC32: aws.String(base64.StdEncoding.EncodeToString(binary.BigEndian.AppendUint32(nil, c)))})
		}
		return parts
	}
	parts := partSums(data)
	ctx := context.Background()
	if !s.completed(ctx, key, 31<<20, parts, data) {
		t.Error("completed: the upload's object not recognized")
	}
	other := randomChunks(8, 31<<20)
	if aws.ToString(head.ChecksumCRC32) != "" && s.completed(ctx, key, 31<<20, partSums(other), other) {
		t.Error("completed: an object of other bytes taken for the upload's")
	}
	if s.completed(ctx, key, 31<<20+1, parts, data) {
		t.Error("completed: an object of another size taken for the upload's")
	}
	if s.completed(ctx, key, 31<<20, make([]types.CompletedPart, 6), data) {
		t.Error("completed: an object of 7 parts taken for an upload of 6")
	}
	if s.completed(ctx, stepKey(3)+"/"+shardName(0, 1), 31<<20, parts, data) {
		t.Error("completed: a missing object taken for the upload's")
	}
}

// The upload is gone when CompleteMultipartUpload comes (another client, or
// a lifecycle rule, aborted it): Complete fails with NoSuchUpload, and so
// does the abort, which is no reason to warn that parts may stay.
func TestS3MultipartAbortNoSuchUpload(t *testing.T) {
	v := startVersity(t, "ckpt")
	withMultipart(t, 5<<20, 5<<20)
	s, err := openS3(context.Background(), "s3://ckpt/job")
	if err != nil {
		t.Fatal(err)
	}
	var abortErr error
	hookMultipart(s, func(in *s3.CompleteMultipartUploadInput, call func() error) error {
		if _, err := v.Client().AbortMultipartUpload(context.Background(), &s3.AbortMultipartUploadInput{
			Bucket: in.Bucket, Key: in.Key, UploadId: in.UploadId,
		}); err != nil {
			t.Errorf("aborting the upload from another client: %v", err)
		}
		return call()
	}, func(call func() error) error {
		abortErr = call()
		return abortErr
	}, nil)
	key := stepKey(1) + "/" + shardName(0, 1)
	err = s.Put(context.Background(), key, randomChunks(7, 31<<20)...) // 7 parts
	if err == nil {
		t.Fatal("Put succeeded although its upload was aborted")
	}
	t.Logf("Put: %v; its abort: %v", err, abortErr)
	if errorCode(abortErr) != "NoSuchUpload" {
		t.Fatalf("the abort of an aborted upload returned %v, want NoSuchUpload", abortErr)
	}
	for _, want := range []string{"s3://ckpt/job/" + key + ": completing a multipart upload of 7 parts: NoSuchUpload", "(" + v.Endpoint() + ")"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if strings.Contains(err.Error(), "aborting the multipart upload") || strings.Contains(err.Error(), "may stay") || strings.HasPrefix(err.Error(), "checkpoint: ") {
		t.Errorf("unexpected error wording: %v", err)
	}
	if _, _, err := s.Get(context.Background(), key); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Get of the object of an aborted upload: %v, want not found", err)
	}
}

// List's errors name the location and the prefix, without the package's
// "checkpoint: ", which the callers that return them as they are add.
func TestS3ListError(t *testing.T) {
	v := startVersity(t, "ckpt")
	s, err := openS3(context.Background(), "s3://ckpt/job")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = s.List(ctx, "step-")
	t.Log(err)
	if want := "s3://ckpt/job/step-: listing: cancelled (" + v.Endpoint() + ")"; err == nil || err.Error() != want || !errors.Is(err, context.Canceled) {
		t.Errorf("List with a cancelled context: %v, want an error that starts %q and wraps context.Canceled", err, want)
	}
}

// The CRC32 checksum S3 gives a multipart object: the composite one of its
// parts ("…-N"), or that of the whole object.
func TestS3CRC32Matches(t *testing.T) {
	data := randomChunks(9, 3, 10, 4)
	sum := func(b ...[]byte) string {
		return base64.StdEncoding.EncodeToString(binary.BigEndian.AppendUint32(nil, crc32.ChecksumIEEE(bytes.Join(b, nil))))
	}
	all := bytes.Join(data, nil)
	parts := []types.CompletedPart{{ChecksumCRC32: aws.String(sum(all[:8]))}, {ChecksumCRC32: aws.String(sum(all[8:]))}}
	raw := func(p types.CompletedPart) []byte {
		b, _ := base64.StdEncoding.DecodeString(aws.ToString(p.ChecksumCRC32))
		return b
	}
	composite := sum(raw(parts[0]), raw(parts[1]))
	for _, c := range []struct {
		sum   string
		parts []types.CompletedPart
		want  bool
	}{
		{composite + "-2", parts, true},
		{composite + "-3", parts, false},
		{sum(all[1:]) + "-2", parts, false},
		{composite + "-2", []types.CompletedPart{parts[0], {}}, true}, // cannot tell
		{sum(all), parts, true},
		{sum(all[1:]), parts, false},
	} {
		if got := s3CRC32Matches(c.sum, c.parts, data); got != c.want {
			t.Errorf("s3CRC32Matches(%q) = %v, want %v", c.sum, got, c.want)
		}
	}
}
