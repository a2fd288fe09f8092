package s3test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// The server serves objects, keeps them across Kill and Restart, refuses
// requests while killed, and the environment of Setenv reaches it through
// the standard AWS configuration.
func TestServerKillRestart(t *testing.T) {
	srv := Start(t)
	srv.MakeBucket("bkt")
	if st, err := os.Stat(filepath.Join(srv.Root(), "data", "bkt")); err != nil || !st.IsDir() {
		t.Fatalf("bucket directory in the POSIX back end: %v", err)
	}
	srv.Setenv(t)
	if got := os.Getenv("AWS_ENDPOINT_URL"); got != srv.Endpoint() || !strings.HasPrefix(got, "http://127.0.0.1:") {
		t.Fatalf("AWS_ENDPOINT_URL=%q, endpoint %q", got, srv.Endpoint())
	}
	env := strings.Join(srv.Env(), "\n")
	for _, want := range []string{"AWS_ACCESS_KEY_ID=", "AWS_SECRET_ACCESS_KEY=", "AWS_REGION=us-east-1", "AWS_ENDPOINT_URL=" + srv.Endpoint(), "AWS_S3_FORCE_PATH_STYLE=true"} {
		if !strings.Contains(env, want) {
			t.Errorf("Env lacks %s", want)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cl := s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = true })
	if _, err := cl.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("bkt"), Key: aws.String("k"), Body: strings.NewReader("hello")}); err != nil {
		t.Fatal(err)
	}

	srv.Kill()
	srv.Kill() // a no-op
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	_, err = srv.Client().ListBuckets(short, &s3.ListBucketsInput{}, func(o *s3.Options) { o.RetryMaxAttempts = 1 })
	cancelShort()
	if err == nil {
		t.Fatal("the killed server still answers")
	}

	srv.Restart()
	out, err := srv.Client().GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("bkt"), Key: aws.String("k")})
	if err != nil {
		t.Fatal(err)
	}
	defer out.Body.Close()
	if b, err := io.ReadAll(out.Body); err != nil || string(b) != "hello" {
		t.Fatalf("after Restart: %q, %v", b, err)
	}
}

// A stopped server (SIGSTOP) leaves requests unanswered until Cont.
func TestServerStopCont(t *testing.T) {
	srv := Start(t)
	srv.MakeBucket("bkt")
	srv.Stop()
	short, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	_, err := srv.Client().ListBuckets(short, &s3.ListBucketsInput{}, func(o *s3.Options) { o.RetryMaxAttempts = 1 })
	cancel()
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a stopped server answered: %v", err)
	}
	srv.Cont()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := srv.Client().ListBuckets(ctx, &s3.ListBucketsInput{}); err != nil {
		t.Fatalf("after Cont: %v", err)
	}
}

// The proxy passes signed requests to the server; Drop closes the
// connection of the requests of a method, Hang holds them until lifted,
// and Faulted tells of each.
func TestProxyFaults(t *testing.T) {
	srv := Start(t)
	srv.MakeBucket("bkt")
	p := srv.StartProxy()
	p.Setenv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cl := s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = true; o.RetryMaxAttempts = 1 })
	put := func() error {
		_, err := cl.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("bkt"), Key: aws.String("k"), Body: strings.NewReader("hello")})
		return err
	}
	del := func(ctx context.Context) error {
		_, err := cl.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("bkt"), Key: aws.String("k")})
		return err
	}
	if err := put(); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	p.Set("DELETE", Drop)
	if err := del(ctx); err == nil {
		t.Fatal("a dropped DELETE succeeded")
	}
	if f := <-p.Faulted(); f != "DELETE /bkt/k" {
		t.Errorf("Faulted: %q", f)
	}
	if err := put(); err != nil {
		t.Fatalf("a PUT while DELETEs are dropped: %v", err)
	}
	p.Set("DELETE", Hang)
	done := make(chan error, 1)
	go func() { done <- del(ctx) }()
	<-p.Faulted() // held
	p.Set("DELETE", Pass)
	if err := <-done; err != nil {
		t.Fatalf("a held DELETE, once lifted: %v", err)
	}
	if _, err := srv.Client().HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("bkt"), Key: aws.String("k")}); err == nil {
		t.Fatal("the object is still there after the lifted DELETE")
	}
}
