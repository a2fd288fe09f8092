package ring

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
	"unsafe"

	"github.com/gorun/gorun/compress"
)

// Compressed allreduce: scatter to owners, reduce once in float32, encode
// once, allgather the same bytes (the scheme of Hivemind and DeepSpeed's
// 1-bit optimizers).
//
// Why not compress the ring: a ring reduce-scatter decodes, adds and
// re-encodes a partial sum at every hop, so the quantization error
// compounds with the number of hops (relative error grows like sqrt(N)).
// Here every value is encoded at most twice, whatever N is:
//
//	1. Split the buffer into N segments as the ring does. For every segment
//	   j != r, rank r adds its error-feedback residual, encodes the
//	   segment once and keeps what the encoding lost as the new residual.
//	2. Scatter, N-1 rounds over the mesh: in round k = 1..N-1 rank r sends
//	   its encoded segment r+k to rank r+k and receives, from rank r-k, that
//	   rank's encoded share of segment r. A send in round k always meets the
//	   receive of round k on the other side, so the exchange cannot
//	   deadlock.
//	3. The owner r sums, in float32 and in the fixed order r, r-1, ...,
//	   r-N+1, its own exact segment and the N-1 decoded shares; divides by N
//	   for Avg; adds its owner residual, encodes the sum once, and keeps the
//	   loss as the owner residual (two-sided error feedback, as 1-bit Adam).
//	4. Allgather, N-1 rounds over the mesh: rank r sends its encoded sum to
//	   every other rank, which decode it. The owner decodes its own bytes
//	   too, so every rank ends with bitwise-identical values.
//
// Traffic per rank: 2 * sum over j != r of EncodedLen(len(segment j)), i.e.
// the ring's 2(N-1)/N * S scaled by the codec's ratio (0.27 for int8 with
// 64-value blocks, 0.5 for fp16/bf16), plus 2(N-1) headers.

// Feedback holds one tensor's error-feedback residuals. Contrib has the
// length of the whole buffer (what this rank's encoded shares lost);
// Owner has the length of the segment this rank owns (what the encoded sum
// lost). A nil Feedback turns error feedback off.
type Feedback struct {
	Contrib []float32
	Owner   []float32
}

// CompressionStats describe one compressed allreduce on this rank.
type CompressionStats struct {
	RawBytes  int     // bytes the uncompressed ring would have sent
	WireBytes int     // payload bytes actually sent
	Clamped   int     // values that did not fit the format and were clamped (fp16)
	RelRMSE   float64 // relative RMS error of this rank's encoded shares against what it meant to send
}

// AllreduceCompressed reduces buf (float32 bytes, c.Count elements) across
// ranks with c.Op (Sum or Avg), compressing with codec. The Transport given
// to New must be a Mesh. fb may be nil; otherwise it is updated in place.
func (r *Ring) AllreduceCompressed(ctx context.Context, c Call, buf []byte, codec compress.Codec, fb *Feedback) (CompressionStats, error) {
	c.Codec = codec.Name()
	c, err := r.begin(Allreduce, c)
	if err != nil {
		return CompressionStats{}, err
	}
	defer r.end()
	if err := checkLen(c, "buffer", buf, c.Count*c.DType.Size()); err != nil {
		return CompressionStats{}, err
	}
	if c.DType != Float32 {
		return CompressionStats{}, fmt.Errorf("ring: %s #%d: compression applies to float32 gradients, not %s", c.Kind, c.Seq, c.DType)
	}
	if c.Op != Sum && c.Op != Avg {
		return CompressionStats{}, fmt.Errorf("ring: %s #%d: compression supports Sum and Avg, not %s", c.Kind, c.Seq, c.Op)
	}
	if fb != nil && (len(fb.Contrib) != c.Count) {
		return CompressionStats{}, fmt.Errorf("ring: %s #%d: feedback residual has %d values, want %d", c.Kind, c.Seq, len(fb.Contrib), c.Count)
	}
	if r.size == 1 { // nothing to send, so nothing to compress
		return CompressionStats{}, nil
	}
	mesh, ok := r.t.(Mesh)
	if !ok {
		return CompressionStats{}, errors.New("ring: compressed allreduce needs a Mesh transport")
	}
	x := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(buf))), c.Count)
	if c.Count == 0 {
		x = nil
	}
	p := r.setup(c, r.size, c.Count, 0)
	_, own := p.segment(r.rank)
	if fb != nil && len(fb.Owner) != own {
		return CompressionStats{}, fmt.Errorf("ring: %s #%d: owner residual has %d values, want %d", c.Kind, c.Seq, len(fb.Owner), own)
	}
	return r.compressed(ctx, mesh, x, codec, fb)
}

