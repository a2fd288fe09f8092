package collective

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"gorgonia.org/tensor"

	"github.com/gorun/gorun/p2p"
	"github.com/gorun/gorun/ring"
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

// The commit's allreduce (see Commit): two words of agreement, then a
// slot per rank of its unique bytes' length and the bytes.
const (
	packJoiners = iota // joiners waiting, summed over the ranks that heard of them
	packLeaving        // ranks that leave at this commit
	packHeader
)

// maxPackedUnique is the largest slot of unique bytes a commit's
// allreduce carries, and maxPackedWords the most words it carries: the
// allreduce gives every rank every rank's bytes, right for RNG states,
// counters and reader positions; larger unique state (compression
// residuals), or many ranks, takes the ring shift, which sends each
// rank's bytes once.
const (
	maxPackedUnique = 4 << 10
	maxPackedWords  = 8 << 10
)

// slotFor is the slot for unique bytes of length n, with room to grow,
// in whole words; -1 past maxPackedUnique.
func slotFor(n int64) int {
	if n > maxPackedUnique {
		return -1
	}
	return int((n+n/4+7)/8) * 8
}

// packedBytes is rank r's unique bytes in a commit's allreduce of slots
// of w words (false if they did not fit their slot).
func packedBytes(packed []int64, w, r int) ([]byte, bool) {
	rec := packed[packHeader+r*w:][:w]
	if rec[0] < 0 || rec[0] > int64(8*(w-1)) {
		return nil, false
	}
	return unpackBytes(rec[1:], int(rec[0])), true
}

// blobOf is the unique bytes at this commit of the member with peer ID
// id, if this rank has them (packed).
func (h heldUnique) blobOf(id peer.ID) ([]byte, bool) {
	if h.packed == nil {
		return nil, false
	}
	for r, p := range h.peers {
		if p.ID == id && packHeader+(r+1)*h.packW <= len(h.packed) {
			return packedBytes(h.packed, h.packW, r)
		}
	}
	return nil, false
}

// heldUnique is what a rank keeps of one commit's unique state.
type heldUnique struct {
	saved   bool    // own holds this rank's unique bytes (false at the start, where the live state is the state)
	own     []byte  // this rank's unique bytes
	buddy   []byte  // the predecessor's unique bytes at that commit
	buddyOf peer.ID // the predecessor's peer ID then
	// packed: every rank's unique bytes at that commit in slots of packW
	// words, in rank order after packHeader words: the commit's allreduce,
	// or when members left there, gatherAll's allgather (see Commit).
	packed []int64
	packW  int
	size   int // the job's size at that commit
	// peers: the members at that commit (re-read once per epoch), which
	// give the lost members of an event their ranks then.
	peers      []p2p.Peer
	peersEpoch int
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
		copyState(it.snap, it.bytes)
	}
}

// restoreSnapshot puts the held commit back into the live state.
func (s *ElasticState) restoreSnapshot() {
	for _, it := range s.items {
		if it.get != nil {
			it.set(it.wsnp)
			continue
		}
		copyState(it.bytes, it.snap)
	}
}

// Prepare starts the commit of the step under way, for a loop that calls
// it once the step's last collective is queued (before Reducer.Step) and
// the step's unique state is final: it saves the unique state, and queues
// the commit's allreduce, which carries the agreement and every rank's
// unique bytes, behind the step's own collectives. The ranks meet there
// anyway, so the commit costs no rendezvous of its own, and its messages
// travel while the loop waits for the gradients and updates the
// parameters. Commit, after the update, finishes it. Without Prepare,
// Commit does both.
//
// The commit then holds the unique state as Prepare saved it: state that
// changes between the two calls is committed at the next commit. When the
// allreduce carries the unique state (at most 4 KiB a rank; larger state
// takes Commit's ring shift as before), a member lost after the allreduce
// and before its Commit does not take this commit along: the others hold
// its unique bytes of it, and the replicated state is the same on every
// rank, so they take it and go on from it. A second Prepare before Commit
// is an error; a reset forgets a Prepare that no Commit followed. On a
// Comm that is not elastic it does nothing.
func (s *ElasticState) Prepare(ctx context.Context) error {
	c := s.comm
	if !c.Elastic() {
		return nil
	}
	if s.prepared != nil {
		return fmt.Errorf("gorun: rank %d: ElasticState.Prepare called again before Commit", c.Rank())
	}
	s.hook("commit")
	pc, err := s.startCommit()
	if err != nil {
		return err
	}
	if pc.packed != nil {
		pc.agreed = c.AllreduceAsync(ctx, pc.packed, Sum, Name("elastic commit"))
	}
	s.prepared = pc
	return nil
}

