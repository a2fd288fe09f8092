package p2p

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// hangKeys records the (epoch, call) of every report the rendezvous had
// printed (OnHang; a report on a stall that ended is not), in order.
type hangKeys struct {
	mu   sync.Mutex
	keys []hangKey
}

func (h *hangKeys) add(rep *HangReport) {
	h.mu.Lock()
	h.keys = append(h.keys, hangKey{epoch: rep.Epoch, seq: rep.Seq})
	h.mu.Unlock()
}

func (h *hangKeys) get() []hangKey {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]hangKey(nil), h.keys...)
}

// hangBrief is what a failure needs of a report (the states' goroutine stacks
// would bury it).
func hangBrief(rep *HangReport) string {
	if rep == nil {
		return "none"
	}
	var in []string
	for _, st := range rep.Ranks {
		call := "no call"
		if st.Current != nil {
			call = fmt.Sprintf("call #%d", st.Current.Seq)
		}
		in = append(in, fmt.Sprintf("rank %d in %s", st.Rank, call))
	}
	return fmt.Sprintf("epoch %d call #%d, requester %d (first %v), culprit %d, ended %v, %q, states [%s]",
		rep.Epoch, rep.Seq, rep.Requester, rep.First, rep.Culprit, rep.Ended, rep.Diagnosis, strings.Join(in, ", "))
}

