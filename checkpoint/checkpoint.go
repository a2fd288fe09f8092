package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gorun/gorun/collective"
)

// Manager saves and restores barrier checkpoints of one job in one
// directory, which every rank must see (a shared filesystem when the job
// spans hosts).
type Manager struct {
	comm   *collective.Comm
	dir    string
	store  Store // nil for a directory: the code paths below use the files directly
	keep   int
	margin int64
	logf   func(format string, args ...any)

	last SaveStats
}

// Option configures a Manager.
type Option func(*Manager)

// WithKeep keeps the newest k committed checkpoints (default 2, at least 1).
func WithKeep(k int) Option { return func(m *Manager) { m.keep = max(k, 1) } }

// WithDiskMargin is the free space a save wants beyond the checkpoint's own
// size (default: 10% of it, at least 1 MiB).
func WithDiskMargin(bytes int64) Option { return func(m *Manager) { m.margin = bytes } }

// WithLogger receives the warnings (a corrupt checkpoint skipped, a stale
// directory replaced). Default: log.Printf.
func WithLogger(logf func(format string, args ...any)) Option {
	return func(m *Manager) { m.logf = logf }
}

// New returns a Manager for the job of comm, keeping its checkpoints under
// dir (created if missing).
func New(comm *collective.Comm, dir string, opts ...Option) (*Manager, error) {
	m := &Manager{comm: comm, dir: dir, keep: 2, margin: -1, logf: log.Printf}
	for _, o := range opts {
		o(m)
	}
	if IsRemote(dir) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*s3CallTimeout)
		defer cancel()
		s, err := openS3(ctx, dir)
		if err != nil {
			return nil, err
		}
		m.store, m.dir = s, s.loc
		return m, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	return m, nil
}

// Dir is the checkpoint directory, or the s3:// location.
func (m *Manager) Dir() string { return m.dir }

// SaveStats describe this rank's last successful Save.
type SaveStats struct {
	Bytes    int64         // the whole checkpoint: every shard and blob file
	Written  int64         // what this rank wrote
	Write    time.Duration // this rank writing and syncing its files
	Total    time.Duration // the whole Save, agreement to commit
	Manifest time.Duration // rank 0: manifest commit and retention
}

// LastSave returns the statistics of this rank's last successful Save.
func (m *Manager) LastSave() SaveStats { return m.last }

// testHook, when set, is called at the named points of a save; an error it
// returns makes the save stop there as if the process had died.
var testHook func(point string, rank int) error

func hook(point string, rank int) error {
	if testHook != nil {
		if err := testHook(point, rank); err != nil {
			return fmt.Errorf("%w at %s: %v", errHook, point, err)
		}
	}
	return nil
}

const agreeLen = 8 + 32 + 8 + 8 + 8 // step, layout hash, blob bytes, free bytes, statfs ok

