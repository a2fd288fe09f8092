package ring

import (
	"context"
	"fmt"
	"time"
)

// Ring allreduce = ring reduce-scatter followed by ring allgather
// (Patarasuk & Yuan; the schedule Gloo's AllreduceRing, Horovod and NCCL use).
//
// The buffer is split into N segments (uneven sizes allowed: the first
// Count%N segments get one extra element; with Count < N some are empty).
// Steps t = 0 .. 2N-3, for rank r (all indices mod N):
//
//	reduce-scatter, s = t = 0 .. N-2:
//	    send segment r-s-1, receive segment r-s-2 and reduce it into the
//	    buffer: buf[seg] = buf[seg] op received.
//	    After step N-2 rank r holds the fully reduced segment r; for Avg it
//	    divides that segment by N right there, once, so every rank later
//	    receives identical bytes.
//	allgather, s = t-(N-1) = 0 .. N-2:
//	    send segment r-s, receive segment r-s-1 directly into the buffer.
//
// Example N = 3, segments A B C, rank 0 (owns A at the end):
//
//	t=0  send C        recv B (+=)
//	t=1  send B        recv A (+=, final: A complete)
//	t=2  send A        recv C (copy)
//	t=3  send C        recv B (copy)
//
// The segment sent at step t >= 1 is the one received at step t-1, so each
// chunk is forwarded as soon as it has been reduced (see the engine comment
// in ring.go). The value of segment k is ((x[k+1] op x[k+2]) op ...) op x[k]
// on every run, so results are deterministic and bitwise identical on every
// rank (the allgather phase copies the owner's bytes).
//
// Traffic: every rank sends 2(N-1) segments, i.e. 2(N-1)/N * S payload
// bytes for S divisible by N, which is bandwidth-optimal.

func allreduceStep(rank, size, t int) step {
	if t < size-1 { // reduce-scatter
		return step{
			send: mod(rank-t-1, size), recv: mod(rank-t-2, size),
			dep: t > 0, src: bMain, dst: bMain, a: bMain,
			reduce: true, final: t == size-2,
		}
	}
	s := t - (size - 1) // allgather
	return step{
		send: mod(rank-s, size), recv: mod(rank-s-1, size),
		dep: true, src: bMain, dst: bMain,
	}
}

// Allreduce reduces buf element-wise across all ranks with c.Op, in place;
// on return every rank holds the same bytes. len(buf) must be
// c.Count*c.DType.Size(). With Size 1 it returns immediately (Avg divides by
// 1). Count 0 still exchanges header-only messages, so a mismatched call on
// another rank is reported as *MismatchError.
func (r *Ring) Allreduce(ctx context.Context, c Call, buf []byte) error {
	c, err := r.begin(Allreduce, c)
	if err != nil {
		return err
	}
	defer r.end()
	if err := checkLen(c, "buffer", buf, c.Count*c.DType.Size()); err != nil {
		return err
	}
	if c.Codec != "" {
		return fmt.Errorf("ring: %s #%d: codec %q: use AllreduceCompressed", c.Kind, c.Seq, c.Codec)
	}
	if r.size == 1 {
		return nil
	}
	if n := len(buf); n > 0 && n <= TinyAllreduceBytes {
		return r.allreduceTiny(ctx, c, buf)
	}
	p := r.setup(c, r.size, c.Count, 2*(r.size-1))
	p.bufs[bMain] = buf
	return r.run(ctx)
}

// TinyAllreduceBytes is the largest buffer reduced by allreduceTiny.
//
// Below it an allreduce is bound by latency, not bandwidth: the ring's
// 2(N-1) dependent hops cost far more than the bytes. allreduceTiny passes
// whole buffers instead (an allgather: one hop over a Mesh, N-1 around a
// plain ring) and every rank folds the N contributions itself, in rank order 0, 1, ..., N-1, so
// results are still bitwise identical everywhere. It sends (N-1)*S bytes
// per rank instead of 2(N-1)/N*S, which is nothing at this size.
const TinyAllreduceBytes = 4 << 10

