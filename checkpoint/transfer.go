package checkpoint

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/gorun/gorun/collective"
)

// allgatherRestores counts the ranks' restores of shards by one allgather
// (for tests).
var allgatherRestores atomic.Int64

// errTextLen is the fixed size of a failed read's message in its broadcast.
const errTextLen = 512

// inPlace is what the in-place reads of step 5 leave to the per-file path.
type inPlace struct {
	errs   []error // per file: this rank's failed in-place read
	status []byte  // per file: the status of its reader's in-place copy (copyStatus), the same on every rank
}

// transfer is step 5 of a restore: every rank reads the files assigned to
// it and every file reaches every rank, the tensor shards into the
// registered tensors and the blob files into c.blobData. In the parallel
// restore the shards come first, in place (readInPlace); the files that
// took no part in that, or whose copy did not verify, then take the
// per-file path (broadcastFiles), which falls back to other copies.
func (m *Manager) transfer(ctx context.Context, st *State, c *candidate) error {
	nf := len(c.files)
	c.blobData = make([][]byte, c.man.WorldSize)
	ip := inPlace{errs: make([]error, nf), status: make([]byte, nf)}
	var todo []int // the files for the per-file path
	if m.restoreRank0 {
		for i := range nf {
			todo = append(todo, i)
		}
	} else {
		var err error
		if todo, err = m.readInPlace(ctx, st, c, &ip); err != nil {
			return restoreErr(c.step, err)
		}
	}
	return m.broadcastFiles(ctx, st, c, todo, &ip)
}

// readInPlace is the parallel part of step 5: each rank reads its shards
// straight into the registered tensors in the background (hashing as it
// reads), while the shards are broadcast in order from their readers
// straight from and into the tensors (restoreShards); one small allgather
// then says which copies did not verify (ip.status), and only those take
// the per-file path. No buffer, no copy. It returns the files for the
// per-file path.
//
// In one storage domain with the size that wrote the checkpoint, each rank
// reads its own blob file and nobody else needs it (no re-replication):
// no broadcast, its status rides with the shards'.
func (m *Manager) readInPlace(ctx context.Context, st *State, c *candidate, ip *inPlace) ([]int, error) {
	rank, n, ns, nf := m.comm.Rank(), m.comm.Size(), c.ns, len(c.files)
	selfBlobs := c.dom.h() == 1 && c.man.WorldSize == n
	for r := range c.man.WorldSize {
		selfBlobs = selfBlobs && c.assign[ns+r] == r
	}
	bad := make([]byte, nf)
	var ownBlob []byte
	if selfBlobs {
		ownBlob, ip.errs[ns+rank] = m.readFile(ctx, c.step, c.files[ns+rank])
		bad[ns+rank] = copyStatus(ip.errs[ns+rank])
	}
	var err error
	if ip.status, err = m.restoreShards(ctx, st, c.step, c.files, c.assign, ns, ip.errs, bad); err != nil {
		return nil, err
	}
	var todo []int
	for i := range nf {
		if ip.status[i] != statusVerified || i >= ns && !selfBlobs {
			todo = append(todo, i)
		}
	}
	if selfBlobs && ip.status[ns+rank] == statusVerified {
		c.blobData[rank] = ownBlob[:c.files[ns+rank].Size]
	}
	return todo, nil
}

// broadcastFiles is the per-file path of step 5: this rank reads and
// verifies its files of todo in the background, in order, at most two
// ahead of the broadcasts (all of them first in the rank-0 mode, as
// restores used to), and each file is broadcast in turn (broadcastFile).
func (m *Manager) broadcastFiles(ctx context.Context, st *State, c *candidate, todo []int, ip *inPlace) error {
	rank := m.comm.Rank()
	var mine []int
	for _, i := range todo {
		if c.assign[i] == rank && ip.status[i] == statusVerified {
			mine = append(mine, i)
		}
	}
	ahead := 2
	if m.restoreRank0 {
		ahead = len(mine)
	}
	ar := m.readAhead(ctx, c.step, c.files, mine, ahead)
	// The reader stops and is gone before Restore returns or tries
	// another step.
	defer ar.stop()
	if m.restoreRank0 && len(mine) > 0 {
		select {
		case <-ar.allRead:
		case <-ctx.Done():
			return restoreErr(c.step, ctx.Err())
		}
	}
	var recv []byte // reused for the files other ranks read
	for _, i := range todo {
		if err := m.broadcastFile(ctx, st, c, i, ip, ar, &recv); err != nil {
			return err
		}
	}
	return nil
}

