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
// chunk is forwarded as soon as it has been reduced (see the comment at the
// top of engine.go). The value of segment k is ((x[k+1] op x[k+2]) op ...) op x[k]
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
//
// The algorithm is chosen by Config.Allreduce from the buffer's size (see
// AllreduceAlgorithm) and recorded in c.Algo, which is part of the call's
// fingerprint: ranks that chose differently fail with *MismatchError.
func (r *Ring) Allreduce(ctx context.Context, c Call, buf []byte) error {
	return r.allreduce(ctx, c, buf, r.AllreduceAlgorithm(len(buf)))
}

// AllreduceWith is Allreduce run by the schedule algo whatever the policy
// says, for a caller timing the schedules against each other (every rank
// must pass the same algo: it is part of the call's fingerprint). algo
// must be one the ring runs (ModelCandidates on a Mesh).
func (r *Ring) AllreduceWith(ctx context.Context, c Call, buf []byte, algo Algorithm) error {
	if !r.runsModelled(algo) {
		return fmt.Errorf("ring: %s #%d: this ring does not run a %s allreduce", c.Kind, c.Seq, algo)
	}
	return r.allreduce(ctx, c, buf, algo)
}

// allreduce runs the call with algo, the schedule the caller chose for
// len(buf) bytes.
func (r *Ring) allreduce(ctx context.Context, c Call, buf []byte, algo Algorithm) error {
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
	c.Algo = algo
	switch c.Algo {
	case AlgoHierarchical:
		return r.allreduceHierarchical(ctx, c, buf)
	case AlgoDirect:
		return r.allreduceDirect(ctx, c, buf)
	case AlgoRing:
		p := r.setup(c, r.size, c.Count, 2*(r.size-1))
		p.bufs[bMain] = buf
		return r.run(ctx)
	}
	// The Mesh schedules (AllreduceAlgorithm picks them only over a Mesh).
	r.setup(c, r.size, c.Count, 0)
	work, restore := r.alignedBuf(buf, c.DType.Size())
	switch c.Algo {
	case AlgoScatterGather:
		err = r.meshReduce(ctx, work, false)
	case AlgoRecursiveDoubling:
		r.startPhases(0)
		if err = r.allreduceRecursiveDoubling(ctx, work); err == nil {
			r.reportSimplePhases("recursive-doubling")
		}
	case AlgoRabenseifner:
		r.startPhases(0)
		r.midPhase = time.Time{}
		if err = r.allreduceRabenseifner(ctx, work); err == nil {
			r.reportMeshPhases(false, time.Time{}, r.midPhase)
		}
	default:
		err = fmt.Errorf("ring: %s #%d: no %s allreduce", c.Kind, c.Seq, c.Algo)
	}
	if err == nil {
		restore()
	}
	return err
}
