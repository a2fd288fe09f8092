package ring

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Wire format of a message: a HeaderSize-byte header followed by Length
// payload bytes. All header fields are little endian:
//
//	off size field
//	  0    4 magic "GRNG" (0x474e5247 as a little-endian uint32)
//	  4    1 version (HeaderVersion)
//	  5    1 kind
//	  6    1 op      (0 unless Allreduce/ReduceScatter)
//	  7    1 dtype   (0 for Barrier)
//	  8    8 seq
//	 16    8 count   (elements of the sender's input buffer)
//	 24    8 offset  (element offset of the payload within the collective's
//	                  segment space: the buffer for Allreduce/Broadcast,
//	                  the input for ReduceScatter, the output for Allgather)
//	 32    4 root    (0 unless Broadcast)
//	 36    4 sender rank
//	 40    4 step
//	 44    4 chunk index within the segment
//	 48    4 payload length in bytes
//	 52    1 codec   (low 4 bits: 0 none, 1 fp16, 2 bf16, 3 int8;
//	                  Allreduce only) and algorithm (high 4 bits:
//	                  Algorithm; 0, the ring, keeps the bytes of the
//	                  format before algorithms)
//	 53    3 epoch   (24 bits: the membership epoch of the sender's Ring,
//	                  Config.Epoch; 0 in a fixed-size job, so its bytes are
//	                  those of the format before epochs, when these three
//	                  bytes were reserved and zero)
//
// The payload is the raw in-memory representation of the elements, which is
// little endian on every platform Go targets for this project (amd64, arm64).
const (
	HeaderSize    = 56
	HeaderVersion = 1
	headerMagic   = 0x474e5247 // "GRNG"
)

// Header is the decoded form of a message header.
type Header struct {
	Kind   Kind
	Op     Op
	DType  DType
	Seq    uint64
	Count  uint64
	Offset uint64 // element offset of the payload
	Root   uint32
	Sender uint32
	Step   uint32
	Chunk  uint32
	Length uint32 // payload bytes following the header
	Codec  string // "" (none), "fp16", "bf16" or "int8"
	Algo   Algorithm
	// Epoch is the membership epoch of the sender (24 bits, see MaxEpoch):
	// a receiver refuses a message of another epoch.
	Epoch uint32
}

// MaxEpoch is the largest epoch a header carries (24 bits). Config.Epoch
// above it is refused; callers with longer-lived generations wrap them
// (EpochOf).
const MaxEpoch = 1<<24 - 1

// EpochOf maps a membership generation number to the 24 bits the header
// carries. Epochs that wrap around are 16 million reconfigurations apart,
// and the links of an old epoch are long closed by then.
func EpochOf(generation int) uint32 { return uint32(generation) & MaxEpoch }

// codecIDs are the wire numbers of Call.Codec.
var codecIDs = []string{"", "fp16", "bf16", "int8"}

func codecID(name string) byte {
	for i, n := range codecIDs {
		if n == name {
			return byte(i)
		}
	}
	return 0
}

// Call returns the call fingerprint carried by h (Name is empty).
func (h *Header) Call() Call {
	return Call{Kind: h.Kind, Seq: h.Seq, Op: h.Op, DType: h.DType, Count: int(h.Count), Root: int(h.Root), Codec: h.Codec, Algo: h.Algo}
}

// ErrReservedHeader is the error of a ring that is not elastic (a
// fixed-size job) for a message whose epoch bytes (53-55) are not zero:
// for it they are the reserved field of the format before epochs.
var ErrReservedHeader = errors.New("ring: nonzero reserved header field")

// ErrShortHeader is returned by DecodeHeader for fewer than HeaderSize bytes.
var ErrShortHeader = errors.New("ring: short header")

// EncodeHeader writes h into dst[:HeaderSize]. It panics if dst is shorter.
func EncodeHeader(dst []byte, h *Header) {
	_ = dst[HeaderSize-1]
	le := binary.LittleEndian
	le.PutUint32(dst[0:], headerMagic)
	dst[4] = HeaderVersion
	dst[5] = byte(h.Kind)
	dst[6] = byte(h.Op)
	dst[7] = byte(h.DType)
	le.PutUint64(dst[8:], h.Seq)
	le.PutUint64(dst[16:], h.Count)
	le.PutUint64(dst[24:], h.Offset)
	le.PutUint32(dst[32:], h.Root)
	le.PutUint32(dst[36:], h.Sender)
	le.PutUint32(dst[40:], h.Step)
	le.PutUint32(dst[44:], h.Chunk)
	le.PutUint32(dst[48:], h.Length)
	dst[52] = codecID(h.Codec) | byte(h.Algo)<<4
	dst[53] = byte(h.Epoch)
	dst[54] = byte(h.Epoch >> 8)
	dst[55] = byte(h.Epoch >> 16)
}

// DecodeHeader parses src[:HeaderSize]. It checks the magic, the version,
// that kind/op/dtype/codec are known values and that counts fit in an int;
// it never panics. EncodeHeader keeps only the low 24 bits of Epoch. Checking the header against the expected
// call and position is the receiver's job.
func DecodeHeader(src []byte) (Header, error) {
	if len(src) < HeaderSize {
		return Header{}, ErrShortHeader
	}
	le := binary.LittleEndian
	if m := le.Uint32(src[0:]); m != headerMagic {
		return Header{}, fmt.Errorf("ring: bad header magic %#08x", m)
	}
	if v := src[4]; v != HeaderVersion {
		return Header{}, fmt.Errorf("ring: unsupported header version %d (want %d)", v, HeaderVersion)
	}
	h := Header{
		Kind:   Kind(src[5]),
		Op:     Op(src[6]),
		DType:  DType(src[7]),
		Seq:    le.Uint64(src[8:]),
		Count:  le.Uint64(src[16:]),
		Offset: le.Uint64(src[24:]),
		Root:   le.Uint32(src[32:]),
		Sender: le.Uint32(src[36:]),
		Step:   le.Uint32(src[40:]),
		Chunk:  le.Uint32(src[44:]),
		Length: le.Uint32(src[48:]),
		Epoch:  uint32(src[53]) | uint32(src[54])<<8 | uint32(src[55])<<16,
	}
	switch {
	case int(src[52]&15) >= len(codecIDs):
		return Header{}, fmt.Errorf("ring: bad header codec %d", src[52]&15)
	case !Algorithm(src[52] >> 4).valid():
		return Header{}, fmt.Errorf("ring: bad header algorithm %d", src[52]>>4)
	case !h.Kind.valid():
		return Header{}, fmt.Errorf("ring: bad header kind %d", src[5])
	case h.Op > maxOp:
		return Header{}, fmt.Errorf("ring: bad header op %d", src[6])
	case h.DType > maxDType:
		return Header{}, fmt.Errorf("ring: bad header dtype %d", src[7])
	case h.Count > maxInt32or64 || h.Offset > maxInt32or64:
		return Header{}, fmt.Errorf("ring: header count %d / offset %d out of range", h.Count, h.Offset)
	case h.Root > maxRoot:
		return Header{}, fmt.Errorf("ring: header root %d out of range", h.Root)
	}
	h.Codec = codecIDs[src[52]&15]
	h.Algo = Algorithm(src[52] >> 4)
	return h, nil
}

const (
	maxInt32or64 = uint64(^uint(0) >> 1) // math.MaxInt for this platform
	maxRoot      = 1<<31 - 1
)
