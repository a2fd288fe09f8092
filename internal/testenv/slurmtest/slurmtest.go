// Package slurmtest starts a small, real Slurm cluster for gorun's tests:
// one munged, one slurmctld and one slurmd per node, the nodes being the
// network namespace hosts of internal/testenv/netns (10.213.0.1, 10.213.0.2, ...).
// Every daemon runs in a UTS and mount namespace of its own with the node's
// host name (node1, node2, ...) and a hosts file made by the test bound over
// /etc/hosts, so node names resolve on every node and nothing of the
// machine's configuration is read or changed: the munge key, socket, Slurm
// configuration, state, spool directories and logs all live in the test's
// temporary directory. Jobs started by a slurmd inherit its namespaces, so a
// rank sees the host name and the network of its node. Fail takes a node
// down as a power loss would, and Restore brings it back.
//
// It needs root, ip, unshare and nsenter (util-linux), munged (Debian
// package munge), slurmctld, slurmd and the client commands (packages
// slurmctld, slurmd, slurm-client; Slurm 22.05 is what Debian 12 has).
// Where they are missing New skips the test with the reason, except under
// CI=true, where it fails it.
package slurmtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv/netns"
)

// Cluster is a running Slurm cluster on namespace hosts.
type Cluster struct {
	Net   *netns.Cluster
	Nodes []*Node
	Dir   string // configuration, munge key, state, spools and logs
	Conf  string // slurm.conf, for SLURM_CONF

	hosts   string // the hosts file bound over /etc/hosts in every node
	munged  *exec.Cmd
	ctld    *exec.Cmd
	started time.Time
}

// Node is one Slurm node: a namespace host with a host name and a slurmd.
type Node struct {
	Name   string // node1, node2, ...
	Host   *netns.Host
	slurmd *exec.Cmd
}

// CPUs is how many CPUs each node declares to Slurm, whatever the machine
// has (SlurmdParameters=config_overrides): two ranks per node.
const CPUs = 2

// Unavailable says why a cluster cannot be made here, or "".
func Unavailable() string {
	if why := netns.Unavailable(); why != "" {
		return why
	}
	for _, bin := range []string{"unshare", "nsenter", "munged", "slurmctld", "slurmd", "srun", "sbatch", "squeue", "scontrol", "sinfo"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Sprintf("%s not found (apt-get install munge slurmctld slurmd slurm-client)", bin)
		}
	}
	return ""
}

// New starts a cluster of n nodes, node1 to node<n>, and waits until every
// node is idle; or skips t (fails it under CI=true) if that cannot be done
// here. Everything is stopped and removed by t's cleanup.
func New(t testing.TB, n int) *Cluster {
	t.Helper()
	if why := Unavailable(); why != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("Slurm test cannot run under CI=true: %s", why)
		}
		t.Skipf("skipping Slurm test: %s", why)
	}
	c := &Cluster{Net: netns.New(t, n), Dir: t.TempDir(), started: time.Now()}
	// Registered after netns's cleanup, so it runs before it: the daemons
	// stop while their namespaces still exist.
	t.Cleanup(c.Close)
	for i, h := range c.Net.Hosts {
		c.Nodes = append(c.Nodes, &Node{Name: "node" + strconv.Itoa(i+1), Host: h})
	}
	dirs := []string{"state", "munge"}
	for _, nd := range c.Nodes {
		dirs = append(dirs, filepath.Join("spool", nd.Name))
	}
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(c.Dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	var hosts strings.Builder
	hosts.WriteString("127.0.0.1 localhost\n")
	for _, nd := range c.Nodes {
		fmt.Fprintf(&hosts, "%s %s\n", nd.Host.IP, nd.Name)
	}
	c.hosts = filepath.Join(c.Dir, "hosts")
	write(t, c.hosts, hosts.String(), 0o644)

	// munged: its own key and socket. The daemons and the client commands
	// find the socket through AuthInfo in slurm.conf.
	key := make([]byte, 1024)
	rand.Read(key)
	keyFile := filepath.Join(c.Dir, "munge", "munge.key")
	if err := os.WriteFile(keyFile, key, 0o400); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(c.Dir, "munge", "munge.socket")
	c.munged = exec.Command("munged", "--foreground", "--force", "--key-file", keyFile, "--socket", socket,
		"--pid-file", filepath.Join(c.Dir, "munge", "munged.pid"), "--seed-file", filepath.Join(c.Dir, "munge", "munged.seed"),
		"--log-file", c.log("munged"), "--num-threads", "4")
	c.start(t, c.munged, "munged")
	c.waitFor(t, 10*time.Second, func() string { return "munged to create its socket " + socket }, func() bool {
		_, err := os.Stat(socket)
		return err == nil
	})

	c.Conf = filepath.Join(c.Dir, "slurm.conf")
	write(t, c.Conf, c.config(socket), 0o644)

	// slurmctld on the first node, then one slurmd per node.
	c.ctld = c.inNode(c.Nodes[0], "slurmctld", "-D", "-i")
	c.start(t, c.ctld, "slurmctld")
	for _, nd := range c.Nodes {
		nd.slurmd = c.inNode(nd, "slurmd", "-D", "-N", nd.Name)
		c.start(t, nd.slurmd, "slurmd on "+nd.Name)
	}
	c.waitIdle(t, 30*time.Second)
	if testing.Verbose() {
		t.Logf("Slurm cluster of %d nodes idle %v after start", len(c.Nodes), time.Since(c.started).Round(time.Millisecond))
	}
	return c
}