// pendingCommit is a commit between its start (Prepare, or Commit
// itself) and its agreement.
type pendingCommit struct {
	blob []byte // this rank's unique bytes
	why  string // why this rank leaves at this commit ("": it stays)
	// packed: the commit's allreduce (see Commit), when it carries the
	// unique bytes, with slots of w words; nil: a tiny allreduce and the
	// ring shift carry them.
	packed []int64
	w      int
	agreed *Handle // packed's allreduce, when Prepare started it
}

// startCommit saves the unique state and fills in this rank's part of the
// commit's allreduce.
func (s *ElasticState) startCommit() (*pendingCommit, error) {
	c := s.comm
	blob, err := s.saveUnique()
	if err != nil {
		return nil, err
	}
	v := c.cur()
	pc := &pendingCommit{blob: blob, why: c.leaving(), w: 1 + s.slot/8}
	if s.slot >= 0 && v.size*pc.w <= maxPackedWords {
		// One allreduce (a Sum: each rank fills only its own slot) agrees
		// on whether joiners wait (the ranks heard of them at different
		// pings) and whether a rank leaves here (RequestLeave), and gives
		// every rank every rank's unique bytes.
		w := pc.w
		pc.packed = make([]int64, packHeader+v.size*w)
		pc.packed[packJoiners] = int64(c.node.PendingJoiners())
		if pc.why != "" {
			pc.packed[packLeaving] = 1
		}
		rec := pc.packed[packHeader+v.rank*w:][:w]
		rec[0] = int64(len(blob))
		packBytes(rec[1:], blob) // as far as the slot holds it
	}
	return pc, nil
}

// Commit records the end of a step. It copies the replicated state (in
// memory), saves the unique state (unless Prepare did) and gets a copy of
// it to the other ranks (see UniqueState), and, when joiners wait to join
// the job (agreed by every rank), admits them and gives them the state
// before it returns: Rank and Size may then differ. Call it at the same point on every rank, outside
// any step, and return its error from the loop: a *MembershipChangeError
// makes RunElastic resume from the last commit. On a Comm that is not
// elastic it does nothing.
//
// A rank that asked to leave (RequestLeave, LeaveOnSignal) leaves the job
// here, once the commit is taken everywhere: its Commit returns an error
// matching ErrLeft, and the others go on from this commit without it.
//
// Its cost is a copy of the replicated state and one small allreduce that
// carries the agreement and every rank's unique state; unique state over
// 4 KiB (compression residuals) takes a ring shift after a tiny
// allreduce instead. Prepare takes the allreduce off the end of the step.
func (s *ElasticState) Commit(ctx context.Context) error {
	c := s.comm
	if !c.Elastic() {
		return nil
	}
	pc := s.prepared
	s.prepared = nil
	if pc == nil {
		s.hook("commit")
		var err error
		if pc, err = s.startCommit(); err != nil {
			return err
		}
	}
	blob, why, packed, w := pc.blob, pc.why, pc.packed, pc.w
	v := c.cur()
	var joiners, leaving, maxLen int64
	var got []byte
	var err error
	if packed != nil {
		if pc.agreed != nil {
			err = pc.agreed.Wait(ctx)
		} else {
			err = c.Allreduce(ctx, packed, Sum, Name("elastic commit"))
		}
		if err != nil {
			return err
		}
		s.hook("commit: agreed")
		// Every rank entered this commit, so every rank holds the one
		// before: a reset can no longer go back further (see reset).
		s.prev = heldUnique{}
		joiners, leaving = packed[packJoiners], packed[packLeaving]
		for r := range v.size {
			maxLen = max(maxLen, packed[packHeader+r*w])
		}
		if maxLen > int64(s.slot) {
			// Some rank's bytes outgrew the slot: the ring shift copies
			// them all to their buddies.
			packed = nil
			if got, err = s.shift(ctx, blob, int(maxLen)); err != nil {
				return err
			}
		} else if v.size > 1 {
			got, _ = packedBytes(packed, w, (v.rank-1+v.size)%v.size)
		}
		s.slot = slotFor(maxLen)
	} else {
		// A tiny allreduce agrees on joiners, leaves and the largest
		// unique bytes, and the ring shift copies each rank's to the
		// next rank.
		agree := []int64{int64(c.node.PendingJoiners()), int64(len(blob)), 0}
		if why != "" {
			agree[2] = 1
		}
		if err := c.Allreduce(ctx, agree, Max, Name("elastic commit")); err != nil {
			return err
		}
		s.hook("commit: agreed")
		s.prev = heldUnique{}
		joiners, leaving, maxLen = agree[0], agree[2], agree[1]
		if agree[1] > 0 {
			if got, err = s.shift(ctx, blob, int(agree[1])); err != nil {
				return err
			}
		}
		s.slot = slotFor(agree[1])
	}
	s.hook("commit: shifted")
	// Every collective of the commit succeeded here: take it. The commit
	// before stays at hand: a member lost during this commit may leave
	// other ranks without it (their buddy copy never arrived), and the
	// job then resumes from the one before.
	s.snapshot()
	s.commits++
	s.has = true
	s.prev = s.held
	s.keepUnique(blob, got)
	if packed != nil {
		s.held.packed, s.held.packW = packed, w
	}
	s.lost = nil
	s.hook("commit: taken")
	if joiners == 0 && leaving == 0 {
		return nil
	}
	start := time.Now()
	if leaving > 0 && packed == nil {
		// Members leave: everybody gets everybody's unique bytes, so
		// that a leaver's buddy leaving with it takes nothing along.
		if err := s.gatherAll(ctx, blob, int(maxLen)); err != nil {
			return err
		}
	}
	if why != "" {
		// Every rank holds this commit, and the others this rank's unique
		// state of it: they go on from here without it.
		return c.depart(ctx, why)
	}
	old, now, err := c.grow(ctx)
	if err != nil {
		return err
	}
	if now == old {
		return nil
	}
	s.lost = append(s.lost, now.lost...)
	return s.reset(ctx, false, start)
}

