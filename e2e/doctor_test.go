package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv/netns"
	"github.com/gorun/gorun/internal/testenv/slurmtest"
)

// doctorIn runs gorun doctor inside host h of cluster c, with the test's
// ssh key and options, and the agent kept in agentDir.
func doctorIn(t *testing.T, c *netns.Cluster, h *netns.Host, agentDir string, args ...string) (stdout, stderr string, code int, took time.Duration) {
	t.Helper()
	full := append([]string{"doctor", "--ssh-identity-file", c.Key, "--agent-dir", agentDir}, args...)
	cmd := c.Command(h, gorunBin, full...)
	cmd.Env = append(os.Environ(), "GORUN_SSH_OPTS="+c.SSHOpts())
	o, e := new(syncBuf), new(syncBuf)
	cmd.Stdout, cmd.Stderr = o, e
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return waitGorun(t, cmd, o, e, start, 60*time.Second)
}

// tableRow finds the row of the doctor table for where and check, and
// returns its status and the rest (its result, and its fix from the line
// under it if it has one).
func tableRow(t *testing.T, table, where, check string) (status, rest string) {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(where) + `\s+` + regexp.QuoteMeta(check) + `\s+(ok|WARN|FAIL)\s+(.*)$(?:\n\s+fix: (.*)$)?`)
	m := re.FindStringSubmatch(table)
	if m == nil {
		t.Fatalf("no row %q %q in the table:\n%s", where, check, table)
	}
	if m[3] != "" {
		return m[1], m[2] + " " + m[3]
	}
	return m[1], m[2]
}

// hiddenFrom hides dir from the processes that host h's sshd starts (and
// only from them), as on a host that lacks the directory: a tmpfs mounted
// over it in that sshd's mount namespace (ip netns exec gave it its own).
func hiddenFrom(t *testing.T, c *netns.Cluster, h *netns.Host, dir string) {
	t.Helper()
	out, err := exec.Command("ip", "netns", "pids", h.NS).Output()
	if err != nil {
		t.Fatalf("ip netns pids %s: %v", h.NS, err)
	}
	others := c.PIDs(h) // every process there but the sshd listener
	sshd := 0
	for _, f := range strings.Fields(string(out)) {
		pid, _ := strconv.Atoi(f)
		if !slices.Contains(others, pid) && strings.Contains(netns.Cmdline(pid), "sshd") {
			sshd = pid
		}
	}
	if sshd == 0 {
		t.Fatalf("no sshd found in %s", h.NS)
	}
	if out, err := exec.Command("nsenter", "-t", strconv.Itoa(sshd), "-m", "mount", "-t", "tmpfs", "gorun-doctor-test", dir).CombinedOutput(); err != nil {
		t.Fatalf("hiding %s on %s: %v: %s", dir, h.IP, err, out)
	}
	t.Cleanup(func() {
		exec.Command("nsenter", "-t", strconv.Itoa(sshd), "-m", "umount", dir).Run()
	})
}

// firewall drops the new TCP connections into host h that match (an nft
// match such as "tcp dport != 22"), with an nftables table of the test's
// own in h's namespace.
func firewall(t *testing.T, c *netns.Cluster, h *netns.Host, match string) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("nft not found under CI=true (apt-get install nftables)")
		}
		t.Skip("nft not found (apt-get install nftables)")
	}
	for _, rule := range []string{
		"add table inet gorun_doctor_test",
		"add chain inet gorun_doctor_test input { type filter hook input priority 0 ; policy accept ; }",
		"add rule inet gorun_doctor_test input ct state new " + match + " drop",
	} {
		if out, err := c.Command(h, "nft", rule).CombinedOutput(); err != nil {
			t.Fatalf("nft %s in %s: %v: %s", rule, h.NS, err, out)
		}
	}
	t.Cleanup(func() { c.Command(h, "nft", "delete table inet gorun_doctor_test").Run() })
}

