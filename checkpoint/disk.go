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
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
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

	// The placement of a replicated checkpoint (several storage domains:
	// hosts with their own directories). Hosts is the number of domains,
	// Replicas how many domains besides a rank's own keep its files, and
	// Host the domain whose directory holds this copy of the manifest
	// (domains are numbered from 0 in the order of their lowest rank);
	// FileInfo.Hosts lists the domains that keep each file. A manifest
	// without them (Hosts 0: one domain, or a checkpoint written before
	// they existed) means that every file is in this manifest's directory.
	Hosts    int `json:"hosts,omitempty"`
	Replicas int `json:"replicas,omitempty"`
	Host     int `json:"host,omitempty"`
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
	Hosts  []int    `json:"hosts,omitempty"` // the storage domains that keep the file (see Manifest.Hosts)
}

// Files returns the checkpoint's files: the shards, then the blob files.
func (m *Manifest) Files() []FileInfo {
	return append(append(make([]FileInfo, 0, len(m.Shards)+len(m.Blobs)), m.Shards...), m.Blobs...)
}

// Size is the checkpoint's size on disk, one copy of every file, without
// the manifest.
func (m *Manifest) Size() int64 {
	var n int64
	for _, f := range m.Files() {
		n += f.Size
	}
	return n
}

// Replicated reports whether the checkpoint is spread over the directories
// of several storage domains (hosts), each holding some of its files.
func (m *Manifest) Replicated() bool { return m.Hosts > 1 }

// Holds reports whether the directory of this copy of the manifest should
// hold f: always, unless the checkpoint is replicated and f is kept by
// other hosts only.
func (m *Manifest) Holds(f FileInfo) bool {
	return !m.Replicated() || len(f.Hosts) == 0 || slices.Contains(f.Hosts, m.Host)
}

// Here is what the directory of this copy of the manifest should hold: its
// number of files and their bytes (every file unless Replicated).
func (m *Manifest) Here() (files int, bytes int64) {
	for _, f := range m.Files() {
		if m.Holds(f) {
			files++
			bytes += f.Size
		}
	}
	return files, bytes
}

// Placement describes a replicated checkpoint's layout from this copy of
// the manifest: "host 1 of 3; each file is on 2 hosts"; "" when it is not
// replicated.
func (m *Manifest) Placement() string {
	if !m.Replicated() {
		return ""
	}
	lo, hi := -1, -1
	for _, f := range m.Files() {
		c := len(f.Hosts)
		if lo < 0 || c < lo {
			lo = c
		}
		hi = max(hi, c)
	}
	copies := fmt.Sprintf("each file is on %d hosts", lo)
	switch {
	case lo != hi:
		copies = fmt.Sprintf("each file is on %d to %d hosts", lo, hi)
	case lo == 1:
		copies = "each file is on 1 host"
	}
	return fmt.Sprintf("host %d of %d; %s", m.Host, m.Hosts, copies)
}

// StepDir is the directory of the checkpoint of step under the directory
// dir. It is for directories only: filepath.Join would turn an s3://
// location into "s3:/..."; Manager.StepLocation names a step in either.
func StepDir(dir string, step int64) string {
	return filepath.Join(dir, stepKey(step))
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
	// Degraded says which files of a replicated checkpoint this directory
	// should hold but lacks or holds damaged, while other hosts should
	// hold intact copies: a restore reads them from there and writes them
	// back here. "" when every file this directory should hold verified.
	Degraded string
}

// Report is what Scan found in a checkpoint directory.
type Report struct {
	Entries []Entry // newest first
	Pick    int64   // the step a restore would load; -1 for none
	Reason  string  // why that one
}

// Scan lists the checkpoints under dir and verifies every committed one
// (manifest, file sizes, sha256), newest first, and says which one a restore
// would pick: the newest committed checkpoint that verifies. A directory
// without checkpoints is an empty report; a dir that does not exist or is
// not a directory is an error (Restore, by contrast, starts fresh there: a
// new job's directory need not exist yet, but a path given to look at
// checkpoints that is not there is most likely mistyped).
//
// In a replicated checkpoint (Manifest.Replicated: each host's directory
// holds some of the files) Scan checks the files this directory should
// hold (Manifest.Holds). One of them missing or damaged here while other
// hosts should hold copies makes the entry Degraded, not corrupted: a
// restore reads it from another host and writes it back here. Only a file
// that no other host should hold makes it corrupted.
//
// dir may also be an s3:// location; the bucket must then exist. "{host}"
// in a directory is expanded as New expands it (ExpandHost).
func Scan(dir string) (*Report, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	s, err := openExisting(ctx, dir)
	if err != nil {
		return nil, err
	}
	entries, err := storeSteps(ctx, s)
	if err != nil {
		return nil, pkgErr(err)
	}
	return scanEntries(entries, func(e *Entry) error { return storeCheckHere(ctx, s, e) }), nil
}

