package collective

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/ring"
)

// The toy model of the elastic tests: integer parameters and a momentum,
// so that a run that lost ranks must end with exactly the parameters of an
// uninterrupted one-process run over the same global batches (an integer
// Sum does not depend on how a batch is split), and a per-sample use count
// that proves every sample of every epoch was used exactly once by the
// committed history.
const toyDim = 4

type toy struct {
	p, m  []int64 // parameters, momentum
	seen  []int64 // seen[e*L+i]: uses of sample i in epoch e
	steps int64
	s     *ElasticSampler
	l     int
}

func newToy(epochs, datasetLen int, init int64) *toy {
	t := &toy{p: make([]int64, toyDim), m: make([]int64, toyDim), seen: make([]int64, epochs*datasetLen),
		s: NewElasticSampler(datasetLen, 42), l: datasetLen}
	for j := range t.p {
		t.p[j] = init + int64(j)
	}
	return t
}

// grads fills buf with the gradient sum over idx and their use counts.
func (t *toy) grads(buf []int64, idx []int, epoch int) {
	for _, i := range idx {
		for j := range toyDim {
			buf[j] += int64(i)*31 + int64(j)*7 + t.p[j]%13 + 1
		}
		buf[toyDim+epoch*t.l+i]++
	}
}

// apply is the optimizer step, the same everywhere.
func (t *toy) apply(buf []int64) {
	for j := range toyDim {
		t.m[j] = t.m[j]*3/4 + buf[j]
		t.p[j] += buf[j] - t.m[j]%101
	}
	for i, v := range buf[toyDim:] {
		t.seen[i] += v
	}
	t.steps++
}

// toyReference runs the toy alone over every epoch.
func toyReference(epochs, datasetLen, batch int) *toy {
	t := newToy(epochs, datasetLen, 1)
	for t.s.Epoch() < epochs {
		for !t.s.EpochDone() {
			e := t.s.Epoch()
			buf := make([]int64, toyDim+len(t.seen))
			t.grads(buf, t.s.Next(batch, 0, 1), e)
			t.apply(buf)
		}
		t.s.NextEpoch()
	}
	return t
}

// counter is rank-unique state: a value of its own that grows by one per
// step, and what it adopted from lost predecessors.
type counter struct {
	mu       sync.Mutex
	val      int64
	adopted  []int64
	restored int64 // own's value at the last RestoreUnique
	fresh    bool  // restored as a joiner
	pad      int   // bytes after the value: unique state too large for the commit's allreduce
}

func (u *counter) SaveUnique() ([]byte, error) {
	return binary.LittleEndian.AppendUint64(make([]byte, 0, 8+u.pad), uint64(u.val))[:8+u.pad], nil
}

func (u *counter) RestoreUnique(own []byte, adopted [][]byte) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	// Set from the arguments, never added to (a repeated reset calls it
	// again with the same ones).
	if own == nil {
		u.val, u.fresh = 5000, true
	} else {
		u.val = int64(binary.LittleEndian.Uint64(own[:8]))
	}
	u.restored = u.val
	u.adopted = nil
	for _, a := range adopted {
		u.adopted = append(u.adopted, int64(binary.LittleEndian.Uint64(a[:8])))
	}
	return nil
}

// member is one process of an elastic toy job.
type member struct {
	c      *Comm
	toy    *toy
	st     *ElasticState
	u      *counter
	err    error // what RunElastic returned
	done   chan struct{}
	first  error // the first error a step or commit returned
	events []ElasticEvent
	ran    int64 // steps whose allreduce completed on this member, re-runs included
}

type toyJob struct {
	t              *testing.T
	j              *LocalJob
	epochs, l, b   int
	ctx            context.Context
	mu             sync.Mutex
	members        []*member
	wg             sync.WaitGroup
	hook           func(m *member, index int) error // before a step's allreduce
	memberCtx      func(index int) context.Context  // the context a member runs with (nil: ctx)
	quitter        int                              // a member expected to end with its own error (-1: none)
	pad            int                              // the members' counters' pad
	prepare        func(m *member, index int)       // before a member starts
	afterAllreduce func(m *member, index int) error
	// prepareCommits: each step's commit is prepared (ElasticState.Prepare)
	// while the step's allreduce is in flight, once the step's unique
	// value is counted, as a training loop with a Reducer does.
	prepareCommits bool
}

func startToyJob(t *testing.T, n, epochs, datasetLen, batch int, opts ...Option) *toyJob {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	t.Cleanup(cancel)
	opts = append([]Option{WithTimeout(30 * time.Second), WithLogger(t.Logf), WithElastic(0)}, opts...)
	before := runtime.NumGoroutine()
	j, err := StartLocal(ctx, n, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := j.Close(); err != nil {
			t.Errorf("closing the job: %v", err)
		}
		checkGoroutines(t, before)
	})
	return &toyJob{t: t, j: j, epochs: epochs, l: datasetLen, b: batch, ctx: ctx, quitter: -1}
}

// run starts c's loop; init is the initial parameter value (a joiner's
// differs, so only a broadcast can make it right).
func (tj *toyJob) run(c *Comm, init int64, val int64) *member {
	m := &member{c: c, toy: newToy(tj.epochs, tj.l, init), st: NewElasticState(c), u: &counter{val: val, pad: tj.pad}, done: make(chan struct{})}
	if err := m.st.Register("p", m.toy.p, "m", m.toy.m, "seen", m.toy.seen, "steps", &m.toy.steps, "sampler", m.toy.s); err != nil {
		tj.t.Fatal(err)
	}
	if err := m.st.RegisterUnique("counter", m.u); err != nil {
		tj.t.Fatal(err)
	}
	m.st.OnReset(func(ctx context.Context, ev ElasticEvent) error {
		m.events = append(m.events, ev)
		return nil
	})
	tj.mu.Lock()
	index := len(tj.members)
	tj.members = append(tj.members, m)
	tj.mu.Unlock()
	if tj.prepare != nil {
		tj.prepare(m, index)
	}
	ctx := tj.ctx
	if tj.memberCtx != nil {
		ctx = tj.memberCtx(index)
	}
	tj.wg.Add(1)
	go func() {
		defer tj.wg.Done()
		defer close(m.done)
		m.err = RunElastic(ctx, c, m.st, func(ctx context.Context) error {
			err := tj.loop(ctx, m, index)
			if err != nil && m.first == nil {
				m.first = err
			}
			return err
		})
	}()
	return m
}

func (tj *toyJob) loop(ctx context.Context, m *member, index int) error {
	t := m.toy
	for t.s.Epoch() < tj.epochs {
		for !t.s.EpochDone() {
			if tj.hook != nil {
				if err := tj.hook(m, index); err != nil {
					return err
				}
			}
			e := t.s.Epoch()
			buf := make([]int64, toyDim+len(t.seen))
			t.grads(buf, t.s.Next(tj.b, m.c.Rank(), m.c.Size()), e)
			if tj.prepareCommits {
				h := m.c.AllreduceAsync(ctx, buf, Sum, Name("toy grads"))
				m.u.mu.Lock()
				m.u.val++
				m.u.mu.Unlock()
				if err := m.st.Prepare(ctx); err != nil {
					return err
				}
				if err := h.Wait(ctx); err != nil {
					return err
				}
			} else if err := m.c.Allreduce(ctx, buf, Sum, Name("toy grads")); err != nil {
				return err
			}
			m.ran++
			if tj.afterAllreduce != nil {
				if err := tj.afterAllreduce(m, index); err != nil {
					return err
				}
			}
			t.apply(buf)
			if !tj.prepareCommits {
				m.u.mu.Lock()
				m.u.val++
				m.u.mu.Unlock()
			}
			if err := m.st.Commit(ctx); err != nil {
				return err
			}
		}
		t.s.NextEpoch()
	}
	return nil
}

