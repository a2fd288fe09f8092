package collective

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"time"

	"github.com/gorun/gorun/internal/memcopy"
	"gorgonia.org/tensor"
)

// Elastic training: the state a training loop commits, and the run wrapper
// that survives membership changes (Horovod's hvd.elastic.run and State).
//
// A loop registers its replicated state (parameters, optimizer moments,
// counters, the sampler) and its rank-unique state (an RNG, a data reader)
// in an ElasticState, and calls Commit at the end of every step. RunElastic
// runs the loop; when a member is lost, the loop's collectives fail with a
// *MembershipChangeError, and RunElastic re-forms the ring with the ranks
// that are left, restores the last commit, hands every surviving rank its
// unique state (and the lost ranks' to their buddies), tells the OnReset
// callbacks, and calls the loop again: the interrupted step is re-run by
// the survivors, and nothing committed is lost. Joiners are admitted at a
// Commit and get the state from a live rank, over the ring.

// ElasticEvent describes a reset of an elastic job, for OnReset callbacks
// and logs.
type ElasticEvent struct {
	Epoch   int          // the membership epoch the job is in now
	OldSize int          // ranks at the commit the job resumes from
	NewSize int          // ranks now
	Rank    int          // this rank now
	Lost    []LostMember // members lost since that commit (their ranks then)
	Joined  []int        // ranks, now, of the members admitted by this change
	Step    int64        // the commit the job resumes from: how many Commits it made
	// Took is how long this rank spent from the failed call (or the start
	// of the Commit that admitted joiners) to the end of the reset: the
	// re-forming of the ring and the state's agreement, broadcast and
	// restore. Detection (the heartbeat bound for a frozen member) comes
	// before it.
	Took time.Duration
	// Notes say what could not be carried over, e.g. compression residuals
	// that were reset because the ring's segments changed.
	Notes []string
}

func (e ElasticEvent) String() string {
	s := fmt.Sprintf("membership epoch %d: %d -> %d ranks, now rank %d, resuming from commit %d, reset took %v",
		e.Epoch, e.OldSize, e.NewSize, e.Rank, e.Step, e.Took.Round(time.Millisecond))
	for _, l := range e.Lost {
		s += "; lost " + l.String()
	}
	if len(e.Joined) > 0 {
		s += fmt.Sprintf("; joined as ranks %v", e.Joined)
	}
	return s
}

// UniqueState is rank-unique state (an RNG, a data reader's position) that
// an ElasticState commits and restores. Commit keeps SaveUnique's bytes on
// this rank and on the others (every rank, when they are at most 4 KiB;
// else on its buddy, the next rank), so they outlive the rank. After a
// reset RestoreUnique gets own, this rank's bytes of the commit the job
// resumes from (nil on a joiner, which starts fresh), and adopted, the
// bytes of that same commit of the members gone since whose first
// surviving successor this rank is, nearest first (usually none; a lost
// rank's bytes over 4 KiB are gone if its buddy was lost with it): fold
// them in or ignore them. It is not called at the
// start of the job, where the live state is the state.
//
// RestoreUnique may be called more than once with the same arguments: a
// reset that fails after it (another member lost meanwhile) is run again.
// So it must set the state from its arguments (own plus adopted), never
// add them to the state it holds, or adopted state would count twice.
type UniqueState interface {
	SaveUnique() ([]byte, error)
	RestoreUnique(own []byte, adopted [][]byte) error
}

// ElasticState is what a training loop commits: replicated state, the same
// on every rank (Register), and rank-unique state (RegisterUnique). Every
// rank must register the same names, types and sizes in the same order.
// Register everything before RunElastic. It is used by the loop's
// goroutine only.
type ElasticState struct {
	comm    *Comm
	items   []*stateItem
	names   map[string]bool
	unique  []uniqueItem
	onReset []func(context.Context, ElasticEvent) error

	has     bool  // holds a commit (a joiner does not, until its first reset)
	commits int64 // Commits in the job's history up to the held one
	snapped bool  // the items' snapshots hold the commit (else the live state is commit 0)
	// held: the unique state of the held commit; prev: of the commit
	// before it, kept from a Commit until every rank is known to hold
	// the newer one (see Commit and reset).
	held, prev heldUnique
	// slot is the room for each rank's unique bytes in the commit's
	// allreduce (see Commit), agreed by every rank at the last commit or
	// reset; -1: the commit takes the ring shift.
	slot     int
	prepared *pendingCommit // started by Prepare, for Commit to finish
	lost     []LostMember
	sendBuf  []byte
	recvBufs [2][]byte
	words    []int64 // scalars packed for a broadcast

	testHook func(stage string) // tests: called at the stages of a commit and a reset
}

