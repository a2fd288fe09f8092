package checkpoint

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/gorun/gorun/collective"
)

// maxCandidates is how many of its newest committed steps each rank offers
// to a restore.
const maxCandidates = 16

// allgatherRestores counts the ranks' restores of shards by one allgather
// (for tests).
var allgatherRestores atomic.Int64

// errTextLen is the fixed size of a failed read's message in its broadcast.
const errTextLen = 512

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
	if st.err != nil {
		return 0, false, st.err
	}
	if err := m.Wait(ctx); err != nil { // abandons a save the job re-formed under
		return 0, false, err
	}
	if err := m.waitOrphan(ctx); err != nil {
		return 0, false, err
	}
	rank, n := m.comm.Rank(), m.comm.Size()
	// R1. Every rank lists the committed steps in its own store, and says
	// what it registered (st.layoutHash): ranks whose states differ would
	// take different collective paths below (fits, the one-allgather
	// restore), so they fail here, every one of them, before any other
	// collective of the restore.
	const hashOff, stepsOff = 16, 16 + 32
	const recLen = stepsOff + 8*maxCandidates
	rec := make([]byte, recLen)
	entries, lerr := storeSteps(ctx, m.store)
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
	if err := m.comm.Allgather(ctx, rec, all, collective.Name("checkpoint.restore.steps")); err != nil {
		return 0, false, fmt.Errorf("checkpoint: restore: %w", err)
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
		return 0, false, fmt.Errorf("checkpoint: restore from %s: ranks %v registered different tensors or blobs than this rank %d (names, dtypes and shapes must match on every rank)", m.dir, layoutDiff, rank)
	}
	cands := slices.Sorted(maps.Keys(has))
	slices.Reverse(cands)
	if len(cands) == 0 {
		if len(listBad) > 0 {
			// The ranks that cannot list their directories may hold
			// checkpoints: never start fresh silently.
			if lerr != nil {
				return 0, false, fmt.Errorf("checkpoint: restore from %s: listing the checkpoints: %w", m.dir, lerr)
			}
			return 0, false, fmt.Errorf("checkpoint: restore from %s: no checkpoint found, and ranks %v could not list their checkpoints (see their logs)", m.dir, listBad)
		}
		return 0, false, nil
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
		problem, fatal := m.restoreStep(ctx, st, dom, s, has[s], &touched)
		if fatal != nil {
			return 0, false, overwritten(fatal, touched)
		}
		if problem == nil {
			m.good = s
			return s, true, nil
		}
		problems = append(problems, fmt.Sprintf("step %d: %v", s, problem))
		if rank == 0 {
			m.logf("checkpoint: WARNING: skipping the checkpoint of step %d in %s: %v; falling back to an older one", s, m.StepLocation(s), problem)
		}
	}
	return 0, false, overwritten(fmt.Errorf("checkpoint: restore from %s: none of the %d committed checkpoints can be loaded: %s", m.dir, len(cands), strings.Join(problems, "; ")), touched)
}

// overwritten adds to a failed restore's error that the registered tensors
// hold part of a checkpoint, when bytes of them were written.
func overwritten(err error, touched bool) error {
	if !touched {
		return err
	}
	return fmt.Errorf("%w; the registered tensors were partly overwritten: re-initialize them before starting fresh", err)
}

