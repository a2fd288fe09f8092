package checkpoint

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/gorun/gorun/collective"
)

// maxCandidates is how many of its newest committed steps each rank offers
// to a restore.
const maxCandidates = 16

// The steps of a restore, numbered as in the package documentation: 1
// listCandidates, then for each candidate step (restoreStep) 2
// shareManifest, 3 findCopies, 4 assign and 5 transfer (transfer.go, which
// reads through read.go); then every rank loads its blobs
// (loadBlobsEverywhere) and the files that lost copies are written again
// (rereplicate.go).

// Restore loads the newest committed checkpoint that verifies into st and
// returns its step. It is collective, and every rank takes part in reading:
// each file of the checkpoint (tensor shards and per-rank blob files) is
// read and verified (size, sha256) by one rank that holds a copy, in the
// background, and broadcast to every rank as it comes, so that reading,
// verification and the broadcasts overlap and every rank holds identical
// tensors. Every rank must have registered the same tensors and blobs
// (names, dtypes, shapes): otherwise every rank fails at once, naming the
// ranks that differ. A file that is corrupt on one host is read again from
// another host's copy; a checkpoint with a file that no host holds intact,
// or whose tensors do not fit st, is skipped with a warning and the
// previous one tried. A manifest that cannot be read or parsed is read from
// another host's copy before the step is given up.
//
// A read that fails with an I/O error (a connection reset in the middle of
// an object, a refused request) is retried, from the start of the file, up
// to 3 times, each retry logged. Only a copy that is missing, of the wrong
// size or whose sha256 differs counts as corrupt; a file that cannot be
// read from any copy fails the restore with that error instead of falling
// back to an older checkpoint, which would silently lose the progress
// since.
//
// The checkpoint may come from a job of another size: rank r gets the blobs
// rank r wrote (ranks beyond the old size keep theirs, with a warning; with
// fewer ranks than wrote it, rank 0 warns that the per-rank state of the
// ranks beyond is not restored). With several storage domains, files of the
// restored step that lost copies are written again from memory
// (re-replication).
//
// With no checkpoint at all, Restore returns found=false and a nil error;
// when checkpoints exist but none can be loaded, it returns an error. A
// failed Restore may leave the registered tensors partly overwritten (by a
// checkpoint that was being loaded when it failed): its error says so, and
// they must be re-initialized before the job starts fresh. An asynchronous
// save in flight is committed first (Wait).
func (m *Manager) Restore(ctx context.Context, st *State) (step int64, found bool, err error) {
	defer func() { err = m.mark(err) }() // for NoRestart
	if st.err != nil {
		return 0, false, st.err
	}
	// Ends the save in flight (or abandons one the job re-formed under);
	// the retention of a save committed here is left to the next save's.
	if err := m.settle(ctx, false); err != nil {
		return 0, false, err
	}
	// Local waits: a store that does not end them counts as one this rank
	// could not list (the others' copies serve), so that every rank takes
	// the same collectives.
	storeErr := m.stopRetention("a restore")
	if err := m.waitOrphan(ctx); storeErr == nil {
		storeErr = err
	}
	cands, listers, err := m.listCandidates(ctx, st, storeErr)
	if err != nil || len(cands) == 0 {
		return 0, false, err
	}
	dom, err := m.domains(ctx)
	if err != nil {
		return 0, false, err
	}
	// A rank that could not list its directory holds nothing as far as
	// this restore goes: other hosts' copies serve.
	var problems []string
	touched := false // bytes of the registered state were overwritten
	for _, s := range cands {
		err := m.restoreStep(ctx, st, dom, s, listers[s], &touched)
		if err == nil {
			m.good = s
			return s, true, nil
		}
		problem, ok := err.(*skipStep)
		if !ok {
			return 0, false, overwritten(err, touched)
		}
		problems = append(problems, fmt.Sprintf("step %d: %v", s, problem))
		if m.comm.Rank() == 0 {
			m.logf("checkpoint: WARNING: skipping the checkpoint of step %d in %s: %v; falling back to an older one", s, m.StepLocation(s), problem)
		}
	}
	return 0, false, overwritten(fmt.Errorf("checkpoint: restore from %s: none of the %d committed checkpoints can be loaded: %s", m.dir, len(cands), strings.Join(problems, "; ")), touched)
}