type stateItem struct {
	name  string
	kind  string
	arg   any    // slices: what is broadcast
	bytes []byte // slices: the live memory
	// Scalars (and the sampler): their value as int64 words.
	get  func() []int64
	set  func([]int64)
	snap []byte
	wsnp []int64
}

type uniqueItem struct {
	name string
	u    UniqueState
}

// NewElasticState returns an empty state for comm.
func NewElasticState(comm *Comm) *ElasticState {
	// A member that started with the job holds commit 0, the state it
	// registers; a joiner holds nothing until its first reset.
	return &ElasticState{comm: comm, names: map[string]bool{}, has: !comm.joiner, held: heldUnique{size: comm.Size()}, slot: -1}
}

// Register adds replicated state as name, value pairs: *int, *int64,
// *float64, []float32, []float64, []int32, []int64, a contiguous
// *tensor.Dense, or an *ElasticSampler. Commit copies them, a reset
// restores them, and a joiner gets them from a live rank. Slices and
// tensors must stay at the same memory.
func (s *ElasticState) Register(nameValues ...any) error {
	if len(nameValues)%2 != 0 {
		return fmt.Errorf("gorun: ElasticState.Register: want name, value pairs, got %d arguments", len(nameValues))
	}
	for i := 0; i < len(nameValues); i += 2 {
		name, ok := nameValues[i].(string)
		if !ok {
			return fmt.Errorf("gorun: ElasticState.Register: argument %d is %T, want a name (string)", i, nameValues[i])
		}
		if err := s.register(name, nameValues[i+1]); err != nil {
			return fmt.Errorf("gorun: ElasticState.Register(%q): %w", name, err)
		}
	}
	return nil
}

func (s *ElasticState) register(name string, v any) error {
	if s.names[name] {
		return errors.New("registered twice")
	}
	it := &stateItem{name: name}
	switch p := v.(type) {
	case *int:
		it.kind = "int"
		it.get = func() []int64 { return []int64{int64(*p)} }
		it.set = func(w []int64) { *p = int(w[0]) }
	case *int64:
		it.kind = "int64"
		it.get = func() []int64 { return []int64{*p} }
		it.set = func(w []int64) { *p = w[0] }
	case *float64:
		it.kind = "float64"
		it.get = func() []int64 { return []int64{int64(math.Float64bits(*p))} }
		it.set = func(w []int64) { *p = math.Float64frombits(uint64(w[0])) }
	case *ElasticSampler:
		// The seed too: ranks with different seeds would draw different
		// permutations and use samples twice or never.
		it.kind = fmt.Sprintf("sampler(%d, seed %d)", p.n, p.seed)
		it.get = func() []int64 { return []int64{p.epoch, p.cursor} }
		it.set = func(w []int64) { p.epoch, p.cursor = w[0], w[1] }
	case []float32, []float64, []int32, []int64, *tensor.Dense:
		vw, err := viewOf(v)
		if err != nil {
			return err
		}
		if p, ok := v.(*tensor.Dense); ok && p == nil {
			return errors.New("nil tensor")
		}
		it.kind, it.arg, it.bytes = vw.String(), v, vw.bytes
	default:
		return fmt.Errorf("unsupported type %T: use *int, *int64, *float64, []float32, []float64, []int32, []int64, *tensor.Dense or *ElasticSampler", v)
	}
	if it.get == nil && v == nil {
		return errors.New("nil value")
	}
	s.names[name] = true
	s.items = append(s.items, it)
	return nil
}

