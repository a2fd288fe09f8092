package collective

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorun/gorun/p2p"
)

// TestMain keeps the hang diagnoses of this package's tests (any test
// whose collective waits past its stall threshold writes one) out of the
// system's temporary directory: they go to a directory removed at the end.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gorun-collective-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv(p2p.EnvHangDir, dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// spinInUserCode stands for user code that never returns (an endless loop
// in a data loader): it spins until stop is set.
//
//go:noinline
func spinInUserCode(stop *atomic.Bool) (n int) {
	for !stop.Load() {
		n++
	}
	return n
}

// Without a launcher (the rendezvous runs in a rank's process), the rank
// that waits past the stall threshold prints the hang diagnosis in its
// stall warning and writes every rank's flight recorder to
// $GORUN_HANG_DIR: here rank 1 spins in user code instead of making its
// second call, and the diagnosis names it, its last call and the function.
func TestHangDiagnosisWithoutLauncher(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(p2p.EnvHangDir, dir)
	warnings := make(chan string, 16)
	logf := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		if strings.Contains(msg, "stall warning") {
			select {
			case warnings <- msg:
			default:
			}
		}
		t.Log(msg)
	}
	comms := newJob(t, 3, WithStallThreshold(time.Second), WithTimeout(2*time.Minute), WithLogger(logf))
	ctx := context.Background()
	var stop atomic.Bool
	diagnosed := make(chan string, 1)
	go func() { // ends the spin once the diagnosis is out, or after a bound
		defer stop.Store(true)
		deadline := time.After(time.Minute)
		for {
			select {
			case w := <-warnings:
				if strings.Contains(w, "hang diagnosis") {
					diagnosed <- w
					return
				}
			case <-deadline:
				return
			}
		}
	}()
	mustAll(t, onEach(comms, func(c *Comm) error {
		if err := c.Allreduce(ctx, make([]float32, 8), Sum, Name("layer1.w")); err != nil {
			return err
		}
		if c.Rank() == 1 {
			spinInUserCode(&stop)
		}
		return c.Allreduce(ctx, make([]float32, 8), Sum, Name("layer2.w"))
	}))
	var w string
	select {
	case w = <-diagnosed:
	default:
		t.Fatal("no stall warning with a hang diagnosis within a minute")
	}
	t.Logf("warning: %s", w)
	want := regexp.MustCompile(`hang diagnosis: rank [02] waits in allreduce #2 "layer2.w" for rank 1; rank 1's last call was #1 and it is in user code: .*collective\.spinInUserCode at collective/hang_test\.go:\d+ \(goroutine \d+, (running|runnable)\)`)
	if !want.MatchString(w) {
		t.Fatalf("the warning does not name rank 1, its last call and spinInUserCode:\n%s", w)
	}
	if !strings.Contains(w, "ranks that have not entered it yet: rank 1 (last entered #1)") {
		t.Errorf("the warning lost its list of ranks that have not entered the call:\n%s", w)
	}
	m := regexp.MustCompile(`every rank's flight recorder is in (\S+\.json)`).FindStringSubmatch(w)
	if m == nil {
		t.Fatalf("the warning names no dump file:\n%s", w)
	}
	rep := readHangReport(t, m[1])
	if rep.Culprit != 1 || rep.Seq != 2 || len(rep.Ranks) != 3 {
		t.Fatalf("dump: culprit %d, seq %d, %d ranks; want 1, 2, 3", rep.Culprit, rep.Seq, len(rep.Ranks))
	}
	for r, s := range rep.Ranks {
		if s.Rank != r || len(s.Recent) != 1 || s.Recent[0].Seq != 1 || s.Recent[0].Name != "layer1.w" || s.Recent[0].Kind != "allreduce" {
			t.Errorf("dump: rank %d's state %+v: want rank %d with call #1 layer1.w finished", s.Rank, s, r)
		}
		if inCall := s.Current != nil; inCall != (r != 1) {
			t.Errorf("dump: rank %d current call %+v", r, s.Current)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) == 0 {
		t.Error("no dump in GORUN_HANG_DIR")
	}
}

func readHangReport(t *testing.T, path string) *p2p.HangReport {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rep p2p.HangReport
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("%s is not a hang report: %v", path, err)
	}
	return &rep
}