// joinAtStep2 starts a joiner; its Comm arrives on the returned channel
// (closed if Join failed). The members wait at step 2 until the rendezvous
// has told them of it, so it is admitted at that commit (bounded by the
// job's ctx).
func (tj *toyJob) joinAtStep2() <-chan *Comm {
	joined := make(chan *Comm, 1)
	go func() {
		c, err := tj.j.Join(tj.ctx)
		if err != nil {
			tj.t.Errorf("joiner: %v", err)
			close(joined)
			return
		}
		joined <- c
	}()
	tj.hook = func(m *member, index int) error {
		for m.toy.steps == 2 && m.c.Epoch() == 0 && m.c.node.PendingJoiners() == 0 {
			select {
			case <-tj.ctx.Done():
				return fmt.Errorf("no joiner announced: %w", context.Cause(tj.ctx))
			case <-time.After(20 * time.Millisecond): // polling a counter the pings update
			}
		}
		return nil
	}
	return joined
}

// runJoiner starts the loop of the joiner that joinAtStep2 admits, with
// wrong parameters (only the broadcast can make them right).
func (tj *toyJob) runJoiner(joined <-chan *Comm) *member {
	tj.t.Helper()
	select {
	case c, ok := <-joined:
		if !ok {
			tj.t.FailNow()
		}
		return tj.run(c, -777, 0)
	case <-tj.ctx.Done():
		tj.t.Fatal("the joiner was not admitted")
	}
	return nil
}

// checkGoroutines fails the test if goroutines started by it are still
// running some seconds after everything was closed (crashed ranks
// included).
func checkGoroutines(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for runtime.NumGoroutine() > before+2 {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Errorf("%d goroutines left running after the job closed (%d before it):\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
			return
		}
		time.Sleep(20 * time.Millisecond) // goroutines end on their own: nothing to wait on
	}
}

var errCrashed = errors.New("test: this rank was killed")

// check waits for every member and compares the survivors with the
// reference run; it returns the survivors.
func (tj *toyJob) check(wantSurvivors int) []*member {
	t := tj.t
	t.Helper()
	done := make(chan struct{})
	go func() { tj.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-tj.ctx.Done():
		t.Fatalf("the elastic job did not finish: %v", context.Cause(tj.ctx))
	}
	ref := toyReference(tj.epochs, tj.l, tj.b)
	var alive []*member
	for i, m := range tj.members {
		if m.err != nil {
			if !errors.Is(m.err, errCrashed) && !errors.Is(m.err, ErrLeft) && !isCutOff(m.err) && !tj.j.crashed[m.c] && i != tj.quitter {
				t.Errorf("member %d: %v", i, m.err)
			}
			continue
		}
		alive = append(alive, m)
		if !slices.Equal(m.toy.p, ref.p) || !slices.Equal(m.toy.m, ref.m) || m.toy.steps != ref.steps {
			t.Errorf("member %d (rank %d of %d): parameters %v momentum %v after %d steps, want %v %v after %d (the uninterrupted run)",
				i, m.c.Rank(), m.c.Size(), m.toy.p, m.toy.m, m.toy.steps, ref.p, ref.m, ref.steps)
		}
		for k, n := range m.toy.seen {
			if n != 1 {
				t.Errorf("member %d: sample %d of epoch %d used %d times, want exactly once", i, k%tj.l, k/tj.l, n)
				break
			}
		}
	}
	if len(alive) != wantSurvivors {
		t.Errorf("%d members finished, want %d", len(alive), wantSurvivors)
	}
	for _, m := range alive {
		if m.c.Size() != wantSurvivors {
			t.Errorf("rank %d: size %d at the end, want %d", m.c.Rank(), m.c.Size(), wantSurvivors)
		}
	}
	return alive
}

func isCutOff(err error) bool {
	var cut *CutOffError
	return errors.As(err, &cut) || strings.Contains(err.Error(), "closed") || strings.Contains(err.Error(), "aborted")
}

// crashAt returns a hook that kills the members with the given indices
// when they are about to run step (count of committed steps).
func (tj *toyJob) crashAt(step int64, indices ...int) func(m *member, index int) error {
	return func(m *member, index int) error {
		if m.toy.steps == step && m.c.Epoch() == 0 && slices.Contains(indices, index) {
			tj.j.Crash(m.c)
			return errCrashed
		}
		return nil
	}
}

// The survivors' failed call is a *MembershipChangeError (errors.As).
func checkMembershipErr(t *testing.T, alive []*member) {
	t.Helper()
	for _, m := range alive {
		var mc *MembershipChangeError
		if m.first == nil || !errors.As(m.first, &mc) {
			t.Errorf("rank %d: first failure %v, want a *MembershipChangeError", m.c.Rank(), m.first)
		}
	}
}

func TestElasticCrashOneOfFour(t *testing.T) {
	tj := startToyJob(t, 4, 2, 40, 8)
	tj.hook = tj.crashAt(2, 1)
	for i, c := range tj.j.Comms {
		tj.run(c, 1, int64(1000*(i+1)))
	}
	// Rank, Size, Epoch and Stats are read from another goroutine while
	// they change (the race detector watches); the wire counters never go
	// back (they did, to 0, at every reconfiguration).
	stop := make(chan struct{})
	var readers sync.WaitGroup
	readers.Add(1)
	go func() {
		defer readers.Done()
		last := make([]Stats, len(tj.j.Comms))
		for {
			for i, c := range tj.j.Comms {
				// Rank, Size and Epoch are read from one view: separate
				// calls may straddle a reconfiguration (rank 3 of the old
				// view, size 3 of the new), which is why a loop re-reads
				// them after a reset, not during one.
				c.Rank()
				c.Size()
				if v := c.cur(); v.rank < 0 || v.rank >= v.size || v.epoch < 0 {
					t.Errorf("rank %d of %d in epoch %d", v.rank, v.size, v.epoch)
				}
				st := c.Stats()
				if st.PayloadBytesSent < last[i].PayloadBytesSent || st.MessagesSent < last[i].MessagesSent ||
					st.HeaderBytesSent < last[i].HeaderBytesSent || st.PayloadBytesRecv < last[i].PayloadBytesRecv {
					t.Errorf("member %d: wire counters went back from %+v to %+v (epoch %d)", i, last[i].Stats, st.Stats, c.Epoch())
				}
				last[i] = st
			}
			select {
			case <-stop:
				return
			default:
				runtime.Gosched()
			}
		}
	}()
	alive := tj.check(3)
	close(stop)
	readers.Wait()
	checkMembershipErr(t, alive)
	for _, m := range alive {
		if len(m.events) != 1 {
			t.Fatalf("rank %d: %d resets, want 1: %v", m.c.Rank(), len(m.events), m.events)
		}
		// The crash comes after member 1's commit 2: the job resumes from
		// it, or from commit 1 when the crash cut another member's commit
		// 2 short (its last message from member 1 never arrived).
		ev := m.events[0]
		if ev.OldSize != 4 || ev.NewSize != 3 || len(ev.Lost) != 1 || ev.Lost[0].Rank != 1 || ev.Step < 1 || ev.Step > 2 || ev.Step != alive[0].events[0].Step {
			t.Errorf("rank %d: event %v", m.c.Rank(), ev)
		}
	}
	// Buddy adoption: member 2 (rank 2, the next of lost rank 1) holds
	// rank 1's unique value of the commit the job resumed from (rank 1
	// counts from 2000, member 2 from 3000, one per step), and its own of
	// that commit too.
	for i, m := range tj.members {
		want := []int64(nil)
		if i == 2 && len(m.events) == 1 {
			step := m.events[0].Step
			if m.u.restored != 3000+step {
				t.Errorf("member 2 restored its own value of commit %d, resuming from commit %d", m.u.restored-3000, step)
			}
			want = []int64{2000 + step}
		}
		if m.err == nil && !slices.Equal(m.u.adopted, want) {
			t.Errorf("member %d adopted %v, want %v", i, m.u.adopted, want)
		}
	}
}

