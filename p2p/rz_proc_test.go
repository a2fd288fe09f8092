package p2p

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

type procEvents struct {
	mu sync.Mutex
	ev []ProcEvent
}

func (p *procEvents) add(ev ProcEvent) {
	p.mu.Lock()
	p.ev = append(p.ev, ev)
	p.mu.Unlock()
}

// find waits up to 10 s for an event of kind about proc.
func (p *procEvents) find(t *testing.T, kind ProcEventKind, proc string) ProcEvent {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.mu.Lock()
		for _, ev := range p.ev {
			if ev.Kind == kind && ev.Member.Proc == proc {
				p.mu.Unlock()
				return ev
			}
		}
		all := append([]ProcEvent(nil), p.ev...)
		p.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("no event %d for process %q; events: %+v", kind, proc, all)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startProcJob starts an elastic job whose members send process ids
// "m0", "m1", ... and whose rendezvous reports to the returned events.
func startProcJob(t *testing.T, size, minSize int) (*elasticJob, *procEvents) {
	t.Helper()
	o := elasticOpts{size: size, min: minSize}
	o.defaults()
	evs := &procEvents{}
	j := &elasticJob{job: &job{key: NewJobKey(), log: &logRec{}}, o: o, changes: &changes{}}
	err := j.launch(t, RendezvousConfig{Size: size, Timeout: o.timeout, OnChange: j.changes.add, OnProc: evs.add,
		Elastic: &ElasticConfig{MinSize: minSize, HeartbeatTimeout: o.hb, MaxSize: size + 2}}, func(r int) Config {
		c := j.config(r)
		c.ProcID = "m" + string(rune('0'+r))
		return c
	})
	t.Cleanup(func() {
		j.mu.Lock()
		j.job.nodes = append(j.job.nodes, j.extra...)
		j.mu.Unlock()
		j.close(t)
	})
	if err != nil {
		t.Fatal(err)
	}
	return j, evs
}

// A member lost is reported at once with the process id its hello
// carried, in OnProc and in the Change.
func TestRendezvousProcIdentity(t *testing.T) {
	j, evs := startProcJob(t, 3, 2)
	j.nodes[2].crash()
	ev := evs.find(t, ProcLost, "m2")
	if ev.Cause != "disconnected" || ev.AfterLeave || ev.Members != 2 || ev.Member.Rank != 2 {
		t.Errorf("lost event: %+v", ev)
	}
	for _, n := range j.nodes[:2] {
		waitDone(t, n, 10*time.Second, "rank 2 (")
	}
	reconfigureAll(t, j.nodes[:2])
	eventually(t, 30*time.Second, "OnChange", func() bool { _, n := j.changes.last(); return n == 1 })
	if ch, _ := j.changes.last(); len(ch.Lost) != 1 || ch.Lost[0].Proc != "m2" {
		t.Errorf("Change.Lost: %+v", ch.Lost)
	}
	// A member that leaves cleanly is reported as such; one lost after it
	// is lost "after leave" (the job was finishing).
	closed := make(chan error, 1)
	go func() { closed <- j.nodes[0].Close() }()
	waitLog(t, j.log, "rendezvous: rank 0 leaves after call")
	j.nodes[1].crash()
	<-closed
	if ev := evs.find(t, ProcLost, "m1"); !ev.AfterLeave {
		t.Errorf("lost after a clean leave: %+v", ev)
	}
}

// Once the job has started and its last member has gone, a pending joiner
// is sent away and a new one refused, with a clear message, rather than
// waiting forever for an admission nobody can give.
func TestRendezvousJoinerAfterLastMember(t *testing.T) {
	j, evs := startProcJob(t, 2, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := j.config(-1)
	cfg.ProcID = "j1"
	pending := make(chan error, 1)
	go func() {
		n, err := Join(ctx, cfg)
		if n != nil {
			n.Close()
		}
		pending <- err
	}()
	eventually(t, 10*time.Second, "the joiner pending", func() bool { return j.nodes[0].PendingJoiners() > 0 })
	for _, n := range j.nodes {
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-pending:
		if err == nil || !strings.Contains(err.Error(), "the job ended before this joiner was admitted") {
			t.Errorf("pending joiner: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("a joiner pending when the last member left was never sent away")
	}
	evs.find(t, ProcSentAway, "j1")
	evs.find(t, ProcLeft, "m0")
	evs.find(t, ProcLeft, "m1")
	if n := j.rz.Members(); n != 0 {
		t.Errorf("Members() = %d after every member left", n)
	}
	cfg.ProcID = "j2"
	n, err := Join(ctx, cfg)
	if err == nil {
		n.Close()
		t.Fatal("a joiner joined a job with no members left")
	}
	if !strings.Contains(err.Error(), "the job has no members left (its last member finished or was lost): there is nobody to join") {
		t.Errorf("late joiner: %v", err)
	}
	if ev := evs.find(t, ProcSentAway, "j2"); !ev.AfterLeave || !strings.Contains(ev.Cause, "no members left") {
		t.Errorf("refused joiner event: %+v", ev)
	}
}