// gatherAll copies every rank's unique bytes (blob here, at most maxLen
// long) to every rank, into the held commit's packed slots.
func (s *ElasticState) gatherAll(ctx context.Context, blob []byte, maxLen int) error {
	c := s.comm
	v := c.cur()
	w := 1 + (maxLen+7)/8
	rec := make([]int64, w)
	rec[0] = int64(len(blob))
	packBytes(rec[1:], blob)
	packed := make([]int64, packHeader+w*v.size)
	if err := c.Allgather(ctx, rec, packed[packHeader:], Name("elastic commit: unique state of everyone")); err != nil {
		return err
	}
	s.held.packed, s.held.packW = packed, w
	return nil
}

// packBytes copies b into words (little-endian), as far as they hold it.
func packBytes(words []int64, b []byte) {
	for i := range words {
		var w [8]byte
		if o := 8 * i; o < len(b) {
			copy(w[:], b[o:])
		}
		words[i] = int64(binary.LittleEndian.Uint64(w[:]))
	}
}

// unpackBytes is n bytes of words (a fresh slice).
func unpackBytes(words []int64, n int) []byte {
	b := make([]byte, 8*len(words))
	for i, w := range words {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(w))
	}
	return b[:n]
}

// hook tells a test that Commit or reset reached stage.
func (s *ElasticState) hook(stage string) {
	if s.testHook != nil {
		s.testHook(stage)
	}
}

// keepUnique records this rank's unique bytes and its predecessor's, as
// of the commit being taken (or re-established by a reset).
func (s *ElasticState) keepUnique(own, pred []byte) {
	v := s.comm.cur()
	h := heldUnique{saved: true, own: own, buddy: pred, size: s.comm.Size(), peers: s.held.peers, peersEpoch: s.held.peersEpoch}
	if v.size <= 1 {
		h.peers = nil
	} else if h.peers == nil || h.peersEpoch != v.epoch {
		h.peers, h.peersEpoch = s.comm.node.Peers(), v.epoch
	}
	if v.size > 1 {
		if p := (v.rank - 1 + v.size) % v.size; p < len(h.peers) {
			h.buddyOf = h.peers[p].ID
		}
	}
	s.held = h
}

// lostThen lists each lost member once, with its rank at the last commit
// (peers): losses come from every reconfiguration since, each numbered in
// the epoch before it, which the commit may predate.
func lostThen(lost []LostMember, peers []p2p.Peer) []LostMember {
	var out []LostMember
	seen := map[string]bool{}
	for _, l := range lost {
		id := l.ID.String()
		if seen[id] {
			continue
		}
		seen[id] = true
		for _, p := range peers {
			if p.ID == l.ID {
				l.Rank = p.Rank
				break
			}
		}
		out = append(out, l)
	}
	return out
}

