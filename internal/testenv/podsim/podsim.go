// Package podsim plays the pods of a Kubernetes job with processes, for
// gorun's tests of elastic jobs on Kubernetes, where no cluster can run.
//
// Each pod has a node of its own: a network namespace host of
// internal/testenv/netns, with its own address, as a pod has its own IP.
// Its container is a process in a UTS and mount namespace of its own, with
// the pod's name as host name and a hosts file made by the test bound over
// /etc/hosts, which names every pod (as the job's Services would), so the
// pods' DNS names resolve as in the cluster. Its environment is exactly
// what the test gives it (the operator's contract and the manifest's env),
// plus what a container runtime adds: PATH and HOSTNAME; nothing of the
// test's own environment.
//
// The kubelet: a container that exits non-zero is started again at once
// (restartPolicy: OnFailure; the real kubelet's back-off delay would only
// slow the tests), one that exits 0 has succeeded. Delete ends a pod as
// Kubernetes deletes one: SIGTERM, SIGKILL after the grace period, and
// the operator then creates it again with the same name, index and
// environment. Every process, namespace and file is removed by the test's
// cleanup.
//
// It needs what netns needs, and unshare (util-linux) and mount.
//
// NewLocal plays pods without namespaces: processes of this host, each
// with its pod's name as HOSTNAME only, for jobs whose pods find each
// other through a service outside the pods (an etcd cluster on this
// host's loopback), which a namespace host could not reach.
package podsim

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv/netns"
)

// MaxRestarts bounds how many times a pod's container is started again
// after it failed, as a Job's backoffLimit does: a container that fails at
// once every time would otherwise spin.
const MaxRestarts = 20

// Cluster is the pods of one job, each on a namespace host (Net), or
// each a process of this host (NewLocal; Net nil).
type Cluster struct {
	Net   *netns.Cluster
	Pods  []*Pod
	Dir   string
	hosts string
	out   io.Writer
	outMu sync.Mutex
}

// Pod is one pod: its name, node and container environment.
type Pod struct {
	Name string
	Host *netns.Host // nil: a process of this host (NewLocal)
	c    *Cluster
	env  []string
	args []string

	mu       sync.Mutex
	cmd      *exec.Cmd // the running container, nil between runs
	pids     []int     // every container process started
	restarts int
	deleting bool          // Delete is ending this container: no restart
	state    string        // "Running", "Succeeded", "Failed"
	exited   chan struct{} // closed when the running container's process ended
	done     chan struct{} // closed when the pod succeeded or failed for good
	exits    []string      // how each container ended
}

// Spec is a pod of a job: its name (a DNS label, as <job>-worker-<i>), the
// container's environment (KEY=VALUE), and its command.
type Spec struct {
	Name string
	Env  []string
	Args []string
}

// Unavailable says why pods cannot be simulated here, or "".
func Unavailable() string {
	if why := netns.Unavailable(); why != "" {
		return why
	}
	for _, bin := range []string{"unshare", "mount"} {
		if _, err := exec.LookPath(bin); err != nil {
			return bin + " not found (apt-get install util-linux mount)"
		}
	}
	return ""
}

// New makes a node per spec and a hosts file naming the pods; or skips t
// (fails it under CI=true) where it cannot. The pods' containers write
// their output to out, each line prefixed with "[<pod name>] ".
func New(t testing.TB, out io.Writer, specs ...Spec) *Cluster {
	t.Helper()
	if why := Unavailable(); why != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("pod simulation cannot run under CI=true: %s", why)
		}
		t.Skipf("skipping pod simulation: %s", why)
	}
	c := &Cluster{Net: netns.New(t, len(specs)), Dir: t.TempDir(), out: out}
	// Registered after netns's cleanup, so it runs before it: the pods
	// stop while their namespaces still exist.
	t.Cleanup(c.Close)
	var hosts strings.Builder
	hosts.WriteString("127.0.0.1 localhost\n")
	for i, s := range specs {
		h := c.Net.Hosts[i]
		fmt.Fprintf(&hosts, "%s %s\n", h.IP, s.Name)
		c.Pods = append(c.Pods, &Pod{Name: s.Name, Host: h, c: c, env: s.Env, args: s.Args})
	}
	c.hosts = filepath.Join(c.Dir, "hosts")
	if err := os.WriteFile(c.hosts, []byte(hosts.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return c
}

// NewLocal makes a pod per spec, each a process of this host (no
// namespaces: its name is only its HOSTNAME, and resolves nowhere).
func NewLocal(t testing.TB, out io.Writer, specs ...Spec) *Cluster {
	t.Helper()
	c := &Cluster{Dir: t.TempDir(), out: out}
	t.Cleanup(c.Close)
	for _, s := range specs {
		c.Pods = append(c.Pods, &Pod{Name: s.Name, c: c, env: s.Env, args: s.Args})
	}
	return c
}

// containerShell takes the pod's host name and hosts file in the new UTS
// and mount namespace, and becomes the container's command.
const containerShell = `echo "$0" > /proc/sys/kernel/hostname && mount --bind "$1" /etc/hosts && shift && exec "$@"`

// Start starts every pod's container.
func (c *Cluster) Start(t testing.TB) {
	t.Helper()
	for _, p := range c.Pods {
		p.mu.Lock()
		p.done = make(chan struct{})
		err := p.startLocked()
		p.mu.Unlock()
		if err != nil {
			t.Fatalf("pod %s: %v", p.Name, err)
		}
	}
}

// startLocked starts the container and the kubelet's watch of it.
func (p *Pod) startLocked() error {
	var cmd *exec.Cmd
	if p.Host == nil {
		cmd = exec.Command(p.args[0], p.args[1:]...)
	} else {
		args := append([]string{"netns", "exec", p.Host.NS, "unshare", "--uts", "--mount", "--", "sh", "-c", containerShell, p.Name, p.c.hosts}, p.args...)
		cmd = exec.Command("ip", args...)
	}
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOSTNAME=" + p.Name}, p.env...)
	w := &lineWriter{c: p.c, prefix: "[" + p.Name + "] "}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		return err
	}
	// ip, unshare and sh exec each other: the process is the container's
	// command itself, as a container's PID 1 is.
	p.cmd, p.state, p.exited = cmd, "Running", make(chan struct{})
	p.pids = append(p.pids, cmd.Process.Pid)
	go p.watch(cmd, w, p.exited)
	return nil
}

