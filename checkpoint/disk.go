package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// ManifestName is the file whose presence commits a checkpoint.
const ManifestName = "manifest.json"

// Format is the version of the on-disk layout.
const Format = 1

// Manifest describes one committed checkpoint. The lowest rank of every
// storage domain writes it last, in that domain.
type Manifest struct {
	Format     int          `json:"format"`
	Step       int64        `json:"step"`
	WorldSize  int          `json:"world_size"`
	ByteOrder  string       `json:"byte_order"`
	TotalBytes int64        `json:"tensor_bytes"` // of the tensors, concatenated in order
	Tensors    []TensorInfo `json:"tensors"`
	Shards     []FileInfo   `json:"shards"` // rank r wrote bytes [Offset, Offset+Size) of the concatenation
	Blobs      []FileInfo   `json:"blobs"`  // rank r's per-rank state
}

// TensorInfo is one replicated tensor in a checkpoint.
type TensorInfo struct {
	Name   string `json:"name"`
	DType  string `json:"dtype"`
	Shape  []int  `json:"shape"`
	Offset int64  `json:"offset"`
	Bytes  int64  `json:"bytes"`
}

// FileInfo is one file of a checkpoint.
type FileInfo struct {
	Rank   int      `json:"rank"`
	File   string   `json:"file"`
	Offset int64    `json:"offset,omitempty"`
	Size   int64    `json:"size"`
	SHA256 string   `json:"sha256"`
	Blobs  []string `json:"blob_names,omitempty"`
}

// Size is the checkpoint's size on disk, without the manifest.
func (m *Manifest) Size() int64 {
	var n int64
	for _, f := range append(append([]FileInfo(nil), m.Shards...), m.Blobs...) {
		n += f.Size
	}
	return n
}

// StepDir is the directory of the checkpoint of step under dir.
func StepDir(dir string, step int64) string {
	return filepath.Join(dir, fmt.Sprintf("step-%012d", step))
}

func shardName(rank, n int) string { return fmt.Sprintf("shard-%05d-of-%05d.bin", rank, n) }
func blobName(rank int) string     { return fmt.Sprintf("rank-%05d.state", rank) }

// Entry is one checkpoint directory found by Scan.
type Entry struct {
	Step      int64
	Dir       string
	Committed bool      // manifest.json exists
	Manifest  *Manifest // nil when not committed or unreadable
	Problem   string    // why it cannot be restored; "" when it verified
}

// Report is what Scan found in a checkpoint directory.
type Report struct {
	Entries []Entry // newest first
	Pick    int64   // the step a restore would load; -1 for none
	Reason  string  // why that one
}

// listSteps returns the checkpoints under dir, newest first: storeSteps
// over a DirStore (a directory that does not exist holds none).
func listSteps(dir string) ([]Entry, error) {
	return storeSteps(context.Background(), DirStore(dir))
}

// Scan lists the checkpoints under dir and verifies every committed one
// (manifest, file sizes, sha256), newest first, and says which one a restore
// would pick: the newest committed checkpoint that verifies. A directory
// without checkpoints is an empty report; a dir that does not exist or is
// not a directory is an error (Restore, by contrast, starts fresh there: a
// new job's directory need not exist yet, but a path given to look at
// checkpoints that is not there is most likely mistyped).
//
// dir may also be an s3:// location; the bucket must then exist.
func Scan(dir string) (*Report, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	var s Store = DirStore(dir)
	if IsRemote(dir) {
		s3, err := openS3(ctx, dir)
		if err != nil {
			return nil, err
		}
		s = s3
	} else if err := checkScanDir(dir); err != nil {
		return nil, err
	}
	entries, err := storeSteps(ctx, s)
	if err != nil {
		return nil, err
	}
	return scanEntries(entries, func(e *Entry) (*Manifest, error) { return storeVerify(ctx, s, e.Step, nil) }), nil
}

// checkScanDir rejects a path that is not an existing directory.
func checkScanDir(dir string) error {
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("checkpoint: %s does not exist: give the directory the job was given (checkpoint.New, --checkpoint-dir)", dir)
	case err != nil:
		return fmt.Errorf("checkpoint: %w", err)
	case !st.IsDir():
		return fmt.Errorf("checkpoint: %s is not a directory: give the directory the job was given (checkpoint.New, --checkpoint-dir)", dir)
	}
	return nil
}