func write(t testing.TB, name, text string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(name, []byte(text), mode); err != nil {
		t.Fatal(err)
	}
}

func (c *Cluster) log(name string) string { return filepath.Join(c.Dir, name+".log") }

// config is slurm.conf: no cgroups (proctrack/linuxproc follows a job's
// processes by parentage, so the ranks' own sessions stay in the job), no
// accounting, state and spools in the test's directory, and short timeouts
// so a failed node or job shows quickly:
//
//   - SlurmdTimeout=10 (Slurm's default is 300 s): a node that stops
//     answering is set DOWN, and its jobs and steps ended ("Node failure"),
//     only after it. slurmctld pings a node that has not answered for
//     SlurmdTimeout/3 seconds, every SlurmdTimeout/3 seconds, and sets it
//     DOWN at the first ping round after it has been silent for
//     SlurmdTimeout since the previous round, and a round waits for the
//     previous one's pings to end (see MessageTimeout): 7 s after a power
//     loss at the soonest, about 17 s at the latest (11 to 15.5 s in the
//     runs here). Until then srun waits for a dead node's tasks, and a job
//     whose node died stays COMPLETING. 10 s and not less, so that the
//     node is set DOWN after a job's ranks have found the loss themselves
//     (the Slurm test's heartbeat bound is 5 s), as on a real cluster, and
//     a node's slurmd starved of CPU on this loaded machine is not taken
//     for dead.
//   - MessageTimeout=3 (default 10): a ping to a dead node lasts this long
//     (the other nodes still have its MAC address cached, so a connect
//     gets no error, only no answer), and the next ping round waits for
//     it; RPCs between live nodes here take milliseconds.
//   - KillWait=2 (default 30): a cancelled job's processes get SIGKILL 2 s
//     after SIGTERM.
//
// The partition lets jobs that ask for it (--oversubscribe) share CPUs, so
// a test can run two jobs on the same nodes at once; a job that does not
// ask still gets CPUs of its own.
func (c *Cluster) config(mungeSocket string) string {
	var b strings.Builder
	first := c.Nodes[0]
	fmt.Fprintf(&b, `ClusterName=gorun
SlurmctldHost=%s(%s)
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=%s
SlurmUser=root
SlurmdUser=root
StateSaveLocation=%s
SlurmdSpoolDir=%s/%%n
SlurmctldPidFile=%s
SlurmdPidFile=%s/slurmd-%%n.pid
SlurmctldLogFile=%s
SlurmdLogFile=%s/slurmd-%%n.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
JobContainerType=job_container/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
PropagateResourceLimits=NONE
ReturnToService=2
KillWait=2
MessageTimeout=3
SlurmdTimeout=10
InactiveLimit=0
MinJobAge=300
`, first.Name, first.Host.IP, mungeSocket, filepath.Join(c.Dir, "state"), filepath.Join(c.Dir, "spool"),
		filepath.Join(c.Dir, "slurmctld.pid"), c.Dir, c.log("slurmctld"), c.Dir)
	for _, nd := range c.Nodes {
		fmt.Fprintf(&b, "NodeName=%s NodeAddr=%s CPUs=%d RealMemory=1000 State=UNKNOWN\n", nd.Name, nd.Host.IP, CPUs)
	}
	b.WriteString("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n")
	return b.String()
}

// nodeShell enters a new UTS and mount namespace, takes the node's name and
// hosts file, and runs its arguments.
const nodeShell = `echo "$0" > /proc/sys/kernel/hostname && mount --bind "$1" /etc/hosts && shift && exec "$@"`