// TestDoctorNamespaceHosts runs gorun doctor on three namespace hosts:
// healthy, then with the job's ports into one host blocked, then with the
// program missing on one host (and a host that does not exist at all).
func TestDoctorNamespaceHosts(t *testing.T) {
	c := netns.New(t, 3)
	h0, h1, h2 := c.Hosts[0], c.Hosts[1], c.Hosts[2]
	agentDir := t.TempDir()
	// A program of the job's own, in a directory that can be hidden from
	// one host without hiding gorun's test binaries.
	progDir := t.TempDir()
	prog := filepath.Join(progDir, "testprog")
	if err := os.Link(testprogBin, prog); err != nil {
		t.Fatal(err)
	}
	hosts := fmt.Sprintf("%s:2,%s:2,%s:2", h0.IP, h1.IP, h2.IP)
	ips := []string{h0.IP, h1.IP, h2.IP}

	t.Run("healthy", func(t *testing.T) {
		stdout, stderr, code, took := doctorIn(t, c, h0, agentDir, "-H", hosts, "--checkpoint-dir", filepath.Join(t.TempDir(), "ckpt", "{host}"), prog)
		if code != 0 {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
		}
		for _, ip := range ips {
			for _, check := range []string{"ssh", "gorun", "workdir", "program", "gorun version", "clock", "checkpoint space", "open files"} {
				if st, rest := tableRow(t, stdout, ip, check); st != "ok" {
					t.Errorf("%s %s: %s %s", ip, check, st, rest)
				}
			}
			if _, rest := tableRow(t, stdout, ip, "checkpoint space"); !strings.Contains(rest, "ckpt/"+ip+" (not yet created;") {
				t.Errorf("%s checkpoint space does not name %s's own directory: %s", ip, ip, rest)
			}
		}
		// Every pair, both ways, with a latency and a bandwidth. A link
		// may be measured slow (WARN) on a loaded machine; none fails.
		link := regexp.MustCompile(`^rtt ([0-9.]+)(µs|ms|s), ([0-9.]+) (B|KiB|MiB|GiB)/s`)
		for _, a := range ips {
			for _, b := range ips {
				if a == b {
					continue
				}
				st, rest := tableRow(t, stdout, a+" -> "+b, "tcp")
				m := link.FindStringSubmatch(rest)
				if st == "FAIL" || m == nil {
					t.Errorf("%s -> %s: %s %q, want rtt and bandwidth", a, b, st, rest)
					continue
				}
				if bw, _ := strconv.ParseFloat(m[3], 64); bw <= 0 || m[4] == "B" {
					t.Errorf("%s -> %s: bandwidth %s %s/s is not a measured transfer", a, b, m[3], m[4])
				}
			}
		}
		if !strings.Contains(stderr, "gorun doctor: all ") || !strings.Contains(stderr, "on 3 hosts (6 links)") {
			t.Errorf("stderr lacks the summary:\n%s", stderr)
		}
		// The agent was sent to the remote hosts once, by its hash.
		if agents, _ := filepath.Glob(filepath.Join(agentDir, "*")); len(agents) != 1 || !strings.Contains(agents[0], "gorun-doctor-agent-") {
			t.Errorf("agent dir holds %v, want one gorun-doctor-agent-<sha256>", agents)
		}
		t.Logf("healthy: %v\n%s", took.Round(time.Millisecond), stdout)
		noneLeft(t, c)
	})

	t.Run("port blocked", func(t *testing.T) {
		firewall(t, c, h2, "tcp dport != 22")
		const ghost = "10.213.0.99" // in the cluster's network, but nobody there
		// 30s: ssh's ConnectTimeout to the ghost is 10s, and race-built
		// agents start slowly on a loaded machine; the test still shows
		// that nothing waits for ever.
		stdout, stderr, code, took := doctorIn(t, c, h0, agentDir, "-H", hosts+","+ghost, "--dial-timeout", "1s", "--timeout", "30s", prog)
		if code != 1 {
			t.Fatalf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
		}
		for _, from := range []string{h0.IP, h1.IP} {
			st, rest := tableRow(t, stdout, from+" -> "+h2.IP, "tcp")
			for _, want := range []string{"cannot open a connection to " + h2.IP + "'s port", "no answer within 1s",
				fmt.Sprintf("allow TCP from %s into %s on ports ", from, h2.IP)} {
				if st != "FAIL" || !strings.Contains(rest, want) {
					t.Errorf("%s -> %s: %s %q lacks %q", from, h2.IP, st, rest, want)
				}
			}
		}
		// Out of the blocked host, and between the others, all is well.
		for _, pair := range [][2]string{{h2.IP, h0.IP}, {h2.IP, h1.IP}, {h0.IP, h1.IP}, {h1.IP, h0.IP}} {
			if st, rest := tableRow(t, stdout, pair[0]+" -> "+pair[1], "tcp"); st == "FAIL" || !strings.HasPrefix(rest, "rtt ") {
				t.Errorf("%s -> %s: %s %s, want a measured link", pair[0], pair[1], st, rest)
			}
		}
		if st, rest := tableRow(t, stdout, ghost, "ssh"); st != "FAIL" || !strings.Contains(rest, "10.213.0.99") && !strings.Contains(rest, "timed out") {
			t.Errorf("host %s: %s %q, want ssh's failure", ghost, st, rest)
		}
		if n := strings.Count(stdout, "FAIL"); n != 3 {
			t.Errorf("%d failed rows, want 3 (two links into %s, and %s)", n, h2.IP, ghost)
		}
		t.Logf("port blocked: %v\n%s%s", took.Round(time.Millisecond), stdout, stderr)
		noneLeft(t, c)
	})

	// A firewall that lets in only the low half of h2's ephemeral ports:
	// one probe port per pair would pass or fail at random.
	t.Run("half the ports blocked", func(t *testing.T) {
		out, err := c.Command(h2, "cat", "/proc/sys/net/ipv4/ip_local_port_range").Output()
		f := strings.Fields(string(out))
		if err != nil || len(f) != 2 {
			t.Fatalf("reading %s's port range: %v %q", h2.IP, err, out)
		}
		lo, _ := strconv.Atoi(f[0])
		hi, _ := strconv.Atoi(f[1])
		mid := lo + (hi-lo)/2
		firewall(t, c, h2, fmt.Sprintf("tcp dport %d-%d", mid+1, hi))
		stdout, stderr, code, took := doctorIn(t, c, h0, agentDir, "-H", hosts, "--dial-timeout", "1s", prog)
		if code != 1 {
			t.Fatalf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
		}
		port := regexp.MustCompile(`cannot open a connection to \S+'s port (\d+): no answer within 1s .* \(its port (\d+) opened: only part of the ephemeral range is allowed\)`)
		for _, from := range []string{h0.IP, h1.IP} {
			st, rest := tableRow(t, stdout, from+" -> "+h2.IP, "tcp")
			m := port.FindStringSubmatch(rest)
			if st != "FAIL" || m == nil {
				t.Errorf("%s -> %s: %s %q, want the high port dropped and the low one open", from, h2.IP, st, rest)
				continue
			}
			closed, open := atoi(m[1]), atoi(m[2])
			if closed <= mid || closed > hi || open < lo || open > mid {
				t.Errorf("%s -> %s: port %d dropped and %d open; want the dropped one in %d-%d and the open one in %d-%d", from, h2.IP, closed, open, mid+1, hi, lo, mid)
			}
		}
		if n := strings.Count(stdout, "FAIL"); n != 2 {
			t.Errorf("%d failed rows, want 2 (the links into %s)", n, h2.IP)
		}
		t.Logf("half the ports blocked: %v\n%s", took.Round(time.Millisecond), stdout)
		noneLeft(t, c)
	})

	t.Run("program missing", func(t *testing.T) {
		hiddenFrom(t, c, h2, progDir)
		stdout, stderr, code, took := doctorIn(t, c, h0, agentDir, "-H", hosts, prog)
		if code != 1 {
			t.Fatalf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
		}
		st, rest := tableRow(t, stdout, h2.IP, "program")
		for _, want := range []string{prog + ": no such file or directory", "install " + prog + " on " + h2.IP} {
			if st != "FAIL" || !strings.Contains(rest, want) {
				t.Errorf("%s program: %s %q lacks %q", h2.IP, st, rest, want)
			}
		}
		for _, ip := range []string{h0.IP, h1.IP} {
			if st, rest := tableRow(t, stdout, ip, "program"); st != "ok" {
				t.Errorf("%s program: %s %s, want ok", ip, st, rest)
			}
		}
		if n := strings.Count(stdout, "FAIL"); n != 1 {
			t.Errorf("%d failed rows, want 1", n)
		}
		t.Logf("program missing: %v\n%s%s", took.Round(time.Millisecond), stdout, stderr)
		noneLeft(t, c)
	})
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// TestDoctorExitStatus: a failed check exits 1 (see TestDoctorNamespaceHosts);
// gorun doctor that cannot check at all exits 2, with the reason, so that a
// script tells the two apart.
func TestDoctorExitStatus(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"--min-free", "lots"}, nil, `--min-free "lots": want one byte count`},
		{[]string{"--hostfile", "/nonexistent/hosts.txt"}, nil, "/nonexistent/hosts.txt"},
		{[]string{"--no-such-flag"}, nil, "unknown flag: --no-such-flag"},
		{[]string{"prog", "arg"}, nil, "takes one PROGRAM"},
		{[]string{"--timeout", "-1s"}, nil, "--timeout must be positive"},
		{[]string{"--launcher", "srun"}, nil, "not inside a Slurm allocation"},
		{nil, []string{"SLURM_JOB_ID=7", "SLURM_JOB_NODELIST=node[1-2]", "SLURM_TASKS_PER_NODE=x"}, "Slurm job 7: SLURM_TASKS_PER_NODE"},
	} {
		stdout, stderr, code := run(t, append([]string{"SLURM_JOB_ID=", "SLURM_JOB_NODELIST="}, tc.env...), gorunBin, append([]string{"doctor"}, tc.args...)...)
		if code != 2 || !strings.Contains(stderr, "gorun doctor: ") || !strings.Contains(stderr, tc.want) || stdout != "" {
			t.Errorf("gorun doctor %v %v: exit %d, stdout %q, stderr %q; want 2 and %q, no table", tc.env, tc.args, code, stdout, stderr, tc.want)
		}
	}
}