// gatherDirect is the gather of allreduceTiny over a Mesh: every rank sends
// its buffer straight to every other rank, then receives theirs, so the
// whole allreduce costs one hop of latency instead of N-1. Sending first is
// safe because the messages are far smaller than any transport's buffer.
func (r *Ring) gatherDirect(ctx context.Context, mesh Mesh, all []byte, n int) error {
	p := &r.p
	r.startPhases(0)
	h := Header{Kind: p.call.Kind, Op: p.call.Op, DType: p.call.DType, Seq: p.call.Seq,
		Count: uint64(p.call.Count), Sender: uint32(r.rank), Length: uint32(n), Epoch: r.epoch}
	mine := all[r.rank*n : (r.rank+1)*n]
	for k := 1; k < r.size; k++ {
		to := mod(r.rank+k, r.size)
		h.Step = uint32(k)
		EncodeHeader(r.shdr[:], &h)
		r.sendBufs[0], r.sendBufs[1] = r.shdr[:], mine
		if err := mesh.SendTo(ctx, to, r.sendBufs[:]...); err != nil {
			return fmt.Errorf("%s: send to rank %d: %w", r.errPrefix(k), to, err)
		}
		r.payloadSent.Add(uint64(n))
		r.headerSent.Add(HeaderSize)
		r.msgs.Add(1)
	}
	for k := 1; k < r.size; k++ {
		from := mod(r.rank-k, r.size)
		if err := mesh.RecvFrom(ctx, from, r.rhdr[:]); err != nil {
			return fmt.Errorf("%s: recv from rank %d: %w", r.errPrefix(k), from, err)
		}
		hd, err := DecodeHeader(r.rhdr[:])
		if err != nil {
			return fmt.Errorf("%s: recv from rank %d: %w", r.errPrefix(k), from, err)
		}
		if err := r.checkEpoch(&hd, p.call, from); err != nil {
			return err
		}
		if remote := hd.Call(); !sameFingerprint(p.call, remote) {
			return &MismatchError{Local: p.call, Remote: remote, LocalRank: r.rank, RemoteRank: int(hd.Sender)}
		}
		if hd.Sender != uint32(from) || hd.Step != uint32(k) || hd.Length != uint32(n) {
			return fmt.Errorf("%s: recv from rank %d: protocol error: got sender %d step %d length %d, want sender %d step %d length %d",
				r.errPrefix(k), from, hd.Sender, hd.Step, hd.Length, from, k, n)
		}
		if err := mesh.RecvFrom(ctx, from, all[from*n:(from+1)*n]); err != nil {
			return fmt.Errorf("%s: recv from rank %d: %w", r.errPrefix(k), from, err)
		}
		r.payloadRecv.Add(uint64(n))
		if r.phase != nil && r.firstRecv.IsZero() {
			r.firstRecv = time.Now()
		}
	}
	r.sendBufs[1] = nil
	r.reportPhases()
	return nil
}

func (r *Ring) allreduceTiny(ctx context.Context, c Call, buf []byte) error {
	n := len(buf)
	r.gather = growAligned(r.gather, r.size*n)
	all := r.gather[:r.size*n]
	copy(all[r.rank*n:], buf)
	p := r.setup(c, r.size, r.size*c.Count, r.size-1)
	p.gather = true
	p.bufs[bMain] = all
	if mesh, ok := r.t.(Mesh); ok {
		if err := r.gatherDirect(ctx, mesh, all, n); err != nil {
			return err
		}
	} else if err := r.run(ctx); err != nil {
		return err
	}
	r.tmp = growAligned(r.tmp, n)
	acc := r.tmp[:n]
	copy(acc, all[:n])
	for k := 1; k < r.size; k++ {
		reduceBytes(c.DType, c.Op, acc, acc, all[k*n:(k+1)*n])
	}
	if c.Op == Avg {
		divBytes(c.DType, acc, r.size)
	}
	copy(buf, acc)
	return nil
}