// storeCheckHere reads e's manifest and verifies the files this location
// should hold, setting e.Manifest and e.Degraded; the error is why the
// step cannot be restored.
func storeCheckHere(ctx context.Context, s Store, e *Entry) error {
	m, err := storeReadManifest(ctx, s, e.Step)
	e.Manifest = m
	if err != nil {
		return err
	}
	var heal, damaged []string
	for _, f := range m.Files() {
		if !m.Holds(f) {
			continue
		}
		err := storeCheckFile(ctx, s, e.Step, f, io.Discard)
		if err == nil {
			continue
		}
		others := slices.DeleteFunc(slices.Clone(f.Hosts), func(h int) bool { return h == m.Host })
		if !m.Replicated() || len(others) == 0 {
			return err
		}
		what := err.Error()
		if errors.Is(err, fs.ErrNotExist) {
			what = f.File + " is missing here"
		}
		also := map[bool]string{true: "keeps it", false: "keep it"}[len(others) == 1]
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, errWrongSize) {
			heal = append(heal, fmt.Sprintf("%s (%s also %s)", what, hostList(others), also))
		} else {
			damaged = append(damaged, fmt.Sprintf("%s (%s also %s)", what, hostList(others), also))
		}
	}
	var parts []string
	if len(heal) > 0 {
		it := map[bool]string{true: "it", false: "them"}[len(heal) == 1]
		parts = append(parts, fmt.Sprintf("%s; the next restore reads %s from another host and writes %s back here", strings.Join(heal, "; "), it, it))
	}
	if len(damaged) > 0 {
		parts = append(parts, fmt.Sprintf("%s; a restore uses another host's copy (remove this one, and the next restore writes it back here)", strings.Join(damaged, "; ")))
	}
	e.Degraded = strings.Join(parts, "; ")
	return nil
}

// hostList names storage domains: "host 2", "hosts 0 and 2", "hosts 0, 1 and 2".
func hostList(hs []int) string {
	if len(hs) == 1 {
		return fmt.Sprintf("host %d", hs[0])
	}
	parts := make([]string, len(hs))
	for i, h := range hs {
		parts[i] = strconv.Itoa(h)
	}
	return "hosts " + strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
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

func scanEntries(entries []Entry, check func(*Entry) error) *Report {
	r := &Report{Entries: entries, Pick: -1}
	var skipped []string
	for i := range r.Entries {
		e := &r.Entries[i]
		if !e.Committed {
			e.Problem = notCommitted
			continue
		}
		if err := check(e); err != nil {
			e.Problem = "corrupted: " + err.Error()
		}
		if e.Problem == "" && r.Pick < 0 {
			r.Pick = e.Step
			verified := "its checksums verify"
			if e.Degraded != "" {
				verified = "the files this directory holds verify; the ones it lacks or holds damaged are read from other hosts (not checked here)"
			}
			if len(skipped) == 0 {
				r.Reason = fmt.Sprintf("step %d is the newest committed checkpoint and %s", e.Step, verified)
			} else {
				r.Reason = fmt.Sprintf("step %d is the newest committed checkpoint that verifies (skipped: %s)", e.Step, strings.Join(skipped, "; "))
				if e.Degraded != "" {
					r.Reason += "; " + verified
				}
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
	if m.Replicated() {
		if m.Host < 0 || m.Host >= m.Hosts {
			return &m, fmt.Errorf("%s: this copy is said to be on host %d of %d", ManifestName, m.Host, m.Hosts)
		}
		for _, f := range m.Files() {
			if len(f.Hosts) == 0 || slices.ContainsFunc(f.Hosts, func(h int) bool { return h < 0 || h >= m.Hosts }) {
				return &m, fmt.Errorf("%s: %s is placed on hosts %v of %d", ManifestName, f.File, f.Hosts, m.Hosts)
			}
		}
	}
	return &m, nil
}

// errWrongSize is wrapped by the error of a file whose size is not the
// manifest's: a restore treats such a copy as missing (it sees the size
// without reading the file), and writes it again from another host's.
var errWrongSize = errors.New("wrong size")

// checkStream copies a file of size bytes from r into w, checking its size
// and sha256 against f.
func checkStream(f FileInfo, r io.Reader, size int64, w io.Writer) error {
	if size != f.Size {
		return &fileError{fmt.Sprintf("%s is %d bytes, manifest says %d (truncated or overwritten)", f.File, size, f.Size), errWrongSize}
	}
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(h, w), r); err != nil {
		return fmt.Errorf("%s: %v", f.File, err)
	}
	return checkSum(f, h)
}

// checkSum compares the sha256 of a file's bytes, h, with the manifest's.
func checkSum(f FileInfo, h hash.Hash) error {
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

// piece is the most bytes hashed, copied or written in one call. SHA-256,
// CRC-32 and memmove over a whole shard are each one assembly call that
// the scheduler cannot preempt, however big the shard: the background
// writes of in-process ranks would hold every P while the ranks' Polls
// wait for a rank that cannot run. Between pieces the writer yields
// (runtime.Gosched).
const piece = 1 << 20

// hashPieces writes b into h a piece at a time.
func hashPieces(h io.Writer, b []byte) {
	for len(b) > 0 {
		n := min(len(b), piece)
		h.Write(b[:n])
		b = b[n:]
		runtime.Gosched()
	}
}

// copyPieces is copy(dst, src), a piece at a time. It runs on the training
// path (SaveAsync's snapshot), so it does not yield: the pieces only give
// the scheduler a chance to preempt it, and yielding would hand the CPU to
// the background writers while the training loop waits.
func copyPieces(dst, src []byte) int {
	n := 0
	for n < len(dst) && n < len(src) {
		n += copy(dst[n:], src[n:min(len(src), n+piece)])
	}
	return n
}