// TestDoctorSlurmAllocationHosts: inside a Slurm allocation, without -H,
// gorun doctor checks the allocation's nodes with their slots, as a job
// would run on them. The nodes here are two names of this host, so that no
// srun is needed to reach them.
func TestDoctorSlurmAllocationHosts(t *testing.T) {
	stdout, stderr, code := run(t, []string{"SLURM_JOB_ID=7", "SLURM_JOB_NODELIST=localhost,127.0.0.1", "SLURM_TASKS_PER_NODE=2(x2)"},
		gorunBin, "doctor", "--agent-dir", t.TempDir(), "--max-clock-skew", "10s")
	if code != 0 && code != 1 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	// The first row names how hosts are reached: srun, in an allocation.
	for _, h := range []string{"localhost", "127.0.0.1"} {
		if st, rest := tableRow(t, stdout, h, "srun"); st != "ok" || !strings.Contains(rest, "this host") {
			t.Errorf("%s srun: %s %s", h, st, rest)
		}
	}
	for _, pair := range []string{"localhost -> 127.0.0.1", "127.0.0.1 -> localhost"} {
		if st, rest := tableRow(t, stdout, pair, "tcp"); st != "ok" && st != "WARN" {
			t.Errorf("%s: %s %s", pair, st, rest)
		}
	}
	if !strings.Contains(stderr, "on 2 hosts") {
		t.Errorf("stderr does not count the allocation's 2 hosts:\n%s", stderr)
	}
	// The open-file need is sized by the allocation's 4 slots.
	_, rest := tableRow(t, stdout, "localhost", "open files")
	if code == 1 && strings.Contains(rest, "below the") && !strings.Contains(rest, "a job of 4 ranks") {
		t.Errorf("open files row does not size the job by the allocation's slots: %s", rest)
	}
}

