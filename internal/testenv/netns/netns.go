// Package netns builds small fake clusters for gorun's multi-host tests:
// network namespaces ("hosts") joined by veth pairs to a bridge in a "switch"
// namespace, each host with its own address in 10.213.0.0/24 and its own
// sshd, reachable with a client key made for the test. Traffic stays inside
// these namespaces. Everything is torn down by the test's cleanup: sshd
// killed by PID, namespaces (and with them the veths) deleted, files removed.
//
// It needs root, ip (iproute2), /usr/sbin/sshd and ssh-keygen. Where they are
// missing, New skips the test with the reason, except under CI=true, where
// it fails it.
package netns

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Cluster is a set of namespace hosts with sshd.
type Cluster struct {
	Hosts []*Host
	Dir   string // keys, sshd configs and logs
	Key   string // client private key
	sw    string // switch namespace
}

// Host is one namespace with an address and an sshd.
type Host struct {
	NS   string
	IP   string
	sshd *exec.Cmd
}

var seq atomic.Int32

// Unavailable says why clusters cannot be made here, or "".
func Unavailable() string {
	if os.Geteuid() != 0 {
		return "needs root to create network namespaces"
	}
	for _, bin := range []string{"ip", "ssh", "ssh-keygen", "/usr/sbin/sshd"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Sprintf("%s not found (apt-get install openssh-server openssh-client iproute2)", bin)
		}
	}
	name := fmt.Sprintf("grprobe%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return fmt.Sprintf("cannot create a network namespace: %v: %s", err, bytes.TrimSpace(out))
	}
	exec.Command("ip", "netns", "del", name).Run()
	return ""
}

// New makes a cluster of n hosts, 10.213.0.1 to 10.213.0.n, or skips t.
func New(t testing.TB, n int) *Cluster {
	t.Helper()
	if why := Unavailable(); why != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("multi-host test cannot run under CI=true: %s", why)
		}
		t.Skipf("skipping multi-host test: %s", why)
	}
	os.MkdirAll("/run/sshd", 0o755) // sshd's privilege separation directory
	id := fmt.Sprintf("gr%d%d", os.Getpid()%100000, seq.Add(1))
	c := &Cluster{Dir: t.TempDir(), sw: id + "sw"}
	t.Cleanup(c.Close)
	must := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	must("ip", "netns", "add", c.sw)
	must("ip", "-n", c.sw, "link", "add", "br0", "type", "bridge")
	must("ip", "-n", c.sw, "link", "set", "br0", "up")
	for i := range n {
		h := &Host{NS: id + "h" + strconv.Itoa(i), IP: "10.213.0." + strconv.Itoa(i+1)}
		c.Hosts = append(c.Hosts, h)
		must("ip", "netns", "add", h.NS)
		hv, sv := fmt.Sprintf("%sa%d", id, i), fmt.Sprintf("%sb%d", id, i)
		must("ip", "link", "add", hv, "type", "veth", "peer", "name", sv)
		must("ip", "link", "set", hv, "netns", h.NS)
		must("ip", "link", "set", sv, "netns", c.sw)
		must("ip", "-n", h.NS, "link", "set", hv, "name", "eth0")
		must("ip", "-n", h.NS, "addr", "add", h.IP+"/24", "dev", "eth0")
		must("ip", "-n", h.NS, "link", "set", "eth0", "up")
		must("ip", "-n", h.NS, "link", "set", "lo", "up")
		must("ip", "-n", c.sw, "link", "set", sv, "master", "br0")
		must("ip", "-n", c.sw, "link", "set", sv, "up")
	}
	c.Key = filepath.Join(c.Dir, "id_ed25519")
	must("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", c.Key)
	must("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", filepath.Join(c.Dir, "hostkey"))
	pub, err := os.ReadFile(c.Key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.Dir, "authorized_keys"), pub, 0o600); err != nil {
		t.Fatal(err)
	}
	for i, h := range c.Hosts {
		conf := filepath.Join(c.Dir, fmt.Sprintf("sshd_%d.conf", i))
		text := fmt.Sprintf(`ListenAddress %s
Port 22
HostKey %s
AuthorizedKeysFile %s
PermitRootLogin yes
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
PidFile %s
MaxStartups 100:30:200
MaxSessions 100
`, h.IP, filepath.Join(c.Dir, "hostkey"), filepath.Join(c.Dir, "authorized_keys"), filepath.Join(c.Dir, fmt.Sprintf("sshd_%d.pid", i)))
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		log, err := os.Create(filepath.Join(c.Dir, fmt.Sprintf("sshd_%d.log", i)))
		if err != nil {
			t.Fatal(err)
		}
		h.sshd = exec.Command("ip", "netns", "exec", h.NS, "/usr/sbin/sshd", "-D", "-e", "-f", conf)
		h.sshd.Stdout, h.sshd.Stderr = log, log
		if err := h.sshd.Start(); err != nil {
			t.Fatal(err)
		}
		log.Close()
	}
	// Wait until every sshd answers, from the first host.
	deadline := time.Now().Add(10 * time.Second)
	for _, h := range c.Hosts {
		for {
			out, err := c.Command(c.Hosts[0], "ssh", append(c.SSHArgs(), h.IP, "true")...).CombinedOutput()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				logs, _ := os.ReadFile(filepath.Join(c.Dir, "sshd_0.log"))
				t.Fatalf("sshd on %s does not answer: %v: %s\nsshd log:\n%s", h.IP, err, out, logs)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

// SSHArgs are the ssh options the test client needs (the key, no known_hosts).
func (c *Cluster) SSHArgs() []string {
	return append([]string{"-i", c.Key}, strings.Fields(c.SSHOpts())...)
}

// SSHOpts are the options for GORUN_SSH_OPTS.
func (c *Cluster) SSHOpts() string {
	return "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o BatchMode=yes"
}

// Command runs name with args inside host h.
func (c *Cluster) Command(h *Host, name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", h.NS, name}, args...)...)
}

// CommandContext is Command with a context.
func (c *Cluster) CommandContext(ctx context.Context, h *Host, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.NS, name}, args...)...)
}

// PIDs lists the processes in h's namespace, except its sshd listener.
func (c *Cluster) PIDs(h *Host) []int {
	out, _ := exec.Command("ip", "netns", "pids", h.NS).Output()
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(f)
		if err != nil || (h.sshd != nil && h.sshd.Process != nil && pid == h.sshd.Process.Pid) {
			continue
		}
		pids = append(pids, pid)
	}
	return pids
}

// Cmdline returns a process's command line, space-separated.
func Cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// Environ returns one variable of a process's environment.
func Environ(pid int, name string) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	for _, kv := range strings.Split(string(b), "\x00") {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v
		}
	}
	return ""
}

// Close kills every sshd and any process left in the namespaces, and
// deletes the namespaces.
func (c *Cluster) Close() {
	for _, h := range c.Hosts {
		if h.sshd != nil && h.sshd.Process != nil {
			h.sshd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { h.sshd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(3 * time.Second):
				h.sshd.Process.Kill()
				<-done
			}
			h.sshd = nil
		}
		for _, pid := range c.PIDs(h) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		exec.Command("ip", "netns", "del", h.NS).Run()
	}
	exec.Command("ip", "netns", "del", c.sw).Run()
}
