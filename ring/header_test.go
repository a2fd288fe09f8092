package ring

import (
	"bytes"
	"errors"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	h := Header{Kind: ReduceScatter, Op: Avg, DType: Int64, Seq: 1<<63 + 5, Count: 1 << 40, Offset: 12345,
		Root: 0, Sender: 6, Step: 11, Chunk: 3, Length: 1 << 20, Epoch: 0xabcdef}
	b := make([]byte, HeaderSize)
	EncodeHeader(b, &h)
	if string(b[:4]) != "GRNG" {
		t.Fatalf("magic bytes %q", b[:4])
	}
	got, err := DecodeHeader(b)
	if err != nil || got != h {
		t.Fatalf("got %+v, %v", got, err)
	}
	if _, err := DecodeHeader(b[:HeaderSize-1]); !errors.Is(err, ErrShortHeader) {
		t.Fatalf("short: %v", err)
	}
	if b[53] != 0xef || b[54] != 0xcd || b[55] != 0xab {
		t.Fatalf("epoch bytes %x, want ef cd ab (little endian, 24 bits)", b[53:56])
	}
	for _, i := range []int{5, 6, 7, 52} { // kind, op, dtype, codec
		c := bytes.Clone(b)
		c[i] = 0xff
		if _, err := DecodeHeader(c); err == nil {
			t.Errorf("corrupt byte %d accepted", i)
		}
	}
}

// An epoch-0 header is byte for byte what was sent before epochs existed:
// bytes 53-55 zero.
func TestHeaderEpochZeroUnchanged(t *testing.T) {
	b := make([]byte, HeaderSize)
	EncodeHeader(b, &Header{Kind: Allreduce, Op: Sum, DType: Float32, Seq: 9, Count: 10, Codec: "int8"})
	if b[52] != 3 || b[53] != 0 || b[54] != 0 || b[55] != 0 {
		t.Fatalf("codec/epoch bytes %x, want 03 00 00 00", b[52:56])
	}
	if EpochOf(1<<24+5) != 5 || EpochOf(MaxEpoch) != MaxEpoch {
		t.Fatalf("EpochOf does not wrap at 24 bits")
	}
	if _, err := New(Config{Rank: 0, Size: 1, Epoch: MaxEpoch + 1, Elastic: true}, nil); err == nil {
		t.Fatal("an epoch beyond 24 bits was accepted")
	}
}

// FuzzDecodeHeader: DecodeHeader must never panic, and whatever it accepts
// must re-encode to the same bytes.
func FuzzDecodeHeader(f *testing.F) {
	b := make([]byte, HeaderSize)
	EncodeHeader(b, &Header{Kind: Allreduce, Op: Sum, DType: Float32, Seq: 17, Count: 1000, Sender: 1, Step: 2, Chunk: 3, Offset: 40, Length: 160})
	f.Add(b)
	f.Add(b[:10])
	f.Add([]byte{})
	f.Add(append(bytes.Clone(b), 1, 2, 3))
	e := make([]byte, HeaderSize)
	EncodeHeader(e, &Header{Kind: Shift, DType: Uint8, Seq: 3, Count: 64, Sender: 2, Length: 64, Epoch: 77})
	f.Add(e)
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := DecodeHeader(data)
		if err != nil {
			return
		}
		out := make([]byte, HeaderSize)
		EncodeHeader(out, &h)
		if !bytes.Equal(out, data[:HeaderSize]) {
			t.Fatalf("round trip mismatch:\n%x\n%x", out, data[:HeaderSize])
		}
		_ = h.Call().String()
	})
}
