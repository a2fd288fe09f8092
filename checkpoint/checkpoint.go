package checkpoint

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorun/gorun/collective"
)

// EnvReplicas is the environment variable that sets how many other storage
// domains keep a copy of each rank's files when WithReplicas is not given
// (default 2). gorun sets it from --checkpoint-replicas.
const EnvReplicas = "GORUN_CHECKPOINT_REPLICAS"

// EnvHost is the environment variable whose value replaces "{host}" in a
// directory location (gorun sets it to the host a rank runs on).
const EnvHost = "GORUN_HOST"

// Manager saves and restores barrier checkpoints of one job. Every rank
// keeps its checkpoints in a Store: a directory (DirStore) or an s3://
// location. Ranks whose directories are the same directory form a storage
// domain; with several domains every file is replicated (see the package
// documentation).
type Manager struct {
	comm       *collective.Comm
	dir        string
	store      Store
	keep       int
	margin     int64
	replicas   int // -1: EnvReplicas, else 2
	skipIfBusy bool
	ioTimeout  time.Duration
	logf       func(format string, args ...any)

	// restoreRank0 restores the old way: rank 0 reads and verifies every
	// file before broadcasting any. Kept to compare against the parallel
	// restore on the same data.
	restoreRank0 bool

	dom    *domains // the storage domains of domKey
	domKey [2]int   // comm size and membership epoch they were found for

	flight *inflight // the asynchronous save being written or committed, if any
	orphan *inflight // a save abandoned by a re-formed job whose goroutines may still run
	stage  []byte    // SaveAsync's snapshot buffer, reused

	retaining chan struct{} // closed when this lead's background retention is over

	last SaveStats
	// good is the step this Manager restored or committed last (-1: none):
	// a committed checkpoint known to load. Saving it again is skipped;
	// another committed step of the same number (one a restore skipped as
	// unloadable, or another run's) is replaced.
	good int64
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

// WithReplicas keeps each rank's files in k storage domains besides its own
// (at most the number of other domains; 0 keeps one copy). It matters only
// when the ranks' checkpoint directories are not all the same directory.
// Default: EnvReplicas, else 2.
func WithReplicas(k int) Option { return func(m *Manager) { m.replicas = max(k, 0) } }

// WithSkipIfBusy makes SaveAsync skip a save, on every rank, while any rank
// is still writing the previous one, instead of waiting for it.
func WithSkipIfBusy() Option { return func(m *Manager) { m.skipIfBusy = true } }

// WithIOTimeout bounds the collectives of a save or restore that wait on
// another rank's storage I/O (default 30 minutes) instead of the
// communicator's collective timeout (collective.WithTimeout,
// GORUN_TIMEOUT): the barrier after every rank's writes and the outcome of
// the commit in Save, the allreduces of Wait, and the broadcasts and
// allgathers of Restore that wait for a reader. A rank uploading a big
// shard with retries is slow, not dead; a dead or frozen peer still ends
// those collectives at once (broken links, heartbeats). Every rank must
// give the same value; d <= 0 leaves the collective timeout.
func WithIOTimeout(d time.Duration) Option { return func(m *Manager) { m.ioTimeout = d } }

// ioCtx is ctx for the collectives that wait on other ranks' storage I/O
// (WithIOTimeout).
func (m *Manager) ioCtx(ctx context.Context) context.Context {
	return collective.WithCallTimeout(ctx, m.ioTimeout)
}

// New returns a Manager for the job of comm, keeping its checkpoints under
// dir (created if missing). In a directory location "{host}" is replaced by
// $GORUN_HOST, else the host name (ExpandHost), so that one location names
// a local directory on every host.
func New(comm *collective.Comm, dir string, opts ...Option) (*Manager, error) {
	m := &Manager{comm: comm, good: -1, keep: 2, margin: -1, replicas: -1, ioTimeout: 30 * time.Minute, logf: log.Printf}
	for _, o := range opts {
		o(m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*s3CallTimeout)
	defer cancel()
	s, err := openForJob(ctx, dir)
	if err != nil {
		return nil, err
	}
	m.store, m.dir = s, s.String()
	return m, nil
}

// ExpandHost returns loc with "{host}" replaced by $GORUN_HOST (EnvHost),
// else the host name: the one expansion that New, OpenStore, Scan, List
// and Remove apply to the location they are given (expanding twice is
// harmless). An s3:// location is shared by every host, so "{host}" in it
// is an error.
func ExpandHost(loc string) (string, error) {
	if !strings.Contains(loc, "{host}") {
		return loc, nil
	}
	if IsRemote(loc) {
		return "", fmt.Errorf("checkpoint: %s: {host} names a directory of each host's own, but an s3:// location is one store that every host shares: remove {host}", loc)
	}
	host := os.Getenv(EnvHost)
	if host == "" {
		h, err := os.Hostname()
		if err != nil {
			return "", fmt.Errorf("checkpoint: %s: naming the host for {host}: %w", loc, err)
		}
		host = h
	}
	return strings.ReplaceAll(loc, "{host}", host), nil
}

// Dir is the checkpoint directory (with {host} replaced), or the s3://
// location.
func (m *Manager) Dir() string { return m.dir }

// SaveStats describe this rank's last successful Save or SaveAsync.
type SaveStats struct {
	Step     int64         // the committed step
	Bytes    int64         // the whole checkpoint: every shard and blob file, one copy
	Written  int64         // what this rank wrote
	Write    time.Duration // this rank writing and syncing its files
	Total    time.Duration // the whole save, agreement to commit
	Manifest time.Duration // manifest commit and retention (in the background for SaveAsync)
	// Stall is how long the caller was blocked: the whole Save, or for
	// SaveAsync its agreement and snapshot (not Poll or Wait).
	Stall time.Duration
}

// LastSave returns the statistics of this rank's last successful save.
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

// errHook wraps errors returned by testHook.
var errHook = errors.New("checkpoint test hook")

// agreeLen: step, layout hash, blob bytes, free bytes, statfs ok, state
// ok, step committed here, replicas, disk margin.
const agreeLen = 8 + 32 + 8 + 8 + 8 + 8 + 8 + 8 + 8

// plan is what every rank agreed a save writes, and where.
type plan struct {
	step    int64
	n       int
	epoch   int     // the comm's membership epoch when the save began
	total   int64   // tensor bytes
	blobLen []int64 // per rank
	need    int64   // one copy of every file
	dom     *domains
	k       int      // replicas beyond the first copy
	mine    []int    // the files this rank writes (see name), ascending
	maxMine int      // the most files any rank writes
	blobs   [][]byte // rank r's blob file; only this rank's unless there are several domains
	start   time.Time

	// The manifest's description of the state, taken when the save began
	// (an asynchronous save commits later).
	tensors   []TensorInfo
	blobNames []string
}

// name: files 0..n-1 are the shards of ranks 0..n-1, files n..2n-1 their
// blob files.
func (p *plan) name(f int) string {
	if f < p.n {
		return shardName(f, p.n)
	}
	return blobName(f - p.n)
}

func (p *plan) size(f int) int64 {
	if f < p.n {
		lo, hi := p.shardRange(f)
		return hi - lo
	}
	return p.blobLen[f-p.n]
}

func (p *plan) shardRange(r int) (int64, int64) {
	return p.total * int64(r) / int64(p.n), p.total * int64(r+1) / int64(p.n)
}

// chunks are file f's bytes as views of the state and the blobs.
func (p *plan) chunks(st *State, f int) [][]byte {
	if f < p.n {
		return st.slice(p.shardRange(f))
	}
	return [][]byte{p.blobs[f-p.n]}
}

// begin runs the steps of a save up to the writes, on every rank: waits
// for an asynchronous save in flight (unless skipIfBusy allows skipping),
// finds the storage domains, agrees on the step, the layout, the settings
// and free space, shares the blobs when they are replicated and prepares
// the step in every domain. It returns a nil plan and nil error when the
// save is skipped (busy, or the step is already committed).
func (m *Manager) begin(ctx context.Context, step int64, st *State, async bool) (*plan, error) {
	start := time.Now()
	m.dropIfReformed()
	if err := m.waitOrphan(ctx); err != nil {
		return nil, err
	}
	if m.flight != nil {
		if async {
			// Every rank has a save in flight (SaveAsync is collective):
			// agree on whether to skip this one before any rank waits.
			skip, err := m.agreeBusy(ctx, step)
			if err != nil || skip {
				return nil, err
			}
		}
		if err := m.Wait(ctx); err != nil {
			return nil, err
		}
		if err := m.waitOrphan(ctx); err != nil { // the retention Wait started
			return nil, err
		}
	}
	rank, n, epoch := m.comm.Rank(), m.comm.Size(), m.comm.Epoch()
	dom, err := m.domains(ctx)
	if err != nil {
		return nil, err
	}
	// A rank whose state cannot be saved (a registration error, a blob's
	// save func failing) still takes part in the agreement, so that every
	// rank fails together.
	stErr := st.err
	var blobs []byte
	if stErr == nil {
		blobs, stErr = st.encodeBlobs()
	}
	// Whether step is already committed here: a restore returned it and
	// the loop saves it again. Its leads look (a save never replaces a
	// committed checkpoint).
	var isCommitted bool
	if dom.leads(rank) && step >= 0 {
		if rc, _, err := m.store.Get(ctx, stepKey(step)+"/"+ManifestName); err == nil {
			rc.Close()
			isCommitted = true
		}
	}
	// 1. Agree on the step, the state and the settings, and check free
	// space, in one allgather so that every rank takes the same decision.
	var free uint64 = 1 << 62 // a store that reports no free space has no limit to check
	var ferr error
	if s, ok := m.store.(spaceReporter); ok {
		free, ferr = s.freeSpace()
	}
	k := m.replicaCount(dom)
	rec := make([]byte, 0, agreeLen)
	rec = binary.LittleEndian.AppendUint64(rec, uint64(step))
	lh := st.layoutHash()
	rec = append(rec, lh[:]...)
	rec = binary.LittleEndian.AppendUint64(rec, uint64(len(blobs)))
	rec = binary.LittleEndian.AppendUint64(rec, free)
	rec = binary.LittleEndian.AppendUint64(rec, boolU64(ferr == nil))
	rec = binary.LittleEndian.AppendUint64(rec, boolU64(stErr == nil))
	// Bit 0: a lead sees step committed; bit 1: it is the step this
	// Manager restored or committed (the same on every member, except a
	// joiner of an elastic job, which has none: one rank knowing is enough).
	rec = binary.LittleEndian.AppendUint64(rec, boolU64(isCommitted)|boolU64(step == m.good)<<1)
	rec = binary.LittleEndian.AppendUint64(rec, uint64(k))
	rec = binary.LittleEndian.AppendUint64(rec, uint64(m.margin))
	all := make([]byte, agreeLen*n)
	if err := m.comm.Allgather(ctx, rec, all, collective.Name("checkpoint.agree")); err != nil {
		return nil, failed(step, async, fmt.Errorf("agreeing on the step: %w", err))
	}
	p := &plan{step: step, n: n, epoch: epoch, total: st.totalBytes(), blobLen: make([]int64, n), dom: dom, k: k, start: start}
	var off int64
	for _, t := range st.tensors {
		p.tensors = append(p.tensors, TensorInfo{Name: t.name, DType: t.dtype, Shape: slices.Clone(t.shape), Offset: off, Bytes: int64(len(t.bytes))})
		off += int64(len(t.bytes))
	}
	for _, b := range st.blobs {
		p.blobNames = append(p.blobNames, b.name)
	}
	steps := map[int64][]int{}
	ks := map[int64][]int{}
	margins := map[int64][]int{}
	var layoutDiff, statfsBad, stateBad []int
	frees := make([]uint64, n)
	anyCommitted, anyGood := false, false
	for r := range n {
		b := all[r*agreeLen:]
		s := int64(binary.LittleEndian.Uint64(b))
		steps[s] = append(steps[s], r)
		if [32]byte(b[8:40]) != lh {
			layoutDiff = append(layoutDiff, r)
		}
		p.blobLen[r] = int64(binary.LittleEndian.Uint64(b[40:]))
		frees[r] = binary.LittleEndian.Uint64(b[48:])
		if binary.LittleEndian.Uint64(b[56:]) == 0 {
			statfsBad = append(statfsBad, r)
		}
		if binary.LittleEndian.Uint64(b[64:]) == 0 {
			stateBad = append(stateBad, r)
		}
		anyCommitted = anyCommitted || binary.LittleEndian.Uint64(b[72:])&1 != 0
		anyGood = anyGood || binary.LittleEndian.Uint64(b[72:])&2 != 0
		kr := int64(binary.LittleEndian.Uint64(b[80:]))
		ks[kr] = append(ks[kr], r)
		mr := int64(binary.LittleEndian.Uint64(b[88:]))
		margins[mr] = append(margins[mr], r)
	}
	if len(stateBad) > 0 {
		if stErr != nil {
			m.logf("checkpoint: rank %d: step %d: %v", rank, step, stErr)
			cause := strings.TrimPrefix(stErr.Error(), "checkpoint: ")
			if len(stateBad) == 1 {
				return nil, failed(step, async, fmt.Errorf("rank %d could not save its state: %s", rank, cause))
			}
			return nil, failed(step, async, fmt.Errorf("ranks %v could not save their state; this rank %d: %s", stateBad, rank, cause))
		}
		if len(stateBad) == 1 {
			return nil, failed(step, async, fmt.Errorf("rank %d could not save its state (see its log for the cause)", stateBad[0]))
		}
		return nil, failed(step, async, fmt.Errorf("ranks %v could not save their state (see their logs for the cause)", stateBad))
	}
	if len(ks) > 1 {
		return nil, failed(step, async, fmt.Errorf("ranks disagree on the number of replicas (WithReplicas, %s): %s", EnvReplicas, rankGroups(ks, "")))
	}
	if len(margins) > 1 {
		return nil, failed(step, async, fmt.Errorf("ranks disagree on the disk margin (WithDiskMargin): %s", rankGroups(margins, "bytes (-1: the default)")))
	}
	if len(steps) > 1 {
		var parts []string
		for _, s := range slices.Sorted(maps.Keys(steps)) {
			parts = append(parts, fmt.Sprintf("ranks %v at step %d", steps[s], s))
		}
		return nil, failed(step, async, fmt.Errorf("ranks disagree on the step: %s", strings.Join(parts, ", ")))
	}
	if step < 0 {
		return nil, fmt.Errorf("checkpoint: step %d is negative", step)
	}
	if len(layoutDiff) > 0 {
		return nil, failed(step, async, fmt.Errorf("ranks %v registered different tensors or blobs than this rank %d (names, dtypes and shapes must match on every rank)", layoutDiff, rank))
	}
	if anyCommitted && anyGood {
		m.logf("checkpoint: step %d is already committed in %s; not saved again", step, m.dir)
		return nil, nil
	}
	if anyCommitted && rank == 0 {
		// Not the checkpoint this job restored or saved: a restore skipped
		// it as unloadable (or another run wrote it). The new save
		// replaces it; keeping it would leave the job unable to save this
		// step at all.
		m.logf("checkpoint: step %d is committed in %s, but it is not a checkpoint this job restored or saved; replacing it", step, m.dir)
	}
	if len(statfsBad) > 0 {
		if ferr != nil {
			return nil, failed(step, async, fmt.Errorf("checking free space in %s: %w", m.dir, ferr))
		}
		return nil, failed(step, async, fmt.Errorf("ranks %v could not check free space in %s", statfsBad, m.dir))
	}
	// Free space, per domain: the bytes of every file that domain keeps.
	needs := make([]int64, dom.h())
	for f := range 2 * n {
		p.need += p.size(f)
		for _, d := range dom.homes(f%n, p.k) {
			needs[d] += p.size(f)
		}
	}
	for d, mem := range dom.members {
		minFree, minRank := ^uint64(0), -1
		for _, r := range mem {
			if frees[r] < minFree {
				minFree, minRank = frees[r], r
			}
		}
		margin := m.margin
		if margin < 0 {
			margin = max(needs[d]/10, 1<<20)
		}
		if uint64(needs[d]+margin) > minFree {
			return nil, failed(step, async, fmt.Errorf("not enough disk space in %s: the checkpoint needs %s plus a margin of %s, but rank %d sees only %s free; nothing was written",
				m.dir, human(needs[d]), human(margin), minRank, human(int64(minFree))))
		}
	}
	// Which files this rank writes, and the most any rank writes (the
	// size of the "written" records).
	counts := make([]int, n)
	for f := range 2 * n {
		for _, d := range dom.homes(f%n, p.k) {
			w := dom.writer(f%n, d)
			counts[w]++
			if w == rank {
				p.mine = append(p.mine, f)
			}
		}
	}
	slices.Sort(p.mine)
	p.maxMine = slices.Max(counts)

	// Blobs are per rank: a replica domain's writer needs the owner's.
	p.blobs = make([][]byte, n)
	p.blobs[rank] = blobs
	if dom.h() > 1 {
		if maxLen := slices.Max(p.blobLen); maxLen > 0 {
			in := make([]byte, maxLen)
			copy(in, blobs)
			out := make([]byte, maxLen*int64(n))
			if err := m.comm.Allgather(ctx, in, out, collective.Name("checkpoint.blobs")); err != nil {
				return nil, failed(step, async, fmt.Errorf("sharing the per-rank state with the replica domains: %w", err))
			}
			for r := range n {
				p.blobs[r] = out[int64(r)*maxLen : int64(r)*maxLen+p.blobLen[r]]
			}
		}
	}

	// 2. Each domain's lowest rank prepares the step (replacing a stale
	// one left by an earlier attempt at this step); the allreduce orders
	// it before every write.
	var prepErr error
	if dom.leads(rank) {
		prepErr = m.prepare(ctx, step)
	}
	// Summed: how many failed, and (when one did) which rank, plus one.
	flag := []int64{boolI64(prepErr != nil), 0}
	if prepErr != nil {
		flag[1] = int64(rank) + 1
	}
	if err := m.comm.Allreduce(ctx, flag, collective.Sum, collective.Name("checkpoint.prepare")); err != nil {
		if prepErr != nil {
			return nil, failed(step, async, fmt.Errorf("preparing %w", ownFirst(objectErr(m.StepLocation(step), prepErr), err)))
		}
		return nil, failed(step, async, fmt.Errorf("preparing %s: %w", m.StepLocation(step), err))
	}
	if flag[0] != 0 {
		if prepErr == nil {
			if flag[0] == 1 {
				return nil, failed(step, async, fmt.Errorf("preparing %s: rank %d failed (see its log for the cause)", m.StepLocation(step), flag[1]-1))
			}
			return nil, failed(step, async, fmt.Errorf("preparing %s: %d ranks failed (see their logs for the cause)", m.StepLocation(step), flag[0]))
		}
		m.logf("checkpoint: rank %d: step %d: preparing %v", rank, step, objectErr(m.StepLocation(step), prepErr))
		return nil, failed(step, async, fmt.Errorf("preparing %w", objectErr(m.StepLocation(step), prepErr)))
	}
	return p, nil
}

// agreeBusy is the agreement of a SaveAsync of step while a save is in
// flight: every rank says whether it skips a save while busy
// (WithSkipIfBusy) and whether it is still busy. With WithSkipIfBusy on
// every rank and any rank busy, the save is skipped (skip true) on every
// rank; ranks that disagree on WithSkipIfBusy fail, named.
func (m *Manager) agreeBusy(ctx context.Context, step int64) (skip bool, err error) {
	n := m.comm.Size()
	rec := []byte{byte(boolU64(m.skipIfBusy)), byte(boolU64(m.flight.busy()))}
	all := make([]byte, 2*n)
	if err := m.comm.Allgather(ctx, rec, all, collective.Name("checkpoint.busy")); err != nil {
		return false, failed(step, true, fmt.Errorf("agreeing on the step: %w", err))
	}
	skips := map[int64][]int{}
	anyBusy := false
	for r := range n {
		skips[int64(all[2*r])] = append(skips[int64(all[2*r])], r)
		anyBusy = anyBusy || all[2*r+1] != 0
	}
	if len(skips) > 1 {
		return false, failed(step, true, fmt.Errorf("ranks disagree on WithSkipIfBusy: ranks %v skip a save while the previous one is busy, ranks %v wait for it", skips[1], skips[0]))
	}
	if !m.skipIfBusy || !anyBusy {
		return false, nil
	}
	doing := "written"
	if m.flight.committing {
		doing = "committed"
	}
	m.logf("checkpoint: step %d: skipped: the save of step %d is still being %s (WithSkipIfBusy)", step, m.flight.p.step, doing)
	return true, nil
}

// rankGroups says which ranks hold which value: "ranks [0 2] 1, ranks [1] 2".
func rankGroups(byValue map[int64][]int, unit string) string {
	var parts []string
	for _, v := range slices.Sorted(maps.Keys(byValue)) {
		part := fmt.Sprintf("ranks %v: %d", byValue[v], v)
		if unit != "" {
			part += " " + unit
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, ", ")
}

// prepare removes a stale, uncommitted step (its manifest first, so a crash
// here leaves nothing that looks committed).
func (m *Manager) prepare(ctx context.Context, step int64) error {
	if err := hook("prepare", m.comm.Rank()); err != nil { // an I/O error, not a crash
		return err
	}
	keys, err := m.store.List(ctx, stepKey(step)+"/")
	if err != nil {
		return err
	}
	if len(keys) == 0 {
		return nil
	}
	m.logf("checkpoint: replacing existing %s", m.StepLocation(step))
	return storeDeleteStep(ctx, m.store, step, nil)
}

// wrote is one file a rank wrote.
type wrote struct {
	file int
	size int64
	sum  [32]byte
}

// writeResult is what a rank's writes came to.
type writeResult struct {
	files []wrote
	bytes int64
	dur   time.Duration
	err   error
}

// write puts this rank's files of p, with data giving each file's bytes,
// and makes them durable before it returns (putHashed, then syncBatch). It
// issues no collective, so that SaveAsync can run it in the background.
func (m *Manager) write(ctx context.Context, p *plan, data func(f int) [][]byte) writeResult {
	start := time.Now()
	rank := m.comm.Rank()
	var res writeResult
	for i, f := range p.mine {
		size, sum, err := putHashed(ctx, m.store, stepKey(p.step)+"/"+p.name(f), data(f))
		if err == nil && i == 0 {
			err = hook("write", rank) // an I/O error, not a crash
		}
		if err != nil {
			res.err = objectErr(m.StepLocation(p.step)+"/"+p.name(f), err)
			break
		}
		res.files = append(res.files, wrote{f, size, sum})
		res.bytes += size
	}
	if res.err == nil && len(p.mine) > 0 {
		if err := syncBatch(m.store, stepKey(p.step)); err != nil {
			res.err = objectErr(m.StepLocation(p.step), err)
		}
	}
	res.dur = time.Since(start)
	if res.err != nil {
		m.logf("checkpoint: rank %d: step %d: %v", rank, p.step, res.err)
	}
	return res
}

// Save writes a barrier checkpoint of st at step. Every rank must call it
// with the same step and the same registered state. It returns once the
// checkpoint is committed (its manifest durable) on every rank, or with an
// error on every rank; a failed or interrupted save leaves the previous
// checkpoints as they were. An asynchronous save in flight is committed
// first (Wait), and its error, if any, is returned instead. A step that is
// already committed (saved again after Restore returned it) is not saved
// again: Save logs it and returns nil.
func (m *Manager) Save(ctx context.Context, step int64, st *State) error {
	p, err := m.begin(ctx, step, st, false)
	if err != nil || p == nil {
		return err
	}
	// 3. Every rank writes its files straight from the state.
	res := m.write(ctx, p, func(f int) [][]byte { return p.chunks(st, f) })
	return m.finish(ctx, p, &res)
}

// failed is the error of a save that failed with what: "checkpoint: step
// S: what (previous checkpoint kept)", or for an asynchronous save
// "checkpoint: async save of step S: what; previous checkpoint kept".
func failed(step int64, async bool, what error) error {
	if async {
		return fmt.Errorf("checkpoint: async save of step %d: %w; previous checkpoint kept", step, what)
	}
	return fmt.Errorf("checkpoint: step %d: %w (previous checkpoint kept)", step, what)
}

// ownFirst is the error of a rank whose own step of a save failed (own)
// and whose agreement on the outcome failed too (agree): its own cause
// comes first. The agreement often fails only because of it: a rank that
// learned of the failure ends the job, and the abort can reach this rank
// before the agreement's last message, so agree alone would name that rank
// and not the cause. own may be nil.
func ownFirst(own, agree error) error {
	if own == nil {
		return agree
	}
	return fmt.Errorf("%w (and telling the other ranks failed: %v)", own, agree)
}

// finish runs the commit of a synchronous save on every rank, once every
// rank's writes are done: the barrier that gathers every file's size and
// sha256 (confirm), the manifest and retention in every domain
// (commitLead), and the outcome, allgathered.
func (m *Manager) finish(ctx context.Context, p *plan, res *writeResult) error {
	rank, n, step := m.comm.Rank(), p.n, p.step
	man, err := m.confirm(ctx, p, res, false)
	if err != nil {
		return err
	}
	mstart := time.Now()
	var commitErr error
	if p.dom.leads(rank) {
		if commitErr = m.commitLead(ctx, man); errors.Is(commitErr, errHook) {
			return commitErr
		}
	}
	// 7. Every rank learns every domain's outcome.
	flags := make([]byte, n)
	if err := m.comm.Allgather(m.ioCtx(ctx), []byte{byte(boolU64(commitErr != nil))}, flags, collective.Name("checkpoint.commit")); err != nil {
		return failed(step, false, ownFirst(commitErr, fmt.Errorf("committing the manifest: %w", err)))
	}
	var bad []int
	failedRanks := make([]bool, n)
	for r, f := range flags {
		if f != 0 {
			bad = append(bad, r)
			failedRanks[r] = true
		}
	}
	if len(bad) > 0 {
		return failed(step, false, fmt.Errorf("%w%s", m.commitFailure(p, commitErr, len(bad), bad[0]), m.committedElsewhere(p, failedRanks)))
	}
	// 6. Committed everywhere: the leads apply retention.
	if p.dom.leads(rank) {
		if err := m.retainLead(ctx, step); err != nil {
			return err
		}
	}
	total := time.Since(p.start)
	m.good = step
	m.last = SaveStats{Step: step, Bytes: p.need, Written: res.bytes, Write: res.dur, Total: total, Manifest: time.Since(mstart), Stall: total}
	return nil
}

// commitFailure says why the commit failed: this rank's own error, or
// which lead ranks failed (count of them; first, the lowest, when known,
// else -1).
func (m *Manager) commitFailure(p *plan, own error, count, first int) error {
	if own != nil {
		return own
	}
	where := "the manifest"
	if p.dom.h() == 1 {
		where = m.StepLocation(p.step) + "/" + ManifestName
	}
	switch {
	case count == 1:
		return fmt.Errorf("%s could not be written by rank %d (see its log for the cause)", where, first)
	case first >= 0:
		return fmt.Errorf("%s could not be written by %d ranks, the first rank %d (see their logs for the cause)", where, count, first)
	}
	return fmt.Errorf("%s could not be written by %d ranks (see their logs for the cause)", where, count)
}

// confirm is step 4 of a save, on every rank once every rank's writes are
// done: the barrier that confirms every file is durable and gathers their
// sizes and checksums; it returns this rank's domain's manifest. Its errors
// are the same on every rank (apart from the cause a failed rank names).
func (m *Manager) confirm(ctx context.Context, p *plan, res *writeResult, async bool) (*Manifest, error) {
	rank, n, step := m.comm.Rank(), p.n, p.step
	loc := m.StepLocation(step)
	fail := func(format string, args ...any) error {
		return failed(step, async, fmt.Errorf(format, args...))
	}
	if err := hook("after-shard", rank); err != nil {
		return nil, err
	}
	const slot = 8 + 8 + 32
	resLen := 8 + slot*p.maxMine
	rec := make([]byte, resLen)
	binary.LittleEndian.PutUint64(rec, boolU64(res.err == nil))
	for i, w := range res.files {
		b := rec[8+i*slot:]
		binary.LittleEndian.PutUint64(b, uint64(w.file)+1) // 0: empty slot
		binary.LittleEndian.PutUint64(b[8:], uint64(w.size))
		copy(b[16:48], w.sum[:])
	}
	all := make([]byte, resLen*n)
	wctx := ctx
	if !async {
		// A synchronous save waits here for every rank's writes (an
		// asynchronous one comes here once every rank is done).
		wctx = m.ioCtx(ctx)
	}
	if err := m.comm.Allgather(wctx, rec, all, collective.Name("checkpoint.written")); err != nil {
		return nil, failed(step, async, ownFirst(res.err, fmt.Errorf("confirming the shards in %s: %w", loc, err)))
	}
	var bad []int
	for r := range n {
		if binary.LittleEndian.Uint64(all[r*resLen:]) == 0 {
			bad = append(bad, r)
		}
	}
	if len(bad) > 0 {
		if res.err != nil {
			return nil, failed(step, async, res.err)
		}
		return nil, fail("ranks %v could not write their shards to %s (see their logs)", bad, loc)
	}
	// Every copy of a file must be the same bytes: a shard's replicas are
	// written by different ranks from their own memory.
	type copyOf struct {
		rank int
		size int64
		sum  [32]byte
	}
	copies := make([][]copyOf, 2*n)
	for r := range n {
		for i := range p.maxMine {
			b := all[r*resLen+8+i*slot:]
			f := int(binary.LittleEndian.Uint64(b)) - 1
			if f < 0 || f >= 2*n {
				continue
			}
			c := copyOf{r, int64(binary.LittleEndian.Uint64(b[8:])), [32]byte(b[16:48])}
			for _, o := range copies[f] {
				if o.size != c.size || o.sum != c.sum {
					return nil, fail("ranks %d and %d wrote different bytes for %s (sha256 %s and %s): the registered tensors must hold the same values on every rank (they are replicated state; a rank whose values diverged is a bug in the training loop)",
						o.rank, c.rank, p.name(f), hex.EncodeToString(o.sum[:8]), hex.EncodeToString(c.sum[:8]))
				}
			}
			copies[f] = append(copies[f], c)
		}
	}
	man := &Manifest{Format: Format, Step: step, WorldSize: n, ByteOrder: "little", TotalBytes: p.total, Tensors: p.tensors}
	if p.dom.h() > 1 {
		// Each domain's copy of the manifest says which files are there.
		man.Hosts, man.Replicas, man.Host = p.dom.h(), p.k, p.dom.of[rank]
	}
	for f := range 2 * n {
		if len(copies[f]) == 0 {
			return nil, fail("no rank reported writing %s", p.name(f))
		}
		c := copies[f][0]
		fi := FileInfo{Rank: f % n, File: p.name(f), Size: c.size, SHA256: hex.EncodeToString(c.sum[:])}
		if p.dom.h() > 1 {
			fi.Hosts = slices.Sorted(slices.Values(p.dom.homes(f%n, p.k)))
		}
		if f < n {
			fi.Offset, _ = p.shardRange(f)
			man.Shards = append(man.Shards, fi)
		} else {
			fi.Blobs = p.blobNames
			man.Blobs = append(man.Blobs, fi)
		}
	}
	return man, nil
}

// commitLead is step 5 on a domain's lowest rank: it commits the
// manifest. It issues no collective, so that an asynchronous save runs it
// in the background. A manifest that cannot be written is its error
// (logged here). An error of the test hook is returned as is. Retention
// (step 6, retainLead) runs only once every domain committed.
func (m *Manager) commitLead(ctx context.Context, man *Manifest) error {
	rank := m.comm.Rank()
	if err := m.commit(ctx, man); errors.Is(err, errHook) {
		return err
	} else if err != nil {
		m.logf("checkpoint: rank %d: step %d: committing the manifest: %v", rank, man.Step, err)
		return err
	}
	return hook("committed", rank)
}

// retainLead is step 6 on a domain's lowest rank, once the save of step is
// committed in every domain: it applies retention. A failure is only
// logged; an error of the test hook is returned.
func (m *Manager) retainLead(ctx context.Context, step int64) error {
	if err := m.retain(ctx, step); err != nil {
		if errors.Is(err, errHook) {
			return err
		}
		m.logf("checkpoint: step %d: deleting old checkpoints: %v", step, err)
	}
	return nil
}

// committedElsewhere says, for a save whose commit failed in some domain,
// in which domains it is committed nevertheless: failedRanks[r] is true for
// the lead ranks whose commit failed. "" with one domain.
func (m *Manager) committedElsewhere(p *plan, failedRanks []bool) string {
	if p.dom.h() == 1 {
		return ""
	}
	var hosts, leads []int
	for d, mem := range p.dom.members {
		if !failedRanks[mem[0]] {
			hosts, leads = append(hosts, d), append(leads, mem[0])
		}
	}
	if len(hosts) == 0 {
		return ""
	}
	return fmt.Sprintf("; the step is nevertheless committed in the directories of %s (lead ranks %v), where a restore may load it", hostList(hosts), leads)
}

// commit writes the manifest: the Store's Put is atomic and durable
// (DirStore: temp file, fsync, rename, fsync).
func (m *Manager) commit(ctx context.Context, man *Manifest) error {
	data, err := json.MarshalIndent(man, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	if err := hook("manifest", m.comm.Rank()); err != nil {
		return err
	}
	if err := m.store.Put(ctx, stepKey(man.Step)+"/"+ManifestName, data); err != nil {
		return objectErr(m.StepLocation(man.Step)+"/"+ManifestName, err)
	}
	return nil
}

// retain runs once step is committed in every domain. It deletes the
// committed checkpoints newer than step (superseded: the job went on from
// an older one, after a restore fell back past them), the committed ones
// beyond the newest keep up to step (step itself always kept), and
// uncommitted steps older than the newest kept one. A deletion removes the
// manifest first, so a crash midway leaves an uncommitted step, never a
// broken committed one. Uncommitted steps newer than step are left alone
// (the next save may be writing one).
func (m *Manager) retain(ctx context.Context, step int64) error {
	entries, err := storeSteps(ctx, m.store)
	if err != nil {
		return err
	}
	rank := m.comm.Rank()
	var superseded []int64
	for _, e := range entries {
		if e.Step > step && e.Committed {
			superseded = append(superseded, e.Step)
		}
	}
	if len(superseded) > 0 {
		m.logf("checkpoint: step %d: deleting the committed steps %v in %s: they are newer than step %d, which the job went on from (superseded)", step, superseded, m.dir, step)
	}
	kept := 0
	var errs []error
	for _, e := range entries {
		switch {
		case e.Step > step && !e.Committed:
			continue // not ours to judge
		case e.Step == step:
			kept++
			continue
		case e.Step < step && e.Committed && kept < m.keep:
			kept++
			continue
		case e.Step < step && !e.Committed && kept == 0:
			continue
		}
		err := storeDeleteStep(ctx, m.store, e.Step, func() error { return hook("retention", rank) })
		if errors.Is(err, errHook) {
			return err
		}
		if err != nil {
			errs = append(errs, err)
		}
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

// writeAt copies data into the concatenated tensors at byte off.
func (s *State) writeAt(off int64, data []byte) {
	var o int64
	for _, t := range s.tensors {
		end := o + int64(len(t.bytes))
		if end > off && o < off+int64(len(data)) {
			copy(t.bytes[max(off-o, 0):], data[max(o-off, 0):])
		}
		o = end
	}
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

// replicaCount is k: how many domains besides a rank's own keep its files.
func (m *Manager) replicaCount(d *domains) int {
	if d.h() == 1 {
		return 0
	}
	k := m.replicas
	if k < 0 {
		k = 2
		if v, err := strconv.Atoi(os.Getenv(EnvReplicas)); err == nil && v >= 0 {
			k = v
		}
	}
	return min(k, d.h()-1)
}

func boolU64(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

func boolI64(b bool) int64 { return int64(boolU64(b)) }

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

// StepLocation is where the checkpoint of step is kept: its directory
// (StepDir of Dir), or for an s3:// location its prefix,
// s3://bucket/prefix/step-<N>.
func (m *Manager) StepLocation(step int64) string {
	return location(m.store, stepKey(step))
}
