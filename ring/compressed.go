package ring

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gorun/gorun/compress"
)

// Compressed allreduce: scatter to owners, reduce once in float32, encode
// once, allgather the same bytes (the scheme of Hivemind and DeepSpeed's
// 1-bit optimizers), pipelined chunk by chunk.
//
// Why not compress the ring: a ring reduce-scatter decodes, adds and
// re-encodes a partial sum at every hop, so the quantization error
// compounds with the number of hops (relative error grows like sqrt(N)).
// Here every value is encoded at most twice, whatever N is:
//
//	1. Split the buffer into N segments as the ring does (rank j owns
//	   segment j), and every segment into chunks of ChunkBytes/4 values
//	   (rounded down to a multiple of 64); every segment has at least one
//	   chunk, possibly empty, so that every link carries a message whose
//	   header checks the call's fingerprint.
//	2. Scatter: an encoder goroutine walks the chunks in order and, for
//	   every segment j != r, adds rank r's error-feedback residual, encodes
//	   the chunk once, keeps what the encoding lost as the new residual and
//	   queues the bytes for j, the segment's owner.
//	3. Reduce: as soon as chunk c of segment r has arrived from every peer,
//	   the owner r sums, in float32 and in the fixed order r, r-1, ...,
//	   r-N+1, its own exact values and the N-1 decoded shares; divides by N
//	   for Avg; adds its owner residual, encodes the sum once and keeps the
//	   loss as the owner residual (two-sided error feedback, as 1-bit
//	   Adam). It decodes its own bytes into the result, as every other rank
//	   will, so that all ranks end with bitwise-identical values, and queues
//	   the bytes for every peer.
//	4. Allgather: a receiver per peer reads that peer's messages in the
//	   order they were sent (shares of our segment and chunks of the peer's
//	   encoded sum, told apart by the header's step) and decodes the sums
//	   straight into the result.
//
// One sender goroutine per peer writes its queue in order, so a link is not
// idle while there is something to send on it, and encoding, reducing and
// decoding overlap with the transfers instead of alternating with them: on
// a slow link the collective takes about as long as moving the compressed
// bytes. Queues have room for every message of the call, so producers never
// wait for the network and the schedule cannot deadlock.
//
// Traffic per rank: 2 * sum over j != r of the encoded length of segment j,
// i.e. the ring's 2(N-1)/N * S scaled by the codec's ratio (0.27 for int8
// with 64-value blocks, 0.5 for fp16/bf16), plus a 56-byte header per
// chunk.

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

// chunkAlign: chunks hold a multiple of this many values, a multiple of the
// int8 codec's default block, so that a chunk boundary is a block boundary.
const chunkAlign = 64

// gatherStep marks allgather messages in the header's step field: scatter
// chunk c travels as step c+1, allgather chunk c as gatherStep+c.
const gatherStep = 1 << 30

// statsStride samples every statsStride-th value for the error statistic:
// it describes the codec's error well and costs little.
const statsStride = 8

// chunking cuts the segments of a compressed allreduce into chunks of cv
// values; only the last chunk of a segment may be shorter, so chunk c's
// encoding starts at c times the encoded size of a full chunk.
type chunking struct {
	p     *plan
	codec compress.Codec
	cv    int // values per full chunk
	encCV int // encoded bytes of a full chunk
}

// chunks is the number of chunks of segment seg: at least one, so that every
// link carries a message (an empty one still checks the call's fingerprint).
func (g *chunking) chunks(seg int) int {
	_, sn := g.p.segment(seg)
	return max(1, (sn+g.cv-1)/g.cv)
}

// span returns chunk c of segment seg: the element offset and count in the
// whole buffer, and the byte range [elo, ehi) in the segment's encoding.
func (g *chunking) span(seg, c int) (off, cnt, elo, ehi int) {
	so, sn := g.p.segment(seg)
	lo := min(c*g.cv, sn)
	hi := min(lo+g.cv, sn)
	elo = c * g.encCV
	return so + lo, hi - lo, elo, elo + g.codec.EncodedLen(hi-lo)
}

