package ring

import (
	"bytes"
	"errors"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	h := Header{Kind: ReduceScatter, Op: Avg, DType: Int64, Seq: 1<<63 + 5, Count: 1 << 40, Offset: 12345,
		Root: 0, Sender: 6, Step: 11, Chunk: 3, Length: 1 << 20}
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
	for _, i := range []int{5, 6, 7, 52} { // kind, op, dtype, reserved
		c := bytes.Clone(b)
		c[i] = 0xff
		if _, err := DecodeHeader(c); err == nil {
			t.Errorf("corrupt byte %d accepted", i)
		}
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
