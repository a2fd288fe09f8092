package membership

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// A job's membership driven by scripted events: every test runs without a
// network or a clock, in microseconds.

var t0 = time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)

type job struct {
	t   *testing.T
	m   *Machine
	now time.Time
}

func newJob(t *testing.T, cfg Config) *job {
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 3 * time.Second
	}
	if cfg.Elastic {
		cfg.MinSize = max(cfg.MinSize, 1)
		cfg.MaxSize = max(cfg.MaxSize, cfg.Size)
		if cfg.WaitTimeout == 0 {
			cfg.WaitTimeout = 600 * time.Second
		}
	}
	return &job{t: t, m: New(cfg), now: t0}
}

func (j *job) step(ev Event) []Action {
	j.t.Helper()
	j.now = j.now.Add(time.Millisecond)
	return j.m.Step(j.now, ev)
}

func info(id ID) Info {
	return Info{PeerID: fmt.Sprintf("peer%d", id), Host: fmt.Sprintf("host%d/boot", id), Addr: fmt.Sprintf("/ip4/10.0.0.%d/tcp/1", id)}
}

// start registers ranks 0..size-1 as IDs 1..size and acks the table.
func (j *job) start() {
	j.t.Helper()
	hb := int64(0)
	if j.m.cfg.Elastic {
		hb = j.m.cfg.Heartbeat.Milliseconds()
	}
	for r := range j.m.cfg.Size {
		j.step(Register{ID: ID(r + 1), Rank: r, Heartbeat: hb, Args: []string{"--epochs", "3"}, Info: info(ID(r + 1))})
	}
	var acts []Action
	for r := range j.m.cfg.Size {
		acts = j.step(Ack{ID: ID(r + 1)})
	}
	if len(sent(acts, Go)) != j.m.cfg.Size {
		j.t.Fatalf("start: the last ack sent %v, want go to all %d", acts, j.m.cfg.Size)
	}
}

// sent returns the messages of kind in acts, by recipient.
func sent(acts []Action, kind MessageKind) map[ID]Message {
	out := map[ID]Message{}
	for _, a := range acts {
		if s, ok := a.(Send); ok && s.Msg.Kind == kind {
			out[s.To] = s.Msg
		}
	}
	return out
}

func find[T Action](acts []Action) (T, bool) {
	for _, a := range acts {
		if x, ok := a.(T); ok {
			return x, true
		}
	}
	var zero T
	return zero, false
}

