// Package etcdtest runs a real etcd cluster for tests: three members on
// loopback, each an etcd process with its data in a temporary directory.
//
// A test starts one with Start, points the code under test at Endpoints,
// and makes faults with KillLeader (kill -9 of the member that leads the
// cluster's raft) and Restart. Every process is killed when the test ends.
//
// The etcd binary comes from PATH (Debian's etcd-server package, which
// .ci/run installs) or $(go env GOPATH)/bin (a released etcd built with
// go install); without it the tests skip, unless CI=true.
package etcdtest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
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

	"github.com/gorun/gorun/internal/testenv/tool"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Members is how many members a Cluster has: the smallest cluster that
// keeps a majority when one member is lost.
const Members = 3

// healthyWithin bounds the wait for a cluster (or a restarted member) to
// elect a leader and answer.
const healthyWithin = 30 * time.Second

// Cluster is a running etcd cluster of Members members.
type Cluster struct {
	t       testing.TB
	bin     string
	root    string
	members []*member
	client  *clientv3.Client // for the harness' own status queries
	tls     *TLSFiles        // StartTLS's client files; nil: plain TCP
}

type member struct {
	name       string
	dir        string
	clientAddr string
	peerAddr   string
	args       []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd.Wait returned
}

// Bin finds etcd in PATH or $(go env GOPATH)/bin; it returns "" when it is
// not installed.
func Bin() string { return tool.Find("etcd", false) }

// Start runs a cluster of Members members on free loopback ports and waits
// (at most 30 s) until it has a leader and every member answers. It skips
// the test if etcd is not installed, unless CI=true, where it fails it.
func Start(t testing.TB) *Cluster { return start(t, false) }

// StartTLS runs a cluster as Start does, that serves its clients over TLS
// only and checks their certificates (--client-cert-auth), with a CA, a
// certificate for its members and one for its clients made for the test
// (TLS says where they are).
func StartTLS(t testing.TB) *Cluster { return start(t, true) }

// TLSFiles are the PEM files a client of a StartTLS cluster needs.
type TLSFiles struct{ CACert, Cert, Key string }

// TLS is how a client reaches a StartTLS cluster (nil for Start's).
func (c *Cluster) TLS() *TLSFiles { return c.tls }

func start(t testing.TB, secure bool) *Cluster {
	t.Helper()
	bin := tool.Require(t, Bin(), "etcd not found in PATH or $(go env GOPATH)/bin: install Debian's etcd-server (`apt-get install etcd-server`; .ci/run does) or `go install go.etcd.io/etcd/server/v3@v3.7.3`")
	c := &Cluster{t: t, bin: bin, root: t.TempDir()}
	scheme := "http://"
	var serverArgs []string
	if secure {
		files, err := writeCerts(c.root)
		if err != nil {
			t.Fatal(err)
		}
		c.tls = &TLSFiles{CACert: files.ca, Cert: files.client, Key: files.clientKey}
		scheme = "https://"
		serverArgs = []string{"--cert-file", files.server, "--key-file", files.serverKey, "--client-cert-auth", "--trusted-ca-file", files.ca}
	}
	var initial []string
	for i := range Members {
		m := &member{name: fmt.Sprintf("m%d", i), dir: filepath.Join(c.root, fmt.Sprintf("m%d", i)),
			clientAddr: freeAddr(t), peerAddr: freeAddr(t)}
		c.members = append(c.members, m)
		initial = append(initial, m.name+"=http://"+m.peerAddr)
	}
	for _, m := range c.members {
		m.args = []string{"--name", m.name, "--data-dir", filepath.Join(m.dir, "data"),
			"--listen-client-urls", scheme + m.clientAddr, "--advertise-client-urls", scheme + m.clientAddr,
			"--listen-peer-urls", "http://" + m.peerAddr, "--initial-advertise-peer-urls", "http://" + m.peerAddr,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "etcdtest-" + filepath.Base(c.root),
			"--logger", "zap", "--log-outputs", filepath.Join(m.dir, "etcd.log")}
		m.args = append(m.args, serverArgs...)
		if err := os.MkdirAll(m.dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(c.stopAll)
	for _, m := range c.members {
		if err := m.start(bin); err != nil {
			t.Fatal(err)
		}
	}
	cl, err := c.newClient()
	if err != nil {
		t.Fatal(err)
	}
	c.client = cl
	t.Cleanup(func() { cl.Close() })
	c.waitHealthy()
	return c
}

// freeAddr returns a loopback address whose port was free a moment ago.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func (m *member) start(bin string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	cmd := exec.Command(bin, m.args...)
	// A test binary that dies (a panic, a timeout) takes its members
	// with it: its cleanup does not run then.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := os.OpenFile(filepath.Join(m.dir, "stderr"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("etcdtest: start member %s: %w", m.name, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		out.Close()
		close(exited)
	}()
	m.cmd, m.exited = cmd, exited
	return nil
}