// Call numbers restart at every epoch of an elastic job, so a hang
// diagnosis is keyed by epoch and call. After rank 2 of 3 is lost:
//   - a survivor that has not reconfigured yet (still in epoch 0) and asks
//     about call #5 gets no report at all: neither the kept report on
//     epoch 0's #5 nor one on epoch 1's;
//   - in epoch 1, an ask about #5 starts a new gathering (every rank is
//     asked for its state again) and its report is of epoch 1, call #5,
//     naming the rank that is not in it now, not epoch 0's culprit;
//   - an ask that carries epoch 0 (sent raw) is ignored by the rendezvous:
//     it starts no gathering, so the next asker about #5 is the first;
//   - an answer of epoch 0 about the same call number, handed to the
//     rank while it waits, is not taken for epoch 1's.
func TestElasticHangDiagnosisKeyedByEpoch(t *testing.T) {
	t.Setenv(EnvHangDir, t.TempDir()) // no dump is expected (OnHang prints); none may land in /tmp
	var printed hangKeys
	// staleTo, once set, is the rank that gets an epoch-0 answer about
	// call #5 while the rendezvous gathers epoch 1's call #5.
	var staleTo atomic.Pointer[Node]
	staleAnswer, err := json.Marshal(&HangReport{Requester: 1, Epoch: 0, Seq: 5, Diagnosis: "epoch 0's call #5", Culprit: 0})
	if err != nil {
		t.Fatal(err)
	}
	onHang := func(rep *HangReport) string {
		printed.add(rep)
		if n := staleTo.Load(); n != nil && rep.Epoch == 1 && rep.Seq == 5 {
			n.ctl.hangReportArrived(string(staleAnswer), 1)
		}
		return ""
	}

	o := elasticOpts{size: 3, min: 2}
	o.defaults()
	j := &elasticJob{job: &job{key: NewJobKey(), log: &logRec{}}, o: o, changes: &changes{}}
	err = j.launch(t, RendezvousConfig{Size: o.size, Timeout: o.timeout, OnHang: onHang, OnChange: j.changes.add,
		Elastic: &ElasticConfig{MinSize: o.min, HeartbeatTimeout: o.hb}}, j.config)
	t.Cleanup(func() { j.close(t) })
	if err != nil {
		t.Fatal(err)
	}
	calls := make([]*fakeCalls, o.size)
	for r, n := range j.nodes {
		calls[r] = &fakeCalls{}
		n.SetCallReporter(calls[r].report)
	}

	// Epoch 0: ranks 0 and 2 in call #5, rank 1 in none.
	calls[0].seq.Store(5)
	calls[2].seq.Store(5)
	rep := diagnoseHang(t, j.nodes[0], 5)
	if rep.Epoch != 0 || rep.Seq != 5 || !rep.First || rep.Requester != 0 || rep.Culprit != 1 || rep.Ended {
		t.Fatalf("epoch 0: %s; want call #5 of epoch 0, asked first by rank 0, rank 1 named", hangBrief(rep))
	}

	j.nodes[2].crash()
	survivors := []*Node{j.nodes[0], j.nodes[1]}
	for _, n := range survivors {
		waitDone(t, n, 10*time.Second, "rank 2 (", "call Reconfigure to go on in epoch 1")
	}
	if e := j.rz.Epoch(); e != 1 || j.nodes[0].Epoch() != 0 {
		t.Fatalf("rendezvous in epoch %d, rank 0 in %d; want 1 and 0 (not reconfigured yet)", e, j.nodes[0].Epoch())
	}
	// Rank 0 still waits in epoch 0's call #5: that call is over (it
	// fails with the epoch), so its ask gets no report. Only a deadline
	// can show that nothing came.
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	late, err := j.nodes[0].DiagnoseHang(ctx, 5)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("an ask of the ended epoch 0: report %s, error %v; want none before the deadline", hangBrief(late), err)
	}

	views := reconfigureAll(t, survivors)
	checkViews(t, views, survivors, 1, []int{2}, nil)
	// Epoch 1: rank 1 is in its call #5, rank 0 in none.
	for _, c := range calls[:2] {
		c.asked.Store(0)
	}
	calls[0].seq.Store(0)
	calls[1].seq.Store(5)

	// An ask that says epoch 0 (a rank's message sent before it learned
	// of the change) is dropped. Rank 0's ask about #6 right after it, on
	// the same control stream, is handled after it: once it is answered,
	// the stale ask had its turn.
	if err := j.nodes[0].ctl.send(&msg{T: tHangAsk, Rank: 0, Seq: 5, Epoch: 0}); err != nil {
		t.Fatal(err)
	}
	// (Rank 0 is in no call: the report says the stall ended, and
	// nothing is printed.)
	if rep := diagnoseHang(t, j.nodes[0], 6); rep.Epoch != 1 || rep.Seq != 6 || !rep.First || !rep.Ended {
		t.Fatalf("epoch 1 call #6: %s; want a report on it, rank 0 first, the stall ended", hangBrief(rep))
	}

	staleTo.Store(j.nodes[1])
	rep = diagnoseHang(t, j.nodes[1], 5)
	if rep.Epoch != 1 || rep.Seq != 5 || !rep.First || rep.Requester != 1 || rep.Culprit != 0 || rep.Ended || rep.Diagnosis == "epoch 0's call #5" {
		t.Fatalf("epoch 1 call #5: %s; want a new report on epoch 1's call #5, asked first by rank 1, rank 0 named", hangBrief(rep))
	}
	if len(rep.Ranks) != 2 || rep.Ranks[1].Current == nil || rep.Ranks[1].Current.Seq != 5 || rep.Ranks[0].Current != nil {
		t.Errorf("epoch 1 states of %d ranks: want rank 1 in call #5 and rank 0 in none (%s)", len(rep.Ranks), hangBrief(rep))
	}
	// Two gatherings in epoch 1 (#6 and #5), none for the stale ask.
	for r, c := range calls[:2] {
		if n := c.asked.Load(); n != 2 {
			t.Errorf("rank %d was asked for its state %d times in epoch 1, want 2 (#6 and #5)", r, n)
		}
	}
	want := []hangKey{{epoch: 0, seq: 5}, {epoch: 1, seq: 5}}
	if got := printed.get(); !slices.Equal(got, want) {
		t.Errorf("reports printed: %+v, want %+v", got, want)
	}
}
