package ring

import (
	"context"
	"time"
)

// Recursive doubling allreduce over a Mesh (Thakur, Rabenseifner & Gropp
// 2005; MPICH's short-message allreduce; Gloo's AllreduceHalvingDoubling
// without the halving).
//
// With P the largest power of two <= N (see fold in exchange.go for the
// ranks beyond P):
//
//	step 0 (N not a power of two): even rank 2i < 2(N-P) sends its whole
//	    buffer to 2i+1, which reduces buf = x[2i] op buf, and sits out.
//	step 1+k, k = 0 .. log2(P)-1: new rank q exchanges its whole buffer
//	    with new rank q xor 2^k and reduces, the lower rank's value first:
//	    buf = lower op higher (both partners compute the same expression).
//	    Avg: every rank divides its (identical) sum by N once at the end.
//	step log2(P)+1: 2i+1 sends the result back to 2i.
//
// A round whose buffer fits a transport's buffer sends, then receives; a
// larger one sends from a goroutine while the caller receives and reduces
// chunk by chunk, each chunk only once its own copy has been sent (the
// exchange reduces in place).
//
// Order: a balanced binary tree over the new ranks in order, i.e. for N = 8
// ((x0 op x1) op (x2 op x3)) op ((x4 op x5) op (x6 op x7)), and for N = 6
// (P = 4, rem = 2) ((x0 op x1) op (x2 op x3)) op (x4 op x5): it depends
// only on N; every rank ends with the same bytes (the final sums are
// computed identically by every pair, the folded ranks get copies).
//
// Cost: log2(P) (+2 when folding) hops; every rank of the power-of-two
// core sends log2(P)*S payload bytes, plus S for the fold (an even folded
// rank sends S only). Latency-optimal, not bandwidth-optimal: for small
// buffers.

func (r *Ring) allreduceRecursiveDoubling(ctx context.Context, buf []byte) error {
	p := &r.p
	count, f := p.call.Count, foldOf(r.size)
	last := f.log + 1
	r.scratch = growAligned(r.scratch, min(p.ce, count)*p.esz)
	nr := f.newRank(r.rank)
	if nr < 0 { // folded in: hand over, then wait for the result
		if err := r.exchange(ctx, buf, pairXfer{peer: r.rank + 1, step: 0, send: true, sN: count}); err != nil {
			return err
		}
		return r.exchange(ctx, buf, pairXfer{peer: r.rank + 1, step: last, recv: true, rN: count})
	}
	if r.rank < 2*f.rem {
		if err := r.exchange(ctx, buf, pairXfer{peer: r.rank - 1, step: 0, recv: true, rN: count, reduce: true, theirsFirst: true}); err != nil {
			return err
		}
	}
	for k := 0; k < f.log; k++ {
		pn := nr ^ (1 << k)
		x := pairXfer{peer: f.rank(pn), step: 1 + k, send: true, sN: count, recv: true, rN: count,
			reduce: true, theirsFirst: pn < nr, overlap: true}
		if err := r.exchange(ctx, buf, x); err != nil {
			return err
		}
	}
	if p.call.Op == Avg {
		divBytes(p.call.DType, buf, r.size)
	}
	if r.rank < 2*f.rem {
		return r.exchange(ctx, buf, pairXfer{peer: r.rank - 1, step: last, send: true, sN: count})
	}
	return nil
}

// reportSimplePhases tells Config.Phase about a call run as one phase
// named after its algorithm (after the wait for the first message).
func (r *Ring) reportSimplePhases(name string) {
	if r.phase == nil {
		return
	}
	c, start, end := r.p.call, r.callStart, time.Now()
	if !r.firstRecv.IsZero() {
		r.phase(c, "wait for peers", start, r.firstRecv)
		start = r.firstRecv
	}
	r.phase(c, name, start, end)
}