// encLen is the encoded size of segment seg.
func (g *chunking) encLen(seg int) int {
	_, sn := g.p.segment(seg)
	full := sn / g.cv
	return full*g.encCV + g.codec.EncodedLen(sn-full*g.cv)
}

// shareStats sum up what encoding one chunk gave up.
type shareStats struct {
	clamped   int
	sq, sqRef float64 // sampled squared error and squared values
}

// encodeShare encodes seg into dst. With a residual res (error feedback) it
// encodes seg+res and leaves in res what the encoding lost; meant and sent
// are scratch of at least sub values. It works sub values at a time
// (sub = len(seg) when the codec's blocks do not divide it) so that every
// pass reads cache-resident values.
func encodeShare(codec compress.Codec, fa compress.FeedbackAddEncoder, sub int, dst []byte, seg, res, meant, sent []float32) (shareStats, error) {
	var st shareStats
	for lo := 0; lo < len(seg); lo += sub {
		hi := min(lo+sub, len(seg))
		s, d := seg[lo:hi], dst[codec.EncodedLen(lo):codec.EncodedLen(hi)]
		if fa != nil && res != nil {
			// One pass: add the residual, encode, keep what was lost. The
			// error statistic wants the meant values s+r, which the call
			// never stores: keep the sampled old residuals and rebuild the
			// sampled sums from them.
			r := res[lo:hi]
			old := meant[:0]
			for i := 0; i < len(r); i += statsStride {
				old = append(old, r[i])
			}
			st.clamped += fa.EncodeFeedbackAdd(d, s, r).Clamped
			for k, i := 0, 0; i < len(r); k, i = k+1, i+statsStride {
				m, e := float64(s[i]+old[k]), float64(r[i])
				st.sq += e * e
				st.sqRef += m * m
			}
			continue
		}
		// Any other codec: encode, decode to learn what was lost.
		m := s
		if res != nil {
			m = meant[:len(s)]
			for i, v := range s {
				m[i] = v + res[lo+i]
			}
		}
		st.clamped += codec.Encode(d, m).Clamped
		dec := sent[:len(s)]
		if err := codec.Decode(dec, d); err != nil {
			return st, err
		}
		if res != nil {
			r := res[lo:hi]
			for i := range r {
				r[i] = m[i] - dec[i]
			}
		}
		for i := 0; i < len(m); i += statsStride {
			e := float64(m[i]) - float64(dec[i])
			st.sq += e * e
			st.sqRef += float64(m[i]) * float64(m[i])
		}
	}
	return st, nil
}

// subBlock is how many values encodeShare handles at a time: 4096 (16 KiB
// of float32, L1-resident) when that is a whole number of the codec's
// blocks, so that encoding piecewise gives the same bytes as encoding the
// chunk at once; otherwise the whole chunk.
func subBlock(codec compress.Codec, cv int) int {
	const sub = 4096
	if b, ok := codec.(interface{ BlockSize() int }); ok && sub%b.BlockSize() != 0 {
		return cv
	}
	return min(sub, cv)
}

