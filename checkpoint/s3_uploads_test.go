package checkpoint

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/gorun/gorun/internal/testenv/s3test"
)

// startUpload starts a multipart upload of key in bucket with one part of
// size bytes, and leaves it: what a rank that died in the middle of a big
// object leaves.
func startUpload(t *testing.T, v *s3test.Server, bucket, key string, size int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	up, err := v.Client().CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Client().UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String(bucket), Key: aws.String(key), UploadId: up.UploadId,
		PartNumber: aws.Int32(1), Body: strings.NewReader(strings.Repeat("x", size)), ContentLength: aws.Int64(int64(size))}); err != nil {
		t.Fatal(err)
	}
	return aws.ToString(up.UploadId)
}

// uploadKeys are the keys of the multipart uploads in progress in bucket.
func uploadKeys(t *testing.T, v *s3test.Server, bucket string) []string {
	var keys []string
	for _, u := range multipartUploads(t, v, bucket) {
		keys = append(keys, aws.ToString(u.Key))
	}
	slices.Sort(keys)
	return keys
}

// The server dies in the middle of a multipart upload of a save: the
// upload stays on the server once it is back (its abort could not reach
// it). List and Scan show it with its step, which has nothing else; the
// next save of the same step commits, and its retention aborts the upload.
func TestS3UploadLeftByCutSaveIsListedAndAborted(t *testing.T) {
	v := startVersity(t, "ckpt")
	withMultipart(t, 5<<20, 5<<20)
	loc := "s3://ckpt/cut"
	comms := newJob(t, 1)
	w := make([]float32, 3<<20) // 12 MiB: 3 parts
	st := new(State).Tensor("w", w)
	m, err := New(comms[0], loc)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	watchParts(m.store.(*s3Store), nil, func(_ int32, err error) {
		if err == nil {
			once.Do(v.Kill) // once the first part is stored
		}
	})
	ctx := context.Background()
	err = m.Save(ctx, 1, st)
	t.Logf("the save cut off: %v", err)
	if err == nil {
		t.Fatal("the save succeeded with the server killed")
	}
	v.Restart()
	if keys := uploadKeys(t, v, "ckpt"); len(keys) != 1 || keys[0] != "cut/"+stepKey(1)+"/"+shardName(0, 1) {
		t.Fatalf("uploads after the cut save: %v, want the shard's", keys)
	}
	entries, err := List(ctx, loc)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Step != 1 || entries[0].Committed || len(entries[0].Uploads) != 1 {
		t.Fatalf("List: %+v", entries)
	}
	u := entries[0].Uploads[0]
	if u.Key != stepKey(1)+"/"+shardName(0, 1) || u.Parts < 1 || u.Bytes < 2<<20 || time.Since(u.Started) > time.Minute {
		t.Errorf("the incomplete upload: %+v", u)
	}
	r, err := Scan(loc)
	if err != nil || len(r.Entries) != 1 || len(r.Entries[0].Uploads) != 1 || r.Pick != -1 {
		t.Fatalf("Scan: %+v %v", r, err)
	}
	// A new Manager (the job restarted) saves the step again.
	m, err = New(comms[0], loc)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Save(ctx, 1, st); err != nil {
		t.Fatal(err)
	}
	if err := m.Wait(ctx); err != nil { // retention
		t.Fatal(err)
	}
	if keys := uploadKeys(t, v, "ckpt"); len(keys) != 0 {
		t.Fatalf("uploads after the save that followed: %v", keys)
	}
}

// Incomplete uploads of a step the save keeps (here the saved one) and of
// older steps are aborted by its retention, whatever their age; those of
// later steps once older than WithStaleUploadAge. Remove aborts a step's,
// and a step with nothing but uploads is there for it. An upload under the
// location that is no step's is left alone.
func TestS3IncompleteUploadsAbortedByRemoveAndRetention(t *testing.T) {
	v := startVersity(t, "ckpt")
	loc := "s3://ckpt/job"
	comms := newJob(t, 2)
	mustAll(t, save(t, comms, loc, 1, 1))
	mustAll(t, save(t, comms, loc, 2, 2))
	key := func(step int64, r int) string { return "job/" + stepKey(step) + "/" + shardName(r, 2) }
	startUpload(t, v, "ckpt", key(2, 0), 1<<20)
	startUpload(t, v, "ckpt", key(3, 1), 1<<20)
	startUpload(t, v, "ckpt", key(7, 0), 1<<20)
	startUpload(t, v, "ckpt", key(9, 1), 1<<20)
	const notOurs = "job/notes/big.bin" // under the location, but no step's
	startUpload(t, v, "ckpt", notOurs, 1<<20)
	entries, err := List(context.Background(), loc)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, fmt.Sprintf("%d:%v:%d", e.Step, e.Committed, len(e.Uploads)))
	}
	if want := "9:false:1 7:false:1 3:false:1 2:true:1 1:true:0"; strings.Join(got, " ") != want {
		t.Fatalf("List: %s, want %s", strings.Join(got, " "), want)
	}
	if err := Remove(context.Background(), loc, 9); err != nil {
		t.Fatal(err)
	}
	if keys := uploadKeys(t, v, "ckpt"); slices.Contains(keys, key(9, 1)) || len(keys) != 4 {
		t.Fatalf("uploads after Remove of step 9: %v", keys)
	}
	// The save of step 3 keeps steps 3 and 2: their uploads go; step 7's
	// is younger than an hour.
	mustAll(t, save(t, comms, loc, 3, 3))
	if keys := uploadKeys(t, v, "ckpt"); !slices.Equal(keys, []string{notOurs, key(7, 0)}) {
		t.Fatalf("uploads after the save of step 3: %v, want only step 7's and %s", keys, notOurs)
	}
	mustAll(t, save(t, comms, loc, 4, 4, WithStaleUploadAge(time.Nanosecond)))
	if keys := uploadKeys(t, v, "ckpt"); !slices.Equal(keys, []string{notOurs}) {
		t.Fatalf("uploads after a save with WithStaleUploadAge(1ns): %v, want only %s", keys, notOurs)
	}
	restore(t, comms, loc, 4, 4)
}
