package checkpoint

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gorun/gorun/collective"
)

// finish runs steps 4 to 7 of a synchronous save on every rank, once every
// rank's writes are done: the barrier that gathers every file's size and
// sha256 (confirm), the manifest in every domain (commitLead, under the
// storage deadline), the outcome (shareOutcome), and it starts retention
// in the background (startRetention): Save returns without waiting for it.
func (m *Manager) finish(ctx context.Context, p *plan, res *writeResult) error {
	rank := m.comm.Rank()
	man, err := m.confirm(ctx, p, res, false)
	if err != nil {
		return err
	}
	mstart := time.Now()
	var commitErr error
	if p.dom.leads(rank) {
		sctx, cancel := m.storageCtx(ctx)
		commitErr = m.commitLead(sctx, man)
		cancel()
		if errors.Is(commitErr, errHook) {
			return commitErr
		}
	}
	if err := m.shareOutcome(ctx, p, commitErr); err != nil {
		return err
	}
	if p.dom.leads(rank) {
		m.startRetention(ctx, p.step)
	}
	total := time.Since(p.start)
	m.good = p.step
	m.last = SaveStats{Step: p.step, Bytes: p.need, Written: res.bytes, Write: res.dur, Total: total, Manifest: time.Since(mstart), Stall: total}
	return nil
}

// writtenSlot is one file in a rank's record of the written barrier: the
// file's number plus one (0: an empty slot), its size and its sha256.
const writtenSlot = 8 + 8 + 32

// confirm is step 4 of a save, on every rank once every rank's writes are
// done: the barrier that confirms every file is durable and gathers their
// sizes and checksums (every copy of a file must be the same bytes); it
// returns this rank's domain's manifest. Its errors are the same on every
// rank (apart from the cause a failed rank names).
func (m *Manager) confirm(ctx context.Context, p *plan, res *writeResult, async bool) (*Manifest, error) {
	rank, n, step := m.comm.Rank(), p.n, p.step
	loc := m.StepLocation(step)
	if err := hook("after-shard", rank); err != nil {
		return nil, err
	}
	recLen := 8 + writtenSlot*p.maxMine
	rec := make([]byte, recLen)
	binary.LittleEndian.PutUint64(rec, boolU64(res.err == nil))
	for i, w := range res.files {
		b := rec[8+i*writtenSlot:]
		binary.LittleEndian.PutUint64(b, uint64(w.file)+1)
		binary.LittleEndian.PutUint64(b[8:], uint64(w.size))
		copy(b[16:48], w.sum[:])
	}
	all := make([]byte, recLen*n)
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
		if binary.LittleEndian.Uint64(all[r*recLen:]) == 0 {
			bad = append(bad, r)
		}
	}
	if len(bad) > 0 {
		if res.err != nil {
			return nil, failed(step, async, res.err)
		}
		return nil, failed(step, async, fmt.Errorf("ranks %v could not write their shards to %s (see their logs)", bad, loc))
	}
	copies, err := p.copiesOf(all, recLen)
	if err != nil {
		return nil, failed(step, async, err)
	}
	man, err := p.manifest(copies, p.dom.of[rank])
	if err != nil {
		return nil, failed(step, async, err)
	}
	return man, nil
}

// fileCopy is one copy of a file, as the rank that wrote it reported it.
type fileCopy struct {
	rank int
	size int64
	sum  [32]byte
}

// copiesOf decodes the records of the written barrier (recLen bytes per
// rank) into the copies of every file. Every copy of a file must be the
// same bytes: a shard's replicas are written by different ranks from
// their own memory.
func (p *plan) copiesOf(all []byte, recLen int) ([][]fileCopy, error) {
	copies := make([][]fileCopy, 2*p.n)
	for r := range p.n {
		for i := range p.maxMine {
			b := all[r*recLen+8+i*writtenSlot:]
			f := int(binary.LittleEndian.Uint64(b)) - 1
			if f < 0 || f >= 2*p.n {
				continue
			}
			c := fileCopy{r, int64(binary.LittleEndian.Uint64(b[8:])), [32]byte(b[16:48])}
			for _, o := range copies[f] {
				if o.size != c.size || o.sum != c.sum {
					return nil, fmt.Errorf("ranks %d and %d wrote different bytes for %s (sha256 %s and %s): the registered tensors must hold the same values on every rank (they are replicated state; a rank whose values diverged is a bug in the training loop)",
						o.rank, c.rank, p.name(f), hex.EncodeToString(o.sum[:8]), hex.EncodeToString(c.sum[:8]))
				}
			}
			copies[f] = append(copies[f], c)
		}
	}
	return copies, nil
}

// manifest is the manifest of the saved step in domain host, from the
// copies of every file.
func (p *plan) manifest(copies [][]fileCopy, host int) (*Manifest, error) {
	n := p.n
	man := &Manifest{Format: Format, Step: p.step, WorldSize: n, ByteOrder: "little", TotalBytes: p.total, Tensors: p.tensors}
	if p.dom.h() > 1 {
		// Each domain's copy of the manifest says which files are there.
		man.Hosts, man.Replicas, man.Host = p.dom.h(), p.k, host
	}
	for f := range 2 * n {
		if len(copies[f]) == 0 {
			return nil, fmt.Errorf("no rank reported writing %s", p.name(f))
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
// (step 7, retention.go) runs only once every domain committed.
func (m *Manager) commitLead(ctx context.Context, man *Manifest) error {
	rank := m.comm.Rank()
	if err := m.putManifest(ctx, man); errors.Is(err, errHook) {
		return err
	} else if err != nil {
		m.logf("checkpoint: rank %d: step %d: committing the manifest: %v", rank, man.Step, err)
		return err
	}
	return hook("committed", rank)
}

// putManifest writes the manifest: the commit. The Store's Put is atomic
// and durable (a directory: temporary file, fsync, rename, fsync).
func (m *Manager) putManifest(ctx context.Context, man *Manifest) error {
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

// shareOutcome is step 6 of a synchronous save: every rank learns every
// domain's outcome (commitErr: this rank's commit, when it leads one), and
// the save fails on every rank when any commit failed, saying in which
// domains the step is committed nevertheless.
func (m *Manager) shareOutcome(ctx context.Context, p *plan, commitErr error) error {
	n, step := p.n, p.step
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

// committedElsewhere says, for a save whose commit failed in some domain,
// in which domains it is committed nevertheless: failedRanks[r] is true for
// the lead ranks whose commit failed. "" with one domain.
func (m *Manager) committedElsewhere(p *plan, failedRanks []bool) string {
	if p.dom.h() == 1 {
		return ""
	}
	var hosts []int
	for d, mem := range p.dom.members {
		if !failedRanks[mem[0]] {
			hosts = append(hosts, d)
		}
	}
	if len(hosts) == 0 {
		return ""
	}
	return fmt.Sprintf("; the step is nevertheless committed in %s, where a restore may load it", p.dom.dirList(hosts))
}
