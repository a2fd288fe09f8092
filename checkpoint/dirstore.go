package checkpoint

import (
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
)

// DirStore is a Store in a local or shared directory: Put writes a temporary
// file, fsyncs it, renames it and fsyncs the directory.
//
// Beyond Store it does what only a filesystem needs (see the optional
// interfaces beside Store): a batch of files made durable by one fsync of
// their directory, a free-space check, sizes without opening a file, and
// the tokens by which ranks find out which of them share the directory.
type DirStore string

var (
	_ Store         = DirStore("")
	_ batchWriter   = DirStore("")
	_ spaceReporter = DirStore("")
	_ sizer         = DirStore("")
	_ perHostStore  = DirStore("")
	_ pather        = DirStore("")
)

func (d DirStore) path(key string) string { return filepath.Join(string(d), filepath.FromSlash(key)) }

// Put implements Store. A directory it creates (a step directory in a
// checkpoint directory that lost it) is made durable in its parent too, so
// that the file's own fsync is not undone by a lost directory entry.
func (d DirStore) Put(ctx context.Context, key string, data ...[]byte) error {
	if _, _, err := d.putUnsynced(ctx, key, data...); err != nil {
		return err
	}
	return syncDir(filepath.Dir(d.path(key)))
}

// putUnsynced implements batchWriter: Put without the fsync of the file's
// directory. The directory, when it creates it, is durable at once.
func (d DirStore) putUnsynced(ctx context.Context, key string, data ...[]byte) (int64, [32]byte, error) {
	p := d.path(key)
	dir := filepath.Dir(p)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return 0, [32]byte{}, err
		}
		if err := syncDir(filepath.Dir(dir)); err != nil {
			return 0, [32]byte{}, err
		}
	}
	return writeDurable(ctx, dir, filepath.Base(p), data...)
}

// syncBatch implements batchWriter: it fsyncs the directory of prefix.
func (d DirStore) syncBatch(prefix string) error { return syncDir(d.path(prefix)) }

// freeSpace implements spaceReporter.
func (d DirStore) freeSpace() (uint64, error) { return freeSpace(string(d)) }

// size implements sizer.
func (d DirStore) size(key string) (int64, error) {
	fi, err := os.Stat(d.path(key))
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// tokenDir holds the files by which ranks find out who shares their
// directory.
const tokenDir = ".gorun-tokens"

// putToken implements perHostStore.
func (d DirStore) putToken(name string) error {
	tdir := d.path(tokenDir)
	if err := os.MkdirAll(tdir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(tdir, name), nil, 0o644)
}

// hasToken implements perHostStore. It looks the token up by name: on NFS
// a lookup revalidates the name with the server (close-to-open
// consistency), whereas a READDIR may be answered from a stale cache.
func (d DirStore) hasToken(name string) bool {
	_, err := os.Lstat(filepath.Join(d.path(tokenDir), name))
	return err == nil
}

// dropToken implements perHostStore.
func (d DirStore) dropToken(name string) {
	tdir := d.path(tokenDir)
	os.Remove(filepath.Join(tdir, name))
	os.Remove(tdir) // fails while another rank's token is there
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

// writeDurable writes the chunks to dir/name through a temporary name:
// write, fsync, rename (the caller fsyncs dir: a rank that writes several
// files syncs it once after the last). It returns the size and sha256,
// hashed as it writes, in pieces; between pieces it stops, with ctx's
// cause, once ctx is done (a disk too slow for the storage deadline).
func writeDurable(ctx context.Context, dir, name string, chunks ...[]byte) (int64, [32]byte, error) {
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return 0, [32]byte{}, err
	}
	h := sha256.New()
	var n int64
	err = func() error {
		for _, c := range chunks {
			for len(c) > 0 {
				if ctx.Err() != nil {
					return context.Cause(ctx)
				}
				b := c[:min(len(c), piece)]
				if _, err := f.Write(b); err != nil {
					return err
				}
				h.Write(b)
				n += int64(len(b))
				c = c[len(b):]
				runtime.Gosched()
			}
		}
		return f.Sync()
	}()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(tmp)
		return 0, [32]byte{}, err
	}
	return n, [32]byte(h.Sum(nil)), nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return err
	}
	return nil
}

// freeSpace is the bytes available to this user on dir's filesystem; tests
// replace it.
var freeSpace = func(dir string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return st.Bavail * uint64(st.Bsize), nil
}