// TestDoctorSlurm runs gorun doctor in an sbatch allocation of two nodes
// (see internal/testenv/slurmtest), without -H: it checks the allocation's nodes,
// reaching node2 with srun (the nodes' sshd does not know a key of
// gorun's), which sends it the agent and runs it as a job step.
func TestDoctorSlurm(t *testing.T) {
	c := slurmtest.New(t, 2)
	agentDir := filepath.Join(t.TempDir(), "agents")
	start := time.Now()
	id, output := slurmBatch(t, c, "doctor", "--agent-dir", agentDir, "--verbose", testprogBin)
	state, exit := c.WaitJob(t, id, 90*time.Second)
	text, _ := os.ReadFile(output)
	t.Logf("sbatch job %s: %s, exit %s, after %v:\n%s", id, state, exit, time.Since(start).Round(time.Millisecond), text)
	if exit != "0:0" && exit != "1:0" {
		t.Fatalf("job %s ended %s, exit code %s, want the table's verdict (0 or 1)\n%s", id, state, exit, c.Logs())
	}
	table := string(text)
	if st, rest := tableRow(t, table, "node1", "srun"); st != "ok" || !strings.Contains(rest, "this host") {
		t.Errorf("node1 srun: %s %s, want this host", st, rest)
	}
	for _, check := range []string{"srun", "gorun", "program"} {
		if st, rest := tableRow(t, table, "node2", check); st != "ok" {
			t.Errorf("node2 %s: %s %s", check, st, rest)
		}
	}
	for _, pair := range []string{"node1 -> node2", "node2 -> node1"} {
		if st, rest := tableRow(t, table, pair, "tcp"); st == "FAIL" || !strings.HasPrefix(rest, "rtt ") {
			t.Errorf("%s: %s %s, want a measured link", pair, st, rest)
		}
	}
	if agents, _ := filepath.Glob(filepath.Join(agentDir, "gorun-doctor-agent-*")); len(agents) != 1 {
		t.Errorf("agent dir holds %v, want one agent", agents)
	}
	c.NoneLeft(t, 10*time.Second)
}