// A rank lost at any phase of a commit, by its own hand (at each stage of
// its Commit: before the agreement, between it and the buddy copy, after
// the copy, after taking the commit) or while a neighbour is at one (so it
// dies in the middle of the others' messages): every survivor resumes
// from one commit with its own unique state, and its lost predecessor's,
// of exactly that commit, and ends with the uninterrupted run's
// parameters and counter. Small unique state rides in the commit's
// allreduce; with pad, it is too large for that and takes the ring shift.
// With prepare, each commit is prepared during its step (its stage
// "commit" is then Prepare's), and a member lost between Prepare and
// Commit too.
func TestElasticCrashAtEveryCommitPhase(t *testing.T) {
	const n, at = 4, 3 // the commit of step 3
	stages := []string{"commit", "commit: agreed", "commit: shifted", "commit: taken"}
	type phase struct {
		victim, by int // by: the member whose hook kills the victim
		stage      string
	}
	var phases []phase
	for _, victim := range []int{0, 2, 3} {
		for _, st := range stages {
			phases = append(phases, phase{victim, victim, st})
		}
		phases = append(phases, phase{victim, (victim + 1) % n, "commit: agreed"}, phase{victim, (victim + n - 1) % n, "commit: shifted"})
	}
	for _, prepare := range []bool{false, true} {
		phases := phases
		if prepare {
			phases = append(phases, phase{0, 0, "prepared"}, phase{2, 1, "prepared"})
		}
		for _, pad := range []int{0, 5000} {
			for _, ph := range phases {
				crashPhase(t, n, at, prepare, pad, ph.victim, ph.by, ph.stage)
			}
		}
	}
}

// crashPhase is one case of TestElasticCrashAtEveryCommitPhase: member
// victim is lost when member by reaches stage of the commit of step at
// ("prepared": between its Prepare and its Commit).
func crashPhase(t *testing.T, n int, at int64, prepare bool, pad, victim, by int, stage string) {
	t.Helper()
	name := fmt.Sprintf("prepare %v/pad %d/member %d at %q", prepare, pad, victim, stage)
	if by != victim {
		name = fmt.Sprintf("prepare %v/pad %d/member %d while member %d is at %q", prepare, pad, victim, by, stage)
	}
	t.Run(name, func(t *testing.T) {
		tj := startToyJob(t, n, 1, 40, 8)
		tj.pad = pad
		tj.prepareCommits = prepare
		init := func(i int) int64 { return int64(1000 * (i + 1)) }
		if stage == "prepared" {
			tj.afterAllreduce = func(m *member, index int) error {
				if index == by && m.toy.steps == at-1 && m.c.Epoch() == 0 {
					tj.j.Crash(tj.j.Comms[victim])
				}
				return nil
			}
		}
		tj.prepare = func(m *member, index int) {
			if index != by || stage == "prepared" {
				return
			}
			m.st.testHook = func(st string) {
				// Prepare runs before the step's update counts it.
				steps := m.toy.steps
				if prepare && st == "commit" {
					steps++
				}
				if st == stage && steps == at && m.c.Epoch() == 0 {
					tj.j.Crash(tj.j.Comms[victim])
				}
			}
		}
		for i, c := range tj.j.Comms {
			tj.run(c, 1, init(i))
		}
		alive := tj.check(n - 1)
		ref := toyReference(tj.epochs, tj.l, tj.b)
		succ := (victim + 1) % n
		var resumed []int64
		for i, m := range tj.members {
			if i == victim || m.err != nil {
				continue
			}
			if len(m.events) != 1 {
				t.Errorf("member %d: %d resets, want 1: %v", i, len(m.events), m.events)
				continue
			}
			step := m.events[0].Step
			resumed = append(resumed, step)
			// A member lost at its Prepare has not waited for anything of
			// the step yet: the others may still be finishing the commit
			// before (the victim's last message of it undelivered), and
			// then run that step again, as after a loss right after a
			// commit without Prepare.
			oldest := at - 1
			if prepare && stage == "commit" {
				oldest = at - 2
			}
			if step > at || step < oldest {
				t.Errorf("member %d resumed from commit %d, want %d to %d", i, step, oldest, at)
			}
			if want := init(i) + step; m.u.restored != want {
				t.Errorf("member %d restored its own unique value %d, want %d (commit %d's, which the job resumed from)", i, m.u.restored, want, step)
			}
			if want := init(i) + ref.steps; m.u.val != want {
				t.Errorf("member %d ends with unique value %d, want %d (the uninterrupted run's)", i, m.u.val, want)
			}
			var want []int64
			if i == succ {
				want = []int64{init(victim) + step}
			}
			if !slices.Equal(m.u.adopted, want) {
				t.Errorf("member %d adopted %v, want %v (the lost member %d's value at commit %d)", i, m.u.adopted, want, victim, step)
			}
		}
		if len(alive) == n-1 && len(slices.Compact(slices.Clone(resumed))) != 1 {
			t.Errorf("the survivors resumed from different commits: %v", resumed)
		}
		t.Logf("resumed from commit %v", resumed)
	})
}

// Two adjacent ranks lost at once (kill -9 of ranks 1 and 2 of 5): the
// commit's allreduce gave every rank every rank's unique state, so the
// first survivor after them adopts both, nearest first.
func TestElasticAdjacentLossesKeepUniqueState(t *testing.T) {
	tj := startToyJob(t, 5, 1, 50, 10)
	init := func(i int) int64 { return int64(1000 * (i + 1)) }
	tj.hook = func(m *member, index int) error {
		if m.toy.steps == 2 && m.c.Epoch() == 0 && index == 1 {
			tj.j.Crash(tj.j.Comms[2])
			tj.j.Crash(m.c)
			return errCrashed
		}
		return nil
	}
	for i, c := range tj.j.Comms {
		tj.run(c, 1, init(i))
	}
	tj.check(3)
	m := tj.members[3]
	if len(m.events) == 0 {
		t.Fatalf("member 3: no reset")
	}
	step := m.events[len(m.events)-1].Step
	if want := []int64{init(2) + step, init(1) + step}; !slices.Equal(m.u.adopted, want) {
		t.Errorf("member 3 adopted %v, want %v (lost members 2 and 1 at commit %d)", m.u.adopted, want, step)
	}
}

// Two ranks of five lost at once, after their allreduce of a step and
// before its commit: the others may or may not have completed that step.
func TestElasticCrashTwoOfFive(t *testing.T) {
	tj := startToyJob(t, 5, 2, 45, 10)
	tj.afterAllreduce = func(m *member, index int) error {
		if m.toy.steps == 3 && m.c.Epoch() == 0 && index == 1 {
			tj.j.Crash(tj.j.Comms[3]) // wherever it is
			tj.j.Crash(m.c)
			return errCrashed
		}
		return nil
	}
	for i, c := range tj.j.Comms {
		tj.run(c, 1, int64(1000*(i+1)))
	}
	tj.check(3)
}

