package checkpoint

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
)

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