// skipStep is the error of a committed step that cannot be loaded (a
// corrupt or missing file that no other copy replaces, tensors that do not
// fit the registered State): the restore tries an older step. Every other
// error of a step ends the restore.
type skipStep struct{ err error }

func (e *skipStep) Error() string { return e.err.Error() }

// skip is the error of a step that cannot be loaded because of err.
func skip(err error) error { return &skipStep{err} }

// overwritten adds to a failed restore's error that the registered tensors
// hold part of a checkpoint, when bytes of them were written.
func overwritten(err error, touched bool) error {
	if !touched {
		return err
	}
	return fmt.Errorf("%w; the registered tensors were partly overwritten: re-initialize them before starting fresh", err)
}

// listCandidates is step 1 of a restore: every rank lists the committed
// steps in its own store, and says what it registered (st.layoutHash):
// ranks whose states differ would take different collective paths below
// (fits, the one-allgather restore), so they fail here, every one of
// them, before any other collective of the restore. It returns the
// candidates, newest first, and the ranks that list each, ascending. No
// candidate and no error is a fresh start; no candidate while some rank
// could not list its store is an error, as that rank may hold checkpoints.
// storeErr, from this rank's waits before the restore, counts as a failure
// to list.
func (m *Manager) listCandidates(ctx context.Context, st *State, storeErr error) ([]int64, map[int64][]int, error) {
	rank, n := m.comm.Rank(), m.comm.Size()
	const hashOff, stepsOff = 16, 16 + 32
	const recLen = stepsOff + 8*maxCandidates
	rec := make([]byte, recLen)
	entries, lerr := []Entry(nil), storeErr
	if lerr == nil {
		entries, lerr = storeSteps(ctx, m.store)
	}
	if lerr != nil {
		m.logf("checkpoint: rank %d: listing the checkpoints in %s: %v", rank, m.dir, lerr)
		binary.LittleEndian.PutUint64(rec, 1)
	}
	cnt := 0
	for _, e := range entries {
		if e.Committed && cnt < maxCandidates {
			binary.LittleEndian.PutUint64(rec[stepsOff+8*cnt:], uint64(e.Step))
			cnt++
		}
	}
	binary.LittleEndian.PutUint64(rec[8:], uint64(cnt))
	lh := st.layoutHash()
	copy(rec[hashOff:stepsOff], lh[:])
	all := make([]byte, recLen*n)
	if err := m.comm.Allgather(m.ioCtx(ctx), rec, all, collective.Name("checkpoint.restore.steps")); err != nil {
		return nil, nil, fmt.Errorf("checkpoint: restore: %w", err)
	}
	has := map[int64][]int{} // step -> the ranks that list it, ascending
	var listBad, layoutDiff []int
	for r := range n {
		b := all[r*recLen:]
		if binary.LittleEndian.Uint64(b) != 0 {
			listBad = append(listBad, r)
		}
		if [32]byte(b[hashOff:stepsOff]) != lh {
			layoutDiff = append(layoutDiff, r)
		}
		for i := range min(int(binary.LittleEndian.Uint64(b[8:])), maxCandidates) {
			s := int64(binary.LittleEndian.Uint64(b[stepsOff+8*i:]))
			has[s] = append(has[s], r)
		}
	}
	if len(layoutDiff) > 0 {
		// Not all equal: every rank sees some rank differ from itself.
		return nil, nil, fmt.Errorf("checkpoint: restore from %s: ranks %v registered different tensors or blobs than this rank %d (names, dtypes and shapes must match on every rank)", m.dir, layoutDiff, rank)
	}
	cands := slices.Sorted(maps.Keys(has))
	slices.Reverse(cands)
	if len(cands) == 0 && len(listBad) > 0 {
		// The ranks that cannot list their directories may hold
		// checkpoints: never start fresh silently.
		if lerr != nil {
			return nil, nil, fmt.Errorf("checkpoint: restore from %s: listing the checkpoints: %w", m.dir, lerr)
		}
		return nil, nil, fmt.Errorf("checkpoint: restore from %s: no checkpoint found, and ranks %v could not list their checkpoints (see their logs)", m.dir, listBad)
	}
	return cands, has, nil
}