// inNode is a daemon command in its own namespaces on node nd. It joins the
// host's network namespace with nsenter rather than "ip netns exec", which
// mounts a new /sys without /sys/fs/cgroup, and slurmd will not start
// without a cgroup file system to look at (even with no cgroup plugin).
func (c *Cluster) inNode(nd *Node, name string, args ...string) *exec.Cmd {
	cmd := exec.Command("nsenter", append([]string{"--net=/run/netns/" + nd.Host.NS, "--", "unshare", "--uts", "--mount", "--", "sh", "-c", nodeShell, nd.Name, c.hosts, name}, args...)...)
	cmd.Env = c.Env()
	return cmd
}

// Env is this process's environment with SLURM_CONF set to the cluster's.
func (c *Cluster) Env() []string {
	return append(slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, "SLURM_") }), "SLURM_CONF="+c.Conf)
}

func (c *Cluster) start(t testing.TB, cmd *exec.Cmd, what string) {
	t.Helper()
	// Appended to: a node's slurmd restarted by Restore keeps the first
	// one's output.
	out, err := os.OpenFile(c.log(strings.ReplaceAll(what, " ", "-")+".out"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	// A daemon dies with the test binary even if cleanup never runs.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", what, err)
	}
}

// waitFor polls ok until it holds, or fails t after limit saying what it
// waited for (what is called then, so it can say what was seen last).
func (c *Cluster) waitFor(t testing.TB, limit time.Duration, what func() string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s\n%s", limit, what(), c.Logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitIdle polls sinfo until every node is idle.
func (c *Cluster) waitIdle(t testing.TB, limit time.Duration) {
	t.Helper()
	var last string
	c.waitFor(t, limit, func() string { return "every node to be idle (sinfo said: " + last + ")" }, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		out, err := c.Command(ctx, c.Nodes[0], "sinfo", "-h", "-N", "-o", "%N %t").CombinedOutput()
		last = strings.TrimSpace(string(out))
		if err != nil {
			return false
		}
		idle := 0
		for _, l := range strings.Split(last, "\n") {
			if f := strings.Fields(l); len(f) == 2 && f[1] == "idle" {
				idle++
			}
		}
		return idle == len(c.Nodes)
	})
}

// Command runs a command (srun, sbatch, squeue, or a test's own) on node nd,
// in the namespaces of its slurmd (network, host name, hosts file), with
// SLURM_CONF set. The caller may add to cmd.Env.
func (c *Cluster) Command(ctx context.Context, nd *Node, name string, args ...string) *exec.Cmd {
	pid := strconv.Itoa(nd.slurmd.Process.Pid)
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--target", pid, "--net", "--uts", "--mount", "--", name}, args...)...)
	cmd.Env = c.Env()
	return cmd
}

// Run runs a client command on nd and returns its combined output; it fails
// t, with the daemons' logs, if the command fails or takes over limit.
func (c *Cluster) Run(t testing.TB, nd *Node, limit time.Duration, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	out, err := c.Command(ctx, nd, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s on %s: %v (limit %v)\n%s\n%s", name, strings.Join(args, " "), nd.Name, err, limit, out, c.Logs())
	}
	return string(out)
}

// WaitJob polls scontrol until job id has ended and returns its state
// (COMPLETED, FAILED, CANCELLED, ...) and exit code ("0:0").
func (c *Cluster) WaitJob(t testing.TB, id string, limit time.Duration) (state, exitCode string) {
	t.Helper()
	var last string
	c.waitFor(t, limit, func() string { return "job " + id + " to end (scontrol said: " + last + ")" }, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		out, _ := c.Command(ctx, c.Nodes[0], "scontrol", "-o", "show", "job", id).CombinedOutput()
		last = strings.TrimSpace(string(out))
		state, exitCode = field(last, "JobState"), field(last, "ExitCode")
		switch state {
		case "", "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED":
			return false
		}
		return true
	})
	return state, exitCode
}

// field is NAME's value in scontrol -o output ("NAME=value ...").
func field(line, name string) string {
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, name+"="); ok {
			return v
		}
	}
	return ""
}

// daemon says whether pid is one of the cluster's daemons, or slurmctld's
// slurmscriptd (netns.PIDs leaves out sshd already).
func (c *Cluster) daemon(pid int) bool {
	ppid := parent(pid)
	for _, cmd := range []*exec.Cmd{c.ctld, c.munged} {
		if cmd != nil && cmd.Process != nil && (cmd.Process.Pid == pid || cmd == c.ctld && cmd.Process.Pid == ppid) {
			return true
		}
	}
	for _, nd := range c.Nodes {
		if nd.slurmd != nil && nd.slurmd.Process != nil && nd.slurmd.Process.Pid == pid {
			return true
		}
	}
	return false
}

