package p2p

import (
	"strings"
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
