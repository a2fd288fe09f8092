package collective

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/gorun/gorun/p2p"
)

// A reset: after a membership change, every rank of the new epoch goes
// back to the newest commit every survivor holds (rolling back those
// ahead), joiners get the replicated state by broadcast, and each rank
// takes over the unique state of the members gone before it.

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
	held := s.held // the commit this rank resumes from, once the broadcast is in
	rollBack := s.has && s.commits != minC
	if rollBack {
		if s.commits != minC+1 || !s.prev.saved {
			return fmt.Errorf("gorun: rank %d: elastic reset: this rank holds commit %d, and the job resumes from commit %d, which it no longer holds (internal error)", v.rank, s.commits, minC)
		}
		// Back to the commit before: its unique state is prev, and its
		// replicated state comes in the broadcast below (need). Its
		// snapshot still holds the newer commit, so the rank moves back
		// only once the broadcast is in: a reset that fails before (a
		// further loss) leaves it at its own commit, snapshot and unique
		// state alike, and the next reset decides again. Moved back
		// before, it would claim the older commit with the newer one's
		// parameters, and a next reset that needs no broadcast would
		// leave the ranks apart.
		held = s.prev
	}
	peersThen := held.peers // keepUnique below moves on to this epoch's
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
	if rollBack {
		s.held, s.commits = held, minC
	}
	s.prev = heldUnique{}
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