// shift sends blob to the next rank and returns the previous rank's, as
// one numbered Shift of maxLen+8 bytes (a length, then the blob, padded).
// The two receive buffers alternate, so a shift that fails half-way does
// not spoil the buddy copy of the held commit. (The copy of the commit
// before may be overwritten: a shift runs only once every rank holds the
// held commit, see Commit.)
func (s *ElasticState) shift(ctx context.Context, blob []byte, maxLen int) ([]byte, error) {
	c := s.comm
	n := maxLen + 8
	if cap(s.sendBuf) < n {
		s.sendBuf = make([]byte, n)
	}
	in := s.sendBuf[:n]
	binary.LittleEndian.PutUint64(in, uint64(len(blob)))
	copy(in[8:], blob)
	clear(in[8+len(blob):])
	// The buffer not holding the current buddy copy.
	i := 0
	if b := s.held.buddy; len(b) > 0 && len(s.recvBufs[0]) > 0 && &b[0] == &s.recvBufs[0][8] {
		i = 1
	}
	if cap(s.recvBufs[i]) < n {
		s.recvBufs[i] = make([]byte, n)
	}
	out := s.recvBufs[i][:n]
	s.recvBufs[i] = out
	call := ring.Call{Kind: ring.Shift, DType: ring.Uint8, Count: n}
	err := c.sync(ctx, call, func(ctx context.Context, call ring.Call) error {
		c.stats.bytes.Add(uint64(n))
		return c.cur().ring.Shift(ctx, call, in, out)
	}, nil, []CallOption{Name("elastic buddy copy")})
	if err != nil {
		return nil, err
	}
	m := binary.LittleEndian.Uint64(out)
	if m > uint64(maxLen) {
		return nil, fmt.Errorf("gorun: rank %d: buddy copy: the previous rank sent a blob of %d bytes, more than the agreed %d", c.Rank(), m, maxLen)
	}
	return out[8 : 8+m], nil
}

// reset brings every rank of the current epoch to the same commit: the
// ranks agree on the newest commit every one of them holds, restore their
// own copy, and the lowest rank holding it broadcasts the replicated
// state whenever the ranks differ (a commit's last message can complete
// on one rank and fail on another), joiners take part (they hold none),
// or the job starts (initial). Then unique state is restored (and adopted
// from lost predecessors), its buddy copies are made anew on the new ring,
// and the OnReset callbacks run.
func (s *ElasticState) reset(ctx context.Context, initial bool, start time.Time) error {
	c := s.comm
	v := c.cur()
	hook := s.hook
	hook("start")
	// A commit that was prepared and not finished was not taken here.
	s.prepared = nil
	mine := []int64{-1, 0, s.layoutHash()}
	if s.has {
		mine[0], mine[1] = s.commits, int64(s.held.size)
	}
	all := make([]int64, 3*v.size)
	if err := c.Allgather(ctx, mine, all, Name("elastic reset: commits")); err != nil {
		return err
	}
	// The job resumes from the oldest commit a holder has: a member lost
	// during the commit after it can leave some ranks without their own
	// or their lost predecessor's unique state of that one, while the
	// ranks that took it still hold the one before (prev). Holders are at
	// most one commit apart: a rank takes a commit only once every rank
	// has entered it.
	minC, src, need := int64(-1), -1, initial
	for r := range v.size {
		if c := all[3*r]; c >= 0 && (minC < 0 || c < minC) {
			minC, src = c, r
		}
	}
	if err := s.checkLayouts(v, all, src); err != nil {
		return err
	}
	for r := range v.size {
		need = need || all[3*r] != minC
	}
	if minC < 0 {
		return fmt.Errorf("gorun: rank %d: elastic reset: no rank of membership epoch %d holds the training state (all %d are joiners)", v.rank, v.epoch, v.size)
	}
	if s.has && s.commits != minC {
		if s.commits != minC+1 || !s.prev.saved {
			return fmt.Errorf("gorun: rank %d: elastic reset: this rank holds commit %d, and the job resumes from commit %d, which it no longer holds (internal error)", v.rank, s.commits, minC)
		}
		// Back to the commit before: its unique state is prev, and its
		// replicated state comes in the broadcast below (need).
		s.held, s.commits = s.prev, minC
	}
	s.prev = heldUnique{}
	peersThen := s.held.peers // keepUnique below moves on to this epoch's
	oldSize := int(all[3*src+1])
	if peersThen != nil {
		// The size the loop last ran with: a reset that failed half-way
		// may have moved the source's size at commit to an epoch that
		// never ran a step.
		oldSize = len(peersThen)
	}
	if s.has && s.snapped {
		s.restoreSnapshot()
	}
	hook("restored")
	if need {
		if err := s.broadcast(ctx, src); err != nil {
			return err
		}
	}
	if need || !s.snapped {
		s.snapshot()
	}
	hook("broadcast")
	joiner := !s.has
	own, adopted, notes, err := s.uniqueFor(joiner)
	if err != nil {
		return err
	}
	// At the start of the job the live unique state is the state: nothing
	// was saved yet.
	restore := joiner || s.held.saved
	for _, u := range s.unique {
		if !restore {
			break
		}
		var ad [][]byte
		for _, a := range adopted {
			if b, ok := a[u.name]; ok {
				ad = append(ad, b)
			}
		}
		if err := u.u.RestoreUnique(own[u.name], ad); err != nil {
			return fmt.Errorf("gorun: rank %d: restoring unique state %q: %w", v.rank, u.name, err)
		}
	}
	if restore {
		notes = append(notes, c.compression.restoreResiduals(own[residualsName], pick(adopted, residualsName), v.size, v.rank)...)
	}
	s.commits, s.has, s.held.size = minC, true, v.size
	// The buddies of the new ring get this rank's unique bytes now, so a
	// rank lost before the next commit does not take them along.
	blob, err := s.saveUnique()
	if err != nil {
		return err
	}
	agree := []int64{int64(len(blob))}
	if err := c.Allreduce(ctx, agree, Max, Name("elastic reset: unique size")); err != nil {
		return err
	}
	s.slot = slotFor(agree[0])
	var got []byte
	if agree[0] > 0 {
		if got, err = s.shift(ctx, blob, int(agree[0])); err != nil {
			return err
		}
	}
	s.keepUnique(blob, got)
	hook("done")
	if v.epoch == 0 {
		return nil // the start of the job: nothing was reset
	}
	ev := ElasticEvent{Epoch: v.epoch, OldSize: oldSize, NewSize: v.size, Rank: v.rank,
		Lost: lostThen(s.lost, peersThen), Joined: slices.Clone(v.joined), Step: minC, Took: time.Since(start), Notes: notes}
	s.lost = nil
	c.logf("gorun: rank %d: elastic reset: %v", v.rank, ev)
	for _, f := range s.onReset {
		if err := f(ctx, ev); err != nil {
			return fmt.Errorf("gorun: rank %d: OnReset callback: %w", v.rank, err)
		}
	}
	return nil
}