// Save writes a barrier checkpoint of st at step. Every rank must call it
// with the same step and the same registered state. It returns once the
// checkpoint is committed (its manifest durable) on every rank, or with an
// error on every rank; a failed or interrupted save leaves the previous
// checkpoints as they were.
func (m *Manager) Save(ctx context.Context, step int64, st *State) error {
	start := time.Now()
	if st.err != nil {
		return st.err
	}
	if step < 0 {
		return fmt.Errorf("checkpoint: step %d is negative", step)
	}
	rank, n := m.comm.Rank(), m.comm.Size()
	blobs, err := st.encodeBlobs()
	if err != nil {
		return err
	}
	// 1. Agree on the step and the state, and check free space, in one
	// allgather so that every rank takes the same decision.
	var free uint64 = 1 << 62 // an object store reports no free space
	var ferr error
	if m.store == nil {
		free, ferr = freeSpace(m.dir)
	}
	rec := make([]byte, 0, agreeLen)
	rec = binary.LittleEndian.AppendUint64(rec, uint64(step))
	lh := st.layoutHash()
	rec = append(rec, lh[:]...)
	rec = binary.LittleEndian.AppendUint64(rec, uint64(len(blobs)))
	rec = binary.LittleEndian.AppendUint64(rec, free)
	rec = binary.LittleEndian.AppendUint64(rec, boolU64(ferr == nil))
	all := make([]byte, agreeLen*n)
	if err := m.comm.Allgather(ctx, rec, all, collective.Name("checkpoint.agree")); err != nil {
		return fmt.Errorf("checkpoint: step %d: agreeing on the step: %w", step, err)
	}
	steps := map[int64][]int{}
	var layoutDiff []int
	blobTotal := int64(0)
	minFree, minFreeRank := ^uint64(0), -1
	var statfsBad []int
	for r := range n {
		b := all[r*agreeLen:]
		s := int64(binary.LittleEndian.Uint64(b))
		steps[s] = append(steps[s], r)
		if [32]byte(b[8:40]) != lh {
			layoutDiff = append(layoutDiff, r)
		}
		blobTotal += int64(binary.LittleEndian.Uint64(b[40:]))
		f := binary.LittleEndian.Uint64(b[48:])
		if binary.LittleEndian.Uint64(b[56:]) == 0 {
			statfsBad = append(statfsBad, r)
		} else if f < minFree {
			minFree, minFreeRank = f, r
		}
	}
	if len(steps) > 1 {
		var parts []string
		for _, s := range slices.Sorted(maps.Keys(steps)) {
			parts = append(parts, fmt.Sprintf("ranks %v at step %d", steps[s], s))
		}
		return fmt.Errorf("checkpoint: ranks disagree on the step: %s", strings.Join(parts, ", "))
	}
	if len(layoutDiff) > 0 {
		return fmt.Errorf("checkpoint: step %d: ranks %v registered different tensors or blobs than this rank %d (names, dtypes and shapes must match on every rank)", step, layoutDiff, rank)
	}
	if len(statfsBad) > 0 {
		if ferr != nil {
			return fmt.Errorf("checkpoint: step %d: checking free space in %s: %w", step, m.dir, ferr)
		}
		return fmt.Errorf("checkpoint: step %d: ranks %v could not check free space in %s", step, statfsBad, m.dir)
	}
	need := st.totalBytes() + blobTotal
	margin := m.margin
	if margin < 0 {
		margin = max(need/10, 1<<20)
	}
	if uint64(need+margin) > minFree {
		return fmt.Errorf("checkpoint: step %d: not enough disk space in %s: the checkpoint needs %s plus a margin of %s, but rank %d sees only %s free; nothing was written and the previous checkpoint is kept",
			step, m.dir, human(need), human(margin), minFreeRank, human(int64(minFree)))
	}

	// 2. Rank 0 prepares the step directory (replacing a stale one left by
	// an earlier attempt at this step); the barrier orders it before writes.
	sdir := m.stepLoc(step)
	var prepErr error
	if rank == 0 {
		if m.store != nil {
			prepErr = storeDeleteStep(ctx, m.store, step, nil)
		} else {
			prepErr = m.prepare(sdir)
		}
	}
	if err := m.agreeOK(ctx, rank == 0, prepErr, "checkpoint.prepare"); err != nil {
		return fmt.Errorf("checkpoint: step %d: preparing %s: %w", step, sdir, err)
	}

	// 3. Every rank writes its shard of the tensors and its blobs.
	wstart := time.Now()
	total := st.totalBytes()
	lo, hi := total*int64(rank)/int64(n), total*int64(rank+1)/int64(n)
	var shSize, blSize int64
	var shSum, blSum string
	var werr error
	if m.store != nil {
		shSize, shSum, werr = m.storePut(ctx, step, shardName(rank, n), st.slice(lo, hi)...)
		if werr == nil {
			werr = hook("write", rank)
		}
		if werr == nil {
			blSize, blSum, werr = m.storePut(ctx, step, blobName(rank), blobs)
		}
	} else {
		shSize, shSum, werr = writeDurable(sdir, shardName(rank, n), false, st.slice(lo, hi)...)
		if werr == nil {
			werr = hook("write", rank) // an I/O error, not a crash
		}
		if werr == nil {
			blSize, blSum, werr = writeDurable(sdir, blobName(rank), false, blobs)
		}
		if werr == nil {
			werr = syncDir(sdir) // both renames durable
		}
	}
	wdur := time.Since(wstart)
	if werr != nil {
		m.logf("checkpoint: rank %d: step %d: writing to %s: %v", rank, step, sdir, werr)
	}
	if err := hook("after-shard", rank); err != nil {
		return err
	}

	// 4. The barrier that confirms every shard is durable, and gathers
	// their sizes and checksums for the manifest.
	const resLen = 8 + 32 + 8 + 32 + 8
	res := make([]byte, 0, resLen)
	res = binary.LittleEndian.AppendUint64(res, uint64(shSize))
	res = append(res, hexBytes(shSum)...)
	res = binary.LittleEndian.AppendUint64(res, uint64(blSize))
	res = append(res, hexBytes(blSum)...)
	res = binary.LittleEndian.AppendUint64(res, boolU64(werr == nil))
	allRes := make([]byte, resLen*n)
	if err := m.comm.Allgather(ctx, res, allRes, collective.Name("checkpoint.written")); err != nil {
		return fmt.Errorf("checkpoint: step %d: confirming the shards: %w", step, err)
	}
	var failed []int
	for r := range n {
		if binary.LittleEndian.Uint64(allRes[r*resLen+resLen-8:]) == 0 {
			failed = append(failed, r)
		}
	}
	if len(failed) > 0 {
		if werr != nil {
			return fmt.Errorf("checkpoint: step %d: writing this rank's shard to %s: %w (previous checkpoint kept)", step, sdir, werr)
		}
		return fmt.Errorf("checkpoint: step %d: ranks %v could not write their shards to %s (see their logs); previous checkpoint kept", step, failed, sdir)
	}

	// 5. Rank 0 commits the manifest, then applies retention.
	mstart := time.Now()
	var commitErr error
	if rank == 0 {
		man := Manifest{Format: Format, Step: step, WorldSize: n, ByteOrder: "little", TotalBytes: total}
		var off int64
		for _, t := range st.tensors {
			man.Tensors = append(man.Tensors, TensorInfo{Name: t.name, DType: t.dtype, Shape: t.shape, Offset: off, Bytes: int64(len(t.bytes))})
			off += int64(len(t.bytes))
		}
		var names []string
		for _, b := range st.blobs {
			names = append(names, b.name)
		}
		for r := range n {
			b := allRes[r*resLen:]
			man.Shards = append(man.Shards, FileInfo{Rank: r, File: shardName(r, n), Offset: total * int64(r) / int64(n),
				Size: int64(binary.LittleEndian.Uint64(b)), SHA256: hex.EncodeToString(b[8:40])})
			man.Blobs = append(man.Blobs, FileInfo{Rank: r, File: blobName(r),
				Size: int64(binary.LittleEndian.Uint64(b[40:])), SHA256: hex.EncodeToString(b[48:80]), Blobs: names})
		}
		if commitErr = m.commit(ctx, sdir, &man); errors.Is(commitErr, errHook) {
			return commitErr
		} else if commitErr != nil {
			m.logf("checkpoint: step %d: committing the manifest: %v", step, commitErr)
		} else if err := hook("committed", rank); err != nil {
			return err
		} else if err := m.retain(ctx); err != nil {
			if errors.Is(err, errHook) {
				return err
			}
			m.logf("checkpoint: step %d: deleting old checkpoints: %v", step, err)
		}
	}
	if err := m.agreeOK(ctx, rank == 0, commitErr, "checkpoint.commit"); err != nil {
		return fmt.Errorf("checkpoint: step %d: committing the manifest: %w", step, err)
	}
	m.last = SaveStats{Bytes: need, Written: shSize + blSize, Write: wdur, Total: time.Since(start), Manifest: time.Since(mstart)}
	return nil
}