// parent is pid's parent process id, or 0.
func parent(pid int) int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	// pid (comm) state ppid ...; comm may hold spaces and parentheses.
	if i := bytes.LastIndexByte(b, ')'); i >= 0 {
		if f := strings.Fields(string(b[i+1:])); len(f) > 1 {
			ppid, _ := strconv.Atoi(f[1])
			return ppid
		}
	}
	return 0
}

// JobProcesses lists the processes on the nodes that are not the cluster's
// daemons: a job's slurmstepd and tasks, and whatever they left behind.
func (c *Cluster) JobProcesses() []string {
	var out []string
	for _, nd := range c.Nodes {
		for _, pid := range c.Net.PIDs(nd.Host) {
			if !c.daemon(pid) {
				out = append(out, fmt.Sprintf("%s: pid %d %q", nd.Name, pid, netns.Cmdline(pid)))
			}
		}
	}
	return out
}

// NoneLeft fails t if, within limit, the nodes still run any process but
// the daemons (slurmstepd takes a moment to exit after its job).
func (c *Cluster) NoneLeft(t testing.TB, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		left := c.JobProcesses()
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes left on the nodes %v after the job:\n%s\n%s", limit, strings.Join(left, "\n"), c.Logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Fail makes node nd fail as a power loss would: everything on it is gone
// and no packet comes from it any more. Its network goes first (eth0 down,
// so that nothing that dies afterwards sends a FIN or a RST that would tell
// the other nodes), then every process on it is killed with SIGKILL: its
// slurmd, the jobs' slurmstepd and tasks (only the netns package's sshd is
// left, unreachable without the link). The other nodes can then learn of
// the failure only by timeouts: slurmctld when the node stops answering its
// pings (SlurmdTimeout), a job's ranks by their heartbeat or collective
// timeout. Restore brings the node back.
func (c *Cluster) Fail(t testing.TB, nd *Node) {
	t.Helper()
	if out, err := exec.Command("ip", "-n", nd.Host.NS, "link", "set", "eth0", "down").CombinedOutput(); err != nil {
		t.Fatalf("taking %s's network down: %v: %s", nd.Name, err, out)
	}
	for _, pid := range c.Net.PIDs(nd.Host) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	// Reaped here, so Close does not signal a pid that may be reused.
	nd.slurmd.Wait()
	if testing.Verbose() {
		t.Logf("%s failed: network down, every process killed", nd.Name)
	}
}

// Restore brings a node back after Fail: its network up, a new slurmd,
// and every node idle again (ReturnToService=2 makes slurmctld take back a
// node it set DOWN as soon as its slurmd registers).
func (c *Cluster) Restore(t testing.TB, nd *Node) {
	t.Helper()
	if out, err := exec.Command("ip", "-n", nd.Host.NS, "link", "set", "eth0", "up").CombinedOutput(); err != nil {
		t.Fatalf("bringing %s's network up: %v: %s", nd.Name, err, out)
	}
	nd.slurmd = c.inNode(nd, "slurmd", "-D", "-N", nd.Name)
	c.start(t, nd.slurmd, "slurmd on "+nd.Name)
	c.waitIdle(t, 30*time.Second)
}

// Logs is the end of every daemon's log, for failure messages.
func (c *Cluster) Logs() string {
	var b bytes.Buffer
	names, _ := filepath.Glob(filepath.Join(c.Dir, "*.log*"))
	for _, name := range names {
		text, err := os.ReadFile(name)
		if err != nil || len(bytes.TrimSpace(text)) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(text)), "\n")
		fmt.Fprintf(&b, "--- %s (last %d lines):\n%s\n", filepath.Base(name), min(len(lines), 30), strings.Join(lines[max(0, len(lines)-30):], "\n"))
	}
	return b.String()
}

// Close stops every daemon by PID (slurmd first, so it stops its jobs'
// steps while slurmctld still answers), and kills whatever is left on the
// nodes; netns's cleanup then deletes the namespaces.
func (c *Cluster) Close() {
	var cmds []*exec.Cmd
	for _, nd := range c.Nodes {
		cmds = append(cmds, nd.slurmd)
	}
	cmds = append(cmds, c.ctld, c.munged)
	for _, cmd := range cmds {
		stop(cmd)
	}
	for _, nd := range c.Nodes {
		for _, pid := range c.Net.PIDs(nd.Host) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// stop ends a daemon with SIGTERM, or SIGKILL after 5 s, and reaps it.
func stop(cmd *exec.Cmd) {
	if cmd == nil || cmd.Process == nil || cmd.ProcessState != nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		cmd.Process.Kill()
		<-done
	}
}