// compressedBufs are the scratch buffers of compressed allreduces, kept in
// the Ring and reused from call to call.
type compressedBufs struct {
	enc, gathered, recv, out []byte
	meant, sent, sum, dec    []float32
}

func growF32(b []float32, n int) []float32 {
	if cap(b) >= n {
		return b[:n]
	}
	return make([]float32, n)
}

func growBytes(b []byte, n int) []byte {
	if cap(b) >= n {
		return b[:n]
	}
	return make([]byte, n)
}

// cacheBlock is how many values are encoded, decoded and compared at a
// time: small enough to stay in L1/L2, and a multiple of every codec's
// block (int8 uses 64) so that encoding block by block gives the same
// bytes as encoding the whole segment.
const cacheBlock = 4096

// statsStride samples every statsStride-th value for the error statistic:
// it describes the codec's error well and costs little.
const statsStride = 8

func (r *Ring) compressed(ctx context.Context, mesh Mesh, x []float32, codec compress.Codec, fb *Feedback) (CompressionStats, error) {
	p, n, rank := &r.p, r.size, r.rank
	var st CompressionStats
	cb := &r.cbufs

	// Layout of the encoded shares: segment j at enc[encOff[j]:encOff[j+1]]
	// (empty for our own segment).
	encOff := make([]int, n+1)
	maxSeg := 0
	for j := range n {
		_, cnt := p.segment(j)
		maxSeg = max(maxSeg, cnt)
		encOff[j+1] = encOff[j]
		if j != rank {
			encOff[j+1] += codec.EncodedLen(cnt)
		}
	}
	ownOff, ownLen := p.segment(rank)
	shareLen := codec.EncodedLen(ownLen)
	cb.enc = growBytes(cb.enc, encOff[n])
	cb.gathered = growBytes(cb.gathered, encOff[n])
	cb.recv = growBytes(cb.recv, (n-1)*shareLen) // round k's share at (k-1)*shareLen
	cb.out = growBytes(cb.out, shareLen)
	cb.meant = growF32(cb.meant, cacheBlock)
	cb.sent = growF32(cb.sent, cacheBlock)
	cb.sum = growF32(cb.sum, ownLen)
	cb.dec = growF32(cb.dec, cacheBlock)

	// encodeShare encodes our share of segment j just before it is sent, on
	// the sender goroutine, so encoding overlaps with receiving and summing.
	var sq, sqRef float64
	encodeShare := func(j int) ([]byte, error) {
		off, cnt := p.segment(j)
		seg, dst := x[off:off+cnt], cb.enc[encOff[j]:encOff[j+1]]
		// Block by block, so the values being encoded, decoded and
		// compared stay in cache: one pass over memory instead of four.
		for lo := 0; lo < cnt; lo += cacheBlock {
			hi := min(lo+cacheBlock, cnt)
			meant := seg[lo:hi]
			if fb != nil {
				meant = cb.meant[:hi-lo]
				res := fb.Contrib[off+lo : off+hi]
				for i, v := range seg[lo:hi] {
					meant[i] = v + res[i]
				}
			}
			eb := dst[codec.EncodedLen(lo):codec.EncodedLen(hi)]
			if fe, ok := codec.(compress.FeedbackEncoder); ok && fb != nil {
				// One pass: encode and keep what was lost as the residual.
				res := fb.Contrib[off+lo : off+hi]
				st.Clamped += fe.EncodeFeedback(eb, meant, res).Clamped
				for i := 0; i < len(meant); i += statsStride {
					sq += float64(res[i]) * float64(res[i])
					sqRef += float64(meant[i]) * float64(meant[i])
				}
				continue
			}
			st.Clamped += codec.Encode(eb, meant).Clamped
			sent := cb.sent[:hi-lo]
			if err := codec.Decode(sent, eb); err != nil {
				return nil, fmt.Errorf("%s: decoding own share: %w", r.errPrefix(0), err)
			}
			if fb != nil {
				res := fb.Contrib[off+lo : off+hi]
				for i, m := range meant {
					res[i] = m - sent[i]
				}
			}
			for i := 0; i < len(meant); i += statsStride {
				d := float64(meant[i]) - float64(sent[i])
				sq += d * d
				sqRef += float64(meant[i]) * float64(meant[i])
			}
		}
		return dst, nil
	}

	// Scatter the shares to their owners; sum ours in a fixed order.
	t0 := time.Now()
	sum, dec := cb.sum, cb.dec
	copy(sum, x[ownOff:ownOff+ownLen])
	err := r.exchange(ctx, mesh, 0,
		func(k int) (int, []byte, error) { // round k: our share of segment rank+k
			j := mod(rank+k, n)
			b, err := encodeShare(j)
			return j, b, err
		},
		func(k int) (int, []byte) { return mod(rank-k, n), cb.recv[(k-1)*shareLen : k*shareLen] },
		func(k, from int) error {
			share := cb.recv[(k-1)*shareLen : k*shareLen]
			for lo := 0; lo < ownLen; lo += cacheBlock {
				hi := min(lo+cacheBlock, ownLen)
				d := dec[:hi-lo]
				if err := codec.Decode(d, share[codec.EncodedLen(lo):codec.EncodedLen(hi)]); err != nil {
					return fmt.Errorf("%s: share from rank %d: %w", r.errPrefix(k), from, err)
				}
				s := sum[lo:hi]
				for i, v := range d {
					s[i] += v
				}
			}
			return nil
		})
	if sqRef > 0 {
		st.RelRMSE = math.Sqrt(sq / sqRef)
	}
	if err != nil {
		return st, err
	}
	if p.call.Op == Avg {
		inv := float32(n)
		for i := range sum {
			sum[i] /= inv
		}
	}

	// Encode the owned sum once; everybody, us included, uses its decoding.
	t1 := time.Now()
	if fb != nil {
		for i := range sum {
			sum[i] += fb.Owner[i]
		}
	}
	st.Clamped += codec.Encode(cb.out, sum).Clamped
	if err := codec.Decode(x[ownOff:ownOff+ownLen], cb.out); err != nil {
		return st, fmt.Errorf("%s: decoding own sum: %w", r.errPrefix(n), err)
	}
	if fb != nil {
		for i, v := range x[ownOff : ownOff+ownLen] {
			fb.Owner[i] = sum[i] - v
		}
	}

	// Allgather the encoded sums.
	t2 := time.Now()
	err = r.exchange(ctx, mesh, n,
		func(k int) (int, []byte, error) { return mod(rank+k, n), cb.out, nil },
		func(k int) (int, []byte) {
			j := mod(rank-k, n)
			return j, cb.gathered[encOff[j]:encOff[j+1]]
		},
		func(k, from int) error {
			off, cnt := p.segment(from)
			if err := codec.Decode(x[off:off+cnt], cb.gathered[encOff[from]:encOff[from+1]]); err != nil {
				return fmt.Errorf("%s: sum from rank %d: %w", r.errPrefix(n+k), from, err)
			}
			return nil
		})
	st.WireBytes = 2 * encOff[n]
	st.RawBytes = 2 * 4 * (p.count - ownLen)
	if err == nil && r.phase != nil {
		r.phase(p.call, "compress+scatter+reduce", t0, t1)
		r.phase(p.call, "encode sum", t1, t2)
		r.phase(p.call, "allgather+decode", t2, time.Now())
	}
	return st, err
}

