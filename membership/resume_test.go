package membership

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

func kinds(msgs []Message) []MessageKind {
	var out []MessageKind
	for _, m := range msgs {
		out = append(out, m.Kind)
	}
	return out
}

// A member that reconnects to a new leader is told again what the old one
// sent: the start's table and go, a reconfiguration it had not acked, the
// table of its epoch; a departed member its departure; a lost one nothing.
func TestMembershipResync(t *testing.T) {
	j := newJob(t, Config{Size: 3})
	j.step(Register{ID: 1, Rank: 0, Info: info(1)})
	if msgs, why := j.m.Resync(1); why != "" || !reflect.DeepEqual(msgs, []Message{{Kind: Missing, Ranks: []int{1, 2}}}) {
		t.Fatalf("before the start: %v %q, want the missing ranks", msgs, why)
	}
	j.step(Register{ID: 2, Rank: 1, Info: info(2)})
	j.step(Register{ID: 3, Rank: 2, Info: info(3)})
	if msgs, _ := j.m.Resync(2); !slices.Equal(kinds(msgs), []MessageKind{Table}) || !slices.Equal(msgs[0].Members, []ID{1, 2, 3}) {
		t.Fatalf("table sent, not acked: %v, want the table", msgs)
	}
	for id := ID(1); id <= 3; id++ {
		j.step(Ack{ID: id})
	}
	if msgs, _ := j.m.Resync(3); !slices.Equal(kinds(msgs), []MessageKind{Table, Go}) {
		t.Fatalf("fixed job running: %v, want table and go", msgs)
	}
	if _, why := j.m.Resync(9); why == "" {
		t.Fatal("an unknown process was not refused")
	}

	e := newJob(t, Config{Size: 4, Elastic: true, MinSize: 2})
	e.start()
	if msgs, _ := e.m.Resync(2); !slices.Equal(kinds(msgs), []MessageKind{Table, Go}) || msgs[0].Epoch != 0 {
		t.Fatalf("epoch 0 established: %v, want its table and go", msgs)
	}
	e.step(Disconnected{ID: 4, Err: "EOF"})
	msgs, _ := e.m.Resync(1)
	if !slices.Equal(kinds(msgs), []MessageKind{Reconfig, Table}) || msgs[0].Epoch != 1 || !strings.Contains(msgs[0].Text, "rank 3") ||
		!slices.Equal(lostRanks(msgs[0].Lost), []int{3}) || !slices.Equal(msgs[1].Members, []ID{1, 2, 3}) {
		t.Fatalf("epoch 1 forming: %v, want its reconfig (rank 3 lost) and table", msgs)
	}
	if _, why := e.m.Resync(4); why == "" {
		t.Fatal("a lost member was not refused")
	}
	e.step(Ack{ID: 1, Epoch: 1})
	if msgs, _ := e.m.Resync(1); !slices.Equal(kinds(msgs), []MessageKind{Table}) {
		t.Fatalf("acked epoch 1: %v, want only its table (no reconfig)", msgs)
	}
	e.step(Ack{ID: 2, Epoch: 1})
	e.step(Ack{ID: 3, Epoch: 1})

	// A grow that found nobody to admit: GrowNone again; the same request
	// sent again is not counted twice.
	for id := ID(1); id <= 3; id++ {
		e.step(Grow{ID: id, Epoch: 1, Seq: 1})
	}
	if msgs, _ := e.m.Resync(2); !slices.Equal(kinds(msgs), []MessageKind{Table, Go, GrowNone}) {
		t.Fatalf("after a grow with nobody to admit: %v, want table, go, grownone", msgs)
	}
	if acts := e.step(Grow{ID: 2, Epoch: 1, Seq: 1}); len(acts) != 0 {
		t.Fatalf("a repeated grow request did something: %v", acts)
	}
	// A departure at a commit: the leaver is told it left.
	e.step(Grow{ID: 1, Epoch: 1, Seq: 2})
	e.step(Grow{ID: 2, Epoch: 1, Seq: 2, Leave: true, Why: "SIGTERM"})
	e.step(Grow{ID: 3, Epoch: 1, Seq: 2})
	if msgs, _ := e.m.Resync(2); !slices.Equal(kinds(msgs), []MessageKind{Departed}) || msgs[0].Epoch != 1 || !strings.Contains(msgs[0].Text, "SIGTERM") {
		t.Fatalf("departed member: %v, want its departure of epoch 1", msgs)
	}
	// An aborted job: the cause.
	e.step(AbortRequest{ID: 1, Text: "bad input"})
	if msgs, _ := e.m.Resync(3); !slices.Equal(kinds(msgs), []MessageKind{SentAway}) || !strings.Contains(msgs[0].Text, "bad input") {
		t.Fatalf("aborted job: %v, want the abort's cause", msgs)
	}
}