func TestElasticCrashOneOfTwo(t *testing.T) {
	tj := startToyJob(t, 2, 2, 20, 4)
	tj.hook = tj.crashAt(3, 0)
	for i, c := range tj.j.Comms {
		tj.run(c, 1, int64(1000*(i+1)))
	}
	alive := tj.check(1)
	checkMembershipErr(t, alive)
	// The commit resumed from is rank 0's last (3) or, if the crash
	// broke the buddy copy of that commit on rank 1, the one before.
	if len(alive) == 1 && len(alive[0].events) == 1 {
		step := alive[0].events[0].Step
		if got := alive[0].u.adopted; !slices.Equal(got, []int64{1000 + step}) || step < 2 || step > 3 {
			t.Errorf("the last rank resumed from commit %d and adopted %v, want rank 0's value at that commit, 1000+%d", step, got, step)
		}
	}
}

// A second rank dies while the survivors of the first loss reset: the
// reset starts over with the ranks that are left.
func TestElasticCrashDuringReset(t *testing.T) {
	tj := startToyJob(t, 4, 1, 40, 8)
	tj.hook = tj.crashAt(2, 3)
	tj.prepare = func(m *member, index int) {
		if index != 1 {
			return
		}
		m.st.testHook = func(stage string) {
			if stage == "restored" && m.c.Epoch() == 1 {
				tj.j.Crash(m.c)
			}
		}
	}
	for i, c := range tj.j.Comms {
		tj.run(c, 1, int64(1000*(i+1)))
	}
	alive := tj.check(2)
	for _, m := range alive {
		if m.c.Epoch() < 2 {
			t.Errorf("rank %d ends in epoch %d, want a second reconfiguration", m.c.Rank(), m.c.Epoch())
		}
		// The first reset failed, so one event reports both losses, with
		// their ranks at the last commit (epoch 0): 3, then 1.
		var lost []int
		for _, ev := range m.events {
			for _, l := range ev.Lost {
				lost = append(lost, l.Rank)
			}
		}
		slices.Sort(lost)
		if !slices.Equal(lost, []int{1, 3}) {
			t.Errorf("rank %d: resets %v report lost ranks %v, want [1 3]", m.c.Rank(), m.events, lost)
		}
		if len(m.events) > 0 && m.events[len(m.events)-1].OldSize != 4 {
			t.Errorf("rank %d: last reset %v: old size %d, want 4 (the size the loop last ran with)", m.c.Rank(), m.events[len(m.events)-1], m.events[len(m.events)-1].OldSize)
		}
	}
}

// A joiner admitted at a commit gets the state by broadcast (its own
// parameters are wrong on purpose) and the job ends exact with 3 ranks.
func TestElasticJoinerGetsState(t *testing.T) {
	tj := startToyJob(t, 2, 2, 30, 6, WithElasticLimits(1, 3))
	joined := tj.joinAtStep2()
	for i, c := range tj.j.Comms {
		tj.run(c, 1, int64(1000*(i+1)))
	}
	jm := tj.runJoiner(joined)
	alive := tj.check(3)
	if len(alive) == 3 && (!jm.u.fresh || jm.c.Rank() != 2) {
		t.Errorf("joiner: fresh unique state %v, rank %d; want fresh, rank 2", jm.u.fresh, jm.c.Rank())
	}
	for _, m := range alive {
		if len(m.events) != 1 || m.events[0].OldSize != 2 || m.events[0].NewSize != 3 || !slices.Equal(m.events[0].Joined, []int{2}) {
			t.Errorf("rank %d: events %v", m.c.Rank(), m.events)
		}
	}
}

// Fewer samples than ranks: some ranks get no sample in a step and still
// take part; nothing is used twice.
func TestElasticDatasetShorterThanRanks(t *testing.T) {
	tj := startToyJob(t, 4, 3, 3, 3)
	for i, c := range tj.j.Comms {
		tj.run(c, 1, int64(1000*(i+1)))
	}
	tj.check(4)
}

// On a Comm that is not elastic RunElastic runs the loop once and Commit
// does nothing: no collective is numbered.
func TestRunElasticNotElastic(t *testing.T) {
	comms := newJob(t, 2)
	errs := onEach(comms, func(c *Comm) error {
		if c.Elastic() || c.Epoch() != 0 {
			return fmt.Errorf("elastic %v epoch %d", c.Elastic(), c.Epoch())
		}
		st := NewElasticState(c)
		x := []float32{float32(c.Rank())}
		if err := st.Register("x", x); err != nil {
			return err
		}
		calls := 0
		err := RunElastic(context.Background(), c, st, func(ctx context.Context) error {
			calls++
			if err := st.Commit(ctx); err != nil {
				return err
			}
			return c.Allreduce(ctx, x, Sum)
		})
		if err != nil {
			return err
		}
		if calls != 1 || x[0] != 1 || c.Stats().Collectives != 1 {
			return fmt.Errorf("calls %d, x %v, collectives %d", calls, x, c.Stats().Collectives)
		}
		return nil
	})
	for i, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", i, err)
		}
	}
}

func TestElasticSamplerExactlyOnce(t *testing.T) {
	const n = 103
	s := NewElasticSampler(n, 7)
	seen := make([]int, n)
	sizes := []int{4, 4, 3, 3, 5, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}
	for step := 0; !s.EpochDone(); step++ {
		size := sizes[step%len(sizes)]
		// Every rank of the step, each from its own copy of the state.
		cursor := s.Cursor()
		var next *ElasticSampler
		for r := range size {
			cp := *s
			for _, i := range cp.Next(10, r, size) {
				seen[i]++
			}
			next = &cp
		}
		if next.Cursor() != min(cursor+10, n) {
			t.Fatalf("cursor %d after a step from %d", next.Cursor(), cursor)
		}
		*s = *next
	}
	for i, c := range seen {
		if c != 1 {
			t.Fatalf("sample %d used %d times", i, c)
		}
	}
	if s.Next(10, 0, 1) != nil {
		t.Fatal("Next after the end of the epoch returned samples")
	}
	a := NewElasticSampler(n, 7)
	a.NextEpoch()
	if slices.Equal(a.Next(n, 0, 1), NewElasticSampler(n, 7).Next(n, 0, 1)) {
		t.Fatal("two epochs drew the same permutation")
	}
	for _, tc := range [][3]int{{3, 0, 4}, {3, 3, 4}, {10, 1, 3}} {
		lo, hi := Share(tc[0], tc[1], tc[2])
		if hi < lo || hi-lo > tc[0]/tc[2]+1 {
			t.Errorf("Share%v = [%d, %d)", tc, lo, hi)
		}
	}
}

// Env: rank -1 only in an elastic job.
func TestReadEnvElastic(t *testing.T) {
	base := map[string]string{EnvRank: "-1", EnvSize: "4", EnvRendezvous: "127.0.0.1:1", EnvJobKey: strings.Repeat("ab", 16)}
	get := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	if _, err := readEnv(get(base)); err == nil || !strings.Contains(err.Error(), EnvElastic) {
		t.Fatalf("rank -1 without %s: %v", EnvElastic, err)
	}
	base[EnvElastic] = "1"
	base[EnvHeartbeatTimeout] = "1500ms"
	e, err := readEnv(get(base))
	if err != nil || !e.elastic || e.rank != -1 || e.heartbeat != 1500*time.Millisecond {
		t.Fatalf("%+v, %v", e, err)
	}
	base[EnvHeartbeatTimeout] = "soon"
	if _, err := readEnv(get(base)); err == nil {
		t.Fatal("a bad heartbeat was accepted")
	}
}