// candidate is the restore of one committed step, as steps 2 to 5 learn it.
type candidate struct {
	step  int64
	dom   *domains
	man   *Manifest
	files []FileInfo // the shards, then the blob files
	ns    int        // the number of shards

	badMan  map[int]bool   // the domains whose manifest could not be used
	holders [][]int        // per file, and the manifest at len(files): the ranks whose copy has the right size
	readers [][]int        // per file: its holders, else the ranks whose copy has the wrong size
	badDom  []map[int]bool // per file: the domains whose copy did not verify
	assign  []int          // per file: the rank that reads it

	blobData [][]byte // per rank that wrote the checkpoint: its blob file
}

// restoreStep runs steps 2 to 5 of a restore for one candidate step on
// every rank, then has every rank load its blobs (loadBlobs), writes the
// files that lost copies again (rereplicate) and warns of the per-rank
// state a smaller job drops (warnDropped); listers are the ranks that list
// the step, ascending. A *skipStep error says why the step cannot be
// loaded (the caller tries an older one); any other ends the restore (a
// collective failed, a rank could not load its blobs, or a file or the
// manifest could not be read from any copy because of I/O errors: falling
// back would silently lose progress). *touched is set once bytes of the
// registered state may have been overwritten.
func (m *Manager) restoreStep(ctx context.Context, st *State, dom *domains, step int64, listers []int, touched *bool) error {
	// Every collective below may wait for a rank reading (or writing
	// back) a file: bounded by WithIOTimeout, not the collective timeout.
	ctx = m.ioCtx(ctx)
	n := m.comm.Size()
	c := &candidate{step: step, dom: dom}
	if err := m.shareManifest(ctx, c, listers); err != nil {
		return err
	}
	if err := fits(c.man, st); err != nil {
		return skip(err)
	}
	c.files, c.ns = c.man.Files(), len(c.man.Shards)
	for _, f := range c.man.Blobs {
		if f.Size < 0 || f.Size > 1<<32 {
			return skip(fmt.Errorf("%s: manifest gives an implausible size %d", f.File, f.Size))
		}
	}
	if err := m.findCopies(ctx, c); err != nil {
		return err
	}
	c.assign = m.assign(c.files, c.readers, c.man.WorldSize, n)
	if st.totalBytes() > 0 {
		*touched = true // the reads and broadcasts of step 5 write into the tensors
	}
	if err := m.transfer(ctx, st, c); err != nil {
		return err
	}
	if err := m.loadBlobsEverywhere(ctx, st, c); err != nil {
		return err
	}
	if dom.h() > 1 {
		holders := c.holders
		for i := range c.files {
			holders[i] = slices.DeleteFunc(holders[i], func(r int) bool { return c.badDom[i][dom.of[r]] })
		}
		if err := m.rereplicate(ctx, st, dom, c.man, c.files, holders, c.blobData); err != nil {
			return fmt.Errorf("checkpoint: restore: step %d: %w", step, err)
		}
	}
	if m.comm.Rank() == 0 {
		m.warnDropped(c.man, n)
	}
	return nil
}

