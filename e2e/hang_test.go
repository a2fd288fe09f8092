package e2e

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/p2p"
)

// A rank that hangs makes the ranks waiting for it warn after the stall
// threshold; gorun, which hosts the rendezvous, then gathers every rank's
// state and prints one diagnosis naming the rank, its last call and what
// it does, and writes every rank's flight recorder to $GORUN_HANG_DIR.
func TestHangDiagnosisByGorun(t *testing.T) {
	for _, tc := range []struct {
		mode string
		// what the diagnosis says rank 1 does, after "it is in user code: "
		top string
	}{
		{"skip", `main\.waitForShutdown at hangprog/main\.go:\d+ \(goroutine 1, chan receive\)`},
		{"spin", `main\.spinInUserCode at hangprog/main\.go:\d+ \(goroutine 1, (running|runnable)\)`},
		{"syscall", `syscall\.\S+ <- .*syscall\.Read <- main\.blockInSyscall at hangprog/main\.go:\d+ \(goroutine 1, syscall\)`},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			prog := hangprog(t)
			dir := t.TempDir()
			start := time.Now()
			g := startGorun(t, "", []string{"HANGPROG_MODE=" + tc.mode, "HANGPROG_VICTIM=1", "GORUN_STALL_THRESHOLD=1s", p2p.EnvHangDir + "=" + dir},
				"-np", "3", "--timeout", "2m", prog)
			// Until both waiting ranks (0 and 2) point to gorun's
			// diagnosis, which they get after gorun printed it: whether
			// they asked within one gathering or one after the other,
			// gorun must have printed it once.
			if err := g.err.waitFor("the launcher printed a hang diagnosis", 2, 2*time.Minute, g.done); err != nil {
				t.Fatalf("gorun stderr: %v\nstdout:\n%s", err, g.out)
			}
			took := time.Since(start)
			g.cmd.Process.Signal(syscall.SIGINT)
			g.wait(t, time.Minute)
			if left := ranksAlive(t, g.cmd.Process.Pid); len(left) > 0 {
				t.Errorf("ranks left running: %v", left)
			}
			errOut := g.err.String()
			t.Logf("diagnosis after %v; gorun said:\n%s", took.Round(time.Millisecond), errOut)
			want := regexp.MustCompile(`(?m)^gorun: hang diagnosis: rank [02] waits in allreduce #3 "layer3.w" for rank 1; rank 1's last call was #2 and it is in user code: ` + tc.top + `$`)
			if !want.MatchString(errOut) {
				t.Errorf("gorun's stderr has no line matching\n%s", want)
			}
			if n := strings.Count(errOut, "gorun: hang diagnosis:"); n != 1 {
				t.Errorf("%d diagnoses printed, want 1", n)
			}
			// The ranks that wait warn without waiting for the diagnosis,
			// then say where it went, and do not print it again.
			if !regexp.MustCompile(`(?m)\[[0-9,]+\] .*gorun: stall warning: rank [02] has waited .* in call #3 Allreduce\(float32\[1024\], Sum, name="layer3.w"\).*ranks that have not entered it yet: rank 1 \(last entered #2\)$`).MatchString(errOut) {
				t.Errorf("no rank's stall warning names call #3 and rank 1 (alone on its line)")
			}
			m := regexp.MustCompile(`flight recorder \(its current call, its last calls and its stack\) is in (\S+\.json)`).FindStringSubmatch(errOut)
			if m == nil {
				t.Fatal("gorun names no dump file")
			}
			host, _ := os.Hostname()
			for _, r := range []int{0, 2} {
				if !strings.Contains(errOut, fmt.Sprintf("gorun: rank %d: the launcher printed a hang diagnosis of call #3 and wrote every rank's flight recorder to %s on host %s\n", r, m[1], host)) {
					t.Errorf("rank %d does not point to gorun's diagnosis and its dump %s", r, m[1])
				}
			}
			if filepath.Dir(m[1]) != dir {
				t.Errorf("dump %s is not in GORUN_HANG_DIR %s", m[1], dir)
			}
			b, err := os.ReadFile(m[1])
			if err != nil {
				t.Fatal(err)
			}
			var rep p2p.HangReport
			if err := json.Unmarshal(b, &rep); err != nil {
				t.Fatalf("the dump is not a hang report: %v", err)
			}
			if rep.Culprit != 1 || rep.Seq != 3 || len(rep.Ranks) != 3 {
				t.Fatalf("dump: culprit %d, call #%d, %d ranks; want 1, #3, 3", rep.Culprit, rep.Seq, len(rep.Ranks))
			}
			for r, s := range rep.Ranks {
				if s.Rank != r || s.PID == 0 || len(s.Recent) != 2 || s.Recent[0].Name != "layer1.w" || s.Recent[1].Name != "layer2.w" || s.Recent[1].Seq != 2 {
					t.Errorf("dump: rank %d: %+v; want rank %d with calls #1 layer1.w and #2 layer2.w finished", s.Rank, s, r)
					continue
				}
				if r == 1 {
					if s.Current != nil || len(s.Goroutines) == 0 || s.Goroutines[0].Role != "user" {
						t.Errorf("dump: rank 1 is in call %+v, goroutines %+v; want no call, a user goroutine first", s.Current, s.Goroutines)
					}
					continue
				}
				if s.Current == nil || s.Current.Seq != 3 || s.Current.Name != "layer3.w" || s.Current.Call != `Allreduce(float32[1024], Sum, name="layer3.w")` {
					t.Errorf("dump: rank %d's current call %+v, want #3 layer3.w", r, s.Current)
				}
				if len(s.Goroutines) == 0 || s.Goroutines[0].Role != "collective" {
					t.Errorf("dump: rank %d's first goroutine is not the collective's: %+v", r, s.Goroutines)
				}
			}
		})
	}
}

