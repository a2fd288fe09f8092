package checkpoint

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
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

// DirStore is a Store in a local or shared directory: Put writes a temporary
// file, fsyncs it, renames it and fsyncs the directory.
type DirStore string

func (d DirStore) path(key string) string { return filepath.Join(string(d), filepath.FromSlash(key)) }

// Put implements Store. A directory it creates (a step directory in a
// checkpoint directory that lost it) is made durable in its parent too, so
// that the file's own fsync is not undone by a lost directory entry.
func (d DirStore) Put(_ context.Context, key string, data ...[]byte) error {
	p := d.path(key)
	dir := filepath.Dir(p)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := syncDir(filepath.Dir(dir)); err != nil {
			return err
		}
	}
	_, _, err := writeDurable(dir, filepath.Base(p), true, data...)
	return err
}

// Get implements Store.
func (d DirStore) Get(_ context.Context, key string) (io.ReadCloser, int64, error) {
	f, err := os.Open(d.path(key))
	if err != nil {
		return nil, 0, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, st.Size(), nil
}

// List implements Store. It walks only the directories that can hold keys
// with prefix, and ignores entries that vanish while it walks (another rank
// sharing the directory removing its domain token or a stale step).
func (d DirStore) List(_ context.Context, prefix string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(string(d), func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				if p == string(d) {
					return fs.SkipAll
				}
				return nil
			}
			return err
		}
		rel, err := filepath.Rel(string(d), p)
		if err != nil {
			return err
		}
		k := filepath.ToSlash(rel)
		if de.IsDir() {
			if k != "." && !strings.HasPrefix(k+"/", prefix) && !strings.HasPrefix(prefix, k+"/") {
				return fs.SkipDir
			}
			return nil
		}
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
		return nil
	})
	slices.Sort(out)
	return out, err
}

// Delete implements Store; it also removes the directories it empties.
func (d DirStore) Delete(_ context.Context, key string) error {
	p := d.path(key)
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := syncDir(filepath.Dir(p)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for dir := filepath.Dir(p); dir != filepath.Clean(string(d)) && strings.HasPrefix(dir, string(d)); dir = filepath.Dir(dir) {
		if os.Remove(dir) != nil {
			break
		}
	}
	return nil
}

func (d DirStore) String() string { return string(d) }

// stepKey is the key prefix of a step's objects.
func stepKey(step int64) string { return fmt.Sprintf("step-%012d", step) }

// storeSteps lists the checkpoints in s, newest first.
func storeSteps(ctx context.Context, s Store) ([]Entry, error) {
	keys, err := s.List(ctx, "step-")
	if err != nil {
		return nil, err
	}
	byStep := map[int64]*Entry{}
	for _, k := range keys {
		dir, name, ok := strings.Cut(k, "/")
		if !ok {
			continue
		}
		var step int64
		if _, err := fmt.Sscanf(dir, "step-%d", &step); err != nil || dir != stepKey(step) {
			continue
		}
		e := byStep[step]
		if e == nil {
			e = &Entry{Step: step, Dir: strings.TrimSuffix(s.String(), "/") + "/" + dir}
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

// storeDeleteStep removes a step's objects, its manifest first, so that an
// interrupted deletion leaves an uncommitted step, never a broken one.
func storeDeleteStep(ctx context.Context, s Store, step int64, afterManifest func() error) error {
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
		if err := s.Delete(ctx, k); err != nil {
			errs = append(errs, err)
		}
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

// storeVerify reads a step's manifest and checks every file's size and
// sha256. With assemble non-nil it also copies the concatenated tensor bytes
// into the buffer assemble returns (len m.TotalBytes, checked by the
// caller); assemble returning nil skips the step (errSkip).
func storeVerify(ctx context.Context, s Store, step int64, assemble func(*Manifest) []byte) (*Manifest, error) {
	m, err := storeReadManifest(ctx, s, step)
	if err != nil {
		return m, err
	}
	var dst []byte
	if assemble != nil {
		if dst = assemble(m); dst == nil {
			return m, errSkip
		}
	}
	for _, f := range m.Shards {
		var w io.Writer = io.Discard
		if dst != nil {
			w = &sliceWriter{buf: dst[f.Offset : f.Offset+f.Size]}
		}
		if err := storeCheckFile(ctx, s, step, f, w); err != nil {
			return m, err
		}
	}
	for _, f := range m.Blobs {
		if err := storeCheckFile(ctx, s, step, f, io.Discard); err != nil {
			return m, err
		}
	}
	return m, nil
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