// broadcastFile brings file i to every rank: its reader broadcasts it with
// a status byte that says whether it verified. A verified shard is
// written into the tensors, a blob file kept in c.blobData. When the
// reader's copy is corrupt or unreadable (the in-place read's, ip, or the
// one broadcast), every rank learns why, and the next holder in another
// domain reads it; when none is left, the step cannot be loaded (a
// *skipStep), or, when a copy could not be read because of I/O errors,
// the restore stops (unreadable). This rank's first read of the file
// comes from ar; recv is reused for the files other ranks read.
func (m *Manager) broadcastFile(ctx context.Context, st *State, c *candidate, i int, ip *inPlace, ar *aheadReader, recv *[]byte) error {
	rank, step, f := m.comm.Rank(), c.step, c.files[i]
	reader := c.assign[i]
	first := true
	known := ip.status[i] // the status of the reader's in-place copy
	var ioText string     // why a copy could not be read, if one could not
	for {
		var rerr error
		var status byte
		if known != statusVerified {
			status, known, first = known, statusVerified, false
			rerr = ip.errs[i] // on the reader
		} else {
			var buf []byte
			switch {
			case rank == reader && first:
				var err error
				if buf, rerr, err = ar.next(ctx); err != nil {
					return restoreErr(step, err)
				}
			case rank == reader:
				buf, rerr = m.readFile(ctx, step, f)
			default:
				if int64(cap(*recv)) < f.Size+1 {
					*recv = make([]byte, f.Size+1)
				}
				buf = (*recv)[:f.Size+1]
			}
			if rank == reader {
				if rerr != nil {
					buf = make([]byte, f.Size+1)
				}
				buf[f.Size] = copyStatus(rerr)
			}
			if err := m.comm.Broadcast(ctx, buf, reader, collective.Name("checkpoint.restore.file")); err != nil {
				return restoreErr(step, err)
			}
			if status = buf[f.Size]; status == statusVerified {
				if i < c.ns {
					st.writeAt(f.Offset, buf[:f.Size])
				} else {
					c.blobData[i-c.ns] = slices.Clone(buf[:f.Size])
				}
				return nil
			}
		}
		msg := make([]byte, errTextLen)
		if rank == reader {
			copy(msg, rerr.Error())
		}
		if err := m.comm.Broadcast(ctx, msg, reader, collective.Name("checkpoint.restore.error")); err != nil {
			return restoreErr(step, err)
		}
		text := strings.TrimRight(string(msg), "\x00")
		if status == statusUnreadable {
			ioText = text
		}
		c.markBad(i, reader)
		first = false
		next := -1
		for _, h := range c.holders[i] {
			if !c.badDom[i][c.dom.of[h]] {
				next = h
				break
			}
		}
		if next < 0 {
			if ioText != "" {
				// Not known to be corrupt: an older checkpoint would
				// silently lose the progress since this one.
				return unreadable(step, ioText)
			}
			return skip(errors.New(text))
		}
		if rank == 0 {
			m.logf("checkpoint: WARNING: step %d: rank %d's copy of %s cannot be used (%s); reading rank %d's", step, reader, f.File, text, next)
		}
		reader = next
	}
}

// aheadReader reads this rank's files of the per-file path in the
// background, in order, a bounded number ahead of their broadcasts.
type aheadReader struct {
	ch      chan readOut
	allRead chan struct{} // closed once every file is read
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// readOut is one file read by an aheadReader: its bytes, one byte longer
// than the file (for the broadcast's status byte), or why not.
type readOut struct {
	buf []byte
	err error
}

// readAhead starts reading the files mine of step, at most ahead of them
// before the first is taken.
func (m *Manager) readAhead(ctx context.Context, step int64, files []FileInfo, mine []int, ahead int) *aheadReader {
	rctx, cancel := context.WithCancel(ctx)
	ar := &aheadReader{ch: make(chan readOut, ahead), allRead: make(chan struct{}), cancel: cancel}
	ar.wg.Add(1)
	go func() {
		defer ar.wg.Done()
		defer close(ar.allRead)
		for _, i := range mine {
			buf, err := m.readFile(rctx, step, files[i])
			select {
			case ar.ch <- readOut{buf, err}:
			case <-rctx.Done():
				return
			}
		}
	}()
	return ar
}

// next is the next file read: its bytes or the read's error (readErr),
// or err when ctx is done first.
func (ar *aheadReader) next(ctx context.Context) (buf []byte, readErr, err error) {
	select {
	case out := <-ar.ch:
		return out.buf, out.err, nil
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
}

// stop ends the reads and waits for the reader to be gone.
func (ar *aheadReader) stop() {
	ar.cancel()
	ar.wg.Wait()
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
// their statuses set). The shards' bytes in st are wrong until read
// again. When every rank reads exactly its own shard of equal ones into
// one tensor, the broadcasts are one allgather instead.
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
