package p2p

import (
	"cmp"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func hangState(rank int, cur *CallRecord, last uint64, waits ...int) RankState {
	s := RankState{Rank: rank, Current: cur, Progress: last}
	if last > 0 {
		s.Recent = []CallRecord{{Seq: last, Kind: "allreduce"}}
	}
	for _, p := range waits {
		s.Waits = append(s.Waits, PeerWait{Peer: p, Op: "recv from", Since: time.Unix(100, 0)})
	}
	return s
}

// The diagnosis follows the chain of waits from the rank that asked to the
// rank outside the stalled call, and says what that rank does.
func TestHangDiagnosisNamesTheRankTheChainEndsAt(t *testing.T) {
	call := &CallRecord{Seq: 17, Kind: "allreduce", Name: "layer3.w", Start: time.Unix(90, 0)}
	user := Goroutine{ID: 1, State: "running", Role: "user", Frames: []Frame{
		{Func: "runtime.asyncPreempt", File: "/go/src/runtime/preempt_amd64.s", Line: 46},
		{Func: "main.loadBatch", File: "/src/train/main.go", Line: 88},
		{Func: "main.main", File: "/src/train/main.go", Line: 40},
	}}
	earlier := &CallRecord{Seq: 16, Kind: "broadcast", Start: time.Unix(95, 0)}
	now := time.Unix(101, 0)
	for _, tc := range []struct {
		name  string
		ranks []RankState
		want  string
		blame int
	}{
		{"user code", []RankState{hangState(0, call, 17, 2), func() RankState {
			s := hangState(1, nil, 16)
			s.Goroutines = []Goroutine{user}
			return s
		}(), hangState(2, call, 17, 1)},
			`rank 2 waits in allreduce #17 "layer3.w" for rank 1; rank 1's last call was #16 and it is in user code: main.loadBatch at train/main.go:88 (goroutine 1, running)`, 1},
		{"no answer", []RankState{hangState(0, call, 17, 1), {Rank: 1, NoAnswer: "no answer within 5s"}},
			`rank 0 waits in allreduce #17 "layer3.w" for rank 1; rank 1 did not answer: no answer within 5s`, 1},
		{"earlier call", []RankState{hangState(0, call, 17, 1), hangState(1, earlier, 16, 3), hangState(2, call, 17), hangState(3, nil, 15)},
			`rank 0 waits in allreduce #17 "layer3.w" for rank 1; rank 1 is in broadcast #16 (for 6s), waiting to receive from rank 3`, 1},
		{"no waits", []RankState{hangState(0, call, 17), hangState(1, nil, 0)},
			`rank 0 waits in allreduce #17 "layer3.w", which rank 1 has not entered; rank 1 has made no collective call yet and it is in user code`, 1},
		{"everyone in the call", []RankState{hangState(0, call, 17, 1), hangState(1, call, 17, 0)},
			`every rank is in allreduce #17 "layer3.w", so the ring is slow or a link is stuck: rank 0 waits to receive from rank 1 (for 1s), rank 1 waits to receive from rank 0 (for 1s)`, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &HangReport{Time: now, Requester: 0, Seq: 17, Ranks: tc.ranks}
			if !r.diagnose() {
				t.Fatal("diagnose says the stall ended")
			}
			if r.Diagnosis != tc.want || r.Culprit != tc.blame {
				t.Errorf("diagnosis (culprit %d):\n%s\nwant (culprit %d):\n%s", r.Culprit, r.Diagnosis, tc.blame, tc.want)
			}
		})
	}
}

// blockedInHangTestHelper waits on ch: a goroutine of "user code" (a test
// file) whose stack a diagnosis must find.
func blockedInHangTestHelper(ch chan struct{}) { <-ch }

