package doctor

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"
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
		h := HostResult{Name: name, Facts: goodFacts(), SSHTime: 50 * time.Millisecond, SkewErr: time.Millisecond, Addr: "10.0.0.1:40000"}
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
	}
	pairs := []PairResult{
		{From: "b", To: "a", Dialed: true, RTT: 80 * time.Microsecond, Bandwidth: 1 << 30},
		{From: "a", To: "b", Dialed: true, RTT: 90 * time.Microsecond, Bandwidth: 1 << 30},
		{From: "a", To: "c", Addr: "10.0.0.3:41000", Err: "no answer within 1s (packets dropped: a firewall?)"},
		{From: "c", To: "a", Dialed: true, RTT: 70 * time.Microsecond, Bandwidth: 1 << 30},
		{From: "c", To: "b", Dialed: true, RTT: 70 * time.Microsecond, Bandwidth: 10 << 20},
		{From: "b", To: "c", Dialed: true, Err: "bandwidth: sent 100 bytes, 50 arrived"},
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
		{"a -> b", "tcp", OK, "rtt 90µs, 1.0 GiB/s", ""},
		{"a -> c", "tcp", Fail, "cannot open a connection to c's port 41000: no answer within 1s", "allow TCP from a (10.0.0.1) into c on ports 32768-60999"},
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
	if got := Failed(rows); got != 11 {
		t.Errorf("Failed = %d, want 11", got)
	}
	// Hosts first, in order, then the pairs sorted by host order.
	var pairOrder []string
	for _, r := range rows {
		if strings.Contains(r.Where, " -> ") {
			pairOrder = append(pairOrder, r.Where)
		}
	}
	if got := strings.Join(pairOrder, ","); got != "a -> b,a -> c,b -> a,b -> c,c -> a,c -> b" {
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
		if !p.Dialed || p.Err != "" || p.RTT <= 0 || p.Bytes <= 0 || p.Bandwidth <= 0 || p.From == p.To {
			t.Errorf("pair %+v: want a dial, a round trip and a transfer", p)
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
	if !r.Dialed || r.Err != "" || r.Bytes <= 0 {
		t.Errorf("probe with the token: %+v", r)
	}
}