// watch is the kubelet: it waits for the container and starts it again
// after a failure.
func (p *Pod) watch(cmd *exec.Cmd, w *lineWriter, exited chan struct{}) {
	err := cmd.Wait()
	w.flush()
	p.mu.Lock()
	defer p.mu.Unlock()
	close(exited)
	p.cmd = nil
	how := "exit 0"
	if err != nil {
		how = err.Error()
	}
	p.exits = append(p.exits, how)
	switch {
	case p.deleting:
		return // Delete decides what comes next
	case err == nil:
		p.state = "Succeeded"
		close(p.done)
	case p.restarts >= MaxRestarts:
		p.state = "Failed"
		close(p.done)
	default:
		p.restarts++
		if serr := p.startLocked(); serr != nil {
			p.exits = append(p.exits, "restart: "+serr.Error())
			p.state = "Failed"
			close(p.done)
		}
	}
}

// PID is the running container's process (0 if none runs).
func (p *Pod) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Signal sends sig to the running container's process.
func (p *Pod) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("pod %s runs no container", p.Name)
	}
	return p.cmd.Process.Signal(sig)
}

// Delete deletes the pod as Kubernetes does: SIGTERM, then SIGKILL after
// grace; then, if recreate, the operator creates it again (a new
// container, its restarts counted afresh).
func (p *Pod) Delete(grace time.Duration, recreate bool) error {
	p.mu.Lock()
	if p.cmd == nil {
		p.mu.Unlock()
		return fmt.Errorf("pod %s runs no container", p.Name)
	}
	p.deleting = true
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		cmd.Process.Kill()
		<-exited
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.deleting = false
	if !recreate {
		p.state = "Deleted"
		close(p.done)
		return nil
	}
	p.restarts = 0
	return p.startLocked()
}

// Done is closed once the pod succeeded, failed for good, or was deleted
// and not recreated.
func (p *Pod) Done() <-chan struct{} { return p.done }

// State is "Running", "Succeeded", "Failed" or "Deleted", and how each of
// its containers ended.
func (p *Pod) State() (string, []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state, append([]string(nil), p.exits...)
}

// PIDs lists every container process the pod started.
func (p *Pod) PIDs() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int(nil), p.pids...)
}

// Wait waits until every pod is done, or ctx ends.
func (c *Cluster) Wait(ctx context.Context) error {
	for _, p := range c.Pods {
		select {
		case <-p.Done():
		case <-ctx.Done():
			return fmt.Errorf("pod %s still runs: %w", p.Name, ctx.Err())
		}
	}
	return nil
}

// Close kills every container still running (no restart) and waits for
// each.
func (c *Cluster) Close() {
	for _, p := range c.Pods {
		p.mu.Lock()
		p.deleting = true
		cmd, exited := p.cmd, p.exited
		p.mu.Unlock()
		if cmd != nil {
			cmd.Process.Kill()
			<-exited
		}
	}
}

// lineWriter writes a container's output to the cluster's, a whole line
// at a time, prefixed with the pod's name.
type lineWriter struct {
	c      *Cluster
	prefix string
	mu     sync.Mutex
	buf    []byte
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, b...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		w.emit(w.buf[:i+1])
		w.buf = w.buf[i+1:]
	}
}

// flush writes what is left of a last line without its newline.
func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.emit(append(w.buf, '\n'))
		w.buf = nil
	}
}

func (w *lineWriter) emit(line []byte) {
	w.c.outMu.Lock()
	defer w.c.outMu.Unlock()
	io.WriteString(w.c.out, w.prefix)
	w.c.out.Write(line)
}