// shareManifest is step 2 of a restore: the lowest rank that lists the
// step reads its manifest for all (c.man). When that copy cannot be read
// or parsed, the lowest lister of the next domain that lists the step
// reads its own, and so on: every rank learns each outcome from the
// broadcast, so all move on together. The domains whose copy could not be
// used are c.badMan.
func (m *Manager) shareManifest(ctx context.Context, c *candidate, listers []int) error {
	rank, dom, step := m.comm.Rank(), c.dom, c.step
	var roots []int // the lowest lister of each domain, ascending
	inRoots := map[int]bool{}
	for _, r := range listers {
		if !inRoots[dom.of[r]] {
			inRoots[dom.of[r]] = true
			roots = append(roots, r)
		}
	}
	var problems, unreadables []string
	c.badMan = map[int]bool{}
	for k, root := range roots {
		hdr := []int64{0, 0} // the copy's status (verified, corrupt, unreadable), the length of data
		var data []byte
		if rank == root {
			var err error
			if data, err = m.readManifestBytes(ctx, step); err != nil {
				hdr[0], data = int64(copyStatus(err)), []byte(err.Error())
			}
			hdr[1] = int64(len(data))
		}
		if err := m.comm.Broadcast(ctx, hdr, root, collective.Name("checkpoint.restore.manifest")); err != nil {
			return restoreErr(step, err)
		}
		if rank != root {
			data = make([]byte, hdr[1])
		}
		if len(data) > 0 {
			if err := m.comm.Broadcast(ctx, data, root); err != nil {
				return restoreErr(step, err)
			}
		}
		var merr error
		if hdr[0] == int64(statusVerified) {
			if c.man, merr = parseManifest(data); merr == nil {
				return nil
			}
		} else {
			merr = errors.New(string(data))
		}
		c.man = nil
		c.badMan[dom.of[root]] = true
		text := merr.Error()
		if len(roots) > 1 {
			text = fmt.Sprintf("rank %d's copy: %s", root, text)
		}
		if hdr[0] == int64(statusUnreadable) {
			unreadables = append(unreadables, text)
		}
		problems = append(problems, text)
		if rank == 0 && k+1 < len(roots) {
			m.logf("checkpoint: WARNING: step %d: rank %d's copy of %s cannot be used (%v); reading rank %d's", step, root, ManifestName, merr, roots[k+1])
		}
	}
	if len(unreadables) > 0 {
		return unreadable(step, strings.Join(unreadables, "; "))
	}
	if len(problems) == 0 { // no lister: cannot happen
		return skip(fmt.Errorf("no rank lists the step"))
	}
	return skip(errors.New(strings.Join(problems, "; ")))
}

// restoreErr is the error of a collective of a restore of step that failed.
func restoreErr(step int64, err error) error {
	return fmt.Errorf("checkpoint: restore: step %d: %w", step, err)
}