// kill kills the member's process (SIGKILL) and waits until it exited.
func (m *member) kill() {
	m.mu.Lock()
	cmd, exited := m.cmd, m.exited
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Kill()
	<-exited
}

func (m *member) running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return false
	}
	select {
	case <-m.exited:
		return false
	default:
		return true
	}
}

func (c *Cluster) stopAll() {
	var wg sync.WaitGroup
	for _, m := range c.members {
		wg.Add(1)
		go func() { defer wg.Done(); m.kill() }()
	}
	wg.Wait()
}

// Endpoints are the members' client addresses, "127.0.0.1:port".
func (c *Cluster) Endpoints() []string {
	out := make([]string, len(c.members))
	for i, m := range c.members {
		out[i] = m.clientAddr
	}
	return out
}

// Client returns a new client of the cluster, closed when the test ends.
func (c *Cluster) Client() *clientv3.Client {
	c.t.Helper()
	cl, err := c.newClient()
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cl.Close() })
	return cl
}

// newClient is a client of the cluster, over TLS for StartTLS's.
func (c *Cluster) newClient() (*clientv3.Client, error) {
	var tlsCfg *tls.Config
	if c.tls != nil {
		pair, err := tls.LoadX509KeyPair(c.tls.Cert, c.tls.Key)
		if err != nil {
			return nil, err
		}
		ca, err := os.ReadFile(c.tls.CACert)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		tlsCfg = &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}
	}
	return clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), TLS: tlsCfg, DialTimeout: 5 * time.Second, Logger: quietZap()})
}

// PID is member i's process id (0: not running).
func (c *Cluster) PID(i int) int {
	m := c.members[i]
	if !m.running() {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cmd.Process.Pid
}

// Leader returns the index of the member that leads the cluster, as the
// running members say (bounded: 30 s).
func (c *Cluster) Leader() int {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), healthyWithin)
	defer cancel()
	i, err := c.leader(ctx)
	if err != nil {
		c.t.Fatalf("etcdtest: no leader: %v", err)
	}
	return i
}

func (c *Cluster) leader(ctx context.Context) (int, error) {
	var last error
	for {
		for i, m := range c.members {
			if !m.running() {
				continue
			}
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := c.client.Status(sctx, m.clientAddr)
			cancel()
			if err != nil {
				last = err
				continue
			}
			if st.Leader != 0 && st.Leader == st.Header.MemberId {
				return i, nil
			}
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return -1, errors.Join(ctx.Err(), last)
		case <-t.C:
		}
	}
}

// KillLeader kills (kill -9) the member that leads the cluster and returns
// its index.
func (c *Cluster) KillLeader() int {
	c.t.Helper()
	i := c.Leader()
	c.Kill(i)
	return i
}

// Kill kills member i (kill -9) and waits until its process exited.
func (c *Cluster) Kill(i int) { c.members[i].kill() }

// Restart starts member i again, with its data, after Kill, and waits (at
// most 30 s) until it answers and the cluster has a leader.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	m := c.members[i]
	if m.running() {
		c.t.Fatalf("etcdtest: member %s is running", m.name)
	}
	if err := m.start(c.bin); err != nil {
		c.t.Fatal(err)
	}
	c.waitHealthy()
}

// waitHealthy waits until every running member answers and one leads.
func (c *Cluster) waitHealthy() {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), healthyWithin)
	defer cancel()
	for _, m := range c.members {
		if !m.running() {
			continue
		}
		for {
			sctx, scancel := context.WithTimeout(ctx, time.Second)
			st, err := c.client.Status(sctx, m.clientAddr)
			scancel()
			if err == nil && st.Leader != 0 {
				break
			}
			if ctx.Err() != nil || !m.running() {
				log, _ := os.ReadFile(filepath.Join(m.dir, "stderr"))
				c.t.Fatalf("etcdtest: member %s at %s not healthy within %v (running %v): %v\n%s", m.name, m.clientAddr, healthyWithin, m.running(), err, log)
			}
			t := time.NewTimer(50 * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
			case <-t.C:
			}
		}
	}
	if _, err := c.leader(ctx); err != nil {
		c.t.Fatalf("etcdtest: no leader within %v: %v", healthyWithin, err)
	}
}

// quietZap keeps the etcd client's retry warnings (a member killed on
// purpose) out of the test output.
func quietZap() *zap.Logger { return zap.NewNop() }
