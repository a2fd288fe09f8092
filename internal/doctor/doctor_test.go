package doctor

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/launcher"
)

// TestMain lets this test binary stand in for gorun's doctor-agent
// command, so that Run can start real agents without building gorun.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "doctor-agent" {
		var o AgentOptions
		fs := flag.NewFlagSet("doctor-agent", flag.ExitOnError)
		fs.StringVar(&o.Host, "host", "", "")
		fs.StringVar(&o.Program, "program", "", "")
		fs.StringVar(&o.WorkDir, "workdir", "", "")
		fs.StringVar(&o.CheckpointDir, "checkpoint-dir", "", "")
		fs.DurationVar(&o.Lifetime, "lifetime", time.Minute, "")
		fs.Parse(os.Args[2:])
		if err := RunAgent(context.Background(), os.Stdin, os.Stdout, o); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func goodFacts() *Facts {
	return &Facts{
		Hostname: "n", OS: "linux", Arch: "amd64", AgentSHA256: "agentsha", Version: "v1.2.0",
		WorkDir:        "/work",
		Program:        &ProgramFacts{Path: "/bin/train", Resolved: "/bin/train", Size: 1 << 20, SHA256: "aaaa", Gorun: "v1.2.0"},
		CheckpointDir:  "/ckpt",
		CheckpointFree: 100 << 30,
		NoFileSoft:     1024, NoFileHard: 65536, PortRange: "32768 60999",
	}
}