// findCopies is step 3 of a restore: every rank says which of the
// checkpoint's files (and whether the manifest) its store holds, and every
// rank learns who holds what: c.holders, c.readers and the domains whose
// copy is known bad (c.badDom). A copy of the wrong size (truncated,
// overwritten), seen without reading it, is read only when no other copy
// is left (to say what is wrong), and is written again from another
// host's copy. A file that no rank holds makes the step unloadable.
func (m *Manager) findCopies(ctx context.Context, c *candidate) error {
	rank, n, dom, step := m.comm.Rank(), m.comm.Size(), c.dom, c.step
	nf := len(c.files)
	keys, lerr := m.store.List(ctx, stepKey(step)+"/")
	if lerr != nil {
		m.logf("checkpoint: rank %d: listing %s: %v", rank, m.StepLocation(step), lerr)
	}
	present := map[string]bool{}
	for _, k := range keys {
		present[strings.TrimPrefix(k, stepKey(step)+"/")] = true
	}
	// 1: this rank holds the file; 2: it holds a copy of the wrong size.
	bits := make([]byte, nf+1)
	sz, sized := m.store.(sizer)
	for i, f := range c.files {
		if !present[f.File] {
			continue
		}
		bits[i] = 1
		if sized {
			if size, err := sz.size(stepKey(step) + "/" + f.File); err == nil && size != f.Size {
				bits[i] = 2
			}
		}
	}
	bits[nf] = byte(boolU64(present[ManifestName]))
	allBits := make([]byte, (nf+1)*n)
	if err := m.comm.Allgather(ctx, bits, allBits, collective.Name("checkpoint.restore.holders")); err != nil {
		return restoreErr(step, err)
	}
	c.holders = make([][]int, nf+1)
	wrongSize := make([][]int, nf)
	for r := range n {
		for i := range nf + 1 {
			if i == nf && c.badMan[dom.of[r]] {
				continue // its manifest is unusable: written again if the domain is complete
			}
			switch allBits[r*(nf+1)+i] {
			case 1:
				c.holders[i] = append(c.holders[i], r)
			case 2:
				wrongSize[i] = append(wrongSize[i], r)
			}
		}
	}
	var missing []string
	c.readers = make([][]int, nf)
	c.badDom = make([]map[int]bool, nf)
	for i, f := range c.files {
		c.readers[i] = c.holders[i]
		if len(c.holders[i]) == 0 {
			c.readers[i] = wrongSize[i]
		}
		if len(c.readers[i]) == 0 {
			missing = append(missing, f.File)
		}
		for _, r := range wrongSize[i] {
			c.markBad(i, r)
		}
	}
	if len(missing) > 0 {
		return skip(m.noCopyLeft(c.man, dom, step, missing))
	}
	return nil
}

// markBad records that rank r's domain holds a bad copy of file i.
func (c *candidate) markBad(i, r int) {
	if c.badDom[i] == nil {
		c.badDom[i] = map[int]bool{}
	}
	c.badDom[i][c.dom.of[r]] = true
}

// noCopyLeft says why files of a step that no rank holds are lost, from
// the placement the checkpoint recorded (not this job's replica count).
func (m *Manager) noCopyLeft(man *Manifest, dom *domains, step int64, missing []string) error {
	list := strings.Join(missing, ", ")
	if !man.Replicated() {
		// Written to one location (a shared directory, S3, one host):
		// the only copy is gone.
		where := m.StepLocation(step)
		if dom.h() > 1 {
			where = fmt.Sprintf("the checkpoint directories of all %d hosts (this one's is %s)", dom.h(), where)
		}
		verb := "is"
		if len(missing) > 1 {
			verb = "are"
		}
		return fmt.Errorf("%s %s missing from %s (deleted?); the checkpoint was written to one location, with no other copy", list, verb, where)
	}
	copies := man.Replicas + 1
	for _, f := range man.Files() {
		if slices.Contains(missing, f.File) && len(f.Hosts) > 0 {
			copies = len(f.Hosts)
			break
		}
	}
	// Whole directories lost, or single files deleted or damaged: the
	// restore sees only that every copy of these files is gone.
	return fmt.Errorf("no copy of %s is left on any host (the checkpoint kept each file on %d of its %d hosts, --checkpoint-replicas %d; every copy of these files is missing or damaged: directories lost, or files deleted)",
		list, copies, man.Hosts, man.Replicas)
}

// assign is step 4 of a restore: it picks the rank that reads each file,
// among its holders, balancing the bytes each rank reads. When the job has
// the size that wrote the checkpoint, rank r reads rank r's files wherever
// it holds them, so a restore from a shared directory reads exactly 1/N
// per rank.
func (m *Manager) assign(files []FileInfo, holders [][]int, oldN, n int) []int {
	assign := make([]int, len(files))
	load := make([]int64, n)
	order := make([]int, len(files))
	for i := range order {
		order[i] = i
	}
	// Largest first, for a better balance when sizes differ.
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(files[b].Size, files[a].Size) })
	for _, i := range order {
		h := holders[i]
		owner := i % oldN
		pick := -1
		switch {
		case m.restoreRank0:
			pick = h[0] // rank 0 whenever it holds the file
		case oldN == n && slices.Contains(h, owner):
			pick = owner
		default:
			for _, r := range h {
				// Least loaded; ties go to the rank nearest the owner, to
				// spread equal files.
				if pick < 0 || load[r] < load[pick] || load[r] == load[pick] && (r-owner+n)%n < (pick-owner+n)%n {
					pick = r
				}
			}
		}
		assign[i] = pick
		load[pick] += files[i].Size
	}
	return assign
}