// A rank's state holds the user's goroutines, parsed from the runtime's
// stacks, and Top names the function they are in.
func TestHangStateFindsUserGoroutines(t *testing.T) {
	ch := make(chan struct{})
	started := make(chan struct{})
	go func() { close(started); blockedInHangTestHelper(ch) }()
	defer close(ch)
	<-started
	var found *Goroutine
	deadline := time.Now().Add(10 * time.Second)
	for found == nil && time.Now().Before(deadline) { // until it is parked in the helper
		for _, g := range relevantGoroutines(parseStacks(allStacks()), false) {
			if strings.Contains(g.Top(), "p2p.blockedInHangTestHelper at p2p/diagnose_test.go:") {
				found = &g
			}
		}
	}
	if found == nil {
		t.Fatalf("no user goroutine in blockedInHangTestHelper:\n%s", allStacks())
	}
	if found.Role != "user" || found.State != "chan receive" || found.ID <= 1 {
		t.Errorf("goroutine %+v: want a user goroutine in chan receive", found)
	}
}

// fakeCalls is a rank's flight recorder for the rendezvous tests: the call
// it is in (none: seq 0), and how often a diagnosis asked for it (once per
// gathering).
type fakeCalls struct {
	seq   atomic.Uint64
	asked atomic.Int32
	name  string // the call's name ("w" if unset)
}

func (f *fakeCalls) report() (*CallRecord, []CallRecord) {
	f.asked.Add(1)
	if s := f.seq.Load(); s > 0 {
		return &CallRecord{Seq: s, Kind: "allreduce", Name: cmp.Or(f.name, "w"), Start: time.Now()}, nil
	}
	return nil, nil
}

// hangJob runs 3 ranks with fake flight recorders: ranks 0 and 2 in call
// #5, rank 1 in none, as if rank 1 skipped it.
func hangJob(t *testing.T, onHang func(*HangReport) string, callName string) (*job, []*fakeCalls) {
	t.Helper()
	j := &job{key: NewJobKey(), log: &logRec{}}
	o := jobOpts{size: 3, timeout: 10 * time.Second, log: j.log}
	err := j.launch(t, RendezvousConfig{Size: 3, Timeout: o.timeout, OnHang: onHang}, func(r int) Config { return baseConfig(j, o, r) })
	t.Cleanup(func() { j.close(t) })
	if err != nil {
		t.Fatal(err)
	}
	calls := make([]*fakeCalls, 3)
	for r, n := range j.nodes {
		calls[r] = &fakeCalls{name: callName}
		if r != 1 {
			calls[r].seq.Store(5)
		}
		n.SetCallReporter(calls[r].report)
	}
	return j, calls
}

func diagnoseHang(t *testing.T, n *Node, seq uint64) *HangReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := n.DiagnoseHang(ctx, seq)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// One stalled call is diagnosed once: a rank that asks after the
// gathering ended gets the same report, with no new gathering (no rank
// is asked for its state again) and no second OnHang; the first asker
// alone is told it asked first. A stall in another call is diagnosed anew.
func TestHangDiagnosisOncePerCall(t *testing.T) {
	var onHang atomic.Int32
	j, calls := hangJob(t, func(*HangReport) string { onHang.Add(1); return "" }, "")
	first := diagnoseHang(t, j.nodes[0], 5)
	if !first.First || first.Requester != 0 || first.Seq != 5 || first.Culprit != 1 || !first.Printed || first.Ended {
		t.Fatalf("first report: %+v; want rank 0 first, call #5, rank 1 named, printed", first)
	}
	again := diagnoseHang(t, j.nodes[2], 5)
	if again.First || again.Requester != 0 || again.Diagnosis != first.Diagnosis || !again.Time.Equal(first.Time) {
		t.Errorf("second ask got %+v; want the first report (requester 0, %q at %v), not first", again, first.Diagnosis, first.Time)
	}
	if n := onHang.Load(); n != 1 {
		t.Errorf("OnHang called %d times for one call, want 1", n)
	}
	if n := calls[1].asked.Load(); n != 1 {
		t.Errorf("rank 1 was asked for its state %d times for one call, want 1", n)
	}
	for _, c := range calls {
		c.seq.Store(6)
	}
	calls[1].seq.Store(0)
	next := diagnoseHang(t, j.nodes[2], 6)
	if !next.First || next.Seq != 6 || next.Requester != 2 || next.Culprit != 1 {
		t.Errorf("call #6: %+v; want a new report asked first by rank 2", next)
	}
	if n := onHang.Load(); n != 2 {
		t.Errorf("OnHang called %d times for two calls, want 2", n)
	}
}