// An uneven split of the global batch: every rank runs its own number of
// micro-batches, each weighted by its sample count, and Step leaves the
// exact mean over the global batch, as one process computes it.
func TestReducerUnevenSplitWeighted(t *testing.T) {
	const n, local = 3, 2
	comms := memJob(t, n)
	sampleGrad := func(i, e int) float64 { return float64(i*7+e) + 0.25*float64(i%3) }
	// Two steps: a global batch of 10 (shares 3, 3, 4), then a short last
	// batch of 4 (shares 1, 1, 2) set with SetGlobalBatch.
	type stepResult struct {
		plans   [][]int
		results [][]float64
	}
	steps := []int{10, 4}
	got := make([]stepResult, len(steps))
	for i := range got {
		got[i] = stepResult{make([][]int, n), make([][]float64, n)}
	}
	errs := onEach(comms, func(c *Comm) error {
		red, err := NewReducer(c, ReducerOptions{GlobalBatch: steps[0], LocalBatch: local, UnevenSplit: true})
		if err != nil {
			return err
		}
		gw, gb := make([]float64, 3), make([]float64, 2) // one bucket of two tensors
		if err := red.Register("w", nil, gw); err != nil {
			return err
		}
		if err := red.Register("b", nil, gb); err != nil {
			return err
		}
		for s, global := range steps {
			if err := red.SetGlobalBatch(global); err != nil {
				return err
			}
			plan := red.MicroBatches()
			got[s].plans[c.Rank()] = plan
			lo, _ := Share(global, c.Rank(), c.Size())
			for _, m := range plan {
				var mean [5]float64
				for i := lo; i < lo+m; i++ {
					for e := range mean {
						mean[e] += sampleGrad(i, e) / float64(m)
					}
				}
				lo += m
				copy(gw, mean[:3])
				copy(gb, mean[3:])
				if err := red.Backward(context.Background()); err != nil {
					return err
				}
			}
			if err := red.Step(context.Background()); err != nil {
				return err
			}
			got[s].results[c.Rank()] = append(slices.Clone(gw), gb...)
		}
		return nil
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", i, err)
		}
	}
	wantPlans := [][][]int{{{2, 1}, {2, 1}, {2, 2}}, {{1}, {1}, {2}}}
	for s, global := range steps {
		var want [5]float64
		for i := range global {
			for e := range want {
				want[e] += sampleGrad(i, e) / float64(global)
			}
		}
		for r := range n {
			if !slices.Equal(got[s].plans[r], wantPlans[s][r]) {
				t.Fatalf("batch %d: plans %v, want %v", global, got[s].plans, wantPlans[s])
			}
			for e := range want {
				if d := got[s].results[r][e] - want[e]; d > 1e-12 || d < -1e-12 {
					t.Fatalf("batch %d: rank %d: mean %v, want %v", global, r, got[s].results[r], want)
				}
			}
		}
	}
}

// Commit cost: a copy of 1 MiB of replicated state and the agreement, and
// with unique=64KiB the buddy copy of 64 KiB of unique state, at 1, 2 and 4
// ranks of one process (unix-socket links).
func BenchmarkElasticCommit(b *testing.B) {
	for _, unique := range []int{0, 64 << 10} {
		for _, n := range []int{1, 2, 4} {
			benchCommit(b, n, unique)
		}
	}
}