// checkLayouts compares the ranks' registrations (every third word of
// all, from reset's allgather) with that of src, a rank holding the state.
// Ranks of the job that differ are a bug of the program and fail it. A
// joiner that differs (started with another program or version) must not
// fail the job that ran fine before it came: it leaves, and the others
// wait for that membership change and reset without it.
func (s *ElasticState) checkLayouts(v *commView, all []int64, src int) error {
	ref := all[3*src+2]
	var joiners []int
	for r := range v.size {
		if all[3*r+2] == ref {
			continue
		}
		if all[3*r] >= 0 {
			return fmt.Errorf("gorun: rank %d: elastic state: rank %d registered different state (names, types or sizes) than rank %d: every rank must Register the same things in the same order", v.rank, r, src)
		}
		joiners = append(joiners, r)
	}
	if len(joiners) == 0 {
		return nil
	}
	err := fmt.Errorf("gorun: rank %d: elastic state: the joiners now ranks %v registered different state (names, types or sizes) than the job's members: they are sent away, and the job goes on without them", v.rank, joiners)
	if slices.Contains(joiners, v.rank) {
		s.comm.node.Quit("it registered different elastic state than the job's members (another program or version?)")
		s.comm.cancel(err)
		return fmt.Errorf("gorun: joiner (rank %d of membership epoch %d): it registered different elastic state (names, types or sizes) than the job's members, so it leaves the job: start the job's own program, with its arguments", v.rank, v.epoch)
	}
	// The joiners' departure ends this epoch (bounded by the heartbeat).
	if mc := s.comm.membershipCause(v, err); mc != nil {
		return fmt.Errorf("gorun: rank %d: elastic reset: %w", v.rank, mc)
	}
	return err
}

func pick(adopted []map[string][]byte, name string) [][]byte {
	var out [][]byte
	for _, a := range adopted {
		if b, ok := a[name]; ok {
			out = append(out, b)
		}
	}
	return out
}