// reduceChunk is the owner's work on one chunk: own (this rank's exact
// values) plus the decoded shares, in order; divided by the rank count for
// Avg; plus the owner residual ores (if error feedback is on); encoded into
// out; and decoded back into own, which leaves ores holding what the
// encoding lost. It works sub values at a time so that every pass reads
// cache-resident values. On a bad share it returns the share's index.
func reduceChunk(codec compress.Codec, da compress.AccumulateDecoder, fa compress.FeedbackAddEncoder, sub int, avg bool, own []float32, shares [][]byte, out []byte, ores, sumBuf, decBuf []float32) (clamped, bad int, err error) {
	n := float32(len(shares) + 1)
	for lo := 0; lo < len(own); lo += sub {
		hi := min(lo+sub, len(own))
		elo, ehi := codec.EncodedLen(lo), codec.EncodedLen(hi)
		sum := sumBuf[:hi-lo]
		copy(sum, own[lo:hi])
		for k, share := range shares {
			b := share[elo:ehi]
			if da != nil {
				err = da.DecodeAdd(sum, b)
			} else {
				d := decBuf[:hi-lo]
				if err = codec.Decode(d, b); err == nil {
					for i, v := range d {
						sum[i] += v
					}
				}
			}
			if err != nil {
				return clamped, k, err
			}
		}
		if avg {
			for i := range sum {
				sum[i] /= n
			}
		}
		// Encode the owned sum (plus the owner residual) once; everybody,
		// this rank included, uses its decoding.
		o, enc := own[lo:hi], out[elo:ehi]
		fused := fa != nil && ores != nil
		switch {
		case ores == nil:
			clamped += codec.Encode(enc, sum).Clamped
		case fused:
			// One pass: add the residual, encode, keep what was lost.
			clamped += fa.EncodeFeedbackAdd(enc, sum, ores[lo:hi]).Clamped
		default:
			r := ores[lo:hi]
			for i, v := range r {
				sum[i] += v
			}
			clamped += codec.Encode(enc, sum).Clamped
		}
		if err := codec.Decode(o, enc); err != nil {
			return clamped, -1, err
		}
		if ores != nil && !fused { // what the separate encoding lost
			r := ores[lo:hi]
			for i := range r {
				r[i] = sum[i] - o[i]
			}
		}
	}
	return clamped, -1, nil
}

// cmsg is one message queued for a peer: a step number and its payload.
type cmsg struct {
	step    uint32
	payload []byte
}

func (r *Ring) chunkPrefix(step uint32) string {
	if step >= gatherStep {
		return fmt.Sprintf("%s #%d allgather chunk %d", r.p.call.Kind, r.p.call.Seq, step-gatherStep)
	}
	return fmt.Sprintf("%s #%d scatter chunk %d", r.p.call.Kind, r.p.call.Seq, int(step)-1)
}

