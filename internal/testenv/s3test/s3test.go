// Package s3test runs a real S3 server for tests: versitygw on loopback,
// with a POSIX back end in a temporary directory.
//
// A test starts one with Start, points the code under test at it with
// Setenv (this process) or Env (a child process), and creates its buckets
// with MakeBucket:
//
//	srv := s3test.Start(t)
//	srv.Setenv(t)
//	srv.MakeBucket("ckpt")
//	// s3://ckpt/job now works for the standard AWS configuration.
//
// Kill stops the server by its PID (SIGKILL) to simulate a crash (requests
// are refused); Stop freezes it (SIGSTOP: requests hang, as with a server
// that stopped answering) until Cont; Restart brings it back on the same
// address with the same data. A Proxy in front of it (proxy.go) makes
// only some requests fail or hang. The server is stopped when the test
// ends.
//
// Start skips the test when versitygw is not installed (go install
// github.com/versity/versitygw/cmd/versitygw@v1.8.0), or fails it when the
// environment has CI=true.
package s3test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/gorun/gorun/internal/testenv/tool"
)

// The credentials and region the server accepts.
const (
	AccessKey = "gorunaccess"
	SecretKey = "gorunsecret0123456789"
	Region    = "us-east-1"
)

// readyTimeout bounds the wait for a started server to answer.
const readyTimeout = 20 * time.Second

// Server is a versitygw process. Its methods may be called from any
// goroutine, except Restart and MakeBucket, which may fail the test and so
// belong to the test's goroutine.
type Server struct {
	t        testing.TB
	bin      string
	root     string
	addr     string
	endpoint string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan error // receives cmd.Wait's result once
}

// Bin finds versitygw in $(go env GOPATH)/bin, ~/go/bin or PATH; it returns
// "" when it is not installed.
func Bin() string { return tool.Find("versitygw", true) }

// Start runs versitygw on a free loopback port and waits until it answers
// a signed request. It skips the test if versitygw is not installed, unless
// CI=true, where it fails it.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := tool.Require(t, Bin(), "versitygw not found in $(go env GOPATH)/bin or PATH: install it with `go install github.com/versity/versitygw/cmd/versitygw@v1.8.0` (.ci/run does)")
	s := &Server{t: t, bin: bin, root: t.TempDir()}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = l.Addr().String()
	l.Close()
	s.endpoint = "http://" + s.addr
	t.Cleanup(s.Kill)
	s.start()
	return s
}

// Endpoint is the server's URL, http://127.0.0.1:port.
func (s *Server) Endpoint() string { return s.endpoint }

// Root is the server's temporary directory; Root()/data is the POSIX back
// end (a directory per bucket), Root()/versitygw.log its output.
func (s *Server) Root() string { return s.root }

// Env is the environment that points the standard AWS configuration at the
// server: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION,
// AWS_ENDPOINT_URL and AWS_S3_FORCE_PATH_STYLE=true, and variables that
// keep out the user's own AWS configuration (profile, shared files, session
// token, instance metadata). Append it to os.Environ() for a child process:
// the later value of a variable wins.
func (s *Server) Env() []string { return s.envFor(s.endpoint) }

// envFor is Env with the endpoint of the server or of a Proxy.
func (s *Server) envFor(endpoint string) []string {
	return []string{
		"AWS_ACCESS_KEY_ID=" + AccessKey,
		"AWS_SECRET_ACCESS_KEY=" + SecretKey,
		"AWS_REGION=" + Region,
		"AWS_ENDPOINT_URL=" + endpoint,
		"AWS_S3_FORCE_PATH_STYLE=true",
		"AWS_SESSION_TOKEN=",
		"AWS_PROFILE=",
		"AWS_ENDPOINT_URL_S3=",
		"AWS_CONFIG_FILE=" + filepath.Join(s.root, "no-config"),
		"AWS_SHARED_CREDENTIALS_FILE=" + filepath.Join(s.root, "no-credentials"),
		"AWS_EC2_METADATA_DISABLED=true",
	}
}

// Setenv sets Env in this process for the rest of t (t.Setenv, so t must
// not be parallel).
func (s *Server) Setenv(t testing.TB) {
	t.Helper()
	setenv(t, s.Env())
}

func setenv(t testing.TB, env []string) {
	t.Helper()
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
}

// Client is an S3 client of the server that does not depend on the
// environment.
func (s *Server) Client() *s3.Client {
	return s3.New(s3.Options{
		Region: Region, BaseEndpoint: aws.String(s.endpoint), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
	})
}

// MakeBucket creates a bucket, or fails the test.
func (s *Server) MakeBucket(name string) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if _, err := s.Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		s.t.Fatalf("s3test: creating bucket %s on %s: %v", name, s.endpoint, err)
	}
}

// Kill stops the server by its PID (SIGKILL) and waits for it to exit. It
// does nothing if the server is not running.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	select { // cmd.Wait runs in start's goroutine
	case <-s.exited:
	case <-time.After(10 * time.Second):
		s.t.Errorf("s3test: versitygw (pid %d) did not exit after SIGKILL", s.cmd.Process.Pid)
	}
	s.cmd = nil
}

// Stop freezes the server (SIGSTOP): its port still accepts connections,
// but no request is answered until Cont, as with a server that hangs. It
// returns once the process is stopped (the signal is delivered
// asynchronously, and a request could slip through meanwhile).
func (s *Server) Stop() {
	s.signal(syscall.SIGSTOP)
	s.mu.Lock()
	pid := s.cmd.Process.Pid
	s.mu.Unlock()
	stat := fmt.Sprintf("/proc/%d/stat", pid)
	deadline := time.Now().Add(readyTimeout)
	for {
		b, err := os.ReadFile(stat)
		// The state follows the command name in parentheses: "pid (comm) T ...".
		if i := bytes.LastIndexByte(b, ')'); err == nil && i >= 0 && i+2 < len(b) && (b[i+2] == 'T' || b[i+2] == 't') {
			return
		}
		if err != nil || time.Now().After(deadline) {
			s.t.Errorf("s3test: versitygw (pid %d) not seen stopped after SIGSTOP: %v", pid, err)
			return
		}
		time.Sleep(time.Millisecond) // poll the process state
	}
}

// Cont resumes the server that Stop froze (SIGCONT).
func (s *Server) Cont() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.t.Errorf("s3test: %v to versitygw, which is not running", sig)
		return
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Errorf("s3test: %v to versitygw (pid %d): %v", sig, s.cmd.Process.Pid, err)
	}
}

// Restart stops the server if it runs, starts it again on the same address
// with the same data, and waits until it answers.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	s.start()
}

// start runs versitygw and waits until it answers a signed ListBuckets.
func (s *Server) start() {
	t := s.t
	t.Helper()
	data := filepath.Join(s.root, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	logName := filepath.Join(s.root, "versitygw.log")
	logf, err := os.OpenFile(logName, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(s.bin, "--access", AccessKey, "--secret", SecretKey, "--port", s.addr, "posix", data)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("s3test: starting %s: %v", s.bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()

	deadline := time.Now().Add(readyTimeout)
	cl := s.Client()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cl.ListBuckets(ctx, &s3.ListBucketsInput{})
		cancel()
		if err == nil {
			return
		}
		select {
		case werr := <-exited:
			exited <- werr // for Kill
			log, _ := os.ReadFile(logName)
			t.Fatalf("s3test: versitygw exited before it was ready (%v):\n%s", werr, log)
		case <-time.After(50 * time.Millisecond): // poll again
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logName)
			t.Fatalf("s3test: versitygw at %s not ready after %v: %v\n%s", s.addr, readyTimeout, err, log)
		}
	}
}
