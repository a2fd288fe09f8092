package collective

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/gorun/gorun/p2p"
	"github.com/gorun/gorun/ring"
)

// A commit: the end of a step that a reset can go back to. Prepare (or
// Commit itself) saves the unique state and starts the commit's one
// allreduce, which carries the agreement on joiners and leavers and every
// rank's unique bytes in per-rank slots (or, over 4 KiB, a ring shift to
// the next rank); Commit snapshots the replicated state and acts on the
// agreement.

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