func benchCommit(b *testing.B, n, unique int) {
	{
		b.Run(fmt.Sprintf("N=%d/unique=%dKiB", n, unique>>10), func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			j, err := StartLocal(ctx, n, WithElastic(0), WithTimeout(30*time.Second))
			if err != nil {
				b.Fatal(err)
			}
			defer j.Close()
			sts := make([]*ElasticState, n)
			for r, c := range j.Comms {
				sts[r] = NewElasticState(c)
				if err := sts[r].Register("params", make([]float32, 1<<18)); err != nil { // 1 MiB
					b.Fatal(err)
				}
				if unique > 0 {
					if err := sts[r].RegisterUnique("rng", &blobState{b: make([]byte, unique)}); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.SetBytes(1 << 20)
			b.ResetTimer()
			errs := onEach(j.Comms, func(c *Comm) error {
				st := sts[c.Rank()]
				for range b.N {
					if err := st.Commit(ctx); err != nil {
						return err
					}
				}
				return nil
			})
			b.StopTimer()
			for _, err := range errs {
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

type blobState struct{ b []byte }

func (s *blobState) SaveUnique() ([]byte, error)                { return s.b, nil }
func (s *blobState) RestoreUnique(own []byte, _ [][]byte) error { s.b = own; return nil }

// A Reducer on an elastic Comm follows a membership change by itself: a
// new plan of micro-batches for the new rank and size, and a new layout
// and topology check, at its first use in the new epoch.
func TestReducerReplansAfterAReset(t *testing.T) {
	tj := startToyJob(t, 3, 1, 1, 1)
	ctx := tj.ctx
	reds := make([]*Reducer, 3)
	grads := make([][]float64, 3)
	for i, c := range tj.j.Comms {
		var err error
		if reds[i], err = NewReducer(c, ReducerOptions{GlobalBatch: 10, LocalBatch: 2}); err != nil {
			t.Fatal(err)
		}
		grads[i] = make([]float64, 4)
		if err := reds[i].Register("g", nil, grads[i]); err != nil {
			t.Fatal(err)
		}
		if got, want := reds[i].MicroBatches(), [][]int{{2, 1}, {2, 1}, {2, 2}}[i]; !slices.Equal(got, want) {
			t.Fatalf("rank %d: plan %v, want %v", i, got, want)
		}
	}
	tj.j.Crash(tj.j.Comms[2])
	survivors := tj.j.Comms[:2]
	errs := onEach(survivors, func(c *Comm) error {
		err := c.Barrier(ctx)
		if !isMembershipChange(err) {
			return fmt.Errorf("barrier after a crash: %v, want a membership change", err)
		}
		if _, _, err := c.reconfigure(ctx); err != nil {
			return err
		}
		r := reds[c.Rank()]
		if got := r.MicroBatches(); !slices.Equal(got, []int{2, 2, 1}) {
			return fmt.Errorf("plan %v after the change, want [2 2 1]", got)
		}
		g := grads[c.Rank()]
		for _, m := range r.MicroBatches() {
			for e := range g {
				g[e] = float64(m) // the micro-batch's mean gradient
			}
			if err := r.Backward(ctx); err != nil {
				return err
			}
		}
		if err := r.Step(ctx); err != nil {
			return err
		}
		// Each rank: 2·2 + 2·2 + 1·1 = 9 sample-gradients; mean 18/10.
		if g[0] != 1.8 {
			return fmt.Errorf("mean %v, want 1.8", g[0])
		}
		return nil
	})
	for i, err := range errs {
		if err != nil {
			t.Errorf("survivor %d: %v", i, err)
		}
	}
}

// In an elastic job, ranks that call different things still abort the
// whole job: a mismatch is a bug of the program, not a lost member.
func TestElasticMismatchAborts(t *testing.T) {
	tj := startToyJob(t, 2, 1, 1, 1)
	errs := onEach(tj.j.Comms, func(c *Comm) error {
		return c.Allreduce(tj.ctx, make([]float32, 10+c.Rank()), Sum)
	})
	for r, err := range errs {
		if err == nil || isMembershipChange(err) || !strings.Contains(err.Error(), "called Allreduce(float32[10], Sum") {
			t.Errorf("rank %d: %v, want the mismatch", r, err)
		}
	}
	for r, c := range tj.j.Comms {
		if err := c.Err(); err == nil || isMembershipChange(err) {
			t.Errorf("rank %d: Err() = %v after a mismatch, want the job aborted", r, err)
		}
	}
}

// Compression residuals are rank-unique state: a rank restores its own and
// adds in those of a lost predecessor (same tensor, same length); the
// owner-side residuals belong to the old ring's segments and are reset
// when the ring changed, which the notes say.
func TestResidualsRestoreAndAdopt(t *testing.T) {
	mk := func(size, rank int, contrib float32) *compressionState {
		s, err := newCompressionState(compressionConfig{}, func(string) string { return "" })
		if err != nil {
			t.Fatal(err)
		}
		fb := s.feedback("g", 6, size, rank)
		for i := range fb.Contrib {
			fb.Contrib[i] = contrib
		}
		for i := range fb.Owner {
			fb.Owner[i] = 9
		}
		return s
	}
	own := mk(2, 0, 1).saveResiduals(&commView{size: 2, rank: 0})
	lost := mk(2, 1, 0.5).saveResiduals(&commView{size: 2, rank: 1})
	s := mk(1, 0, 0)
	notes := s.restoreResiduals(own, [][]byte{lost}, 1, 0)
	fb := s.fb["g"]
	if fb == nil || !slices.Equal(fb.Contrib, []float32{1.5, 1.5, 1.5, 1.5, 1.5, 1.5}) {
		t.Fatalf("contrib residuals %v, want own 1 + adopted 0.5", fb)
	}
	if len(fb.Owner) != 6 || slices.Max(fb.Owner) != 0 {
		t.Fatalf("owner residuals %v, want 6 zeros (the segment changed)", fb.Owner)
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "owner-side compression residuals of 1 tensors reset") {
		t.Fatalf("notes %q", notes)
	}
	// A joiner has none; a lost rank's tensor of another length is dropped.
	other := mk(2, 1, 1)
	other.fb["g"] = &ring.Feedback{Contrib: make([]float32, 3), Owner: make([]float32, 1)}
	notes = s.restoreResiduals(nil, [][]byte{other.saveResiduals(&commView{size: 2, rank: 1})}, 1, 0)
	if len(s.fb) != 0 || len(notes) != 1 || !strings.Contains(notes[0], "dropped") {
		t.Fatalf("joiner: residuals %v, notes %q", s.fb, notes)
	}
}

// A rank stopped as by SIGSTOP is dropped after the heartbeat bound, and
// the others go on, exact, long before the collective timeout.
func TestElasticFrozenRank(t *testing.T) {
	// The default bound: a shorter one could take a rank of a loaded CI
	// machine (-race, 2 shared cores) for frozen (see
	// TestElasticNoFalseAlarmUnderLoad).
	const hb = DefaultHeartbeatTimeout
	tj := startToyJob(t, 3, 1, 30, 6, WithElastic(hb))
	release := make(chan struct{})
	frozen := make(chan func(), 1) // the thaw of the frozen rank
	tj.hook = func(m *member, index int) error {
		if index != 2 || m.toy.steps != 2 || m.c.Epoch() != 0 {
			return nil
		}
		frozen <- tj.j.Freeze(m.c)
		select { // the stopped process does nothing until SIGCONT
		case <-release:
		case <-tj.ctx.Done():
		}
		return nil
	}
	for i, c := range tj.j.Comms {
		tj.run(c, 1, int64(1000*(i+1)))
	}
	var thaw func()
	select {
	case thaw = <-frozen:
	case <-tj.ctx.Done():
		t.Fatal("rank 2 never reached its freeze")
	}
	frozeAt := time.Now()
	var resetTook time.Duration
	for _, m := range tj.members[:2] {
		select {
		case <-m.done:
		case <-tj.ctx.Done():
			t.Fatal("the survivors did not finish")
		}
		if len(m.events) > 0 {
			resetTook = m.events[0].Took
		}
	}
	since := time.Since(frozeAt)
	thaw()
	close(release)
	alive := tj.check(2)
	checkMembershipErr(t, alive)
	// Within the heartbeat bound plus the wait for the verdict, far below
	// the 30 s collective timeout.
	if since > 20*time.Second {
		t.Errorf("the survivors took %v after the freeze (reset %v), want about the heartbeat bound %v", since, resetTook, hb)
	}
	if m := tj.members[2]; m.err == nil {
		t.Errorf("the frozen rank went on after it was dropped")
	} else {
		t.Logf("the frozen rank, thawed: %v", m.err)
	}
}

// A second goroutine making a synchronous collective while Commit admits a
// joiner (grow holds the ring, waiting in the node's Grow) must neither
// deadlock nor run: the call is queued, and fails with a
// *MembershipChangeError once the epoch it was numbered in is replaced.
// Before the fix, the call took the Comm's mutex and then waited for the
// ring's, and grow, holding the ring's, waited for the mutex to adopt the
// new epoch: both hung for good.
func TestElasticSyncCallDuringGrow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	j, err := StartLocal(ctx, 2, WithElastic(0), WithElasticLimits(1, 3), WithTimeout(20*time.Second), WithLogger(t.Logf))
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	joined := make(chan *Comm, 1)
	go func() {
		c, err := j.Join(ctx)
		if err != nil {
			t.Errorf("joiner: %v", err)
		}
		joined <- c
	}()
	for _, c := range j.Comms {
		for c.node.PendingJoiners() == 0 {
			select {
			case <-ctx.Done():
				t.Fatal("no joiner announced")
			case <-time.After(10 * time.Millisecond): // a counter the pings update
			}
		}
	}
	c0 := j.Comms[0]
	side := make(chan error, 1)
	c0.testReconfigHook = func() {
		go func() { side <- c0.Allreduce(ctx, []int64{1}, Sum, Name("side call")) }()
		// Until the side call is queued (fixed), or surely blocked.
		deadline := time.Now().Add(500 * time.Millisecond)
		for time.Now().Before(deadline) {
			c0.mu.Lock()
			n := c0.pending
			c0.mu.Unlock()
			if n > 0 {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	sts := make([]*ElasticState, 2)
	done := make(chan error, 3)
	for r, c := range j.Comms {
		sts[r] = NewElasticState(c)
		if err := sts[r].Register("p", []int64{int64(r), 7}); err != nil {
			t.Fatal(err)
		}
		go func() { done <- sts[r].Commit(ctx) }()
	}
	var jc *Comm
	select {
	case jc = <-joined:
	case <-ctx.Done():
		t.Fatal("the joiner was not admitted: deadlock?")
	}
	if jc == nil {
		t.FailNow()
	}
	jst := NewElasticState(jc)
	if err := jst.Register("p", make([]int64, 2)); err != nil {
		t.Fatal(err)
	}
	go func() { done <- RunElastic(ctx, jc, jst, func(context.Context) error { return nil }) }()
	for range 3 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatal("Commit/reset did not finish: deadlock between a sync call and grow")
		}
	}
	select {
	case err := <-side:
		var mc *MembershipChangeError
		if !errors.As(err, &mc) {
			t.Fatalf("side call: %v, want a *MembershipChangeError", err)
		}
	case <-ctx.Done():
		t.Fatal("the side call never returned")
	}
	c0.testReconfigHook = nil
	if !jc.Joiner() || c0.Joiner() || j.Comms[1].Joiner() {
		t.Errorf("Joiner: %v for the joiner, %v and %v for the members; want true, false, false", jc.Joiner(), c0.Joiner(), j.Comms[1].Joiner())
	}
	if jc.Size() != 3 || c0.Size() != 3 || c0.Epoch() != 1 {
		t.Fatalf("sizes %d/%d, epoch %d; want 3 ranks in epoch 1", jc.Size(), c0.Size(), c0.Epoch())
	}
}

// A view whose ring was never formed (its epoch ended while it formed)
// has no traffic of its own: Stats gives the earlier epochs' counters and
// does not panic; a call queued in an epoch that was replaced, though not
// ended, fails as a membership change.
func TestElasticViewWithoutRing(t *testing.T) {
	base := ring.Stats{PayloadBytesSent: 10, HeaderBytesSent: 56, MessagesSent: 1, PayloadBytesRecv: 10}
	c := &Comm{}
	v1 := &commView{rank: 1, size: 3, epoch: 4, ctx: context.Background()}
	c.view.Store(&commView{rank: 0, size: 2, epoch: 5, base: base, ctx: context.Background()})
	if got := c.Stats().Stats; got != base {
		t.Fatalf("Stats of a view without a ring: %+v, want %+v", got, base)
	}
	err := c.staleErr(&Handle{view: v1, call: ring.Call{Kind: ring.Allreduce, Seq: 3}})
	var mc *MembershipChangeError
	if !errors.As(err, &mc) || mc.Epoch != 4 || mc.Next != 5 {
		t.Fatalf("a call of a replaced epoch: %v, want a *MembershipChangeError from epoch 4 to 5", err)
	}
}

// No false alarm on a loaded machine: with the default heartbeat bound, a
// job whose process is saturated (GOMAXPROCS busy goroutines and forced
// GCs, for more than two heartbeat periods) while its ranks keep calling
// collectives and committing sees no membership change.
func TestElasticNoFalseAlarmUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for more than two heartbeat periods")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 3
	j, err := StartLocal(ctx, n, WithElastic(0), WithTimeout(30*time.Second), WithLogger(t.Logf))
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	load := 2*DefaultHeartbeatTimeout + time.Second
	end := time.Now().Add(load)
	var busy sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		busy.Add(1)
		go func() {
			defer busy.Done()
			x := 1.0
			for i := 0; time.Now().Before(end); i++ {
				x = x*1.0000001 + 1e-9
				if i%1_000_000 == 0 {
					_ = make([]byte, 1<<20) // garbage for the collector
				}
			}
			_ = x
		}()
	}
	busy.Add(1)
	go func() {
		defer busy.Done()
		for time.Now().Before(end) {
			runtime.GC()
			time.Sleep(50 * time.Millisecond)
		}
	}()
	errs := onEach(j.Comms, func(c *Comm) error {
		st := NewElasticState(c)
		p := make([]float32, 1<<14)
		if err := st.Register("p", p); err != nil {
			return err
		}
		return RunElastic(ctx, c, st, func(ctx context.Context) error {
			for steps := 0; ; steps++ {
				// Every rank stops at the same step: the first after the
				// load that rank 0 saw end.
				stop := []int64{0}
				if c.Rank() == 0 && time.Now().After(end) {
					stop[0] = 1
				}
				if err := c.Allreduce(ctx, stop, Max); err != nil {
					return err
				}
				if stop[0] == 1 {
					return nil
				}
				if err := c.Allreduce(ctx, p, Sum); err != nil {
					return err
				}
				if err := st.Commit(ctx); err != nil {
					return err
				}
				time.Sleep(time.Duration(steps%3) * 100 * time.Millisecond) // idle gaps too
			}
		})
	})
	busy.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	for r, c := range j.Comms {
		if c.Epoch() != 0 || c.Size() != n {
			t.Errorf("rank %d: epoch %d, size %d: a false alarm under load", r, c.Epoch(), c.Size())
		}
	}
}

// Close while the Comm waits, below the job's minimum size, for members
// (up to the rendezvous's 600 s): it returns at once, not when the wait
// ends, and later calls fail with ErrClosed.
func TestElasticCloseDuringReconfigure(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	j, err := StartLocal(ctx, 2, WithElastic(0), WithElasticLimits(2, 2), WithTimeout(30*time.Second), WithLogger(t.Logf))
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	c := j.Comms[0]
	j.Crash(j.Comms[1])
	if err := c.Allreduce(ctx, []int64{1}, Sum); !isMembershipChange(err) {
		t.Fatalf("allreduce after the crash: %v, want a membership change", err)
	}
	reconf := make(chan error, 1)
	go func() {
		_, _, err := c.reconfigure(ctx)
		reconf <- err
	}()
	for { // until the reconfiguration holds the ring
		c.mu.Lock()
		r := c.reconfiguring
		c.mu.Unlock()
		if r {
			break
		}
		select {
		case err := <-reconf:
			t.Fatalf("reconfigure returned below the minimum size: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	start := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for the reconfiguration (below the minimum size)")
	}
	t.Logf("Close took %v", time.Since(start))
	if err := <-reconf; !errors.Is(err, ErrClosed) {
		t.Errorf("reconfigure: %v, want ErrClosed", err)
	}
	if err := c.Barrier(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("a call after Close: %v, want ErrClosed", err)
	}
}

// Samplers with different seeds would draw different permutations: the
// registration check refuses them at the start, as it does other
// differences of the registered state.
func TestElasticSamplerSeedMismatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	j, err := StartLocal(ctx, 2, WithElastic(0), WithTimeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	errs := onEach(j.Comms, func(c *Comm) error {
		st := NewElasticState(c)
		if err := st.Register("sampler", NewElasticSampler(100, uint64(7+c.Rank()))); err != nil {
			return err
		}
		return RunElastic(ctx, c, st, func(context.Context) error { return nil })
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "registered different state") {
			t.Errorf("rank %d: %v, want the registration mismatch", r, err)
		}
	}
}

// Members that ask to leave (RequestLeave, as on SIGTERM) in the middle of
// a step leave at its commit: their RunElastic returns ErrLeft, the others
// go on from that commit without running any step again, their successors
// adopt the leavers' unique state of that commit, and everybody ends with
// the uninterrupted run's parameters.
func TestElasticLeaveCostsNoStep(t *testing.T) {
	for _, tc := range []struct {
		n       int
		leavers []int
	}{
		{4, []int{0}}, {4, []int{2}}, {4, []int{3}}, {5, []int{1, 3}}, {3, []int{0, 1}}, {5, []int{4, 0, 1}},
	} {
		for _, prepare := range []bool{false, true} {
			leaveCostsNoStep(t, tc.n, tc.leavers, prepare)
		}
	}
}

// leaveCostsNoStep is one case of TestElasticLeaveCostsNoStep: the members
// leavers of a job of n ask to leave during step 4, with commits prepared
// during their steps or not.
func leaveCostsNoStep(t *testing.T, n int, leavers []int, prepare bool) {
	t.Helper()
	t.Run(fmt.Sprintf("%d of %d/prepare %v", leavers, n, prepare), func(t *testing.T) {
		const at = 3 // asks during step 4, leaves at its commit
		tj := startToyJob(t, n, 1, 12*n, 2*n)
		tj.prepareCommits = prepare
		init := func(i int) int64 { return int64(1000 * (i + 1)) }
		tj.hook = func(m *member, index int) error {
			if m.toy.steps == at && slices.Contains(leavers, index) {
				m.c.RequestLeave("test")
			}
			return nil
		}
		for i, c := range tj.j.Comms {
			tj.run(c, 1, init(i))
		}
		survivors := n - len(leavers)
		tj.check(survivors)
		ref := toyReference(tj.epochs, tj.l, tj.b)
		left := map[int]bool{}
		for _, i := range leavers {
			left[i] = true
		}
		for i, m := range tj.members {
			if left[i] {
				var le *LeftError
				if !errors.Is(m.err, ErrLeft) || !errors.As(m.err, &le) || le.Why != "test" {
					t.Errorf("leaver %d: RunElastic returned %v, want a *LeftError for \"test\"", i, m.err)
				}
				if m.toy.steps != at+1 || m.u.val != init(i)+at+1 {
					t.Errorf("leaver %d left after %d steps with unique value %d, want %d and %d", i, m.toy.steps, m.u.val, at+1, init(i)+at+1)
				}
				if err := m.c.Barrier(context.Background()); !errors.Is(err, ErrLeft) {
					t.Errorf("leaver %d: a call after leaving returned %v, want ErrLeft", i, err)
				}
				continue
			}
			if m.ran != ref.steps {
				t.Errorf("member %d ran %d steps, want %d: a graceful leave must not re-run a step", i, m.ran, ref.steps)
			}
			if want := init(i) + ref.steps; m.u.val != want {
				t.Errorf("member %d ends with unique value %d, want %d", i, m.u.val, want)
			}
			if len(m.events) != 1 {
				t.Errorf("member %d: %d resets, want 1: %v", i, len(m.events), m.events)
				continue
			}
			ev := m.events[0]
			if ev.Step != at+1 || ev.NewSize != survivors || ev.OldSize != n || len(ev.Lost) != len(leavers) {
				t.Errorf("member %d: reset %v, want commit %d, %d -> %d ranks, %d lost", i, ev, at+1, n, survivors, len(leavers))
			}
			for _, l := range ev.Lost {
				if !l.Left || !left[l.Rank] || !strings.Contains(l.Cause, "left the job (test)") {
					t.Errorf("member %d: lost %+v, want a leaver (Left, cause \"left the job (test)\")", i, l)
				}
			}
			// The first member alive after leavers adopts their state,
			// nearest first, also of leavers whose buddy left too.
			var want []int64
			for p := (i + n - 1) % n; left[p] && p != i; p = (p + n - 1) % n {
				want = append(want, init(p)+at+1)
			}
			if !slices.Equal(m.u.adopted, want) {
				t.Errorf("member %d adopted %v, want %v", i, m.u.adopted, want)
			}
		}
	})
}

// Every member leaving at once ends the job: each RunElastic returns
// ErrLeft, and nothing hangs.
func TestElasticAllLeave(t *testing.T) {
	tj := startToyJob(t, 3, 1, 36, 6)
	tj.hook = func(m *member, index int) error {
		if m.toy.steps == 2 {
			m.c.RequestLeave("drain")
		}
		return nil
	}
	for i, c := range tj.j.Comms {
		tj.run(c, 1, int64(i))
	}
	tj.check(0)
	for i, m := range tj.members {
		if !errors.Is(m.err, ErrLeft) || m.toy.steps != 3 {
			t.Errorf("member %d: %v after %d steps, want ErrLeft after 3", i, m.err, m.toy.steps)
		}
	}
}

// A member whose context ends in a collective (a program that cancels on
// SIGTERM) leaves at once: the others lose that step, as after a crash,
// but the job is not aborted and ends with the uninterrupted result.
func TestElasticCancelledContextLeaves(t *testing.T) {
	tj := startToyJob(t, 4, 1, 40, 8)
	victim, cancelVictim := context.WithCancelCause(tj.ctx)
	defer cancelVictim(nil)
	tj.quitter = 1
	tj.memberCtx = func(index int) context.Context {
		if index == 1 {
			return victim
		}
		return tj.ctx
	}
	tj.afterAllreduce = func(m *member, index int) error {
		if index == 2 && m.toy.steps == 2 && m.c.Epoch() == 0 {
			cancelVictim(errors.New("terminated signal received"))
		}
		return nil
	}
	for i, c := range tj.j.Comms {
		tj.run(c, 1, int64(1000*(i+1)))
	}
	alive := tj.check(3)
	if m := tj.members[1]; !strings.Contains(fmt.Sprint(m.err), "terminated signal received") {
		t.Errorf("member 1: %v, want its context's end", m.err)
	}
	for _, m := range alive {
		if len(m.events) != 1 || len(m.events[0].Lost) != 1 || !strings.Contains(m.events[0].Lost[0].Cause, "terminated signal received") {
			t.Errorf("rank %d: resets %v, want one losing member 1 with its context's cause", m.c.Rank(), m.events)
		}
	}
}

// A joiner that registered different state than the job's members (another
// program or version) is sent away at its first reset; the members go on
// without it and end as the uninterrupted run.
func TestElasticJoinerWithOtherStateSentAway(t *testing.T) {
	tj := startToyJob(t, 2, 2, 30, 6, WithElasticLimits(1, 3))
	tj.quitter = 2
	joined := tj.joinAtStep2()
	var extra int64
	tj.prepare = func(m *member, index int) {
		if index == 2 {
			if err := m.st.Register("extra", &extra); err != nil {
				t.Error(err)
			}
		}
	}
	for i, c := range tj.j.Comms {
		tj.run(c, 1, int64(1000*(i+1)))
	}
	jm := tj.runJoiner(joined)
	tj.check(2)
	if want := "registered different elastic state"; jm.err == nil || !strings.Contains(jm.err.Error(), want) {
		t.Errorf("joiner: %v, want an error saying it %s", jm.err, want)
	}
}

// A joiner that calls something else than the job (another program or
// version) leaves, naming both calls, and the job that ran fine before it
// came goes on from its last commit with the same results, instead of
// aborting.
func TestElasticJoinerWithOtherCallsSentAway(t *testing.T) {
	tj := startToyJob(t, 2, 2, 30, 6, WithElasticLimits(1, 3))
	tj.quitter = 2
	joined := tj.joinAtStep2()
	admitted := tj.hook
	tj.hook = func(m *member, index int) error {
		if index == 2 && m.ran == 2 {
			// What the joiner's other program does at its third step.
			return m.c.Allreduce(tj.ctx, make([]float64, 6), Sum, Name("other program"))
		}
		return admitted(m, index)
	}
	for i, c := range tj.j.Comms {
		tj.run(c, 1, int64(1000*(i+1)))
	}
	jm := tj.runJoiner(joined)
	alive := tj.check(2)
	if want := "leaves the job, which goes on without it"; jm.err == nil || !strings.Contains(jm.err.Error(), want) || !strings.Contains(jm.err.Error(), "float64[6]") {
		t.Errorf("joiner: %v, want an error naming its call and saying it %s", jm.err, want)
	}
	for _, m := range alive {
		var saw bool
		for _, ev := range m.events {
			for _, l := range ev.Lost {
				saw = saw || strings.Contains(l.Cause, "float64[6]") && strings.Contains(l.Cause, "int64[")
			}
		}
		if !saw {
			t.Errorf("rank %d: no reset names the joiner's call and the job's: %+v", m.c.Rank(), m.events)
		}
	}
}
