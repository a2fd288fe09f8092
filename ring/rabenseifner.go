package ring

import (
	"context"
	"time"
)

// Rabenseifner's allreduce over a Mesh: recursive-halving reduce-scatter,
// then recursive-doubling allgather (Rabenseifner 2004; Thakur et al. 2005;
// MPICH's long-message allreduce, Gloo's AllreduceHalvingDoubling).
//
// With P the largest power of two <= N (ranks beyond P are folded in and
// out as in recursive doubling, see fold in exchange.go), the buffer is
// split into P near-equal blocks (as Segment splits it for P ranks). New
// rank q starts with blocks [0, P):
//
//	step 0: fold in (N not a power of two): 2i sends its whole buffer to
//	    2i+1, which reduces buf = x[2i] op buf.
//	reduce-scatter, step 1+k, k = 0 .. log2(P)-1, partner q xor 2^k: split
//	    the current block range in halves; the lower new rank keeps the
//	    lower half, the higher one the upper half; send the other half,
//	    receive the partner's copy of the kept half and reduce it, the
//	    lower rank's value first. After log2(P) steps q holds one fully
//	    reduced block (block bitreverse(q)); Avg divides it by N, once.
//	allgather, step 1+log2(P)+j, j = 0 .. log2(P)-1, partner q xor
//	    2^(log2(P)-1-j): send the reduced range, receive the partner's
//	    (the other half of the range before the matching halving step)
//	    straight into the buffer.
//	step 2*log2(P)+1: fold out, 2i+1 sends the result to 2i.
//
// Order: the same balanced binary tree over the new ranks as recursive
// doubling (the partner at distance 2^k combines groups of 2^k adjacent
// new ranks), e.g. ((x0 op x1) op (x2 op x3)) op ((x4 op x5) op (x6 op x7))
// for N = 8; it depends only on N. Each element is reduced by exactly one
// rank and copied to the others, so all ranks end with the same bytes.
//
// Cost: 2*log2(P) (+2 when folding) hops; a rank of the core sends
// 2(P-1)/P*S payload bytes when P divides the count (+S for the fold; an
// even folded rank sends S): bandwidth-optimal with logarithmic latency.

func (r *Ring) allreduceRabenseifner(ctx context.Context, buf []byte) error {
	p := &r.p
	count, f := p.call.Count, foldOf(r.size)
	last := 2*f.log + 1
	nr := f.newRank(r.rank)
	r.scratch = growAligned(r.scratch, min(p.ce, count)*p.esz)
	if nr < 0 {
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
	// blocks [lo, hi) -> elements [off, off+n)
	span := func(lo, hi int) (off, n int) {
		o1, _ := Segment(count, f.p, lo)
		o2 := count
		if hi < f.p {
			o2, _ = Segment(count, f.p, hi)
		}
		return o1, o2 - o1
	}
	var parents [32][2]int
	lo, hi := 0, f.p
	for k := 0; k < f.log; k++ {
		pn := nr ^ (1 << k)
		mid := (lo + hi) / 2
		klo, khi, slo, shi := lo, mid, mid, hi
		if pn < nr {
			klo, khi, slo, shi = mid, hi, lo, mid
		}
		sOff, sN := span(slo, shi)
		rOff, rN := span(klo, khi)
		x := pairXfer{peer: f.rank(pn), step: 1 + k, send: true, sOff: sOff, sN: sN, recv: true, rOff: rOff, rN: rN,
			reduce: true, theirsFirst: pn < nr}
		if err := r.exchange(ctx, buf, x); err != nil {
			return err
		}
		parents[k] = [2]int{lo, hi}
		lo, hi = klo, khi
	}
	if p.call.Op == Avg {
		off, n := span(lo, hi)
		divBytes(p.call.DType, buf[off*p.esz:(off+n)*p.esz], r.size)
	}
	if r.phase != nil {
		r.midPhase = time.Now() // reduce-scatter done
	}
	for j := 0; j < f.log; j++ {
		k := f.log - 1 - j
		pn := nr ^ (1 << k)
		plo, phi := parents[k][0], parents[k][1]
		olo, ohi := plo, lo // the partner's half of the parent range
		if lo == plo {
			olo, ohi = hi, phi
		}
		sOff, sN := span(lo, hi)
		rOff, rN := span(olo, ohi)
		x := pairXfer{peer: f.rank(pn), step: 1 + f.log + j, send: true, sOff: sOff, sN: sN, recv: true, rOff: rOff, rN: rN}
		if err := r.exchange(ctx, buf, x); err != nil {
			return err
		}
		lo, hi = plo, phi
	}
	if r.rank < 2*f.rem {
		return r.exchange(ctx, buf, pairXfer{peer: r.rank - 1, step: last, send: true, sN: count})
	}
	return nil
}
