package collective

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
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

// Without a launcher (the rendezvous runs in a rank's process), the ranks
// that wait past the stall threshold print their stall warning at once,
// then the hang diagnosis on lines of their own: the rank that asked first
// prints it, the other says who did and where the dump is. The rendezvous
// wrote every rank's flight recorder to $GORUN_HANG_DIR. Here rank 1 spins
// in user code instead of making its second call, and the diagnosis names
// it, its last call and the function.
func TestHangDiagnosisWithoutLauncher(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(p2p.EnvHangDir, dir)
	var (
		mu    sync.Mutex
		lines []string // the stall warnings and diagnosis lines, in order
	)
	// Both waiting ranks have said what they had to: one the diagnosis
	// and the dump, the other where they are.
	done := func() bool {
		full, dump, pointer := false, false, false
		for _, l := range lines {
			full = full || strings.HasPrefix(l, "gorun: hang diagnosis: ")
			dump = dump || strings.HasPrefix(l, "gorun: every rank's flight recorder")
			pointer = pointer || strings.Contains(l, "hang diagnosis of call #2: rank")
		}
		return full && dump && pointer
	}
	allSaid := make(chan struct{})
	var said sync.Once
	logf := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		if strings.HasPrefix(msg, "gorun: ") && (strings.Contains(msg, "stall warning") || strings.Contains(msg, "hang diagnosis") || strings.Contains(msg, "flight recorder")) {
			mu.Lock()
			lines = append(lines, msg)
			if done() {
				said.Do(func() { close(allSaid) })
			}
			mu.Unlock()
		}
		t.Log(msg)
	}
	comms := newJob(t, 3, WithStallThreshold(time.Second), WithTimeout(2*time.Minute), WithLogger(logf))
	ctx := context.Background()
	var stop atomic.Bool
	go func() { // ends the spin once the diagnosis is out, or after a bound
		// Blocked, not polling: a busy goroutine of this file would be
		// the user code the diagnosis names.
		defer stop.Store(true)
		select {
		case <-allSaid:
		case <-time.After(time.Minute):
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
	mu.Lock()
	defer mu.Unlock()
	t.Logf("said:\n%s", strings.Join(lines, "\n"))
	if !done() {
		t.Fatal("no hang diagnosis from both waiting ranks within a minute")
	}
	var full, dumpLine, pointer []string
	firstWarning, firstDiagnosis := -1, -1
	for i, l := range lines {
		switch {
		case strings.Contains(l, "stall warning"):
			if strings.Contains(l, "hang diagnosis") {
				t.Errorf("a stall warning waits for the diagnosis: %s", l)
			}
			if !strings.Contains(l, "ranks that have not entered it yet: rank 1 (last entered #1)") {
				t.Errorf("the warning lost its list of ranks that have not entered the call:\n%s", l)
			}
			if firstWarning < 0 {
				firstWarning = i
			}
		case strings.HasPrefix(l, "gorun: hang diagnosis: "):
			full = append(full, l)
			firstDiagnosis = i
		case strings.HasPrefix(l, "gorun: every rank's flight recorder"):
			dumpLine = append(dumpLine, l)
		case strings.Contains(l, "hang diagnosis of call #2: rank"):
			pointer = append(pointer, l)
		}
	}
	if len(full) != 1 || len(dumpLine) != 1 || len(pointer) != 1 {
		t.Fatalf("%d diagnoses, %d dump lines, %d pointers to them; want 1 each (one per job, not per rank)", len(full), len(dumpLine), len(pointer))
	}
	if firstWarning < 0 || firstWarning > firstDiagnosis {
		t.Errorf("the first stall warning (line %d) does not come before the diagnosis (line %d)", firstWarning, firstDiagnosis)
	}
	want := regexp.MustCompile(`^gorun: hang diagnosis: rank [02] waits in allreduce #2 "layer2.w" for rank 1; rank 1's last call was #1 and it is in user code: .*collective\.spinInUserCode at collective/hang_test\.go:\d+ \(goroutine \d+, (running|runnable)\)$`)
	if !want.MatchString(full[0]) {
		t.Fatalf("the diagnosis does not name rank 1, its last call and spinInUserCode:\n%s", full[0])
	}
	host, _ := os.Hostname()
	m := regexp.MustCompile(`is in (\S+\.json) on host (\S+)$`).FindStringSubmatch(dumpLine[0])
	if m == nil || m[2] != host || filepath.Dir(m[1]) != dir {
		t.Fatalf("the dump line names no dump in %s on host %s:\n%s", dir, host, dumpLine[0])
	}
	rep := readHangReport(t, m[1])
	if rep.Culprit != 1 || rep.Seq != 2 || len(rep.Ranks) != 3 || (rep.Requester != 0 && rep.Requester != 2) {
		t.Fatalf("dump: culprit %d, seq %d, %d ranks, requester %d; want 1, 2, 3, rank 0 or 2", rep.Culprit, rep.Seq, len(rep.Ranks), rep.Requester)
	}
	other := 2 - rep.Requester
	if wantPointer := fmt.Sprintf("gorun: rank %d: hang diagnosis of call #2: rank %d printed it; every rank's flight recorder is in %s on host %s", other, rep.Requester, m[1], host); pointer[0] != wantPointer {
		t.Errorf("pointer line:\n%s\nwant:\n%s", pointer[0], wantPointer)
	}
	for r, s := range rep.Ranks {
		if s.Rank != r || len(s.Recent) != 1 || s.Recent[0].Seq != 1 || s.Recent[0].Name != "layer1.w" || s.Recent[0].Kind != "allreduce" {
			t.Errorf("dump: rank %d's state %+v: want rank %d with call #1 layer1.w finished", s.Rank, s, r)
		}
		if inCall := s.Current != nil; inCall != (r != 1) {
			t.Errorf("dump: rank %d current call %+v", r, s.Current)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("%d files in GORUN_HANG_DIR, want the one dump", len(entries))
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

// A report whose dump the rendezvous was still writing when it answered
// (a stuck file system) is printed by the rank that asked first, which
// says the states are not written yet and writes no dump of its own.
func TestHangReportLinesDumpPending(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(p2p.EnvHangDir, dir)
	rep := &p2p.HangReport{Requester: 2, Seq: 7, Culprit: 1, First: true, DumpPending: true,
		Diagnosis: "rank 2 waits in allreduce #7 for rank 1",
		DumpErr:   "writing the hang report had not finished after 5s",
		Ranks:     []p2p.RankState{{Rank: 0}, {Rank: 1}, {Rank: 2}}}
	lines := strings.Join(hangReportLines(2, 7, rep), "\n")
	if !strings.Contains(lines, "hang diagnosis: rank 2 waits in allreduce #7 for rank 1") || !strings.Contains(lines, "not written yet: writing the hang report had not finished after 5s") {
		t.Errorf("lines:\n%s\nwant the diagnosis and that the states are not written yet", lines)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("the rank wrote %d file(s) to %s while the rendezvous was still writing", len(entries), dir)
	}
	// Without DumpPending the same rank writes the states itself.
	rep.DumpPending = false
	lines = strings.Join(hangReportLines(2, 7, rep), "\n")
	if entries, _ := os.ReadDir(dir); len(entries) != 1 || !strings.Contains(lines, "written by rank 2") {
		t.Errorf("%d file(s) in %s, lines:\n%s\nwant the rank to write the states once the rendezvous could not", len(entries), dir, lines)
	}
}
