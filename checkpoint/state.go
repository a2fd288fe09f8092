package checkpoint

import (
	"crypto/sha256"
	"encoding"
	"encoding/binary"
	"fmt"
	"unsafe"

	"gorgonia.org/tensor"
)

// State names what a checkpoint holds. Register everything once, before the
// training loop, in the same order on every rank:
//
//	st := new(checkpoint.State).
//		Tensor("w", w).Tensor("adam.m", m).Tensor("adam.v", v). // replicated, sharded on save
//		Binary("rng", pcg).                                  // per-rank
//		Int64("epoch", &epoch)                               // per-rank
//
// Tensors are replicated data-parallel state (parameters, optimizer moments):
// every rank holds the same values, and a save splits them into one shard per
// rank. Blobs are per-rank state (RNG state, data-loader position): each rank
// writes its own, and gets its own back on restore.
type State struct {
	tensors []tensorEntry
	blobs   []blobEntry
	err     error
}

type tensorEntry struct {
	name  string
	buf   any // what the caller registered, passed to collective.Broadcast
	dtype string
	shape []int
	bytes []byte // the tensor's memory, no copy
}

type blobEntry struct {
	name string
	save func() ([]byte, error)
	load func([]byte) error
}

// Tensor registers replicated state: a []float32, []float64, []int32,
// []int64 or a contiguous *tensor.Dense of those dtypes. The checkpoint
// reads and restores its memory in place, so register the buffer the
// training loop updates.
func (s *State) Tensor(name string, buf any) *State {
	e, err := tensorOf(name, buf)
	if err != nil {
		s.fail(err)
		return s
	}
	for _, o := range s.tensors {
		if o.name == name {
			s.fail(fmt.Errorf("checkpoint: tensor %q registered twice", name))
		}
	}
	s.tensors = append(s.tensors, e)
	return s
}

// Blob registers per-rank state through a pair of functions: save returns
// the bytes to keep, load gets them back on restore.
func (s *State) Blob(name string, save func() ([]byte, error), load func([]byte) error) *State {
	if save == nil || load == nil {
		s.fail(fmt.Errorf("checkpoint: blob %q needs both a save and a load function", name))
		return s
	}
	for _, o := range s.blobs {
		if o.name == name {
			s.fail(fmt.Errorf("checkpoint: blob %q registered twice", name))
		}
	}
	s.blobs = append(s.blobs, blobEntry{name, save, load})
	return s
}

// BinaryState is state that marshals itself, such as math/rand/v2's *PCG and
// *ChaCha8.
type BinaryState interface {
	encoding.BinaryMarshaler
	encoding.BinaryUnmarshaler
}

// Binary registers per-rank state that marshals itself (an RNG).
func (s *State) Binary(name string, v BinaryState) *State {
	return s.Blob(name, v.MarshalBinary, v.UnmarshalBinary)
}

// Int64 registers a per-rank counter (data-loader position, epoch).
func (s *State) Int64(name string, p *int64) *State {
	return s.Blob(name, func() ([]byte, error) {
		return binary.LittleEndian.AppendUint64(nil, uint64(*p)), nil
	}, func(b []byte) error {
		if len(b) != 8 {
			return fmt.Errorf("checkpoint: blob %q holds %d bytes, want 8", name, len(b))
		}
		*p = int64(binary.LittleEndian.Uint64(b))
		return nil
	})
}

func (s *State) fail(err error) {
	if s.err == nil {
		s.err = err
	}
}

// totalBytes is the size of the concatenated tensors.
func (s *State) totalBytes() int64 {
	var n int64
	for _, t := range s.tensors {
		n += int64(len(t.bytes))
	}
	return n
}

// layoutHash fingerprints the registered tensors and blob names, so ranks
// that registered different state fail the save together.
func (s *State) layoutHash() [32]byte {
	h := sha256.New()
	for _, t := range s.tensors {
		fmt.Fprintf(h, "t %q %s %v\n", t.name, t.dtype, t.shape)
	}
	for _, b := range s.blobs {
		fmt.Fprintf(h, "b %q\n", b.name)
	}
	var out [32]byte
	h.Sum(out[:0])
	return out
}

func bytesOf[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var zero T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(zero)))
}

func tensorOf(name string, buf any) (tensorEntry, error) {
	e := tensorEntry{name: name, buf: buf}
	switch b := buf.(type) {
	case []float32:
		e.dtype, e.shape, e.bytes = "float32", []int{len(b)}, bytesOf(b)
	case []float64:
		e.dtype, e.shape, e.bytes = "float64", []int{len(b)}, bytesOf(b)
	case []int32:
		e.dtype, e.shape, e.bytes = "int32", []int{len(b)}, bytesOf(b)
	case []int64:
		e.dtype, e.shape, e.bytes = "int64", []int{len(b)}, bytesOf(b)
	case *tensor.Dense:
		if b == nil {
			return e, fmt.Errorf("checkpoint: tensor %q is a nil *tensor.Dense", name)
		}
		if b.RequiresIterator() {
			return e, fmt.Errorf("checkpoint: tensor %q of shape %v is a non-contiguous view: call Materialize() first", name, b.Shape())
		}
		inner, err := tensorOf(name, b.Data())
		if err != nil {
			return e, fmt.Errorf("checkpoint: tensor %q: dtype %v is not supported: use float32, float64, int32 or int64", name, b.Dtype())
		}
		e.dtype, e.shape, e.bytes = inner.dtype, append([]int(nil), b.Shape()...), inner.bytes
	default:
		return e, fmt.Errorf("checkpoint: tensor %q: type %T is not supported: use []float32, []float64, []int32, []int64 or *tensor.Dense", name, buf)
	}
	return e, nil
}

// encodeBlobs frames this rank's blobs: for each, a uint32 name length, the
// name, a uint64 data length and the data (little-endian).
func (s *State) encodeBlobs() ([]byte, error) {
	var out []byte
	for _, b := range s.blobs {
		data, err := b.save()
		if err != nil {
			return nil, fmt.Errorf("checkpoint: saving blob %q: %w", b.name, err)
		}
		out = binary.LittleEndian.AppendUint32(out, uint32(len(b.name)))
		out = append(out, b.name...)
		out = binary.LittleEndian.AppendUint64(out, uint64(len(data)))
		out = append(out, data...)
	}
	return out, nil
}

func decodeBlobs(data []byte) (map[string][]byte, error) {
	m := map[string][]byte{}
	for len(data) > 0 {
		if len(data) < 4 {
			return nil, fmt.Errorf("blob file is truncated")
		}
		n := int(binary.LittleEndian.Uint32(data))
		data = data[4:]
		if len(data) < n+8 {
			return nil, fmt.Errorf("blob file is truncated")
		}
		name := string(data[:n])
		l := binary.LittleEndian.Uint64(data[n:])
		data = data[n+8:]
		if uint64(len(data)) < l {
			return nil, fmt.Errorf("blob file is truncated in blob %q", name)
		}
		m[name] = data[:l]
		data = data[l:]
	}
	return m, nil
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