// An answer that does not answer this request (a late one to an earlier
// request, here arriving while this one waits) is dropped: DiagnoseHang
// returns the report on the call it asked about.
func TestHangDiagnosisDropsStaleAnswers(t *testing.T) {
	var j *job
	stale, err := json.Marshal(&HangReport{Requester: 0, Seq: 4, Diagnosis: "stale", Culprit: -1})
	if err != nil {
		t.Fatal(err)
	}
	j, _ = hangJob(t, func(*HangReport) string {
		// Rank 0 waits for the answer on call #5 now: it asked before
		// the gathering began.
		j.nodes[0].ctl.hangReportArrived(string(stale), 0)
		return ""
	}, "")
	rep := diagnoseHang(t, j.nodes[0], 5)
	if rep.Seq != 5 || rep.Diagnosis == "stale" || !rep.First {
		t.Fatalf("got %+v; want the report on call #5", rep)
	}
}

// Without a launcher the rendezvous, which has every rank's state, writes
// the dump (readable by its owner only: it holds host names, PIDs and
// tensor names) and tells the ranks where; the rank that asked later
// gets the same dump, and no other is written.
func TestHangDiagnosisRendezvousWritesDump(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(EnvHangDir, dir)
	j, _ := hangJob(t, nil, "")
	rep := diagnoseHang(t, j.nodes[2], 5)
	host, _ := os.Hostname()
	if rep.Printed || !rep.First || rep.Dump == "" || filepath.Dir(rep.Dump) != dir || rep.DumpHost != host || rep.Stripped {
		t.Fatalf("report %+v: want not printed, first, a dump in %s on host %s", rep, dir, host)
	}
	fi, err := os.Stat(rep.Dump)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("dump mode %v, want 0600", fi.Mode().Perm())
	}
	b, err := os.ReadFile(rep.Dump)
	if err != nil {
		t.Fatal(err)
	}
	var dumped HangReport
	if err := json.Unmarshal(b, &dumped); err != nil {
		t.Fatal(err)
	}
	if dumped.Culprit != 1 || dumped.Seq != 5 || len(dumped.Ranks) != 3 || dumped.Ranks[0].Current == nil || dumped.Ranks[1].Current != nil {
		t.Errorf("dump: %+v; want call #5, rank 1 named, every rank's state", dumped)
	}
	later := diagnoseHang(t, j.nodes[0], 5)
	if later.First || later.Dump != rep.Dump {
		t.Errorf("the later ask got dump %q (first %v), want %q, not first", later.Dump, later.First, rep.Dump)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("%d dumps in %s, want 1", len(entries), dir)
	}
}

// A report too big for a control frame (here: long call names; in a big
// job: many ranks) reaches the ranks without the states, and says so; the
// rendezvous' dump has them all.
func TestHangDiagnosisStripsBigReports(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(EnvHangDir, dir)
	j, _ := hangJob(t, nil, strings.Repeat("n", maxFrame/5))
	rep := diagnoseHang(t, j.nodes[0], 5)
	if !rep.Stripped || rep.Ranks != nil || rep.Culprit != 1 || rep.Dump == "" {
		t.Fatalf("report: stripped %v, %d ranks, culprit %d, dump %q; want stripped, no ranks, culprit 1, a dump", rep.Stripped, len(rep.Ranks), rep.Culprit, rep.Dump)
	}
	b, err := os.ReadFile(rep.Dump)
	if err != nil {
		t.Fatal(err)
	}
	var dumped HangReport
	if err := json.Unmarshal(b, &dumped); err != nil {
		t.Fatal(err)
	}
	if len(dumped.Ranks) != 3 || dumped.Stripped || dumped.Ranks[0].Current == nil || len(dumped.Ranks[0].Current.Name) != maxFrame/5 {
		t.Errorf("the dump does not hold every rank's whole state: %d ranks, stripped %v", len(dumped.Ranks), dumped.Stripped)
	}
}