// uniqueFor returns this rank's own unique bytes as of its commit (none on
// a joiner) and those of the members lost or gone since that commit whose
// nearest surviving successor this rank is (the chain of members right
// before it that are gone), nearest first: from the copies of everyone's
// bytes (packed), or else from its buddy copy, which only covers its
// immediate predecessor.
func (s *ElasticState) uniqueFor(joiner bool) (own map[string][]byte, adopted []map[string][]byte, notes []string, err error) {
	v := s.comm.cur()
	if joiner {
		return map[string][]byte{}, nil, nil, nil
	}
	h := s.held
	if own, err = parseBlob(h.own); err != nil {
		return nil, nil, nil, fmt.Errorf("gorun: rank %d: own unique state: %w", v.rank, err)
	}
	n := len(h.peers)
	if n <= 1 {
		return own, nil, nil, nil
	}
	alive := map[peer.ID]bool{}
	for _, p := range s.comm.node.Peers() {
		alive[p.ID] = true
	}
	me := slices.IndexFunc(h.peers, func(p p2p.Peer) bool { return p.ID == s.comm.node.PeerID() })
	if me < 0 {
		return own, nil, nil, nil
	}
	for k := 1; k < n; k++ {
		id := h.peers[(me-k+n)%n].ID
		if alive[id] {
			break
		}
		b, ok := h.blobOf(id)
		if !ok && k == 1 && id == h.buddyOf {
			b, ok = h.buddy, true
		}
		if !ok {
			notes = append(notes, fmt.Sprintf("the unique state of peer %s is gone: its buddy (the next rank) went with it", shortID(id)))
			continue
		}
		m, err := parseBlob(b)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("gorun: rank %d: the unique state of peer %s: %w", v.rank, shortID(id), err)
		}
		adopted = append(adopted, m)
		notes = append(notes, fmt.Sprintf("rank %d adopted the unique state of peer %s, gone since the commit", v.rank, shortID(id)))
	}
	return own, adopted, notes, nil
}

func shortID(p peer.ID) string {
	id := p.String()
	if len(id) > 12 {
		return "…" + id[len(id)-8:]
	}
	return id
}

// broadcast copies the replicated state from rank src to every rank.
func (s *ElasticState) broadcast(ctx context.Context, src int) error {
	c := s.comm
	var hs []*Handle
	s.words = s.words[:0]
	for _, it := range s.items {
		if it.get != nil {
			s.words = append(s.words, it.get()...)
			continue
		}
		hs = append(hs, c.BroadcastAsync(ctx, it.arg, src, Name("elastic state "+it.name)))
	}
	if len(s.words) > 0 {
		hs = append(hs, c.BroadcastAsync(ctx, s.words, src, Name("elastic state scalars")))
	}
	var errs []error
	for _, h := range hs {
		if err := h.Wait(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	for _, err := range errs {
		if isMembershipChange(err) {
			return err // one membership change, reported once
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	w := s.words
	for _, it := range s.items {
		if it.get != nil {
			n := len(it.get())
			it.set(w[:n])
			w = w[n:]
		}
	}
	return nil
}

// The unique blob: for every unique item, its name and bytes.
func (s *ElasticState) saveUnique() ([]byte, error) {
	var out []byte
	add := func(name string, b []byte) {
		out = binary.LittleEndian.AppendUint32(out, uint32(len(name)))
		out = append(out, name...)
		out = binary.LittleEndian.AppendUint64(out, uint64(len(b)))
		out = append(out, b...)
	}
	for _, u := range s.unique {
		b, err := u.u.SaveUnique()
		if err != nil {
			return nil, fmt.Errorf("gorun: rank %d: saving unique state %q: %w", s.comm.Rank(), u.name, err)
		}
		add(u.name, b)
	}
	if b := s.comm.compression.saveResiduals(s.comm.cur()); len(b) > 0 {
		add(residualsName, b)
	}
	return out, nil
}

func parseBlob(b []byte) (map[string][]byte, error) {
	out := map[string][]byte{}
	for len(b) > 0 {
		if len(b) < 4 {
			return nil, errors.New("truncated")
		}
		n := int(binary.LittleEndian.Uint32(b))
		b = b[4:]
		if len(b) < n+8 {
			return nil, errors.New("truncated")
		}
		name := string(b[:n])
		m := binary.LittleEndian.Uint64(b[n:])
		b = b[n+8:]
		if uint64(len(b)) < m {
			return nil, errors.New("truncated")
		}
		out[name] = slices.Clone(b[:m])
		b = b[m:]
	}
	return out, nil
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