// restoreStep runs R2–R5 for one candidate step on every rank; listers are
// the ranks that list it, ascending. problem is why the step cannot be
// loaded (the caller tries an older one); fatal ends the restore (a
// collective failed, a rank could not load its blobs, or a file or the
// manifest could not be read from any copy because of I/O errors: falling
// back would silently lose progress). *touched is set once bytes of the
// registered state may have been overwritten.
func (m *Manager) restoreStep(ctx context.Context, st *State, dom *domains, step int64, listers []int, touched *bool) (problem, fatal error) {
	// Every collective below may wait for a rank reading (or writing
	// back) a file: bounded by WithIOTimeout, not the collective timeout.
	ctx = m.ioCtx(ctx)
	rank, n := m.comm.Rank(), m.comm.Size()
	wrap := func(err error) error { return fmt.Errorf("checkpoint: restore: step %d: %w", step, err) }

	// R2. The lowest rank that lists the step reads its manifest for all.
	// When that copy cannot be read or parsed, the lowest lister of the
	// next domain that lists the step reads its own, and so on: every rank
	// learns each outcome from the broadcast, so all move on together.
	var roots []int // the lowest lister of each domain, ascending
	inRoots := map[int]bool{}
	for _, r := range listers {
		if !inRoots[dom.of[r]] {
			inRoots[dom.of[r]] = true
			roots = append(roots, r)
		}
	}
	var man *Manifest
	var manProblems, manUnreadable []string
	badMan := map[int]bool{} // domains whose manifest could not be used
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
			return nil, wrap(err)
		}
		if rank != root {
			data = make([]byte, hdr[1])
		}
		if len(data) > 0 {
			if err := m.comm.Broadcast(ctx, data, root); err != nil {
				return nil, wrap(err)
			}
		}
		var merr error
		if hdr[0] == int64(statusVerified) {
			if man, merr = parseManifest(data); merr == nil {
				break
			}
		} else {
			merr = errors.New(string(data))
		}
		man = nil
		badMan[dom.of[root]] = true
		text := merr.Error()
		if len(roots) > 1 {
			text = fmt.Sprintf("rank %d's copy: %s", root, text)
		}
		if hdr[0] == int64(statusUnreadable) {
			manUnreadable = append(manUnreadable, text)
		}
		manProblems = append(manProblems, text)
		if rank == 0 && k+1 < len(roots) {
			m.logf("checkpoint: WARNING: step %d: rank %d's copy of %s cannot be used (%v); reading rank %d's", step, root, ManifestName, merr, roots[k+1])
		}
	}
	if man == nil {
		if len(manUnreadable) > 0 {
			return nil, unreadable(step, strings.Join(manUnreadable, "; "))
		}
		if len(manProblems) == 0 { // no lister: cannot happen
			return fmt.Errorf("no rank lists the step"), nil
		}
		return errors.New(strings.Join(manProblems, "; ")), nil
	}
	if err := fits(man, st); err != nil {
		return err, nil
	}
	files := append(slices.Clone(man.Shards), man.Blobs...)
	for _, f := range man.Blobs {
		if f.Size < 0 || f.Size > 1<<32 {
			return fmt.Errorf("%s: manifest gives an implausible size %d", f.File, f.Size), nil
		}
	}
	nf := len(files)

	// R3. Which ranks hold which files (and the manifest, index nf).
	keys, lerr := m.store.List(ctx, stepKey(step)+"/")
	if lerr != nil {
		m.logf("checkpoint: rank %d: listing %s: %v", rank, m.StepLocation(step), lerr)
	}
	present := map[string]bool{}
	for _, k := range keys {
		present[strings.TrimPrefix(k, stepKey(step)+"/")] = true
	}
	// 1: this rank holds the file; 2: it holds a copy of the wrong size
	// (truncated, overwritten), seen without reading it: read only when
	// no other copy is left (to say what is wrong), and written again
	// from another host's copy.
	bits := make([]byte, nf+1)
	sz, sized := m.store.(sizer)
	for i, f := range files {
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
		return nil, wrap(err)
	}
	holders := make([][]int, nf+1)
	wrongSize := make([][]int, nf)
	for r := range n {
		for i := range nf + 1 {
			if i == nf && badMan[dom.of[r]] {
				continue // its manifest is unusable: written again if the domain is complete
			}
			switch allBits[r*(nf+1)+i] {
			case 1:
				holders[i] = append(holders[i], r)
			case 2:
				wrongSize[i] = append(wrongSize[i], r)
			}
		}
	}
	var missing []string
	readers := make([][]int, nf)       // the holders, else the wrong-size copies
	badDom := make([]map[int]bool, nf) // domains whose copy failed to verify
	for i, f := range files {
		readers[i] = holders[i]
		if len(holders[i]) == 0 {
			readers[i] = wrongSize[i]
		}
		if len(readers[i]) == 0 {
			missing = append(missing, f.File)
		}
		for _, r := range wrongSize[i] {
			if badDom[i] == nil {
				badDom[i] = map[int]bool{}
			}
			badDom[i][dom.of[r]] = true
		}
	}
	if len(missing) > 0 {
		return m.noCopyLeft(man, dom, step, missing), nil
	}

	// R4. One reader per file.
	assign := m.assign(files, readers, man.WorldSize, n)

	// R5. In the parallel restore the shards come first, in place: each
	// rank reads its shards straight into the registered tensors in the
	// background (hashing as it reads), while the shards are broadcast in
	// order from their readers straight from and into the tensors; one
	// small allgather then says which copies did not verify, and only
	// those take the per-file path below. No buffer, no copy.
	blobData := make([][]byte, man.WorldSize)
	var todo []int                    // the files for the per-file path
	inPlaceErr := make([]error, nf)   // this rank's failed in-place reads
	failedInPlace := make([]byte, nf) // their status (copyStatus), agreed
	ns := len(man.Shards)
	if st.totalBytes() > 0 {
		*touched = true // the reads and broadcasts below write into the tensors
	}
	if m.restoreRank0 {
		for i := range nf {
			todo = append(todo, i)
		}
	} else {
		// In one storage domain with the size that wrote the checkpoint,
		// each rank reads its own blob file and nobody else needs it (no
		// re-replication): no broadcast, its status rides with the
		// shards'.
		selfBlobs := dom.h() == 1 && man.WorldSize == n
		for r := range man.WorldSize {
			selfBlobs = selfBlobs && assign[ns+r] == r
		}
		bad := make([]byte, nf)
		var ownBlob []byte
		if selfBlobs {
			ownBlob, inPlaceErr[ns+rank] = m.readFile(ctx, step, files[ns+rank])
			bad[ns+rank] = copyStatus(inPlaceErr[ns+rank])
		}
		var err error
		if failedInPlace, err = m.restoreShards(ctx, st, step, files, assign, ns, inPlaceErr, bad); err != nil {
			return nil, wrap(err)
		}
		for i := range nf {
			if failedInPlace[i] != statusVerified || i >= ns && !selfBlobs {
				todo = append(todo, i)
			}
		}
		if selfBlobs && failedInPlace[ns+rank] == statusVerified {
			blobData[rank] = ownBlob[:files[ns+rank].Size]
		}
	}

	// The per-file path: this rank reads and verifies its files in the
	// background, in order, at most two ahead of the broadcasts (all of
	// them first in the rank-0 mode, as restores used to); each file is
	// broadcast with a status byte that says whether it verified.
	var mine []int
	for _, i := range todo {
		if assign[i] == rank && failedInPlace[i] == statusVerified {
			mine = append(mine, i)
		}
	}
	type readOut struct {
		buf []byte
		err error
	}
	ahead := 2
	if m.restoreRank0 {
		ahead = len(mine)
	}
	ch := make(chan readOut, ahead)
	allRead := make(chan struct{})
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(allRead)
		for _, i := range mine {
			buf, err := m.readFile(rctx, step, files[i])
			select {
			case ch <- readOut{buf, err}:
			case <-rctx.Done():
				return
			}
		}
	}()
	// The reader stops and is gone before Restore returns or tries
	// another step.
	defer func() { cancel(); wg.Wait() }()
	if m.restoreRank0 && len(mine) > 0 {
		select {
		case <-allRead:
		case <-ctx.Done():
			return nil, wrap(ctx.Err())
		}
	}

	var recv []byte // reused for the files other ranks read
	for _, i := range todo {
		f := files[i]
		reader := assign[i]
		first := true
		known := failedInPlace[i] // the status of the reader's in-place copy
		var ioText string         // why a copy could not be read, if one could not
		for {
			var rerr error
			var status byte
			if known != statusVerified {
				status, known, first = known, statusVerified, false
				rerr = inPlaceErr[i] // on the reader
			} else {
				var buf []byte
				switch {
				case rank == reader && first:
					select {
					case out := <-ch:
						buf, rerr = out.buf, out.err
					case <-ctx.Done():
						return nil, wrap(ctx.Err())
					}
				case rank == reader:
					buf, rerr = m.readFile(ctx, step, f)
				default:
					if int64(cap(recv)) < f.Size+1 {
						recv = make([]byte, f.Size+1)
					}
					buf = recv[:f.Size+1]
				}
				if rank == reader {
					if rerr != nil {
						buf = make([]byte, f.Size+1)
					}
					buf[f.Size] = copyStatus(rerr)
				}
				if err := m.comm.Broadcast(ctx, buf, reader, collective.Name("checkpoint.restore.file")); err != nil {
					return nil, wrap(err)
				}
				if status = buf[f.Size]; status == statusVerified {
					if i < ns {
						st.writeAt(f.Offset, buf[:f.Size])
					} else {
						blobData[i-ns] = slices.Clone(buf[:f.Size])
					}
					break
				}
			}
			// The reader's copy is corrupt or unreadable (status): every
			// rank learns why, and the next holder in another domain reads
			// it.
			msg := make([]byte, errTextLen)
			if rank == reader {
				copy(msg, rerr.Error())
			}
			if err := m.comm.Broadcast(ctx, msg, reader, collective.Name("checkpoint.restore.error")); err != nil {
				return nil, wrap(err)
			}
			text := strings.TrimRight(string(msg), "\x00")
			if status == statusUnreadable {
				ioText = text
			}
			if badDom[i] == nil {
				badDom[i] = map[int]bool{}
			}
			badDom[i][dom.of[reader]] = true
			first = false
			next := -1
			for _, h := range holders[i] {
				if !badDom[i][dom.of[h]] {
					next = h
					break
				}
			}
			if next < 0 {
				if ioText != "" {
					// Not known to be corrupt: an older checkpoint would
					// silently lose the progress since this one.
					return nil, unreadable(step, ioText)
				}
				return errors.New(text), nil
			}
			if rank == 0 {
				m.logf("checkpoint: WARNING: step %d: rank %d's copy of %s cannot be used (%s); reading rank %d's", step, reader, f.File, text, next)
			}
			reader = next
		}
	}

	// Every rank loads its own blobs; a failure there is an error on
	// every rank, not a reason to fall back.
	berr := m.loadBlobs(st, man, blobData)
	if berr != nil {
		m.logf("checkpoint: rank %d: step %d: %v", rank, step, berr)
	}
	ok := []int64{boolI64(berr != nil)}
	if err := m.comm.Allreduce(ctx, ok, collective.Max, collective.Name("checkpoint.restore.blobs")); err != nil {
		return nil, wrap(err)
	}
	if ok[0] != 0 {
		if berr == nil {
			berr = fmt.Errorf("another rank could not load its per-rank state (see its log)")
		}
		return nil, fmt.Errorf("checkpoint: restore of step %d: %w", step, berr)
	}
	if dom.h() > 1 {
		for i := range nf {
			holders[i] = slices.DeleteFunc(holders[i], func(r int) bool { return badDom[i][dom.of[r]] })
		}
		if err := m.rereplicate(ctx, st, dom, man, files, holders, blobData); err != nil {
			return nil, wrap(err)
		}
	}
	if rank == 0 {
		m.warnDropped(man, n)
	}
	return nil, nil
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

