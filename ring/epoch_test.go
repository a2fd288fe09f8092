package ring

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// A ring refuses a message of another membership epoch, whatever the
// schedule: ring steps (pipelined and sequential) and the direct gather of
// a tiny allreduce over a Mesh. Rank 1 plays a peer still on the ring of
// epoch 3 and sends a header with the right fingerprint; rank 0, in epoch
// 4, must refuse it before reading any payload.
func TestOldEpochRefused(t *testing.T) {
	for _, count := range []int{1 << 16, 2048, 16} { // pipelined, sequential, tiny
		ts := NewMemRing(2)
		r0, err := New(Config{Rank: 0, Size: 2, Epoch: 4, Elastic: true}, ts[0])
		if err != nil {
			t.Fatal(err)
		}
		call := Call{Seq: 1, Kind: Allreduce, Op: Sum, DType: Float32, Count: count}
		hdr := make([]byte, HeaderSize)
		EncodeHeader(hdr, &Header{Kind: Allreduce, Op: Sum, DType: Float32, Seq: 1, Count: uint64(count), Sender: 1, Epoch: 3, Length: 64})
		if err := ts[1].(*MemTransport).SendTo(testCtx(t), 0, hdr); err != nil {
			t.Fatal(err)
		}
		err = r0.Allreduce(testCtx(t), call, make([]byte, count*4))
		var ee *EpochError
		if !errors.As(err, &ee) || ee.Remote != 3 || ee.Local != 4 || ee.From != 1 || ee.Rank != 0 {
			t.Fatalf("count %d: got %v, want an *EpochError from rank 1 of epoch 3", count, err)
		}
		if !strings.Contains(err.Error(), "message from rank 1 of membership epoch 3, this ring is in epoch 4") {
			t.Errorf("count %d: unclear error: %v", count, err)
		}
	}
	// Rings of the same epoch work as always.
	const n = 3
	ts := NewMemRing(n)
	rs := make([]*Ring, n)
	for i := range rs {
		var err error
		if rs[i], err = New(Config{Rank: i, Size: n, Epoch: 7, Elastic: true}, ts[i]); err != nil {
			t.Fatal(err)
		}
	}
	ctx := testCtx(t)
	mustAll(t, parallel(n, func(i int) error {
		return rs[i].Allreduce(ctx, Call{Seq: 1, Op: Sum, DType: Float32, Count: 1 << 16}, make([]byte, 4<<16))
	}))
}

// Shift moves every rank's buffer to the next rank, pipelined for large
// buffers and sequential for small ones, and is a copy on one rank.
func TestShift(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5} {
		for _, count := range []int{0, 7, 300_000} {
			rs, _ := newRings(t, n, 4096)
			ctx := testCtx(t)
			outs := make([][]byte, n)
			mustAll(t, parallel(n, func(i int) error {
				in := bytes.Repeat([]byte{byte(i + 1)}, count)
				outs[i] = make([]byte, count)
				return rs[i].Shift(ctx, Call{Seq: 1, DType: Uint8, Count: count}, in, outs[i])
			}))
			for i := range n {
				want := bytes.Repeat([]byte{byte((i+n-1)%n + 1)}, count)
				if !bytes.Equal(outs[i], want) {
					t.Fatalf("n=%d count=%d: rank %d did not receive rank %d's bytes", n, count, i, (i+n-1)%n)
				}
			}
		}
	}
}

// A ring that is not elastic (a fixed-size job, epoch 0) has no epochs:
// nonzero bytes 53-55 are the reserved field of the format before epochs,
// and the error says so, not that a newer membership exists.
func TestFixedRingReservedField(t *testing.T) {
	for _, count := range []int{1 << 16, 2048, 16} { // pipelined, sequential, tiny
		ts := NewMemRing(2)
		r0, err := New(Config{Rank: 0, Size: 2}, ts[0])
		if err != nil {
			t.Fatal(err)
		}
		hdr := make([]byte, HeaderSize)
		EncodeHeader(hdr, &Header{Kind: Allreduce, Op: Sum, DType: Float32, Seq: 1, Count: uint64(count), Sender: 1, Epoch: 5, Length: 64})
		if err := ts[1].(*MemTransport).SendTo(testCtx(t), 0, hdr); err != nil {
			t.Fatal(err)
		}
		err = r0.Allreduce(testCtx(t), Call{Seq: 1, Kind: Allreduce, Op: Sum, DType: Float32, Count: count}, make([]byte, count*4))
		var ee *EpochError
		if !errors.Is(err, ErrReservedHeader) || errors.As(err, &ee) || strings.Contains(err.Error(), "membership") {
			t.Fatalf("count %d: got %v, want the nonzero reserved header field error", count, err)
		}
	}
	if _, err := New(Config{Rank: 0, Size: 1, Epoch: 3}, nil); err == nil {
		t.Fatal("a nonzero epoch on a ring that is not elastic was accepted")
	}
}