// errHook wraps errors returned by testHook.
var errHook = errors.New("checkpoint test hook")

// agreeOK broadcasts whether the root's step succeeded, so that every rank
// returns the same outcome.
func (m *Manager) agreeOK(ctx context.Context, root bool, err error, name string) error {
	flag := []int64{0}
	if root && err != nil {
		flag[0] = 1
	}
	if berr := m.comm.Broadcast(ctx, flag, 0, collective.Name(name)); berr != nil {
		return berr
	}
	if flag[0] != 0 {
		if err != nil {
			return err
		}
		return fmt.Errorf("rank 0 failed (see its log)")
	}
	return nil
}

// prepare empties a stale directory for this step: it is uncommitted first,
// so a crash here leaves nothing that looks committed.
func (m *Manager) prepare(sdir string) error {
	if _, err := os.Stat(sdir); err == nil {
		m.logf("checkpoint: replacing existing %s", sdir)
		if err := os.Remove(filepath.Join(sdir, ManifestName)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if err := syncDir(sdir); err != nil {
			return err
		}
		if err := os.RemoveAll(sdir); err != nil {
			return err
		}
	}
	if err := os.Mkdir(sdir, 0o755); err != nil {
		return err
	}
	return syncDir(m.dir)
}

// commit writes the manifest atomically: temp file, fsync, rename, fsync.
func (m *Manager) commit(ctx context.Context, sdir string, man *Manifest) error {
	data, err := json.MarshalIndent(man, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	if m.store != nil {
		if err := hook("manifest", 0); err != nil {
			return err
		}
		return m.store.Put(ctx, stepKey(man.Step)+"/"+ManifestName, data)
	}
	if testHook != nil {
		// A crash during the manifest write leaves half a temp file.
		tmp := filepath.Join(sdir, ManifestName+".tmp")
		if err := os.WriteFile(tmp, data[:len(data)/2], 0o644); err != nil {
			return err
		}
		if err := hook("manifest", 0); err != nil {
			return err
		}
	}
	// The step directory's own entry was made durable by prepare.
	_, _, err = writeDurable(sdir, ManifestName, true, data)
	return err
}

// retain deletes committed checkpoints beyond the newest keep, and
// uncommitted directories older than the newest committed one. A deletion
// removes the manifest first, so a crash midway leaves an uncommitted
// directory, never a broken committed one.
func (m *Manager) retain(ctx context.Context) error {
	if m.store != nil {
		return m.storeRetain(ctx)
	}
	entries, err := listSteps(m.dir)
	if err != nil {
		return err
	}
	kept := 0
	var errs []error
	for _, e := range entries {
		if e.Committed && kept < m.keep {
			kept++
			continue
		}
		if !e.Committed && kept == 0 {
			continue // newer than every committed checkpoint: not ours to judge
		}
		if e.Committed {
			if err := os.Remove(filepath.Join(e.Dir, ManifestName)); err != nil {
				errs = append(errs, err)
				continue
			}
			if err := syncDir(e.Dir); err != nil {
				errs = append(errs, err)
			}
			if err := hook("retention", 0); err != nil {
				return err
			}
		}
		if err := os.RemoveAll(e.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := syncDir(m.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// slice returns the bytes [lo, hi) of the concatenated tensors, as views.
func (s *State) slice(lo, hi int64) [][]byte {
	var out [][]byte
	var off int64
	for _, t := range s.tensors {
		b := t.bytes
		end := off + int64(len(b))
		if end > lo && off < hi {
			out = append(out, b[max(lo-off, 0):min(hi, end)-off])
		}
		off = end
	}
	return out
}

// Restore loads the newest committed checkpoint that verifies into st and
// returns its step. Rank 0 reads and checks every file (sizes, sha256,
// tensor names, dtypes and shapes against st), falling back to older
// checkpoints with a warning when one is corrupt, and broadcasts the tensors
// so that every rank holds identical values; each rank then loads its own
// blobs. The checkpoint may come from a job of another size: the tensors are
// reassembled from all its shards, and rank r gets the blobs rank r wrote
// (ranks beyond the old size keep theirs, with a warning). With no
// checkpoint at all, Restore returns found=false and a nil error; when
// checkpoints exist but none can be loaded, it returns an error.
func (m *Manager) Restore(ctx context.Context, st *State) (step int64, found bool, err error) {
	if st.err != nil {
		return 0, false, st.err
	}
	rank := m.comm.Rank()
	// status: 0 fresh start, 1 found, 2 error
	hdr := []int64{0, 0}
	var msg []byte
	if rank == 0 {
		s, ok, err := m.pick(ctx, st)
		switch {
		case err != nil:
			hdr[0], msg = 2, []byte(err.Error())
		case ok:
			hdr[0], hdr[1] = 1, s
		}
	}
	if err := m.comm.Broadcast(ctx, hdr, 0, collective.Name("checkpoint.restore")); err != nil {
		return 0, false, fmt.Errorf("checkpoint: restore: %w", err)
	}
	switch hdr[0] {
	case 0:
		return 0, false, nil
	case 2:
		ln := []int64{int64(len(msg))}
		if err := m.comm.Broadcast(ctx, ln, 0); err != nil {
			return 0, false, fmt.Errorf("checkpoint: restore: %w", err)
		}
		if rank != 0 {
			msg = make([]byte, ln[0])
		}
		if len(msg) > 0 {
			if err := m.comm.Broadcast(ctx, msg, 0); err != nil {
				return 0, false, fmt.Errorf("checkpoint: restore: %w", err)
			}
		}
		return 0, false, fmt.Errorf("checkpoint: restore from %s: %s", m.dir, msg)
	}
	step = hdr[1]
	for _, t := range st.tensors {
		if len(t.bytes) == 0 {
			continue
		}
		if err := m.comm.Broadcast(ctx, t.buf, 0, collective.Name("checkpoint.restore."+t.name)); err != nil {
			return 0, false, fmt.Errorf("checkpoint: restore: broadcasting %q: %w", t.name, err)
		}
	}
	berr := m.loadBlobs(ctx, step, st)
	if berr != nil {
		m.logf("checkpoint: rank %d: step %d: %v", rank, step, berr)
	}
	ok := []int64{boolI64(berr != nil)}
	if err := m.comm.Allreduce(ctx, ok, collective.Max, collective.Name("checkpoint.restore.blobs")); err != nil {
		return 0, false, fmt.Errorf("checkpoint: restore: %w", err)
	}
	if ok[0] != 0 {
		if berr == nil {
			berr = fmt.Errorf("another rank could not load its per-rank state (see its log)")
		}
		return 0, false, fmt.Errorf("checkpoint: restore of step %d: %w", step, berr)
	}
	return step, true, nil
}

// pick runs on rank 0: it finds the newest checkpoint that verifies and fits
// st, and loads its tensors into st.
func (m *Manager) pick(ctx context.Context, st *State) (int64, bool, error) {
	entries, err := m.steps(ctx)
	if err != nil {
		return 0, false, err
	}
	var problems []string
	committed := 0
	for _, e := range entries {
		if !e.Committed {
			continue
		}
		committed++
		var buf []byte
		var fitErr error
		assemble := func(man *Manifest) []byte {
			if fitErr = fits(man, st); fitErr != nil {
				return nil
			}
			buf = make([]byte, man.TotalBytes)
			return buf
		}
		if m.store != nil {
			_, err = storeVerify(ctx, m.store, e.Step, assemble)
		} else {
			_, err = verify(e.Dir, assemble)
		}
		if fitErr != nil {
			err = fitErr
		}
		if err != nil {
			problems = append(problems, fmt.Sprintf("step %d: %v", e.Step, err))
			m.logf("checkpoint: WARNING: skipping the checkpoint of step %d in %s: %v; falling back to an older one", e.Step, e.Dir, err)
			continue
		}
		var off int64
		for _, t := range st.tensors {
			copy(t.bytes, buf[off:])
			off += int64(len(t.bytes))
		}
		return e.Step, true, nil
	}
	if committed == 0 {
		return 0, false, nil
	}
	return 0, false, fmt.Errorf("none of the %d committed checkpoints can be loaded: %s", committed, strings.Join(problems, "; "))
}

// fits checks a manifest's tensors against the registered ones.
func fits(man *Manifest, st *State) error {
	if len(man.Tensors) != len(st.tensors) {
		return fmt.Errorf("it holds %d tensors, the state registers %d", len(man.Tensors), len(st.tensors))
	}
	var off int64
	for i, t := range st.tensors {
		mt := man.Tensors[i]
		if mt.Name != t.name || mt.DType != t.dtype || !slices.Equal(mt.Shape, t.shape) || mt.Bytes != int64(len(t.bytes)) || mt.Offset != off {
			return fmt.Errorf("tensor %d is %q %s%v in the checkpoint but %q %s%v in the state", i, mt.Name, mt.DType, mt.Shape, t.name, t.dtype, t.shape)
		}
		off += mt.Bytes
	}
	if off != man.TotalBytes {
		return fmt.Errorf("tensors hold %d bytes, manifest says %d", off, man.TotalBytes)
	}
	return nil
}

// loadBlobs gives this rank its per-rank state back.
func (m *Manager) loadBlobs(ctx context.Context, step int64, st *State) error {
	if len(st.blobs) == 0 {
		return nil
	}
	sdir := StepDir(m.dir, step)
	var man *Manifest
	var err error
	if m.store != nil {
		man, err = storeReadManifest(ctx, m.store, step)
	} else {
		man, err = readManifest(sdir)
	}
	if err != nil {
		return err
	}
	rank := m.comm.Rank()
	if rank >= man.WorldSize {
		m.logf("checkpoint: WARNING: rank %d: the checkpoint of step %d was written by %d ranks; this rank keeps its initial per-rank state", rank, man.Step, man.WorldSize)
		return nil
	}
	f := man.Blobs[rank]
	var buf sliceWriter
	buf.buf = make([]byte, max(f.Size, 0))
	if m.store != nil {
		err = storeCheckFile(ctx, m.store, step, f, &buf)
	} else {
		err = checkFile(sdir, f, &buf)
	}
	if err != nil {
		return err
	}
	blobs, err := decodeBlobs(buf.buf)
	if err != nil {
		return fmt.Errorf("%s: %w", f.File, err)
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

func boolU64(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

func boolI64(b bool) int64 { return int64(boolU64(b)) }

func hexBytes(s string) []byte {
	b, _ := hex.DecodeString(s)
	if len(b) != 32 {
		b = make([]byte, 32)
	}
	return b
}

func human(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB (%d bytes)", float64(n)/(1<<30), n)
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB (%d bytes)", float64(n)/(1<<20), n)
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB (%d bytes)", float64(n)/(1<<10), n)
	}
	return fmt.Sprintf("%d bytes", n)
}

// stepLoc names a step's directory or object prefix, for messages.
func (m *Manager) stepLoc(step int64) string {
	if m.store != nil {
		return m.dir + "/" + stepKey(step)
	}
	return StepDir(m.dir, step)
}

// steps lists the checkpoints, newest first.
func (m *Manager) steps(ctx context.Context) ([]Entry, error) {
	if m.store != nil {
		return storeSteps(ctx, m.store)
	}
	return listSteps(m.dir)
}

// storePut writes one object of a step and returns its size and sha256.
func (m *Manager) storePut(ctx context.Context, step int64, name string, chunks ...[]byte) (int64, string, error) {
	h := sha256.New()
	var n int64
	for _, c := range chunks {
		h.Write(c)
		n += int64(len(c))
	}
	if err := m.store.Put(ctx, stepKey(step)+"/"+name, chunks...); err != nil {
		return 0, "", err
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}

// storeRetain is retain for a Store: the same rule, each deletion manifest
// first.
func (m *Manager) storeRetain(ctx context.Context) error {
	entries, err := storeSteps(ctx, m.store)
	if err != nil {
		return err
	}
	kept := 0
	var errs []error
	for _, e := range entries {
		if e.Committed && kept < m.keep {
			kept++
			continue
		}
		if !e.Committed && kept == 0 {
			continue
		}
		err := storeDeleteStep(ctx, m.store, e.Step, func() error { return hook("retention", 0) })
		if errors.Is(err, errHook) {
			return err
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
