package checkpoint

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
)

// Store is where a Manager keeps its checkpoints: a flat namespace of
// objects named by slash-separated keys ("step-000000000120/manifest.json"),
// relative to the location given to New.
//
// The manifest is the commit, so a back end must give two guarantees: Put
// makes an object visible whole or not at all (a reader never sees half a
// manifest), and an object is durable once Put returns (so that the manifest,
// written after every shard's Put has returned on every rank, never commits
// a shard that could still be lost).
type Store interface {
	// Put writes the concatenation of data to key, replacing it.
	Put(ctx context.Context, key string, data ...[]byte) error
	// Get opens key; the error wraps fs.ErrNotExist when it is absent.
	Get(ctx context.Context, key string) (io.ReadCloser, int64, error)
	// List returns every key that starts with prefix, sorted.
	List(ctx context.Context, prefix string) ([]string, error)
	// Delete removes key; deleting an absent key is not an error.
	Delete(ctx context.Context, key string) error
	// String names the location, for messages.
	String() string
}

// What a Store on a filesystem (DirStore) does beyond Store. A Manager
// finds these optional interfaces by type assertion, as database/sql finds
// a driver's; a Store without them (S3, or a Store wrapped by a test) takes
// the general path: one Put per object, no free-space check, one storage
// domain.

// A batchWriter writes the files of a step with one fsync of their
// directory after the last one (syncBatch) instead of one per file. A save
// writes a rank's files with putUnsynced and calls syncBatch before the
// barrier that precedes the commit, so that the manifest still commits only
// durable files.
type batchWriter interface {
	// putUnsynced writes key as Put does (a temporary name, fsynced and
	// renamed: visible whole or not at all), hashing the bytes as it
	// writes them, but its name is durable only once syncBatch of its
	// prefix returns. It returns the object's size and sha256; when ctx
	// ends first, it stops and fails with ctx's cause.
	putUnsynced(ctx context.Context, key string, data ...[]byte) (size int64, sum [32]byte, err error)
	// syncBatch makes the names written under prefix durable.
	syncBatch(prefix string) error
}

// A spaceReporter says how many bytes it can still take; a save checks
// them before it writes anything. An object store reports none.
type spaceReporter interface {
	freeSpace() (uint64, error)
}

// A sizer tells an object's size without opening it: a restore finds the
// copies of the wrong size (truncated, overwritten) before reading any.
type sizer interface {
	size(key string) (int64, error)
}

// A perHostStore may be a different store on each host under the same
// name (a directory on each host's local disk), so the ranks find out
// which of them share it (their storage domain) through tokens they leave
// in it. Every rank sees the same object store: one domain.
type perHostStore interface {
	// putToken creates the token name; hasToken looks it up by name;
	// dropToken removes it, and the tokens' place when it is empty.
	putToken(name string) error
	hasToken(name string) bool
	dropToken(name string)
}

// An uploadKeeper keeps incomplete uploads (uploads.go): an object
// store's multipart uploads that were started and neither completed nor
// aborted, by a rank that died or lost the store in the middle of a big
// object. Their parts take space, and are billed, but make no object:
// List never shows them.
type uploadKeeper interface {
	// uploads lists the incomplete uploads whose keys start with prefix,
	// with the parts each stored, sorted by key.
	uploads(ctx context.Context, prefix string) ([]Upload, error)
	// abortUpload discards an upload and its parts; one that is gone
	// already is not an error.
	abortUpload(ctx context.Context, u Upload) error
}

// A pather names its keys as file paths (cleaned, with the system's
// separator) rather than as location + "/" + key.
type pather interface {
	path(key string) string
}

// putHashed writes key in s and returns its size and sha256: as part of a
// batch when s is a batchWriter (durable once syncBatch returns), else with
// Put (durable at once), hashed first.
func putHashed(ctx context.Context, s Store, key string, chunks [][]byte) (int64, [32]byte, error) {
	if b, ok := s.(batchWriter); ok {
		return b.putUnsynced(ctx, key, chunks...)
	}
	h := sha256.New()
	var n int64
	for _, c := range chunks {
		hashPieces(h, c)
		n += int64(len(c))
	}
	if err := s.Put(ctx, key, chunks...); err != nil {
		return 0, [32]byte{}, err
	}
	return n, [32]byte(h.Sum(nil)), nil
}

