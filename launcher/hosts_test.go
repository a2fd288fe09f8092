package launcher

import (
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseHosts(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []Host
		err  string
	}{
		{"node1:2,node2:2", []Host{{"node1", 2}, {"node2", 2}}, ""},
		{"node1,node2:3", []Host{{"node1", 1}, {"node2", 3}}, ""},
		{"a:1,a:2", []Host{{"a", 3}}, ""},
		{"[fd00::1]:4,10.0.0.2:1", []Host{{"fd00::1", 4}, {"10.0.0.2", 1}}, ""},
		{"a:b", nil, `"b" is not a slot count`},
		{"a:0", nil, "is not a slot count"},
		{"a:2,,b:1", nil, "empty host"},
		{":2", nil, "empty host name"},
		{"a;rm:2", nil, "characters a host name cannot have"},
		{"-oProxyCommand=x:1", nil, "starts with '-'"},
	} {
		got, err := ParseHosts(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "write host:slots") {
				t.Errorf("ParseHosts(%q) error %v, want one containing %q and how to write it", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseHosts(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseHostfile(t *testing.T) {
	got, err := parseHostfile("h", strings.NewReader("# cluster\nnode1 slots=4\n\n  node2 slots=2 # gpu box\nnode3\n"))
	if want := []Host{{"node1", 4}, {"node2", 2}, {"node3", 1}}; err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, %v; want %v", got, err, want)
	}
	for in, want := range map[string]string{
		"node1 slots=x\n":  `line 1 "node1 slots=x": slots="x" is not a positive integer`,
		"node1 cpus=2\n":   `unknown field "cpus=2"`,
		"# nothing\n":      "lists no hosts",
		"a slots=1\nb;c\n": "has characters",
	} {
		if _, err := parseHostfile("h", strings.NewReader(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", in, err, want)
		}
	}
}

func TestPlace(t *testing.T) {
	p, err := place([]Host{{"a", 2}, {"b", 3}}, 4)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(p.host, []int{0, 0, 1, 1}) || !reflect.DeepEqual(p.localRank, []int{0, 1, 0, 1}) || !reflect.DeepEqual(p.localSize, []int{2, 2}) {
		t.Errorf("%+v", p)
	}
	if _, err := place([]Host{{"a", 1}}, 2); err == nil || !strings.Contains(err.Error(), "needs 2 slots") {
		t.Errorf("over-subscription: %v", err)
	}
}

func TestIsLocalHost(t *testing.T) {
	hn, _ := os.Hostname()
	for _, h := range []string{"localhost", "127.0.0.1", "::1", hn} {
		if !IsLocalHost(h) {
			t.Errorf("%s is not local", h)
		}
	}
	if IsLocalHost("192.0.2.77") || IsLocalHost("no-such-host.invalid") {
		t.Error("a foreign host counts as local")
	}
}

func TestEnvBlock(t *testing.T) {
	b, err := envBlock([]string{"A=1", "B=x y 'z' $HOME", "A=2"})
	if err != nil || string(b) != "A=2\nB=x y 'z' $HOME\n\n" {
		t.Errorf("%q %v", b, err)
	}
	for _, bad := range []string{"A=line\nbreak", "1A=x", "A-B=x"} {
		if _, err := envBlock([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// The wrapper, run by sh as ssh would run it, reads the environment from
// stdin, runs the program with it, and passes its exit status on.
func TestWrapperEnvAndStatus(t *testing.T) {
	dir := t.TempDir()
	cmdline := remoteCommand(time.Second, "127.0.0.1", dir, "sh", []string{"-c", `echo "$GORUN_JOB_KEY|$V|$(pwd)|$GORUN_LISTEN_IP|$1"; exit 3`, "x", "it's"})
	cmd := exec.Command("sh", "-c", cmdline)
	// Stdin stays open, as gorun keeps it: its end means "stop".
	inR, inW, _ := os.Pipe()
	defer inW.Close()
	cmd.Stdin = inR
	inW.Write([]byte("GORUN_JOB_KEY=s3cret\nV=a b 'c' \"d\" $X\n\n"))
	out, err := cmd.Output()
	inR.Close()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
		t.Fatalf("exit %v, want status 3; output %q", err, out)
	}
	want := "s3cret|a b 'c' \"d\" $X|" + dir + "|127.0.0.1|it's\n"
	if string(out) != want {
		t.Errorf("output %q, want %q", out, want)
	}
	if strings.Contains(cmdline, "s3cret") {
		t.Error("the key is on the command line")
	}
}

// Closing the wrapper's stdin (gorun stopped, or ssh lost) stops the program
// and everything it started: SIGTERM, then SIGKILL after the grace period.
func TestWrapperStopsOnStdinEOF(t *testing.T) {
	dir := t.TempDir()
	// The program ignores SIGTERM and starts a child: both must die.
	prog := `trap "" TERM; sleep 3117 & echo started; wait`
	cmd := exec.Command("sh", "-c", remoteCommand(300*time.Millisecond, "127.0.0.1", dir, "sh", []string{"-c", prog}))
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	in.Write([]byte("A=1\n\n"))
	buf := make([]byte, 8)
	if n, _ := out.Read(buf); !strings.HasPrefix(string(buf[:n]), "started") {
		t.Fatalf("read %q", buf[:n])
	}
	start := time.Now()
	in.Close()
	err := cmd.Wait()
	el := time.Since(start)
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 128+9 {
		t.Errorf("wrapper ended with %v, want status 137 (SIGKILL)", err)
	}
	if el < 250*time.Millisecond || el > 5*time.Second {
		t.Errorf("stopped after %v, want about the 300ms grace", el)
	}
	time.Sleep(100 * time.Millisecond)
	if out, _ := exec.Command("pgrep", "-f", "sleep 3117").Output(); len(out) > 0 {
		t.Errorf("the program's child survived: pids %s", out)
	}
}