func (r *Ring) compressed(ctx context.Context, mesh Mesh, x []float32, codec compress.Codec, fb *Feedback) (CompressionStats, error) {
	r.concurrent(true)
	defer r.concurrent(false)
	p, n, rank := &r.p, r.size, r.rank
	cb := &r.cbufs
	cv := max(chunkAlign, r.chunkBytes/4/chunkAlign*chunkAlign)
	g := &chunking{p: p, codec: codec, cv: cv, encCV: codec.EncodedLen(cv)}

	// Encoded segment j lives at enc[encOff[j]:encOff[j+1]] (our shares) and
	// at gathered[encOff[j]:encOff[j+1]] (owner j's sum); our own segment's
	// slot in enc stays unused.
	encOff := make([]int, n+1)
	for j := range n {
		encOff[j+1] = encOff[j] + g.encLen(j)
	}
	ownOff, ownLen := p.segment(rank)
	ownEnc, mine := g.encLen(rank), g.chunks(rank)
	cb.enc = growBytes(cb.enc, encOff[n])
	cb.gathered = growBytes(cb.gathered, encOff[n])
	cb.recv = growBytes(cb.recv, (n-1)*ownEnc) // the share of rank-k at (k-1)*ownEnc
	cb.out = growBytes(cb.out, ownEnc)
	sub := subBlock(codec, cv)
	cb.meant = growF32(cb.meant, sub)
	cb.sent = growF32(cb.sent, sub)
	cb.sum = growF32(cb.sum, sub)
	cb.dec = growF32(cb.dec, sub)
	// The one-pass operations, when the codec has them.
	fa, _ := codec.(compress.FeedbackAddEncoder)
	da, _ := codec.(compress.AccumulateDecoder)

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	var failed atomic.Bool
	run := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				failed.Store(true)
				cancel(err)
			}
		}()
	}

	// One queue and sender per peer, sized for every message of the call.
	queues := make([]chan cmsg, n)
	arrived := make([]chan int, n) // per peer, the chunks of its shares that have arrived
	for k := 1; k < n; k++ {
		to, from := mod(rank+k, n), mod(rank-k, n)
		queues[to] = make(chan cmsg, g.chunks(to)+mine)
		arrived[from] = make(chan int, mine)
	}
	t0 := time.Now()
	for k := 1; k < n; k++ {
		to, from, slot := mod(rank+k, n), mod(rank-k, n), k-1
		total := g.chunks(to) + mine
		run(func() error { return r.sendQueue(ctx, mesh, to, total, queues[to]) })
		run(func() error {
			return r.recvPeer(ctx, mesh, from, g, x,
				cb.recv[slot*ownEnc:(slot+1)*ownEnc], cb.gathered[encOff[from]:encOff[from+1]], arrived[from])
		})
	}

	// The encoder: our share of every other segment, chunk by chunk.
	var st CompressionStats
	var encClamped int
	var sq, sqRef float64
	run(func() error {
		maxChunks := 0
		for j := range n {
			if j != rank {
				maxChunks = max(maxChunks, g.chunks(j))
			}
		}
		for c := range maxChunks {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			for k := 1; k < n; k++ {
				j := mod(rank+k, n)
				if c >= g.chunks(j) {
					continue
				}
				off, cnt, elo, ehi := g.span(j, c)
				dst := cb.enc[encOff[j]+elo : encOff[j]+ehi]
				var res []float32
				if fb != nil {
					res = fb.Contrib[off : off+cnt]
				}
				cs, err := encodeShare(codec, fa, sub, dst, x[off:off+cnt], res, cb.meant, cb.sent)
				if err != nil {
					return fmt.Errorf("%s: decoding own share: %w", r.chunkPrefix(uint32(c+1)), err)
				}
				encClamped += cs.clamped
				sq += cs.sq
				sqRef += cs.sqRef
				queues[j] <- cmsg{step: uint32(c + 1), payload: dst}
			}
		}
		return nil
	})

	// The reducer, on this goroutine: chunk by chunk, as the shares arrive.
	var tReduced time.Time
	rerr := func() error {
		shares := make([][]byte, n-1)
		for c := range mine {
			off, cnt, elo, ehi := g.span(rank, c)
			for k := 1; k < n; k++ {
				select {
				case <-arrived[mod(rank-k, n)]: // chunks arrive in order: this is chunk c
				case <-ctx.Done():
					return context.Cause(ctx)
				}
				shares[k-1] = cb.recv[(k-1)*ownEnc+elo : (k-1)*ownEnc+ehi]
			}
			var ores []float32
			if fb != nil {
				ores = fb.Owner[off-ownOff : off-ownOff+cnt]
			}
			out := cb.out[elo:ehi]
			clamped, bad, err := reduceChunk(codec, da, fa, sub, p.call.Op == Avg, x[off:off+cnt], shares, out, ores, cb.sum, cb.dec)
			st.Clamped += clamped
			if err != nil && bad >= 0 {
				return fmt.Errorf("%s: share from rank %d: %w", r.chunkPrefix(uint32(c+1)), mod(rank-1-bad, n), err)
			}
			if err != nil {
				return fmt.Errorf("%s: decoding own sum: %w", r.chunkPrefix(gatherStep+uint32(c)), err)
			}
			for k := 1; k < n; k++ {
				queues[mod(rank+k, n)] <- cmsg{step: gatherStep + uint32(c), payload: out}
			}
		}
		tReduced = time.Now()
		return nil
	}()
	if rerr != nil {
		failed.Store(true)
		cancel(rerr)
	}
	wg.Wait()
	st.Clamped += encClamped
	if sqRef > 0 {
		st.RelRMSE = math.Sqrt(sq / sqRef)
	}
	st.WireBytes = 2 * (encOff[n] - ownEnc)
	st.RawBytes = 2 * 4 * (p.count - ownLen)
	if failed.Load() {
		return st, context.Cause(ctx)
	}
	if r.phase != nil {
		r.phase(p.call, "compress+scatter+reduce", t0, tReduced)
		r.phase(p.call, "allgather+decode", tReduced, time.Now())
	}
	return st, nil
}