// syncBatch makes the objects putHashed wrote under prefix durable; a
// Store that is no batchWriter made each durable in its Put.
func syncBatch(s Store, prefix string) error {
	if b, ok := s.(batchWriter); ok {
		return b.syncBatch(prefix)
	}
	return nil
}

// EnvHost is the environment variable whose value replaces "{host}" in a
// directory location (gorun sets it to the host a rank runs on).
const EnvHost = "GORUN_HOST"

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

// IsRemote reports whether loc names an object store (s3://bucket/prefix)
// rather than a directory.
func IsRemote(loc string) bool { return strings.HasPrefix(loc, "s3://") }

// OpenStore returns the Store of a location: s3://bucket/prefix for S3 (see
// the package documentation for its environment), anything else a
// directory, with "{host}" expanded (ExpandHost).
func OpenStore(ctx context.Context, loc string) (Store, error) {
	loc, err := ExpandHost(loc)
	if err != nil {
		return nil, err
	}
	if IsRemote(loc) {
		return openS3(ctx, loc)
	}
	return DirStore(loc), nil
}

// openForJob is OpenStore for a Manager: a directory is created when it is
// missing (a new job's directory need not exist yet); a bucket must exist
// (openS3 checks).
func openForJob(ctx context.Context, loc string) (Store, error) {
	loc, err := ExpandHost(loc)
	if err != nil {
		return nil, err
	}
	if !IsRemote(loc) {
		if err := os.MkdirAll(loc, 0o755); err != nil {
			return nil, fmt.Errorf("checkpoint: %w", err)
		}
	}
	return OpenStore(ctx, loc)
}

// openExisting is OpenStore for a location that must hold checkpoints
// already (Scan, List, Remove): a directory must exist and be one, in
// Scan's words; openS3 checks that a bucket exists.
func openExisting(ctx context.Context, loc string) (Store, error) {
	loc, err := ExpandHost(loc)
	if err != nil {
		return nil, err
	}
	if !IsRemote(loc) {
		if err := checkScanDir(loc); err != nil {
			return nil, err
		}
	}
	return OpenStore(ctx, loc)
}

// stepKey is the key prefix of a step's objects.
func stepKey(step int64) string { return fmt.Sprintf("step-%012d", step) }

// location names key in s for messages: its path in a directory, else
// s3://bucket/prefix/key.
func location(s Store, key string) string {
	if p, ok := s.(pather); ok {
		return p.path(key)
	}
	return strings.TrimSuffix(s.String(), "/") + "/" + key
}

// storeSteps lists the checkpoints in s, newest first.
func storeSteps(ctx context.Context, s Store) ([]Entry, error) {
	keys, err := s.List(ctx, "step-")
	if err != nil {
		return nil, err
	}
	byStep := map[int64]*Entry{}
	for _, k := range keys {
		step, name, ok := parseStepKey(k)
		if !ok {
			continue
		}
		e := byStep[step]
		if e == nil {
			e = &Entry{Step: step, Dir: entryDir(s, step)}
			byStep[step] = e
		}
		if name == ManifestName {
			e.Committed = true
		}
	}
	var out []Entry
	for _, e := range byStep {
		out = append(out, *e)
	}
	slices.SortFunc(out, func(a, b Entry) int { return cmp.Compare(b.Step, a.Step) })
	return out, nil
}

// entryDir is Entry.Dir: where a step is, as the location names it.
func entryDir(s Store, step int64) string {
	return strings.TrimSuffix(s.String(), "/") + "/" + stepKey(step)
}

// parseStepKey splits a key "step-<N>/name" into the step and the name.
func parseStepKey(k string) (step int64, name string, ok bool) {
	dir, name, ok := strings.Cut(k, "/")
	if !ok {
		return 0, "", false
	}
	if _, err := fmt.Sscanf(dir, "step-%d", &step); err != nil || dir != stepKey(step) {
		return 0, "", false
	}
	return step, name, true
}