// loadBlobsEverywhere has every rank load its own blobs (loadBlobs) from
// c.blobData; a failure there is an error on every rank, not a reason to
// fall back to an older step.
func (m *Manager) loadBlobsEverywhere(ctx context.Context, st *State, c *candidate) error {
	berr := m.loadBlobs(st, c.man, c.blobData)
	if berr != nil {
		m.logf("checkpoint: rank %d: step %d: %v", m.comm.Rank(), c.step, berr)
	}
	ok := []int64{boolI64(berr != nil)}
	if err := m.comm.Allreduce(ctx, ok, collective.Max, collective.Name("checkpoint.restore.blobs")); err != nil {
		return restoreErr(c.step, err)
	}
	if ok[0] != 0 {
		if berr == nil {
			berr = fmt.Errorf("another rank could not load its per-rank state (see its log)")
		}
		return fmt.Errorf("checkpoint: restore of step %d: %w", c.step, berr)
	}
	return nil
}

// loadBlobs gives this rank its per-rank state back from the blob files
// every rank received.
func (m *Manager) loadBlobs(st *State, man *Manifest, blobData [][]byte) error {
	if len(st.blobs) == 0 {
		return nil
	}
	rank := m.comm.Rank()
	if rank >= man.WorldSize {
		m.logf("checkpoint: WARNING: rank %d: the checkpoint of step %d was written by %d ranks; this rank keeps its initial per-rank state", rank, man.Step, man.WorldSize)
		return nil
	}
	blobs, err := decodeBlobs(blobData[rank])
	if err != nil {
		return fmt.Errorf("%s: %w", man.Blobs[rank].File, err)
	}
	for _, b := range st.blobs {
		data, ok := blobs[b.name]
		if !ok {
			m.logf("checkpoint: WARNING: rank %d: blob %q is not in the checkpoint of step %d; keeping its current value", rank, b.name, man.Step)
			continue
		}
		if err := b.load(data); err != nil {
			return fmt.Errorf("loading blob %q: %w", b.name, err)
		}
	}
	return nil
}

// warnDropped logs, once, the per-rank state that a job smaller than the
// one that wrote the checkpoint does not restore: the blob files of the
// old ranks n and beyond.
func (m *Manager) warnDropped(man *Manifest, n int) {
	if man.WorldSize <= n || len(man.Blobs) <= n {
		return
	}
	var names []string
	var bytes int64
	blobs := map[string]bool{}
	for _, f := range man.Blobs[n:] {
		names = append(names, f.File)
		bytes += f.Size
		for _, b := range f.Blobs {
			blobs[b] = true
		}
	}
	if bytes == 0 {
		return // no rank registered per-rank state: nothing is lost
	}
	which := fmt.Sprintf("ranks %d to %d", n, man.WorldSize-1)
	if man.WorldSize-n == 1 {
		which = fmt.Sprintf("rank %d", n)
	}
	what := ""
	if len(blobs) > 0 {
		var q []string
		for _, b := range slices.Sorted(maps.Keys(blobs)) {
			q = append(q, strconv.Quote(b))
		}
		what = ": blobs " + strings.Join(q, ", ")
	}
	m.logf("checkpoint: WARNING: the checkpoint of step %d was written by %d ranks and this job has %d: the per-rank state of old %s (%s%s) is not restored; what it held (data-loader positions, RNG states) is dropped, and only ranks 0 to %d get their own back",
		man.Step, man.WorldSize, n, which, strings.Join(names, ", "), what, n-1)
}