// sendQueue writes the total messages queued for peer to, in order.
func (r *Ring) sendQueue(ctx context.Context, mesh Mesh, to, total int, q <-chan cmsg) error {
	p := &r.p
	h := Header{Kind: p.call.Kind, Op: p.call.Op, DType: p.call.DType, Seq: p.call.Seq,
		Count: uint64(p.call.Count), Sender: uint32(r.rank), Codec: p.call.Codec, Epoch: r.epoch}
	var hdr [HeaderSize]byte
	for range total {
		var m cmsg
		select {
		case m = <-q:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		h.Step, h.Length = m.step, uint32(len(m.payload))
		EncodeHeader(hdr[:], &h)
		if err := mesh.SendTo(ctx, to, hdr[:], m.payload); err != nil {
			return fmt.Errorf("%s: send to rank %d: %w", r.chunkPrefix(m.step), to, err)
		}
		r.payloadSent.Add(uint64(len(m.payload)))
		r.headerSent.Add(HeaderSize)
		r.msgs.Add(1)
	}
	return nil
}

// recvPeer reads every message peer from sends in a compressed allreduce:
// its shares of our segment, into shares (announcing each chunk on arrived),
// and its encoded sum, into sums, decoding each chunk into x at once. The
// two kinds interleave in whatever order the peer produced them; each kind
// arrives in chunk order, which is checked.
func (r *Ring) recvPeer(ctx context.Context, mesh Mesh, from int, g *chunking, x []float32, shares, sums []byte, arrived chan<- int) error {
	p := &r.p
	wantShares, wantSums := g.chunks(r.rank), g.chunks(from)
	nextShare, nextSum := 0, 0
	var hdr [HeaderSize]byte
	for nextShare < wantShares || nextSum < wantSums {
		// Name what we wait for, in case the peer never sends it.
		wait := gatherStep + uint32(nextSum)
		if nextShare < wantShares {
			wait = uint32(nextShare + 1)
		}
		if err := mesh.RecvFrom(ctx, from, hdr[:]); err != nil {
			return fmt.Errorf("%s: recv from rank %d: %w", r.chunkPrefix(wait), from, err)
		}
		h, err := DecodeHeader(hdr[:])
		if err != nil {
			return fmt.Errorf("%s: recv from rank %d: %w", r.chunkPrefix(wait), from, err)
		}
		if err := r.checkEpoch(&h, p.call, from); err != nil {
			return err
		}
		if remote := h.Call(); !sameFingerprint(p.call, remote) {
			return &MismatchError{Local: p.call, Remote: remote, LocalRank: r.rank, RemoteRank: int(h.Sender)}
		}
		var buf []byte
		ok := false
		switch {
		case h.Sender != uint32(from):
		case h.Step >= gatherStep && h.Step-gatherStep == uint32(nextSum) && nextSum < wantSums:
			_, _, elo, ehi := g.span(from, nextSum)
			buf, ok = sums[elo:ehi], true
		case h.Step < gatherStep && h.Step == uint32(nextShare+1) && nextShare < wantShares:
			_, _, elo, ehi := g.span(r.rank, nextShare)
			buf, ok = shares[elo:ehi], true
		}
		if !ok || h.Length != uint32(len(buf)) {
			return fmt.Errorf("%s: recv from rank %d: protocol error: got sender %d step %d length %d, want sender %d with scatter chunk %d of %d or allgather chunk %d of %d",
				r.chunkPrefix(wait), from, h.Sender, h.Step, h.Length, from, nextShare, wantShares, nextSum, wantSums)
		}
		if err := mesh.RecvFrom(ctx, from, buf); err != nil {
			return fmt.Errorf("%s: recv from rank %d: %w", r.chunkPrefix(h.Step), from, err)
		}
		r.payloadRecv.Add(uint64(len(buf)))
		if h.Step < gatherStep {
			arrived <- nextShare // buffered for every chunk: never blocks
			nextShare++
			continue
		}
		off, cnt, _, _ := g.span(from, nextSum)
		if err := g.codec.Decode(x[off:off+cnt], buf); err != nil {
			return fmt.Errorf("%s: sum from rank %d: %w", r.chunkPrefix(h.Step), from, err)
		}
		nextSum++
	}
	return nil
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