// assign picks the rank that reads each file, among its holders, balancing
// the bytes each rank reads. When the job has the size that wrote the
// checkpoint, rank r reads rank r's files wherever it holds them, so a
// restore from a shared directory reads exactly 1/N per rank.
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

// restoreShards is the parallel restore of the tensor shards, in place:
// this rank reads the shards assigned to it straight into st's tensors in
// the background, while every shard is broadcast in order from its reader
// straight from and into the tensors (a shard that spans tensors is one
// broadcast per tensor); shards read elsewhere land in disjoint bytes, so
// the reads and the broadcasts overlap. One allgather then tells every
// rank which shards' copies did not verify (the status of every file,
// copyStatus of the reader's error, which is in errs), together with the
// other files this rank read for itself (bad, of every file, comes with
// their statuses set). The
// shards' bytes in st are wrong until read again. When every rank reads
// exactly its own shard of equal ones into one tensor, the broadcasts are
// one allgather instead.
func (m *Manager) restoreShards(ctx context.Context, st *State, step int64, files []FileInfo, assign []int, ns int, errs []error, bad []byte) ([]byte, error) {
	rank, n := m.comm.Rank(), m.comm.Size()
	shards := files[:ns]
	if buf, ok := allgatherable(st, shards, assign[:ns], n); ok {
		// Every rank reads exactly its own shard, the shards are equal
		// and the tensors are one buffer: one allgather, in place, which
		// keeps every link of the ring busy.
		allgatherRestores.Add(1)
		size := shards[rank].Size
		own := buf[int64(rank)*size : int64(rank+1)*size]
		errs[rank] = m.readInto(ctx, step, shards[rank], [][]byte{own})
		bad[rank] = copyStatus(errs[rank])
		if err := m.comm.Allgather(ctx, own, buf, collective.Name("checkpoint.restore.shards")); err != nil {
			return nil, err
		}
		return m.shardsVerified(ctx, bad, assign)
	}
	done := make([]chan error, ns)
	var mine []int
	for i, r := range assign[:ns] {
		if r == rank {
			mine = append(mine, i)
			done[i] = make(chan error, 1)
		}
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for _, i := range mine {
			f := shards[i]
			done[i] <- m.readInto(rctx, step, f, st.slice(f.Offset, f.Offset+f.Size))
		}
	}()
	defer func() { cancel(); wg.Wait() }()
	for i, f := range shards {
		if assign[i] == rank {
			select {
			case errs[i] = <-done[i]:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			bad[i] = copyStatus(errs[i]) // a bad copy's bytes go out anyway, and are ignored
		}
		for _, v := range st.slice(f.Offset, f.Offset+f.Size) {
			if err := m.comm.Broadcast(ctx, v, assign[i], collective.Name("checkpoint.restore.shard")); err != nil {
				return nil, err
			}
		}
	}
	return m.shardsVerified(ctx, bad, assign)
}

// shardsVerified allgathers the status of the files' copies (bad[i] on
// their reader: statusVerified, statusCorrupt or statusUnreadable) and
// returns them, the same on every rank.
func (m *Manager) shardsVerified(ctx context.Context, bad []byte, assign []int) ([]byte, error) {
	ns := len(bad)
	all := make([]byte, ns*m.comm.Size())
	if err := m.comm.Allgather(ctx, bad, all, collective.Name("checkpoint.restore.verified")); err != nil {
		return nil, err
	}
	status := make([]byte, ns)
	for i := range ns {
		status[i] = all[assign[i]*ns+i]
	}
	return status, nil
}

// allgatherable returns the tensors' bytes as one buffer when the shards
// can be restored by one allgather: rank r reads shard r, one per rank,
// all of one size, and the non-empty tensors are a single one.
func allgatherable(st *State, shards []FileInfo, assign []int, n int) ([]byte, bool) {
	if n < 2 || len(shards) != n {
		return nil, false
	}
	for i, f := range shards {
		if assign[i] != i || f.Size != shards[0].Size || f.Offset != int64(i)*shards[0].Size {
			return nil, false
		}
	}
	views := st.slice(0, st.totalBytes())
	if len(views) != 1 || int64(len(views[0])) != int64(n)*shards[0].Size {
		return nil, false
	}
	return views[0], true
}

// The status of one copy of a file (or a manifest) as its reader found it,
// which every rank learns from a broadcast or an allgather.
const (
	statusVerified   byte = 0 // read, and its size and sha256 are the manifest's
	statusCorrupt    byte = 1 // missing, of the wrong size, or its sha256 differs
	statusUnreadable byte = 2 // reads failed with I/O errors, retries included
)

// readRetries is how many times a read that failed with an I/O error is
// tried again, from the start of the file.
const readRetries = 3

// readFailed is the error of a copy that could not be read (the store
// refused or dropped the request, the disk returned an error): unlike a
// copy that is missing, of the wrong size or that does not verify, it says
// nothing about the checkpoint, so it is retried and never makes a restore
// fall back to an older step.
type readFailed struct {
	msg string // names the file's location and the cause
	err error
}

func (e *readFailed) Error() string { return e.msg }
func (e *readFailed) Unwrap() error { return e.err }

// copyStatus is the status of a copy whose read returned err.
func copyStatus(err error) byte {
	var rf *readFailed
	switch {
	case err == nil:
		return statusVerified
	case errors.As(err, &rf):
		return statusUnreadable
	}
	return statusCorrupt
}

// unreadable is the error of a restore that stops because a file of step
// could not be read from any copy (what says which and why).
func unreadable(step int64, what string) error {
	return fmt.Errorf("checkpoint: restore: step %d: %s; the checkpoint itself may be intact, so the restore stops rather than fall back to an older checkpoint, which would lose the progress since: fix the storage and restart", step, what)
}

// readFailure is a failed read of key in s.
func readFailure(s Store, key string, err error) error {
	loc := strings.TrimSuffix(s.String(), "/") + "/" + key
	return &readFailed{"reading " + loc + ": " + causeOf(err, loc, key), err}
}

// retryRead runs read, and again up to readRetries times while it fails
// with an I/O error (readFailed), logging each retry. A context that is
// done ends it.
func (m *Manager) retryRead(ctx context.Context, step int64, read func() error) error {
	for attempt := 1; ; attempt++ {
		err := read()
		if copyStatus(err) != statusUnreadable || ctx.Err() != nil {
			return err
		}
		if attempt > readRetries {
			return &readFailed{fmt.Sprintf("%v (%d attempts)", err, attempt), err}
		}
		m.logf("checkpoint: WARNING: rank %d: step %d: %v; reading it again from the start (retry %d of %d)", m.comm.Rank(), step, err, attempt, readRetries)
	}
}

// readInto reads one file of a step straight into dst (views whose lengths
// add up to the file's size), checking its size and sha256 as it goes, and
// retries I/O errors (retryRead).
func (m *Manager) readInto(ctx context.Context, step int64, f FileInfo, dst [][]byte) error {
	return m.retryRead(ctx, step, func() error { return readOnce(ctx, m.store, step, f, dst) })
}

// readOnce is one attempt of readInto.
func readOnce(ctx context.Context, s Store, step int64, f FileInfo, dst [][]byte) error {
	if err := checkFileName(f); err != nil {
		return err
	}
	key := stepKey(step) + "/" + f.File
	rc, size, err := s.Get(ctx, key)
	if errors.Is(err, fs.ErrNotExist) {
		return &fileError{f.File + " is missing", err}
	}
	if err != nil {
		return readFailure(s, key, err)
	}
	defer rc.Close()
	if size != f.Size {
		return &fileError{fmt.Sprintf("%s is %d bytes, manifest says %d (truncated or overwritten)", f.File, size, f.Size), errWrongSize}
	}
	h := sha256.New()
	const piece = 1 << 20 // hashed while it is in the cache
	for _, d := range dst {
		for len(d) > 0 {
			p := d[:min(len(d), piece)]
			if _, err := io.ReadFull(rc, p); err != nil {
				// A body that ends early (a dropped connection) or an
				// error of the disk: read again, which sees a file that
				// really shrank as of the wrong size.
				return readFailure(s, key, err)
			}
			h.Write(p)
			d = d[len(p):]
		}
	}
	return checkSum(f, h)
}

// readFile reads and verifies one file of a step into a buffer one byte
// longer than the file (for the broadcast's status byte).
func (m *Manager) readFile(ctx context.Context, step int64, f FileInfo) ([]byte, error) {
	buf := make([]byte, f.Size+1)
	if err := m.readInto(ctx, step, f, [][]byte{buf[:f.Size]}); err != nil {
		return nil, err
	}
	return buf, nil
}

// readManifestBytes reads a step's manifest as it is stored, retrying I/O
// errors (retryRead).
func (m *Manager) readManifestBytes(ctx context.Context, step int64) ([]byte, error) {
	var data []byte
	err := m.retryRead(ctx, step, func() error {
		key := stepKey(step) + "/" + ManifestName
		rc, _, err := m.store.Get(ctx, key)
		if errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err != nil {
			return readFailure(m.store, key, err)
		}
		defer rc.Close()
		if data, err = io.ReadAll(rc); err != nil {
			return readFailure(m.store, key, err)
		}
		return nil
	})
	return data, err
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
	return fmt.Errorf("no copy of %s is left on any host (the checkpoint kept each file on %d of its %d hosts, --checkpoint-replicas %d; more hosts lost their checkpoint directory than that allows)",
		list, copies, man.Hosts, man.Replicas)
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

// rereplicate writes the files of a restored step that have fewer copies
// than the replication factor asks for to domains that lack them, from
// memory: shards from the restored tensors, blob files from the broadcast.
// Each file goes first to its owner's domain, then to the domains after
// it, so the layout a save of this job size makes comes back. The
// manifest follows the files in every domain that received any, and goes
// to a domain that lost only it; it is written once every rank knows which
// domains' file writes succeeded, and names as holders of a file only the
// domains whose copy is verified (read by this restore, or written here).
// A failure here is logged, not returned: the restore itself succeeded.
func (m *Manager) rereplicate(ctx context.Context, st *State, dom *domains, man *Manifest, files []FileInfo, holders [][]int, blobData [][]byte) error {
	rank, n, h := m.comm.Rank(), m.comm.Size(), dom.h()
	want := min(m.replicaCount(dom)+1, h)
	nf := len(files)
	type job struct{ file, dom int }
	var jobs []job
	targets := map[int]bool{}
	for i := range nf {
		in := map[int]bool{}
		for _, r := range holders[i] {
			in[dom.of[r]] = true
		}
		if len(in) >= want {
			continue
		}
		start := dom.of[holders[i][0]]
		if o := i % man.WorldSize; o < n {
			start = dom.of[o]
		}
		for j := 0; j < h && len(in) < want; j++ {
			d := (start + j) % h
			if !in[d] {
				in[d] = true
				jobs = append(jobs, job{i, d})
				targets[d] = true
			}
		}
	}
	hasMan := map[int]bool{}
	for _, r := range holders[nf] {
		hasMan[dom.of[r]] = true
	}
	// A domain that holds every file a save of this size puts there but
	// lost only the manifest (a crash between the files and the commit
	// there) gets the manifest back too.
	if man.WorldSize == n {
		k := m.replicaCount(dom)
		complete := map[int]bool{}
		for d := range h {
			complete[d] = !hasMan[d]
		}
		for i := range nf {
			in := map[int]bool{}
			for _, r := range holders[i] {
				in[dom.of[r]] = true
			}
			for _, j := range jobs {
				if j.file == i {
					in[j.dom] = true
				}
			}
			for _, d := range dom.homes(i%n, k) {
				if !in[d] {
					complete[d] = false
				}
			}
		}
		for d, ok := range complete {
			if ok {
				targets[d] = true
			}
		}
	}
	if len(targets) == 0 {
		return nil
	}
	// The files first, in every domain that lacks some; then every rank
	// learns which domains wrote theirs, and only then the manifests are
	// written, each recording as holders only the verified copies: those
	// read above and those just written.
	var werr error
	lead := dom.leads(rank) && targets[dom.of[rank]]
	if lead {
		for _, j := range jobs {
			if j.dom != dom.of[rank] || werr != nil {
				continue
			}
			f := files[j.file]
			var chunks [][]byte
			if j.file < len(man.Shards) {
				chunks = st.slice(f.Offset, f.Offset+f.Size)
			} else {
				chunks = [][]byte{blobData[j.file-len(man.Shards)]}
			}
			hs := sha256.New()
			for _, c := range chunks {
				hs.Write(c)
			}
			if sum := hex.EncodeToString(hs.Sum(nil)); sum != f.SHA256 {
				werr = fmt.Errorf("%s: the restored bytes have sha256 %s, the manifest says %s", f.File, short(sum), short(f.SHA256))
				break
			}
			if err := m.store.Put(ctx, stepKey(man.Step)+"/"+f.File, chunks...); err != nil {
				werr = objectErr(m.StepLocation(man.Step)+"/"+f.File, err)
			}
		}
		if werr != nil {
			m.logf("checkpoint: WARNING: rank %d: step %d: re-replicating: %v", rank, man.Step, werr)
		}
	}
	fileFlags := make([]byte, n)
	if err := m.comm.Allgather(ctx, []byte{byte(boolU64(werr != nil))}, fileFlags, collective.Name("checkpoint.restore.rereplicate.files")); err != nil {
		return err
	}
	wrote := func(d int) bool { return fileFlags[dom.members[d][0]] == 0 }
	var merr error
	if lead && werr == nil {
		// The manifest says where the files are now, in this job's
		// numbering of the domains, and that this copy is here.
		nm := *man
		nm.Hosts, nm.Replicas, nm.Host = h, want-1, dom.of[rank]
		nm.Shards, nm.Blobs = slices.Clone(man.Shards), slices.Clone(man.Blobs)
		for i := range nf {
			at := map[int]bool{}
			for _, r := range holders[i] {
				at[dom.of[r]] = true
			}
			for _, j := range jobs {
				if j.file == i && wrote(j.dom) {
					at[j.dom] = true
				}
			}
			hs := slices.Sorted(maps.Keys(at))
			if i < len(nm.Shards) {
				nm.Shards[i].Hosts = hs
			} else {
				nm.Blobs[i-len(nm.Shards)].Hosts = hs
			}
		}
		var data []byte
		if data, merr = json.MarshalIndent(&nm, "", "  "); merr == nil {
			if err := m.store.Put(ctx, stepKey(man.Step)+"/"+ManifestName, append(data, '\n')); err != nil {
				merr = objectErr(m.StepLocation(man.Step)+"/"+ManifestName, err)
			}
		}
		if merr != nil {
			m.logf("checkpoint: WARNING: rank %d: step %d: re-replicating: %v", rank, man.Step, merr)
		}
	}
	flags := make([]byte, n)
	if err := m.comm.Allgather(ctx, []byte{byte(boolU64(werr != nil || merr != nil))}, flags, collective.Name("checkpoint.restore.rereplicate")); err != nil {
		return err
	}
	if rank == 0 {
		var ranks []int
		files := 0
		for _, j := range jobs {
			if flags[dom.members[j.dom][0]] == 0 {
				files++
			}
		}
		for _, d := range slices.Sorted(maps.Keys(targets)) {
			if flags[dom.members[d][0]] == 0 {
				ranks = append(ranks, dom.members[d]...)
			}
		}
		slices.Sort(ranks)
		if len(ranks) > 0 {
			m.logf("checkpoint: step %d: re-replicated %d file(s) to the checkpoint directories of ranks %v", man.Step, files, ranks)
		}
	}
	return nil
}