// storeDeleteStep removes a step's objects, its manifest first, so that an
// interrupted deletion leaves an uncommitted step, never a broken one. An
// object it cannot delete is skipped (the error lists them), unless
// firstErr: then it stops there (retention: a store that does not answer
// one deletion would not answer the next either, each after its retries).
// It stops when ctx is done. Last, it aborts the step's incomplete
// uploads, if the store keeps any (an uploadKeeper).
func storeDeleteStep(ctx context.Context, s Store, step int64, afterManifest func() error, firstErr bool) error {
	pre := stepKey(step) + "/"
	if err := s.Delete(ctx, pre+ManifestName); err != nil {
		return err
	}
	if afterManifest != nil {
		if err := afterManifest(); err != nil {
			return err
		}
	}
	keys, err := s.List(ctx, pre)
	if err != nil {
		return err
	}
	var errs []error
	for _, k := range keys {
		if ctx.Err() != nil {
			if len(errs) == 0 {
				return context.Cause(ctx) // as it is: a cut, no failure
			}
			return errors.Join(append(errs, context.Cause(ctx))...)
		}
		if err := s.Delete(ctx, k); err != nil {
			if firstErr {
				return err
			}
			errs = append(errs, err)
		}
	}
	if uk, ok := s.(uploadKeeper); ok && len(errs) == 0 {
		ups, err := uk.uploads(ctx, pre)
		if err == nil {
			err = abortUploads(ctx, uk, ups)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// storeReadManifest reads and sanity-checks a step's manifest.
func storeReadManifest(ctx context.Context, s Store, step int64) (*Manifest, error) {
	rc, _, err := s.Get(ctx, stepKey(step)+"/"+ManifestName)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", ManifestName, err)
	}
	return parseManifest(data)
}

// storeCheckFile streams one object of a step into w, checking its size and
// sha256.
func storeCheckFile(ctx context.Context, s Store, step int64, f FileInfo, w io.Writer) error {
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
	return checkStream(f, rc, size, w)
}

// fileError is an error about one file or object whose text names it once
// (msg); it unwraps to the error it was made from, so errors.Is still sees
// fs.ErrNotExist, syscall.ENOSPC or a context's error.
type fileError struct {
	msg string
	err error
}

func (e *fileError) Error() string { return e.msg }
func (e *fileError) Unwrap() error { return e.err }

// objectErr is err from an operation on the object or file at loc (a
// path, or an s3:// location and key), said as "loc: cause" with loc once:
// the cause drops the path an *os.PathError repeats and the location the
// S3 back end's errors start with.
func objectErr(loc string, err error) error {
	c := causeOf(err, loc)
	if strings.HasPrefix(c, loc+"/") { // it names a file under loc itself
		return &fileError{c, err}
	}
	return &fileError{loc + ": " + c, err}
}

// causeOf is err's text without the names of the file it is about, which
// the caller says: an *os.PathError or *os.LinkError gives its operation
// and cause ("write: no space left on device"); a text loses the
// package's "checkpoint: " prefix and then one of names (or name + "/")
// and ": " that it starts with.
func causeOf(err error, names ...string) string {
	var pe *fs.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe) && err == error(pe):
		return pe.Op + ": " + pe.Err.Error()
	case errors.As(err, &le) && err == error(le):
		return le.Op + ": " + le.Err.Error()
	}
	// The package's own prefix, which an error of the S3 back end may
	// carry, is said once by the caller's error.
	text := strings.TrimPrefix(err.Error(), "checkpoint: ")
	for _, n := range names {
		for _, p := range []string{n + ": ", n + "/: "} { // a prefix is named with its slash
			if t, ok := strings.CutPrefix(text, p); ok {
				return t
			}
		}
	}
	return text
}

// checkFileName refuses a manifest's file name that is not a plain name in
// the step.
func checkFileName(f FileInfo) error {
	if f.File != path.Base(f.File) || f.File == "" || f.File == "." || strings.Contains(f.File, `\`) {
		return fmt.Errorf("manifest names a file %q outside the checkpoint", f.File)
	}
	return nil
}