// row finds the one row for where and check.
func row(t *testing.T, rows []Row, where, check string) Row {
	t.Helper()
	var found []Row
	for _, r := range rows {
		if r.Where == where && r.Check == check {
			found = append(found, r)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d rows for %s %s, want 1: %+v", len(found), where, check, rows)
	}
	return found[0]
}

func TestDoctorEvaluateVerdicts(t *testing.T) {
	want := Expect{Program: "/bin/train", Version: "v1.2.0", AgentSHA256: "agentsha", Slots: 8, MinFree: 1 << 30, MaxSkew: time.Second}
	host := func(name string, edit func(*HostResult)) HostResult {
		h := HostResult{Name: name, Facts: goodFacts(), SSHTime: 50 * time.Millisecond, SkewErr: time.Millisecond, Addrs: []string{"10.0.0.1:40000", "10.0.0.1:55000"}}
		if edit != nil {
			edit(&h)
		}
		return h
	}
	hosts := []HostResult{
		host("a", func(h *HostResult) { h.Local = true }),
		host("b", nil),
		host("c", nil),
		host("down", func(h *HostResult) {
			h.SSHErr = "ssh: connect to host down port 22: Connection timed out"
			h.Facts = nil
		}),
		host("noprog", func(h *HostResult) {
			h.Facts.Program = &ProgramFacts{Path: "/bin/train", Resolved: "/bin/train", Err: "/bin/train: no such file or directory"}
		}),
		host("otherbuild", func(h *HostResult) { h.Facts.Program.SHA256 = "bbbb"; h.Facts.Program.Gorun = "v1.1.0" }),
		host("skewed", func(h *HostResult) { h.Skew = -3 * time.Second }),
		host("full", func(h *HostResult) { h.Facts.CheckpointFree = 10 << 20 }),
		host("ro", func(h *HostResult) { h.Facts.CheckpointErr = "not writable: /ckpt: permission denied" }),
		host("fewfiles", func(h *HostResult) { h.Facts.NoFileHard = 1024 }),
		host("nowd", func(h *HostResult) {
			h.Facts.WorkDirErr = "cannot enter the working directory: /work: no such file or directory"
		}),
		host("stale", func(h *HostResult) { h.Facts.AgentSHA256 = "old" }),
		host("shareddir", func(h *HostResult) {
			h.Facts = nil
			h.AgentDirErr = "/tmp/agents is writable by other users: drwxrwxrwt 2 root root 40 /tmp/agents"
		}),
	}
	open := []PortDial{{Addr: "10.0.0.9:33000"}, {Addr: "10.0.0.9:50000"}}
	dropped := "no answer within 1s (packets dropped: a firewall?)"
	pairs := []PairResult{
		{From: "b", To: "a", Ports: open, RTT: 80 * time.Microsecond, Bandwidth: 1 << 30},
		{From: "a", To: "b", Ports: open, RTT: 90 * time.Microsecond, Bandwidth: 1 << 30},
		{From: "a", To: "c", Ports: []PortDial{{Addr: "10.0.0.3:41000", Err: dropped}, {Addr: "10.0.0.3:52000", Err: dropped}}},
		{From: "c", To: "a", Ports: open, RTT: 70 * time.Microsecond, Bandwidth: 1 << 30},
		{From: "c", To: "b", Ports: open, RTT: 70 * time.Microsecond, Bandwidth: 10 << 20},
		{From: "b", To: "c", Ports: open, Err: "bandwidth: sent 100 bytes, 50 arrived"},
		// A firewall that lets in only the low half of the range.
		{From: "skewed", To: "a", Err: "the probe did not finish: gorun doctor did not finish within --timeout 30s"},
		{From: "nowd", To: "b", Ports: []PortDial{{Addr: "[fd00::4]:33000"}, {Addr: "[fd00::4]:52000", Err: dropped}}},
	}
	rows := Evaluate(hosts, pairs, want)

	for _, tc := range []struct {
		where, check string
		status       Status
		result, fix  string
	}{
		{"a", "ssh", OK, "this host", ""},
		{"b", "ssh", OK, "reached in 50ms", ""},
		{"b", "program", OK, "/bin/train: 1.0 MiB, sha256 aaaa", ""},
		{"b", "gorun version", OK, "links gorun v1.2.0", ""},
		{"down", "ssh", Fail, "Connection timed out", "make `ssh down true` work"},
		{"noprog", "program", Fail, "no such file or directory", "install /bin/train on noprog"},
		{"otherbuild", "program", Fail, "differs from a's", "copy the same build"},
		{"otherbuild", "gorun version", Warn, "links gorun v1.1.0, this gorun is v1.2.0", "same gorun version"},
		{"skewed", "clock", Fail, "-3s off", "NTP"},
		{"full", "checkpoint space", Fail, "10.0 MiB free, below --min-free 1.0 GiB", "free space on full's"},
		{"ro", "checkpoint space", Fail, "permission denied", "writable by the ssh user"},
		{"fewfiles", "open files", Fail, "hard limit 1024", fmt.Sprintf("to %d or more", NoFileNeed(8))},
		{"nowd", "workdir", Fail, "no such file", "create /work on nowd"},
		{"stale", "gorun", Fail, "not this gorun", "remove the agent cache on stale"},
		{"shareddir", "gorun", Fail, "agent directory is unsafe, no agent was run from it: /tmp/agents is writable by other users", "chmod 700 DIR"},
		{"a -> b", "tcp", OK, "rtt 90µs, 1.0 GiB/s; ports 33000 and 50000 open", ""},
		{"a -> c", "tcp", Fail, "cannot open a connection to c's ports 41000 and 52000: no answer within 1s", "allow TCP from a (10.0.0.1) into c on ports 32768-60999"},
		{"skewed -> a", "tcp", Fail, "no result: the probe did not finish: gorun doctor did not finish within --timeout 30s", "longer --timeout"},
		{"nowd -> b", "tcp", Fail, "cannot open a connection to b's port 52000: no answer within 1s (packets dropped: a firewall?) (its port 33000 opened: only part of the ephemeral range is allowed)", "allow TCP from nowd (10.0.0.1) into b on ports 32768-60999"},
		{"b -> c", "tcp", Fail, "connected, then the probe failed", "MTU"},
		{"c -> b", "tcp", Warn, "a tenth or less of the median", "slows every collective"},
	} {
		r := row(t, rows, tc.where, tc.check)
		if r.Status != tc.status || !strings.Contains(r.Result, tc.result) || !strings.Contains(r.Fix, tc.fix) {
			t.Errorf("%s %s: got %s %q fix %q; want %s, result with %q, fix with %q", tc.where, tc.check, r.Status, r.Result, r.Fix, tc.status, tc.result, tc.fix)
		}
		if r.Status == Fail && r.Fix == "" {
			t.Errorf("%s %s failed without a fix", tc.where, tc.check)
		}
	}
	// A host ssh cannot reach has no further rows.
	for _, r := range rows {
		if r.Where == "down" && r.Check != "ssh" {
			t.Errorf("row for unreachable host: %+v", r)
		}
	}
	if got := Failed(rows); got != 14 {
		t.Errorf("Failed = %d, want 14", got)
	}
	// Hosts first, in order, then the pairs sorted by host order.
	var pairOrder []string
	for _, r := range rows {
		if strings.Contains(r.Where, " -> ") {
			pairOrder = append(pairOrder, r.Where)
		}
	}
	if got := strings.Join(pairOrder, ","); got != "a -> b,a -> c,b -> a,b -> c,c -> a,c -> b,skewed -> a,nowd -> b" {
		t.Errorf("pair order %s", got)
	}
}

func TestDoctorWriteTable(t *testing.T) {
	var b bytes.Buffer
	WriteTable(&b, []Row{
		{"node1", "ssh", OK, "reached in 50ms", ""},
		{"node1 -> node2", "tcp", Fail, "no\tanswer", "allow TCP"},
	})
	want := "HOST            CHECK  STATUS  RESULT\n" +
		"node1           ssh    ok      reached in 50ms\n" +
		"node1 -> node2  tcp    FAIL    no answer\n" +
		"                               fix: allow TCP\n"
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestDoctorModuleVersion(t *testing.T) {
	for _, tc := range []struct {
		bi   debug.BuildInfo
		want string
	}{
		{debug.BuildInfo{Main: debug.Module{Path: Module, Version: "v1.3.0"}}, "v1.3.0"},
		{debug.BuildInfo{Main: debug.Module{Path: Module, Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "true"}}}, "devel 0123456789ab+dirty"},
		{debug.BuildInfo{Main: debug.Module{Path: Module, Version: "(devel)"}}, "(devel)"},
		{debug.BuildInfo{Main: debug.Module{Path: "example.com/train"}, Deps: []*debug.Module{{Path: Module, Version: "v1.2.0"}}}, "v1.2.0"},
		{debug.BuildInfo{Main: debug.Module{Path: "example.com/train"}, Deps: []*debug.Module{{Path: Module, Version: "v1.2.0", Replace: &debug.Module{Path: "../gorun"}}}}, "(replaced by ../gorun)"},
		{debug.BuildInfo{Main: debug.Module{Path: "example.com/other"}}, ""},
	} {
		if got := moduleVersion(&tc.bi); got != tc.want {
			t.Errorf("moduleVersion(%+v) = %q, want %q", tc.bi.Main, got, tc.want)
		}
	}
}

// TestDoctorRunLocalAgents runs two real agents on this host (this test binary
// standing in for gorun): both report their facts, the missing program is
// named, and each dials and measures the other.
func TestDoctorRunLocalAgents(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	prog := filepath.Join(dir, "train")
	want := Expect{Program: prog, Version: Version(), Slots: 2, MaxSkew: time.Second}
	res, pairs, err := Run(context.Background(), Config{
		Hosts: []string{"localhost", "127.0.0.1"}, Local: func(string) bool { return true },
		Expect: want, WorkDir: dir, CheckpointDir: filepath.Join(dir, "ckpt-{host}"), Self: self,
		Timeout: 30 * time.Second, DialTimeout: time.Second, ProbeBytes: 4 << 20, ProbeTime: 200 * time.Millisecond,
		Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	want.AgentSHA256, _, _ = fileSHA256(self)
	rows := Evaluate(res, pairs, want)
	var table bytes.Buffer
	WriteTable(&table, rows)
	t.Logf("\n%s", table.String())
	for _, h := range []string{"localhost", "127.0.0.1"} {
		r := row(t, rows, h, "program")
		if r.Status != Fail || !strings.Contains(r.Result, prog+": no such file or directory") {
			t.Errorf("%s program: %+v, want the missing %s named", h, r, prog)
		}
		if r := row(t, rows, h, "checkpoint space"); r.Status != OK || !strings.Contains(r.Result, "ckpt-"+h+" (not yet created; "+dir+" exists)") {
			t.Errorf("%s checkpoint space: %+v", h, r)
		}
		if r := row(t, rows, h, "gorun"); r.Status != OK {
			t.Errorf("%s gorun: %+v", h, r)
		}
	}
	if len(pairs) != 2 {
		t.Fatalf("%d pairs, want 2: %+v", len(pairs), pairs)
	}
	for _, p := range pairs {
		if !p.Dialed() || len(p.Ports) != 2 || p.Err != "" || p.RTT <= 0 || p.Bytes <= 0 || p.Bandwidth <= 0 || p.From == p.To {
			t.Errorf("pair %+v: want two ports dialed, a round trip and a transfer", p)
		}
		lo, hi := portRange()
		mid := lo + (hi-lo)/2
		var ports []int
		for _, d := range p.Ports {
			_, port, _ := net.SplitHostPort(d.Addr)
			n, _ := strconv.Atoi(port)
			ports = append(ports, n)
		}
		if len(ports) == 2 && !(lo <= ports[0] && ports[0] <= mid && mid < ports[1] && ports[1] <= hi) {
			t.Errorf("pair %s -> %s: ports %v, want one in %d-%d and one in %d-%d", p.From, p.To, ports, lo, mid, mid+1, hi)
		}
	}
	if got := Failed(rows); got != 2 {
		t.Errorf("Failed = %d, want 2 (the program on each host)", got)
	}
}

// A connection without the run's token gets nothing back.
func TestDoctorServeRefusesStrangers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	token := []byte(strings.Repeat("ab", 16))
	go serve(ctx, ln, token)
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write(append([]byte(strings.Repeat("cd", 16)), opPing))
	c.Write(make([]byte, 8))
	if n, err := io.ReadFull(c, make([]byte, 8)); err == nil || n != 0 {
		t.Errorf("a stranger got %d bytes back (err %v)", n, err)
	}
	r := probe(ctx, ln.Addr().String(), token, time.Second, 1<<20, 100*time.Millisecond)
	if r.Err != "" || r.RTT <= 0 || r.Bytes <= 0 {
		t.Errorf("probe with the token: %+v", r)
	}
}

// On a tie the build of the first of the tied hosts, in the hosts' order,
// is the reference, whatever order the counts reach the tie in.
func TestDoctorMajoritySHATie(t *testing.T) {
	build := func(name, sha string) HostResult {
		f := goodFacts()
		f.Program.SHA256 = sha
		return HostResult{Name: name, Facts: f}
	}
	for _, tc := range []struct {
		hosts          []HostResult
		wantSHA, wantH string
	}{
		// y reaches 2 first, x ties it last: x, the first host's, wins.
		{[]HostResult{build("a", "x"), build("b", "y"), build("c", "y"), build("d", "x")}, "x", "a"},
		{[]HostResult{build("a", "x"), build("b", "y")}, "x", "a"},
		// The first host has no program: the first of the tied hosts wins.
		{[]HostResult{{Name: "down"}, build("b", "y"), build("c", "x"), build("d", "x"), build("e", "y")}, "y", "b"},
		// A majority wins over the first host.
		{[]HostResult{build("a", "x"), build("b", "y"), build("c", "y")}, "y", "b"},
		{[]HostResult{{Name: "down"}}, "", ""},
	} {
		sha, host := majoritySHA(tc.hosts)
		if sha != tc.wantSHA || host != tc.wantH {
			var names []string
			for _, h := range tc.hosts {
				names = append(names, h.Name)
			}
			t.Errorf("majoritySHA(%v) = %q, %q; want %q, %q", names, sha, host, tc.wantSHA, tc.wantH)
		}
	}
}

// fakeSSH is an "ssh" that runs the command line on this host, as sshd's
// shell would, so that the remote path of Run (install, then run the
// agent from the agent directory) runs without an ssh server.
func fakeSSH(t *testing.T) string {
	t.Helper()
	name := filepath.Join(t.TempDir(), "ssh")
	script := "#!/bin/sh\nwhile [ $# -gt 0 ] && [ \"$1\" != -- ]; do shift; done\nshift 2\nexec sh -c \"$1\"\n"
	if err := os.WriteFile(name, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return name
}

// TestDoctorAgentCacheTrust: what runs from the agent directory runs as the
// user, so a directory others may write or own is refused, and a file under
// the agent's name that is not this gorun is replaced, never run.
func TestDoctorAgentCacheTrust(t *testing.T) {
	if _, err := exec.LookPath("sha256sum"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("sha256sum not found under CI=true (apt-get install coreutils)")
		}
		t.Skip("sha256sum not found")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	selfSHA, _, err := fileSHA256(self)
	if err != nil {
		t.Fatal(err)
	}
	agentName := "gorun-doctor-agent-" + selfSHA[:16]
	ssh := fakeSSH(t)
	work := t.TempDir()
	run := func(t *testing.T, agentDir string) Row {
		t.Helper()
		want := Expect{Version: Version(), Slots: 1, MaxSkew: time.Second}
		res, pairs, err := Run(context.Background(), Config{
			Hosts: []string{"remote"}, Local: func(string) bool { return false },
			Expect: want, WorkDir: work, Self: self, AgentDir: agentDir,
			SSH:     launcher.SSH{Command: ssh},
			Timeout: 30 * time.Second, DialTimeout: time.Second, ProbeTime: 100 * time.Millisecond,
			Logf: t.Logf,
		})
		if err != nil {
			t.Fatal(err)
		}
		want.AgentSHA256 = selfSHA
		return row(t, Evaluate(res, pairs, want), "remote", "gorun")
	}
	// plant puts a program under the agent's name that leaves a mark if
	// it is ever run.
	plant := func(t *testing.T, dir string) string {
		t.Helper()
		mark := filepath.Join(t.TempDir(), "planted-ran")
		if err := os.WriteFile(filepath.Join(dir, agentName), []byte("#!/bin/sh\ntouch "+mark+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return mark
	}
	ran := func(mark string) bool { _, err := os.Stat(mark); return err == nil }

	t.Run("fresh directory", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "cache", "doctor")
		if r := run(t, dir); r.Status != OK {
			t.Fatalf("gorun row %+v, want ok", r)
		}
		st, err := os.Stat(dir)
		if err != nil || st.Mode().Perm() != 0o700 {
			t.Errorf("agent directory %s: %v %v, want mode 0700", dir, st.Mode(), err)
		}
		if sum, _, _ := fileSHA256(filepath.Join(dir, agentName)); sum != selfSHA {
			t.Errorf("stored agent sha256 %q, want this binary's %s", sum, selfSHA)
		}
	})
	t.Run("planted binary replaced", func(t *testing.T) {
		dir := t.TempDir()
		mark := plant(t, dir)
		if r := run(t, dir); r.Status != OK {
			t.Fatalf("gorun row %+v, want ok", r)
		}
		if ran(mark) {
			t.Error("the planted program under the agent's name was run")
		}
		if sum, _, _ := fileSHA256(filepath.Join(dir, agentName)); sum != selfSHA {
			t.Errorf("stored agent sha256 %q, want it replaced by this binary's %s", sum, selfSHA)
		}
	})
	t.Run("writable by others", func(t *testing.T) {
		dir := t.TempDir()
		mark := plant(t, dir)
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		r := run(t, dir)
		if r.Status != Fail || !strings.Contains(r.Result, dir+" is writable by other users") || !strings.Contains(r.Fix, "chmod 700") {
			t.Errorf("gorun row %+v, want a failure naming %s and a fix", r, dir)
		}
		if ran(mark) {
			t.Error("a program from a world-writable agent directory was run")
		}
	})
	t.Run("owned by another user", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root to give a directory to another user")
		}
		dir := filepath.Join(t.TempDir(), "theirs")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		mark := plant(t, dir)
		if err := os.Chown(dir, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		r := run(t, dir)
		if r.Status != Fail || !strings.Contains(r.Result, dir+" is not owned by") {
			t.Errorf("gorun row %+v, want a failure naming %s's owner", r, dir)
		}
		if ran(mark) {
			t.Error("a program from another user's agent directory was run")
		}
	})
	// The session that runs the agent checks it again: a file swapped in
	// after the install session is not run.
	t.Run("swapped before run", func(t *testing.T) {
		dir := t.TempDir()
		mark := plant(t, dir)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, "sh", "-c", runScript, "gorun-doctor", dir, agentName, selfSHA, "--host", "x")
		cmd.Stderr = &stderr
		if err := cmd.Run(); err == nil || !strings.Contains(stderr.String(), "is not this gorun") {
			t.Errorf("runScript with a swapped agent: %v, stderr %q; want a refusal", err, stderr.String())
		}
		if ran(mark) {
			t.Error("runScript ran a file whose sha256 is not this gorun's")
		}
	})
	// It checks the directory again too: one made writable by others
	// after the install session is refused before anything in it runs.
	t.Run("made unsafe before run", func(t *testing.T) {
		dir := t.TempDir()
		mark := plant(t, dir)
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, "sh", "-c", runScript, "gorun-doctor", dir, agentName, selfSHA, "--host", "x")
		cmd.Stderr = &stderr
		if err := cmd.Run(); err == nil || !strings.Contains(stderr.String(), dir+" is writable by other users") || !strings.Contains(stderr.String(), "was not run") {
			t.Errorf("runScript in a world-writable directory: %v, stderr %q; want a refusal naming %s", err, stderr.String(), dir)
		}
		if ran(mark) {
			t.Error("runScript ran a program from a world-writable directory")
		}
		// The doctor reports that refusal as an unsafe directory, in the
		// words of the install session's check.
		a := &agentConn{stderr: &lockedBuf{}}
		a.stderr.Write(stderr.Bytes())
		if msg, ok := a.unsafeDirRefusal(); !ok || msg != dir+" is writable by other users: "+strings.TrimSpace(lsOf(t, dir)) {
			t.Errorf("unsafeDirRefusal() = %q, %v; want %s named as writable by other users", msg, ok, dir)
		}
	})
}

// lsOf is ls -ldL's line for path, as the scripts quote it.
func lsOf(t *testing.T, path string) string {
	t.Helper()
	out, err := exec.Command("ls", "-ldL", path).Output()
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}
