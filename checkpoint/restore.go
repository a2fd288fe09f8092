package checkpoint

import (
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
	"os"
	"path/filepath"
	"slices"
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
// tensors. A file that is corrupt on one host is read again from another
// host's copy; a checkpoint with a file that no host holds intact, or whose
// tensors do not fit st, is skipped with a warning and the previous one
// tried. The checkpoint may come from a job of another size: rank r gets the
// blobs rank r wrote (ranks beyond the old size keep theirs, with a
// warning). With several storage domains, files of the restored step that
// lost copies are written again from memory (re-replication).
//
// With no checkpoint at all, Restore returns found=false and a nil error;
// when checkpoints exist but none can be loaded, it returns an error. An
// asynchronous save in flight is committed first (Wait).
func (m *Manager) Restore(ctx context.Context, st *State) (step int64, found bool, err error) {
	if st.err != nil {
		return 0, false, st.err
	}
	if m.flight != nil {
		if err := m.Wait(ctx); err != nil {
			return 0, false, err
		}
	}
	rank, n := m.comm.Rank(), m.comm.Size()
	dom, err := m.domains(ctx)
	if err != nil {
		return 0, false, err
	}
	// R1. Every rank lists the committed steps in its own store.
	const recLen = 8 * (2 + maxCandidates)
	rec := make([]byte, recLen)
	entries, lerr := storeSteps(ctx, m.store)
	if lerr != nil {
		m.logf("checkpoint: rank %d: listing the checkpoints in %s: %v", rank, m.dir, lerr)
		binary.LittleEndian.PutUint64(rec, 1)
	}
	cnt := 0
	for _, e := range entries {
		if e.Committed && cnt < maxCandidates {
			binary.LittleEndian.PutUint64(rec[16+8*cnt:], uint64(e.Step))
			cnt++
		}
	}
	binary.LittleEndian.PutUint64(rec[8:], uint64(cnt))
	all := make([]byte, recLen*n)
	if err := m.comm.Allgather(ctx, rec, all, collective.Name("checkpoint.restore.steps")); err != nil {
		return 0, false, fmt.Errorf("checkpoint: restore: %w", err)
	}
	has := map[int64][]int{} // step -> the ranks that list it, ascending
	var listBad []int
	for r := range n {
		b := all[r*recLen:]
		if binary.LittleEndian.Uint64(b) != 0 {
			listBad = append(listBad, r)
		}
		for i := range min(int(binary.LittleEndian.Uint64(b[8:])), maxCandidates) {
			s := int64(binary.LittleEndian.Uint64(b[16+8*i:]))
			has[s] = append(has[s], r)
		}
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
	// A rank that could not list its directory holds nothing as far as
	// this restore goes: other hosts' copies serve.
	var problems []string
	for _, s := range cands {
		problem, fatal := m.restoreStep(ctx, st, dom, s, has[s][0])
		if fatal != nil {
			return 0, false, fatal
		}
		if problem == nil {
			return s, true, nil
		}
		problems = append(problems, fmt.Sprintf("step %d: %v", s, problem))
		if rank == 0 {
			m.logf("checkpoint: WARNING: skipping the checkpoint of step %d in %s: %v; falling back to an older one", s, m.stepLoc(s), problem)
		}
	}
	return 0, false, fmt.Errorf("checkpoint: restore from %s: none of the %d committed checkpoints can be loaded: %s", m.dir, len(cands), strings.Join(problems, "; "))
}

// restoreStep runs R2–R5 for one candidate step on every rank. problem is
// why the step cannot be loaded (the caller tries an older one); fatal ends
// the restore (a collective failed, or a rank could not load its blobs).
func (m *Manager) restoreStep(ctx context.Context, st *State, dom *domains, step int64, root int) (problem, fatal error) {
	rank, n := m.comm.Rank(), m.comm.Size()
	wrap := func(err error) error { return fmt.Errorf("checkpoint: restore: step %d: %w", step, err) }

	// R2. The lowest rank that lists the step reads its manifest for all.
	hdr := []int64{0, 0}
	var data []byte
	if rank == root {
		var err error
		if data, err = readManifestBytes(ctx, m.store, step); err != nil {
			hdr[0], data = 1, []byte(err.Error())
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
	if hdr[0] != 0 {
		return errors.New(string(data)), nil
	}
	man, err := parseManifest(data)
	if err != nil {
		return err, nil
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
		m.logf("checkpoint: rank %d: listing %s: %v", rank, m.stepLoc(step), lerr)
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
	d, isDir := m.store.(DirStore)
	for i, f := range files {
		if !present[f.File] {
			continue
		}
		bits[i] = 1
		if isDir {
			if fi, err := os.Stat(filepath.Join(StepDir(string(d), step), f.File)); err == nil && fi.Size() != f.Size {
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
		if dom.h() == 1 {
			return fmt.Errorf("no copy of %s is left in %s", strings.Join(missing, ", "), m.stepLoc(step)), nil
		}
		return fmt.Errorf("no copy of %s is left on any host (they were kept on %d hosts; more hosts lost their checkpoint directory than --checkpoint-replicas allows)",
			strings.Join(missing, ", "), min(m.replicaCount(dom)+1, dom.h())), nil
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
	var todo []int                  // the files for the per-file path
	inPlaceErr := make([]error, nf) // this rank's failed in-place reads
	failedInPlace := make([]bool, nf)
	ns := len(man.Shards)
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
			if ownBlob, inPlaceErr[ns+rank] = readFile(ctx, m.store, step, files[ns+rank]); inPlaceErr[ns+rank] != nil {
				bad[ns+rank] = 1
			}
		}
		var err error
		if failedInPlace, err = m.restoreShards(ctx, st, step, files, assign, ns, inPlaceErr, bad); err != nil {
			return nil, wrap(err)
		}
		for i := range nf {
			if failedInPlace[i] || i >= ns && !selfBlobs {
				todo = append(todo, i)
			}
		}
		if selfBlobs && !failedInPlace[ns+rank] {
			blobData[rank] = ownBlob[:files[ns+rank].Size]
		}
	}

	// The per-file path: this rank reads and verifies its files in the
	// background, in order, at most two ahead of the broadcasts (all of
	// them first in the rank-0 mode, as restores used to); each file is
	// broadcast with a status byte that says whether it verified.
	var mine []int
	for _, i := range todo {
		if assign[i] == rank && !failedInPlace[i] {
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
			buf, err := readFile(rctx, m.store, step, files[i])
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
		known := failedInPlace[i] // the reader's in-place copy did not verify
		for {
			var rerr error
			if known {
				known, first = false, false
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
					buf, rerr = readFile(ctx, m.store, step, f)
				default:
					if int64(cap(recv)) < f.Size+1 {
						recv = make([]byte, f.Size+1)
					}
					buf = recv[:f.Size+1]
				}
				if rank == reader {
					if rerr != nil {
						buf = make([]byte, f.Size+1) // status 0
					} else {
						buf[f.Size] = 1
					}
				}
				if err := m.comm.Broadcast(ctx, buf, reader, collective.Name("checkpoint.restore.file")); err != nil {
					return nil, wrap(err)
				}
				if buf[f.Size] == 1 {
					if i < ns {
						st.writeAt(f.Offset, buf[:f.Size])
					} else {
						blobData[i-ns] = slices.Clone(buf[:f.Size])
					}
					break
				}
			}
			// The reader's copy is corrupt or unreadable: every rank
			// learns why, and the next holder in another domain reads it.
			msg := make([]byte, errTextLen)
			if rank == reader {
				copy(msg, rerr.Error())
			}
			if err := m.comm.Broadcast(ctx, msg, reader, collective.Name("checkpoint.restore.error")); err != nil {
				return nil, wrap(err)
			}
			text := strings.TrimRight(string(msg), "\x00")
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
	return nil, nil
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
	slices.SortStableFunc(order, func(a, b int) int { return int(sign(files[b].Size - files[a].Size)) })
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
// rank which shards' copies did not verify (failed, of every file; the
// reader's error is in errs), together with the other files this rank
// read for itself (bad, of every file, comes with their bits set). The
// shards' bytes in st are wrong until read again. When every rank reads
// exactly its own shard of equal ones into one tensor, the broadcasts are
// one allgather instead.
func (m *Manager) restoreShards(ctx context.Context, st *State, step int64, files []FileInfo, assign []int, ns int, errs []error, bad []byte) ([]bool, error) {
	rank, n := m.comm.Rank(), m.comm.Size()
	shards := files[:ns]
	if buf, ok := allgatherable(st, shards, assign[:ns], n); ok {
		// Every rank reads exactly its own shard, the shards are equal
		// and the tensors are one buffer: one allgather, in place, which
		// keeps every link of the ring busy.
		allgatherRestores.Add(1)
		size := shards[rank].Size
		own := buf[int64(rank)*size : int64(rank+1)*size]
		if errs[rank] = readInto(ctx, m.store, step, shards[rank], [][]byte{own}); errs[rank] != nil {
			bad[rank] = 1
		}
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
			done[i] <- readInto(rctx, m.store, step, f, st.slice(f.Offset, f.Offset+f.Size))
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
			if errs[i] != nil {
				bad[i] = 1 // its bytes go out anyway, and are ignored
			}
		}
		for _, v := range st.slice(f.Offset, f.Offset+f.Size) {
			if err := m.comm.Broadcast(ctx, v, assign[i], collective.Name("checkpoint.restore.shard")); err != nil {
				return nil, err
			}
		}
	}
	return m.shardsVerified(ctx, bad, assign)
}

// shardsVerified allgathers which files' copies did not verify (bad[i] on
// their reader) and returns them.
func (m *Manager) shardsVerified(ctx context.Context, bad []byte, assign []int) ([]bool, error) {
	ns := len(bad)
	all := make([]byte, ns*m.comm.Size())
	if err := m.comm.Allgather(ctx, bad, all, collective.Name("checkpoint.restore.verified")); err != nil {
		return nil, err
	}
	failed := make([]bool, ns)
	for i := range ns {
		failed[i] = all[assign[i]*ns+i] != 0
	}
	return failed, nil
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

// readInto reads one file of a step straight into dst (views whose lengths
// add up to the file's size), checking its size and sha256 as it goes.
func readInto(ctx context.Context, s Store, step int64, f FileInfo, dst [][]byte) error {
	if err := checkFileName(f); err != nil {
		return err
	}
	key := stepKey(step) + "/" + f.File
	rc, size, err := s.Get(ctx, key)
	if errors.Is(err, fs.ErrNotExist) {
		return &fileError{f.File + " is missing", err}
	}
	if err != nil {
		return &fileError{f.File + ": " + causeOf(err, strings.TrimSuffix(s.String(), "/")+"/"+key, key), err}
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
				return fmt.Errorf("%s: %v", f.File, causeOf(err))
			}
			h.Write(p)
			d = d[len(p):]
		}
	}
	return checkSum(f, h)
}

// readFile reads and verifies one file of a step into a buffer one byte
// longer than the file (for the broadcast's status byte).
func readFile(ctx context.Context, s Store, step int64, f FileInfo) ([]byte, error) {
	buf := make([]byte, f.Size+1)
	if err := storeCheckFile(ctx, s, step, f, &sliceWriter{buf: buf[:f.Size]}); err != nil {
		return nil, err
	}
	return buf, nil
}

// readManifestBytes reads a step's manifest as it is stored.
func readManifestBytes(ctx context.Context, s Store, step int64) ([]byte, error) {
	rc, _, err := s.Get(ctx, stepKey(step)+"/"+ManifestName)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", ManifestName, err)
	}
	return data, nil
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
// to a domain that lost only it. A failure
// here is logged, not returned: the restore itself succeeded.
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
	var werr error
	if dom.leads(rank) && targets[dom.of[rank]] {
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
				werr = objectErr(m.stepLoc(man.Step)+"/"+f.File, err)
			}
		}
		if werr == nil {
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
					if j.file == i {
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
			if data, werr = json.MarshalIndent(&nm, "", "  "); werr == nil {
				if err := m.store.Put(ctx, stepKey(man.Step)+"/"+ManifestName, append(data, '\n')); err != nil {
					werr = objectErr(m.stepLoc(man.Step)+"/"+ManifestName, err)
				}
			}
		}
		if werr != nil {
			m.logf("checkpoint: WARNING: rank %d: step %d: re-replicating: %v", rank, man.Step, werr)
		}
	}
	flags := make([]byte, n)
	if err := m.comm.Allgather(ctx, []byte{byte(boolU64(werr != nil))}, flags, collective.Name("checkpoint.restore.rereplicate")); err != nil {
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
