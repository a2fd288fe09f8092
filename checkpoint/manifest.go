package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"path/filepath"
	"slices"
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