// A rendezvous that can not write the dump says why, and sends the states
// to the ranks (which may write them).
func TestHangDiagnosisDumpError(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	t.Setenv(EnvHangDir, missing)
	j, _ := hangJob(t, nil, "")
	rep := diagnoseHang(t, j.nodes[0], 5)
	if rep.Dump != "" || !strings.Contains(rep.DumpErr, EnvHangDir) || !strings.Contains(rep.DumpErr, missing) || len(rep.Ranks) != 3 || rep.Stripped {
		t.Errorf("report: dump %q, error %q, %d ranks, stripped %v; want no dump, an error naming %s and %s, 3 ranks", rep.Dump, rep.DumpErr, len(rep.Ranks), rep.Stripped, EnvHangDir, missing)
	}
}

// A hang report whose printing or writing does not finish (a dump
// directory on a stuck file system) does not keep the ranks from the
// diagnosis: they get it after hangDumpTimeout, with every rank's state and
// an error that says the dump is not written yet, while the writer still
// runs.
func TestHangDiagnosisDumpStuck(t *testing.T) {
	defer func(d time.Duration) { hangDumpTimeout = d }(hangDumpTimeout)
	hangDumpTimeout = 100 * time.Millisecond
	stuck, entered := make(chan struct{}), make(chan struct{})
	j, _ := hangJob(t, func(*HangReport) string {
		close(entered)
		<-stuck
		return "/never/written.json"
	}, "")
	defer close(stuck) // before the job closes (cleanup): the writer is left running until then
	rep := diagnoseHang(t, j.nodes[0], 5)
	select {
	case <-entered:
	default:
		t.Fatal("the diagnosis came back before OnHang was called")
	}
	if rep.Dump != "" || rep.Printed || !rep.DumpPending || !strings.Contains(rep.DumpErr, "had not finished after 100ms") || !strings.Contains(rep.DumpErr, EnvHangDir) ||
		len(rep.Ranks) != 3 || rep.Culprit != 1 {
		t.Errorf("report: dump %q, printed %v, pending %v, error %q, %d ranks, culprit %d; want no dump, not printed, pending, an error saying the write had not finished, 3 ranks, rank 1 named",
			rep.Dump, rep.Printed, rep.DumpPending, rep.DumpErr, len(rep.Ranks), rep.Culprit)
	}
}

// A receive that waits for its peer shows in the rank's state, naming the
// peer, on a shm link (recorded only once the transfer parks) and on a
// socket; it is gone once the transfer completed.
func TestHangStateNamesThePeerAWaitIsFor(t *testing.T) {
	for _, noShm := range []bool{false, true} {
		t.Run(map[bool]string{false: "shm", true: "socket"}[noShm], func(t *testing.T) {
			j := startJob(t, jobOpts{size: 2, noShm: noShm})
			t.Logf("links: %s", linkKinds(j.nodes))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			got := make(chan error, 1)
			buf := make([]byte, 64)
			go func() { got <- j.nodes[0].Mesh().RecvFrom(ctx, 1, buf) }()
			var waits []PeerWait
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
				if waits = j.nodes[0].pendingWaits(); len(waits) > 0 {
					break
				}
			}
			if len(waits) != 1 || waits[0].Peer != 1 || waits[0].Op != "recv from" || time.Since(waits[0].Since) > time.Minute {
				t.Errorf("waits %+v; want one receive from rank 1", waits)
			}
			if err := j.nodes[1].Mesh().SendTo(ctx, 0, pattern(1, 0, len(buf))); err != nil {
				t.Fatal(err)
			}
			if err := <-got; err != nil {
				t.Fatal(err)
			}
			if w := j.nodes[0].pendingWaits(); len(w) != 0 {
				t.Errorf("waits %+v after the receive completed; want none", w)
			}
		})
	}
}