// RegisterUnique adds rank-unique state under name (see UniqueState).
func (s *ElasticState) RegisterUnique(name string, u UniqueState) error {
	if u == nil {
		return fmt.Errorf("gorun: ElasticState.RegisterUnique(%q): nil state", name)
	}
	if s.names[name] || name == residualsName {
		return fmt.Errorf("gorun: ElasticState.RegisterUnique(%q): name already used", name)
	}
	s.names[name] = true
	s.unique = append(s.unique, uniqueItem{name, u})
	return nil
}

// OnReset adds a callback run on every rank after each reset of the job
// (a lost member, an admitted joiner), once the state is restored and
// before the loop runs again: rescale the learning rate, re-shard data.
// It is not run at the start of the job. An error ends RunElastic.
func (s *ElasticState) OnReset(f func(ctx context.Context, ev ElasticEvent) error) {
	s.onReset = append(s.onReset, f)
}

// Commits is how many times the job committed this state (the commit a
// reset resumes from).
func (s *ElasticState) Commits() int64 { return s.commits }

// layoutHash digests the registration, so ranks that registered different
// state find out before a broadcast mixes it up.
func (s *ElasticState) layoutHash() int64 {
	h := fnv.New64a()
	for _, it := range s.items {
		fmt.Fprintf(h, "%s\x00%s\x00", it.name, it.kind)
	}
	for _, u := range s.unique {
		fmt.Fprintf(h, "u:%s\x00", u.name)
	}
	return int64(h.Sum64() >> 1)
}

// snapshot copies the live replicated state into the held commit.
func (s *ElasticState) snapshot() {
	s.snapped = true
	for _, it := range s.items {
		if it.get != nil {
			it.wsnp = append(it.wsnp[:0], it.get()...)
			continue
		}
		if len(it.snap) != len(it.bytes) {
			it.snap = make([]byte, len(it.bytes))
		}
		memcopy.Copy(it.snap, it.bytes)
	}
}

// restoreSnapshot puts the held commit back into the live state.
func (s *ElasticState) restoreSnapshot() {
	for _, it := range s.items {
		if it.get != nil {
			it.set(it.wsnp)
			continue
		}
		memcopy.Copy(it.bytes, it.snap)
	}
}

// RunElastic runs loop until it returns nil or an error that is not a
// membership change. In an elastic job it first brings every rank to the
// same state (a joiner receives it from a live rank); when the loop fails
// with a *MembershipChangeError it re-forms the Comm with the ranks that
// are left (and waiting joiners), resets the state to the newest commit
// every rank holds, runs the OnReset callbacks and calls loop again. A
// change during the reset starts it over. Errors that end it: the loop's
// own, a mismatch of calls, an aborted job (below --min-np for too long),
// or this rank cut off from the rendezvous (*CutOffError), which is final
// for this rank only.
//
// The loop must read Rank and Size afresh at every step (they change with
// the membership) and return the errors of its collectives and of Commit.
// On a Comm that is not elastic RunElastic just calls loop once.
func RunElastic(ctx context.Context, comm *Comm, st *ElasticState, loop func(ctx context.Context) error) error {
	if !comm.Elastic() {
		return loop(ctx)
	}
	if st == nil || st.comm != comm {
		return fmt.Errorf("gorun: rank %d: RunElastic needs an ElasticState of the same Comm (NewElasticState(comm))", comm.Rank())
	}
	initial, start := true, time.Now()
	for {
		err := st.reset(ctx, initial, start)
		if err == nil {
			initial = false
			if err = loop(ctx); err == nil {
				return nil
			}
		}
		if !isMembershipChange(err) || ctx.Err() != nil {
			return stopErr(comm, err)
		}
		start = time.Now()
		comm.logf("%v; re-forming the job", err)
		_, now, rerr := comm.reconfigure(ctx)
		if rerr != nil {
			return stopErr(comm, rerr)
		}
		st.lost = append(st.lost, now.lost...)
	}
}

// stopErr says why an elastic run stops for good on this rank.
func stopErr(c *Comm, err error) error {
	var cut *CutOffError
	if errors.As(err, &cut) {
		// Its text names the rank, the rendezvous and what happens next.
		return fmt.Errorf("gorun: %w", cut)
	}
	return err
}