// exchange runs N-1 rounds of a shifted all-to-all: in round k a sender
// goroutine sends send(k) and this goroutine receives recv(k) and then calls
// got(k, from). step0 numbers the rounds in headers and errors.
func (r *Ring) exchange(ctx context.Context, mesh Mesh, step0 int,
	send func(k int) (int, []byte, error), recv func(k int) (int, []byte), got func(k, from int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	p, n := &r.p, r.size
	sent := make(chan error, 1)
	go func() {
		h := Header{Kind: p.call.Kind, Op: p.call.Op, DType: p.call.DType, Seq: p.call.Seq,
			Count: uint64(p.call.Count), Sender: uint32(r.rank), Codec: p.call.Codec}
		var hdr [HeaderSize]byte
		for k := 1; k < n; k++ {
			to, payload, err := send(k)
			if err != nil {
				cancel(err)
				sent <- err
				return
			}
			h.Step, h.Length = uint32(step0+k), uint32(len(payload))
			EncodeHeader(hdr[:], &h)
			if err := mesh.SendTo(ctx, to, hdr[:], payload); err != nil {
				err = fmt.Errorf("%s: send to rank %d: %w", r.errPrefix(step0+k), to, err)
				cancel(err)
				sent <- err
				return
			}
			r.payloadSent.Add(uint64(len(payload)))
			r.headerSent.Add(HeaderSize)
			r.msgs.Add(1)
		}
		sent <- nil
	}()
	// The receiver only moves bytes, into a buffer per round, so senders are
	// never held up by decoding; this goroutine processes the rounds in
	// order, which keeps the sum's order fixed.
	arrived := make(chan int, n)
	recvErr := make(chan error, 1)
	go func() {
		defer close(arrived)
		var hdr [HeaderSize]byte
		for k := 1; k < n; k++ {
			from, buf := recv(k)
			if err := mesh.RecvFrom(ctx, from, hdr[:]); err != nil {
				recvErr <- fmt.Errorf("%s: recv from rank %d: %w", r.errPrefix(step0+k), from, err)
				return
			}
			h, err := DecodeHeader(hdr[:])
			if err != nil {
				recvErr <- fmt.Errorf("%s: recv from rank %d: %w", r.errPrefix(step0+k), from, err)
				return
			}
			if remote := h.Call(); !sameFingerprint(p.call, remote) {
				recvErr <- &MismatchError{Local: p.call, Remote: remote, LocalRank: r.rank, RemoteRank: int(h.Sender)}
				return
			}
			if h.Sender != uint32(from) || h.Step != uint32(step0+k) || h.Length != uint32(len(buf)) {
				recvErr <- fmt.Errorf("%s: recv from rank %d: protocol error: got sender %d step %d length %d, want sender %d step %d length %d",
					r.errPrefix(step0+k), from, h.Sender, h.Step, h.Length, from, step0+k, len(buf))
				return
			}
			if err := mesh.RecvFrom(ctx, from, buf); err != nil {
				recvErr <- fmt.Errorf("%s: recv from rank %d: %w", r.errPrefix(step0+k), from, err)
				return
			}
			r.payloadRecv.Add(uint64(len(buf)))
			arrived <- k
		}
		recvErr <- nil
	}()
	rerr := func() error {
		for k := range arrived {
			from, _ := recv(k)
			if err := got(k, from); err != nil {
				return err
			}
		}
		return <-recvErr
	}()
	if rerr != nil {
		cancel(rerr)
		for range arrived { // let the receiver finish
		}
	}
	serr := <-sent
	if rerr != nil {
		return rerr
	}
	return serr
}

// Segment returns the element offset and length of rank's segment of a
// count-element buffer split over size ranks: the part rank owns after a
// reduce-scatter, and in a compressed allreduce the length of its owner
// residual (Feedback.Owner).
func Segment(count, size, rank int) (off, n int) {
	p := plan{count: count, nseg: size}
	return p.segment(rank)
}

func (r *Ring) segmentOf(count, rank int) (off, n int) { return Segment(count, r.size, rank) }