func ids(m map[ID]Message) []ID {
	var out []ID
	for id := range m {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

func lostRanks(ls []Lost) []int {
	var out []int
	for _, l := range ls {
		out = append(out, l.Rank)
	}
	return out
}

func TestMembershipFixedStart(t *testing.T) {
	j := newJob(t, Config{Size: 3})
	acts := j.step(Register{ID: 1, Rank: 0, Info: info(1)})
	if w := sent(acts, Welcome); len(w) != 1 || !reflect.DeepEqual(acts[0], Send{To: 1, Msg: Message{Kind: Welcome}}) {
		t.Fatalf("first registration: %v, want the welcome first", acts)
	}
	acts = j.step(Register{ID: 2, Rank: 2, Info: info(2)})
	if m := sent(acts, Missing); !slices.Equal(ids(m), []ID{1, 2}) || !slices.Equal(m[1].Ranks, []int{1}) {
		t.Errorf("second registration: %v, want both told rank 1 is missing", acts)
	}
	for _, tc := range []struct {
		reg  Register
		want string
	}{
		{Register{ID: 3, Rank: 2}, "rank 2 already registered from /ip4/10.0.0.2/tcp/1"},
		{Register{ID: 4, Rank: 3}, "rank 3 out of range [0,3)"},
		{Register{ID: 5, Rank: 1, Heartbeat: 3000}, "this job is not elastic"},
		{Register{ID: 6, Joiner: true}, "this job is not elastic"},
	} {
		acts := j.step(tc.reg)
		if f, ok := find[Refuse](acts); !ok || f.To != tc.reg.ID || !strings.Contains(f.Why, tc.want) {
			t.Errorf("register %+v: %v, want refused: %q", tc.reg, acts, tc.want)
		}
		if len(sent(acts, Welcome)) != 0 {
			t.Errorf("register %+v: welcomed", tc.reg)
		}
	}
	acts = j.step(Register{ID: 7, Rank: 1, Info: info(7)})
	if _, ok := find[AllRegistered](acts); !ok {
		t.Errorf("last registration: no AllRegistered in %v", acts)
	}
	tables := sent(acts, Table)
	if !slices.Equal(ids(tables), []ID{1, 2, 7}) || !slices.Equal(tables[1].Members, []ID{1, 7, 2}) {
		t.Errorf("table: %v, want members 1, 7, 2 (by rank) sent to all", tables)
	}
	if acts := j.step(Register{ID: 8, Rank: 1}); len(sent(acts, Welcome)) != 0 {
		t.Errorf("a registration after the start was welcomed")
	}
	if missing, _, _ := j.m.Ping(); !slices.Equal(missing, []int{0, 1, 2}) {
		t.Errorf("ping before the acks: missing %v, want every unacked rank", missing)
	}
	j.step(Ack{ID: 1})
	j.step(Ack{ID: 2})
	if acts := j.step(Ack{ID: 7}); !slices.Equal(ids(sent(acts, Go)), []ID{1, 2, 7}) {
		t.Errorf("last ack: %v, want go to all", acts)
	}
}

func TestMembershipDropBeforeStart(t *testing.T) {
	j := newJob(t, Config{Size: 2})
	j.step(Register{ID: 1, Rank: 0})
	acts := j.step(Disconnected{ID: 1, Err: "EOF"})
	if _, ok := find[Abort](acts); ok {
		t.Errorf("a rank gone before the start aborted the job: %v", acts)
	}
	if acts := j.step(Register{ID: 2, Rank: 0}); len(sent(acts, Welcome)) != 1 {
		t.Errorf("rank 0 could not register again: %v", acts)
	}
	if got := j.m.MissingRanks(); !slices.Equal(got, []int{1}) {
		t.Errorf("missing %v, want [1]", got)
	}
}

func TestMembershipFixedEnd(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []Event
		want  *Abort // nil: no abort
		gone  bool   // AllGone at the last step
	}{
		{name: "stopped responding", steps: []Event{Disconnected{ID: 2, Timeout: true}},
			want: &Abort{Cause: "rank 1 (/ip4/10.0.0.2/tcp/1) stopped responding: no heartbeat within 3s", Unresponsive: true, Rank: 1, Addr: "/ip4/10.0.0.2/tcp/1", Why: "no heartbeat within 3s"}},
		{name: "disconnected", steps: []Event{Disconnected{ID: 3}},
			want: &Abort{Cause: "rank 2 (/ip4/10.0.0.3/tcp/1) disconnected"}},
		{name: "clean end", steps: []Event{
			Leaving{ID: 1, LastCall: 9}, Leaving{ID: 2, LastCall: 9}, Leaving{ID: 3, LastCall: 9},
			Leave{ID: 1}, Disconnected{ID: 1}, Leave{ID: 2}, Disconnected{ID: 2}, Leave{ID: 3}, Disconnected{ID: 3}}, gone: true},
		{name: "left early", steps: []Event{
			Leaving{ID: 1, LastCall: 5}, Late{ID: 2, Call: 6}, Disconnected{ID: 2}},
			want: &Abort{Cause: "rank 0 closed its communicator after call #5; rank 1 (/ip4/10.0.0.2/tcp/1) was in a later call and exited", LeftEarly: true, Rank: 0, Seq: 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := newJob(t, Config{Size: 3})
			j.start()
			var all, last []Action
			for _, ev := range tc.steps {
				last = j.step(ev)
				all = append(all, last...)
			}
			a, ok := find[Abort](all)
			switch {
			case tc.want == nil && ok:
				t.Errorf("aborted: %+v", a)
			case tc.want != nil && !ok:
				t.Errorf("no abort in %v", all)
			case tc.want != nil && a != *tc.want:
				t.Errorf("abort %+v\nwant  %+v", a, *tc.want)
			}
			if _, ok := find[AllGone](last); ok != tc.gone {
				t.Errorf("AllGone at the last step: %v, want %v", ok, tc.gone)
			}
			// A second loss never aborts again.
			if ok {
				if _, again := find[Abort](j.step(Disconnected{ID: 1})); again {
					t.Error("aborted twice")
				}
			}
		})
	}
}

func TestMembershipLeavingNotices(t *testing.T) {
	j := newJob(t, Config{Size: 3})
	j.start()
	acts := j.step(Leaving{ID: 2, LastCall: 7})
	if n, ok := find[LeaveNotice](acts); !ok || n != (LeaveNotice{Rank: 1, LastCall: 7}) {
		t.Errorf("leaving: %v, want LeaveNotice{1, 7}", acts)
	}
	if got := ids(sent(acts, LeavingNotice)); !slices.Equal(got, []ID{1, 3}) {
		t.Errorf("leaving notice went to %v, want the others", got)
	}
	// A late rank is reported to the one that left after an earlier call.
	acts = j.step(Late{ID: 3, Call: 9})
	if m := sent(acts, LateNotice); !slices.Equal(ids(m), []ID{2}) || m[2].Rank != 2 || m[2].Seq != 9 {
		t.Errorf("late: %v, want rank 1 told rank 2 is in call 9", acts)
	}
}

func TestMembershipElasticLoss(t *testing.T) {
	j := newJob(t, Config{Size: 4, Elastic: true, MinSize: 2})
	j.start()
	acts := j.step(Disconnected{ID: 3, Timeout: true})
	pe, _ := find[ProcEvent](acts)
	if pe.Kind != ProcLost || pe.Rank != 2 || pe.Members != 3 || pe.Cause != "stopped responding: no heartbeat within 3s" {
		t.Errorf("process event %+v", pe)
	}
	rc := sent(acts, Reconfig)
	if !slices.Equal(ids(rc), []ID{1, 2, 4}) || rc[1].Epoch != 1 || !slices.Equal(lostRanks(rc[1].Lost), []int{2}) {
		t.Errorf("reconfig %v, want epoch 1 to the survivors, lost rank 2", rc)
	}
	tb := sent(acts, Table)
	if !slices.Equal(tb[1].Members, []ID{1, 2, 4}) || !slices.Equal(lostRanks(tb[4].Lost), []int{2}) || len(tb[4].JoinedRanks) != 0 {
		t.Errorf("table %+v", tb[4])
	}
	if _, ok := find[Abort](acts); ok {
		t.Error("a loss aborted the elastic job")
	}
	if j.m.Rank(4) != 2 {
		t.Errorf("rank of the last survivor %d, want 2", j.m.Rank(4))
	}
	j.step(Ack{ID: 1, Epoch: 1})
	j.step(Ack{ID: 2, Epoch: 1})
	if acts := j.step(Ack{ID: 2, Epoch: 0}); len(acts) != 0 {
		t.Errorf("a stale ack did something: %v", acts)
	}
	acts = j.step(Ack{ID: 4, Epoch: 1})
	est, ok := find[Established](acts)
	if !ok || est.Epoch != 1 || est.Size != 3 || !slices.Equal(lostRanks(est.Lost), []int{2}) || est.Took != 4*time.Millisecond {
		t.Errorf("established %+v (ok %v), want epoch 1 of 3 after losing rank 2, 4 ms after the loss", est, ok)
	}
	if g := sent(acts, Go); len(g) != 3 || g[1].Epoch != 1 {
		t.Errorf("go %v", g)
	}
	if _, ok := find[ResetProgress](acts); !ok {
		t.Error("no ResetProgress when the ranks changed")
	}
}

// A loss while the next epoch forms overtakes it: the epoch after counts
// both losses against the last established epoch, and late acks of the
// overtaken epoch do nothing.
func TestMembershipOvertakenEpoch(t *testing.T) {
	j := newJob(t, Config{Size: 4, Elastic: true, MinSize: 2})
	j.start()
	j.step(Disconnected{ID: 4})
	j.step(Ack{ID: 1, Epoch: 1})
	j.step(Ack{ID: 2, Epoch: 1})
	acts := j.step(Disconnected{ID: 3})
	tb := sent(acts, Table)
	if len(tb) != 2 || tb[1].Epoch != 2 || !slices.Equal(lostRanks(tb[1].Lost), []int{3, 2}) {
		t.Errorf("table of epoch 2: %+v, want 2 members, lost ranks 3 and 2 of epoch 0", tb[1])
	}
	if acts := j.step(Ack{ID: 1, Epoch: 1}); len(acts) != 0 {
		t.Errorf("an ack of the overtaken epoch did something: %v", acts)
	}
	j.step(Ack{ID: 1, Epoch: 2})
	est, _ := find[Established](j.step(Ack{ID: 2, Epoch: 2}))
	if est.Epoch != 2 || est.Size != 2 || len(est.Lost) != 2 {
		t.Errorf("established %+v", est)
	}
}

func TestMembershipBelowMinSize(t *testing.T) {
	for _, joinerComes := range []bool{true, false} {
		t.Run(fmt.Sprintf("joiner=%v", joinerComes), func(t *testing.T) {
			j := newJob(t, Config{Size: 3, Elastic: true, MinSize: 3, MaxSize: 4, WaitTimeout: 60 * time.Second})
			j.start()
			acts := j.step(Disconnected{ID: 2})
			w, ok := find[WaitForMembers](acts)
			if !ok || len(sent(acts, Table)) != 0 {
				t.Fatalf("below min: %v, want a wait and no table", acts)
			}
			if m := sent(acts, Waiting); len(m) != 2 || m[1].Text != "waiting for 1 more member (--min-np 3), 60 s left" {
				t.Errorf("waiting %v", m)
			}
			j.now = w.Since.Add(20 * time.Second)
			if m := sent(j.m.Step(j.now, WaitTick{Since: w.Since}), Waiting); m[3].Text != "waiting for 1 more member (--min-np 3), 40 s left" {
				t.Errorf("tick: %v", m)
			}
			if joinerComes {
				acts := j.step(Register{ID: 9, Joiner: true, Heartbeat: 3000, Args: []string{"--epochs", "3"}, Info: info(9)})
				tb := sent(acts, Table)
				if !slices.Equal(ids(tb), []ID{1, 3, 9}) || !slices.Equal(tb[9].JoinedRanks, []int{2}) || !slices.Equal(lostRanks(tb[9].Lost), []int{1}) {
					t.Errorf("joiner: %v, want a table of 3 with the joiner as rank 2", acts)
				}
				if j.m.Waiting(w.Since) {
					t.Error("still waiting")
				}
			}
			j.now = w.Since.Add(60 * time.Second)
			a, aborted := find[Abort](j.m.Step(j.now, WaitExpired{Since: w.Since}))
			if aborted == joinerComes {
				t.Errorf("aborted %v (%+v), want %v", aborted, a, !joinerComes)
			}
			if want := "job below --min-np 3 for 60s: 2 members left (rank 0 on host1/boot, rank 2 on host3/boot) after losing rank 1 (host host2, /ip4/10.0.0.2/tcp/1) disconnected; no joiner came to take their place"; aborted && a.Cause != want {
				t.Errorf("abort %q\nwant  %q", a.Cause, want)
			}
		})
	}
}

func TestMembershipJoin(t *testing.T) {
	j := newJob(t, Config{Size: 2, Elastic: true, MaxSize: 3})
	j.start()
	args := []string{"--epochs", "3"}
	if acts := j.step(Register{ID: 9, Joiner: true, Heartbeat: 3000, Args: args, Info: info(9)}); len(sent(acts, Welcome)) != 1 {
		t.Fatalf("joiner: %v", acts)
	}
	if _, _, pending := j.m.Ping(); pending != 1 {
		t.Errorf("ping: %d pending, want 1", pending)
	}
	for _, tc := range []struct {
		reg  Register
		want string
	}{
		{Register{ID: 10, Joiner: true, Heartbeat: 3000, Args: []string{"--epochs", "10"}}, `its program arguments ["--epochs" "10"] differ from those the job's ranks started with, ["--epochs" "3"]`},
		{Register{ID: 11, Joiner: true, Heartbeat: 2000, Args: args}, "heartbeat bound 2s differs from the job's 3s"},
		{Register{ID: 12, Joiner: true, Args: args}, "this job is elastic"},
	} {
		acts := j.step(tc.reg)
		f, ok := find[Refuse](acts)
		pe, _ := find[ProcEvent](acts)
		if !ok || !strings.Contains(f.Why, tc.want) || (tc.reg.Heartbeat == 3000 && pe.Kind != ProcSentAway) {
			t.Errorf("register %+v: %v, want refused: %q", tc.reg, acts, tc.want)
		}
	}
	j.step(Grow{ID: 1, Epoch: 0})
	acts := j.step(Grow{ID: 2, Epoch: 0})
	rc := sent(acts, Reconfig)
	tb := sent(acts, Table)
	if rc[1].Text != "admitting 1 new member" || !slices.Equal(tb[9].Members, []ID{1, 2, 9}) || !slices.Equal(tb[9].JoinedRanks, []int{2}) {
		t.Errorf("grow: %v", acts)
	}
	for _, id := range []ID{1, 2} {
		j.step(Ack{ID: id, Epoch: 1})
	}
	est, _ := find[Established](j.step(Ack{ID: 9, Epoch: 1}))
	if len(est.Joined) != 1 || est.Joined[0].Rank != 2 || est.Joined[0].Info != info(9) {
		t.Errorf("established %+v", est)
	}
	// Full: a grow finds nobody to admit.
	j.step(Register{ID: 13, Joiner: true, Heartbeat: 3000, Args: args})
	j.step(Grow{ID: 1, Epoch: 1})
	j.step(Grow{ID: 2, Epoch: 1})
	if acts := j.step(Grow{ID: 9, Epoch: 1}); len(sent(acts, GrowNone)) != 3 {
		t.Errorf("grow at --max-np: %v, want nobody admitted", acts)
	}
}

func TestMembershipGracefulLeave(t *testing.T) {
	j := newJob(t, Config{Size: 3, Elastic: true})
	j.start()
	j.step(Grow{ID: 1, Epoch: 0})
	j.step(Grow{ID: 2, Epoch: 0, Leave: true, Why: "SIGTERM"})
	acts := j.step(Grow{ID: 3, Epoch: 0})
	d := sent(acts, Departed)
	if !slices.Equal(ids(d), []ID{2}) || d[2].Text != "left the job (SIGTERM)" {
		t.Errorf("departed %v", d)
	}
	// The leaver hears first: its Depart returns before the others'
	// links to it close.
	if s, _ := find[Send](acts); s.Msg.Kind != Departed {
		t.Errorf("%+v went out before the leaver heard", s)
	}
	pe, _ := find[ProcEvent](acts)
	if pe.Kind != ProcDeparted || pe.Rank != 1 || pe.Cause != "SIGTERM" {
		t.Errorf("process event %+v", pe)
	}
	tb := sent(acts, Table)
	if !slices.Equal(tb[1].Members, []ID{1, 3}) || len(tb[1].Lost) != 1 || !tb[1].Lost[0].Left {
		t.Errorf("table %+v", tb[1])
	}
	if rc := sent(acts, Reconfig); rc[3].Text != "rank 1 leaves the job at a commit (SIGTERM)" {
		t.Errorf("reconfig %q", rc[3].Text)
	}
	// Its Close afterwards is no departure the others must act on.
	if acts := j.step(Leaving{ID: 2, LastCall: 40}); len(acts) != 0 {
		t.Errorf("leaving after departing: %v", acts)
	}
}

func TestMembershipEveryoneLeaves(t *testing.T) {
	j := newJob(t, Config{Size: 2, Elastic: true, MaxSize: 2})
	j.start()
	j.step(Register{ID: 9, Joiner: true, Heartbeat: 3000, Args: []string{"--epochs", "3"}})
	j.step(Grow{ID: 1, Epoch: 0, Leave: true})
	acts := j.step(Grow{ID: 2, Epoch: 0, Leave: true})
	if len(sent(acts, Departed)) != 2 || len(sent(acts, Reconfig)) != 0 {
		t.Errorf("all leave: %v", acts)
	}
	if a := sent(acts, SentAway); a[9].Text != "the job ended (every member left) before this joiner was admitted" {
		t.Errorf("joiner: %v", a)
	}
	if acts := j.step(Register{ID: 10, Joiner: true, Heartbeat: 3000}); len(sent(acts, Welcome)) != 0 {
		t.Error("a joiner was welcomed into a job with no members")
	}
}

func TestMembershipElasticFinish(t *testing.T) {
	j := newJob(t, Config{Size: 2, Elastic: true, MaxSize: 2})
	j.start()
	j.step(Register{ID: 9, Joiner: true, Heartbeat: 3000, Args: []string{"--epochs", "3"}})
	j.step(Leaving{ID: 1, LastCall: 30})
	j.step(Leave{ID: 1})
	acts := j.step(Disconnected{ID: 1})
	if pe, _ := find[ProcEvent](acts); pe.Kind != ProcLeft || !pe.AfterLeave {
		t.Errorf("clean leave: %v", acts)
	}
	if len(sent(acts, Reconfig)) != 0 {
		t.Error("a clean leave started an epoch")
	}
	j.step(Leave{ID: 2})
	acts = j.step(Disconnected{ID: 2})
	if a := sent(acts, SentAway); a[9].Text != "the job ended before this joiner was admitted" {
		t.Errorf("the last leave: %v", acts)
	}
}

// A broken link between two live members re-forms the ring once; if the
// same link breaks again in that epoch, the member that could not be
// reached is dropped (a partition: the side with the rendezvous goes on).
func TestMembershipPartition(t *testing.T) {
	j := newJob(t, Config{Size: 3, Elastic: true})
	j.start()
	acts := j.step(LinkFailed{ID: 1, Epoch: 0, Rank: 2, Text: "dial: timeout"})
	c, ok := find[CheckLinkLater](acts)
	if !ok || c.Reporter != 1 || c.Peer != 3 {
		t.Fatalf("link failure: %v", acts)
	}
	if acts := j.step(LinkFailed{ID: 2, Epoch: 0, Rank: 2, Text: "again"}); len(acts) != 0 {
		t.Errorf("a second report of the same epoch: %v", acts)
	}
	acts = j.step(LinkCheck{c})
	if rc := sent(acts, Reconfig); len(rc) != 3 || !strings.Contains(rc[1].Text, "re-forming with the same members") {
		t.Errorf("re-form: %v", acts)
	}
	for _, id := range []ID{1, 2, 3} {
		j.step(Ack{ID: id, Epoch: 1})
	}
	c, _ = find[CheckLinkLater](j.step(LinkFailed{ID: 1, Epoch: 1, Rank: 2, Text: "dial: timeout"}))
	acts = j.step(LinkCheck{c})
	if d := sent(acts, Dropped); !slices.Equal(ids(d), []ID{3}) {
		t.Errorf("dropped %v", d)
	}
	tb := sent(acts, Table)
	if !slices.Equal(tb[1].Members, []ID{1, 2}) || !strings.HasPrefix(tb[1].Lost[0].Cause, "unreachable: rank 0 could not set up its link with it again") {
		t.Errorf("table after the partition %+v", tb[1])
	}
	// A check that a loss overtook does nothing.
	c, _ = find[CheckLinkLater](j.step(LinkFailed{ID: 1, Epoch: 2, Rank: 1, Text: "x"}))
	j.step(Disconnected{ID: 2})
	if acts := j.step(LinkCheck{c}); len(acts) != 0 {
		t.Errorf("stale link check: %v", acts)
	}
}

// The same events give the same actions: what a replicated rendezvous
// relies on.
func TestMembershipDeterministic(t *testing.T) {
	script := func(seed uint64) []Event {
		rng := rand.New(rand.NewPCG(seed, 1))
		var evs []Event
		for range 200 {
			id := ID(1 + rng.IntN(8))
			switch rng.IntN(7) {
			case 0:
				evs = append(evs, Register{ID: id + 10*ID(rng.IntN(3)), Joiner: true, Heartbeat: 3000, Args: []string{"a"}})
			case 1:
				evs = append(evs, Disconnected{ID: id, Timeout: rng.IntN(2) == 0})
			case 2, 3:
				evs = append(evs, Ack{ID: id, Epoch: rng.IntN(4)})
			case 4:
				evs = append(evs, Grow{ID: id, Epoch: rng.IntN(4), Leave: rng.IntN(5) == 0})
			case 5:
				evs = append(evs, LinkFailed{ID: id, Epoch: rng.IntN(4), Rank: rng.IntN(4)})
			case 6:
				evs = append(evs, Leaving{ID: id, LastCall: uint64(rng.IntN(50))})
			}
		}
		return evs
	}
	for seed := range uint64(20) {
		var runs [2][][]Action
		for i := range runs {
			j := newJob(t, Config{Size: 4, Elastic: true, MinSize: 2, MaxSize: 6})
			j.start()
			for _, ev := range script(seed) {
				runs[i] = append(runs[i], j.step(ev))
			}
		}
		if !reflect.DeepEqual(runs[0], runs[1]) {
			t.Fatalf("seed %d: two runs of one script differ", seed)
		}
	}
}

// Every event survives a replicated log's encoding unchanged.
func TestMembershipEncoding(t *testing.T) {
	at := t0.Add(1500 * time.Millisecond)
	for _, ev := range []Event{
		Register{ID: 3, Rank: 2, Joiner: true, Heartbeat: 3000, Args: []string{"--epochs", "3"}, Info: info(3)},
		Ack{ID: 1, Epoch: 4}, Disconnected{ID: 2, Timeout: true, Quit: "SIGTERM", Err: "EOF"}, Leave{ID: 5},
		Leaving{ID: 1, LastCall: 99}, Late{ID: 2, Call: 100}, AbortRequest{ID: 1, Text: "boom"},
		LinkFailed{ID: 1, Epoch: 2, Rank: 3, Text: "dial"}, LinkCheck{CheckLinkLater{Epoch: 2, Reporter: 1, Peer: 4, Text: "dial"}},
		Grow{ID: 1, Epoch: 3, Leave: true, Why: "SIGTERM"}, WaitTick{Since: t0}, WaitExpired{Since: t0},
	} {
		b, err := Encode(at, ev)
		if err != nil {
			t.Fatalf("%T: %v", ev, err)
		}
		gotAt, got, err := Decode(b)
		if err != nil || !gotAt.Equal(at) || !reflect.DeepEqual(got, ev) {
			t.Errorf("%T: decoded %v %#v (%v), want %v %#v", ev, gotAt, got, err, at, ev)
		}
	}
	if _, _, err := Decode([]byte(`{"k":"reboot","ev":{}}`)); err == nil || !strings.Contains(err.Error(), `unknown kind "reboot"`) {
		t.Errorf("unknown kind: %v", err)
	}
}