// Without gorun (torchrun's variables; rank 0 hosts the rendezvous), the
// rank that asked first for a diagnosis prints it after its stall warning;
// rank 0's process, which hosts the rendezvous, writes every rank's flight
// recorder to $GORUN_HANG_DIR; the other waiting rank says where both are.
func TestHangDiagnosisWithoutGorun(t *testing.T) {
	prog := hangprog(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir := t.TempDir()
	key := hex.EncodeToString(p2p.NewJobKey())
	const n = 3
	errs := make([]*watchedBuffer, n)
	exited := make(chan struct{}) // closed when any rank exits: it should not
	var once sync.Once
	for r := range n {
		cmd := exec.Command(prog)
		cmd.Env = append(os.Environ(), "RANK="+strconv.Itoa(r), "WORLD_SIZE=3", "LOCAL_RANK="+strconv.Itoa(r),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port), "GORUN_JOB_KEY="+key,
			"LOCAL_WORLD_SIZE=3", "GORUN_LISTEN_IP=127.0.0.1", "HANGPROG_MODE=syscall", "HANGPROG_VICTIM=1", "GORUN_STALL_THRESHOLD=1s", "GORUN_TIMEOUT=2m", p2p.EnvHangDir+"="+dir)
		errs[r] = newWatchedBuffer()
		cmd.Stdout, cmd.Stderr = new(syncBuf), errs[r]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); once.Do(func() { close(exited) }); close(done) }()
		t.Cleanup(func() { cmd.Process.Kill(); <-done })
	}
	for _, r := range []int{0, 2} { // the waiting ranks
		if err := errs[r].waitFor("hang diagnosis", 1, 2*time.Minute, exited); err != nil {
			t.Fatalf("rank %d: %v\nrank 0's stderr:\n%s\nrank 1's stderr:\n%s\nrank 2's stderr:\n%s", r, err, errs[0], errs[1], errs[2])
		}
	}
	// Wait for the full diagnosis's last line, printed after the first.
	first := -1
	for deadline := time.Now().Add(time.Minute); first < 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, r := range []int{0, 2} {
			if strings.Contains(errs[r].String(), "gorun: every rank's flight recorder") {
				first = r
			}
		}
	}
	if first < 0 {
		t.Fatalf("no rank printed where the dump is\nrank 0's stderr:\n%s\nrank 2's stderr:\n%s", errs[0], errs[2])
	}
	other := 2 - first
	w := errs[first].String()
	t.Logf("rank %d said:\n%s\nrank %d said:\n%s", first, w, other, errs[other])
	if !regexp.MustCompile(fmt.Sprintf(`(?m)gorun: stall warning: rank %d has waited \S+ in call #3 Allreduce\(float32\[1024\], Sum, name="layer3.w"\).*ranks that have not entered it yet: rank 1 \(last entered #2\)$`, first)).MatchString(w) {
		t.Errorf("rank %d's stall warning does not name call #3 and rank 1, alone on its line", first)
	}
	want := regexp.MustCompile(`(?m)gorun: hang diagnosis: rank [02] waits in allreduce #3 "layer3.w" for rank 1; rank 1's last call was #2 and it is in user code: syscall\.\S+ <- .*syscall\.Read <- main\.blockInSyscall at hangprog/main\.go:\d+ \(goroutine 1, syscall\)$`)
	if !want.MatchString(w) {
		t.Fatalf("rank %d's diagnosis does not match\n%s", first, want)
	}
	host, _ := os.Hostname()
	m := regexp.MustCompile(`gorun: every rank's flight recorder \(its current call, its last calls and its stack\) is in (\S+\.json) on host (\S+)`).FindStringSubmatch(w)
	if m == nil || m[2] != host {
		t.Fatalf("rank %d names no dump on host %s", first, host)
	}
	if filepath.Dir(m[1]) != dir {
		t.Errorf("dump %s is not in GORUN_HANG_DIR %s", m[1], dir)
	}
	if o := errs[other].String(); strings.Contains(o, "gorun: hang diagnosis:") || !strings.Contains(o, fmt.Sprintf("gorun: rank %d: hang diagnosis of call #3: rank %d printed it; every rank's flight recorder is in %s on host %s\n", other, first, m[1], host)) {
		t.Errorf("rank %d printed the diagnosis again, or does not point to rank %d's and the dump", other, first)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("%d files in GORUN_HANG_DIR, want the one dump", len(entries))
	}
	fi, err := os.Stat(m[1])
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("the dump's mode is %v, want 0600: it holds host names, PIDs and tensor names", fi.Mode().Perm())
	}
	b, err := os.ReadFile(m[1])
	if err != nil {
		t.Fatal(err)
	}
	var rep p2p.HangReport
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("the dump is not a hang report: %v", err)
	}
	if rep.Culprit != 1 || rep.Seq != 3 || len(rep.Ranks) != n || rep.Printed || rep.Requester != first {
		t.Fatalf("dump: culprit %d, call #%d, %d ranks, printed %v, requester %d; want 1, #3, 3, false, %d", rep.Culprit, rep.Seq, len(rep.Ranks), rep.Printed, rep.Requester, first)
	}
	for r, s := range rep.Ranks {
		if s.Rank != r || len(s.Recent) != 2 || (s.Current == nil) != (r == 1) || len(s.Goroutines) == 0 {
			t.Errorf("dump: rank %d: %+v", r, s)
		}
	}
}