func scanEntries(entries []Entry, check func(*Entry) (*Manifest, error)) *Report {
	r := &Report{Entries: entries, Pick: -1}
	var skipped []string
	for i := range r.Entries {
		e := &r.Entries[i]
		if !e.Committed {
			e.Problem = "not committed (no " + ManifestName + "): a save that did not finish, or a deletion in progress"
			continue
		}
		m, err := check(e)
		e.Manifest = m
		if err != nil {
			e.Problem = "corrupted: " + err.Error()
		}
		if e.Problem == "" && r.Pick < 0 {
			r.Pick = e.Step
			if len(skipped) == 0 {
				r.Reason = fmt.Sprintf("step %d is the newest committed checkpoint and its checksums verify", e.Step)
			} else {
				r.Reason = fmt.Sprintf("step %d is the newest committed checkpoint that verifies (skipped: %s)", e.Step, strings.Join(skipped, "; "))
			}
		} else if e.Problem != "" && r.Pick < 0 && e.Committed {
			skipped = append(skipped, fmt.Sprintf("step %d %s", e.Step, e.Problem))
		}
	}
	if r.Pick < 0 {
		switch {
		case len(skipped) > 0:
			r.Reason = "no committed checkpoint verifies: " + strings.Join(skipped, "; ")
		default:
			r.Reason = "no committed checkpoint: a restore starts fresh"
		}
	}
	return r
}

// parseManifest decodes and sanity-checks a manifest.
func parseManifest(data []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s is not valid JSON: %v", ManifestName, err)
	}
	if m.Format != Format {
		return &m, fmt.Errorf("%s has format %d, this gorun reads format %d", ManifestName, m.Format, Format)
	}
	if m.WorldSize < 1 || len(m.Shards) != m.WorldSize || len(m.Blobs) != m.WorldSize {
		return &m, fmt.Errorf("%s lists %d shards and %d blob files for world size %d", ManifestName, len(m.Shards), len(m.Blobs), m.WorldSize)
	}
	var off int64
	for _, s := range m.Shards {
		if s.Offset != off {
			return &m, fmt.Errorf("%s: shard of rank %d starts at byte %d, want %d", ManifestName, s.Rank, s.Offset, off)
		}
		off += s.Size
	}
	if off != m.TotalBytes {
		return &m, fmt.Errorf("%s: shards cover %d bytes, tensors hold %d", ManifestName, off, m.TotalBytes)
	}
	return &m, nil
}

var errSkip = errors.New("skip")

type sliceWriter struct {
	buf []byte
	n   int
}

func (w *sliceWriter) Write(p []byte) (int, error) {
	n := copy(w.buf[w.n:], p)
	w.n += n
	if n < len(p) {
		return n, io.ErrShortWrite
	}
	return n, nil
}

// checkStream copies a file of size bytes from r into w, checking its size
// and sha256 against f.
func checkStream(f FileInfo, r io.Reader, size int64, w io.Writer) error {
	if size != f.Size {
		return fmt.Errorf("%s is %d bytes, manifest says %d (truncated or overwritten)", f.File, size, f.Size)
	}
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(h, w), r); err != nil {
		return fmt.Errorf("%s: %v", f.File, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != f.SHA256 {
		return fmt.Errorf("%s has sha256 %s, manifest says %s (bit rot or a torn write)", f.File, got[:16], short(f.SHA256))
	}
	return nil
}

func short(s string) string {
	if len(s) > 16 {
		return s[:16]
	}
	return s
}

// writeDurable writes the chunks to dir/name through a temporary name:
// write, fsync, rename, and with syncD, fsync the directory (callers that
// write several files sync it once after the last). It returns the size and
// sha256.
func writeDurable(dir, name string, syncD bool, chunks ...[]byte) (int64, string, error) {
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return 0, "", err
	}
	h := sha256.New()
	var n int64
	err = func() error {
		for _, c := range chunks {
			if _, err := f.Write(c); err != nil {
				return err
			}
			h.Write(c)
			n += int64(len(c))
		}
		return f.Sync()
	}()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err == nil && syncD {
		err = syncDir(dir)
	}
	if err != nil {
		os.Remove(tmp)
		return 0, "", err
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}

var _ hash.Hash = sha256.New()

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
