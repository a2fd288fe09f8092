package ring

import (
	"context"
	"fmt"
)

// Ring reduce-scatter: the first half of ring allreduce (allreduce.go), out
// of place. The input of Size*len(out) bytes is split into N equal segments;
// rank r ends with the reduction of segment r in out.
//
// Steps t = 0 .. N-2, for rank r (indices mod N):
//
//	send segment r-t-1: from the input at t = 0, otherwise the partial
//	    result received and reduced at step t-1;
//	receive segment r-t-2 and compute partial = in[seg] op received, into
//	    the Ring's work buffer, or into out at the last step t = N-2 (when
//	    the segment is r; Avg divides by N there).
//
// The input is never written. Partial results need a work buffer of len(in)
// bytes, which the Ring keeps and reuses across calls. Each rank sends
// (N-1)/N of the input, which is optimal.

func reduceScatterStep(rank, size, t int) step {
	st := step{
		send: mod(rank-t-1, size), recv: mod(rank-t-2, size),
		dep: t > 0, src: bWork, dst: bWork, a: bIn,
		reduce: true, final: t == size-2,
	}
	if t == 0 {
		st.src = bIn
	}
	if st.final {
		st.dst = bOut
	}
	return st
}

// ReduceScatter reduces in element-wise across ranks and leaves block Rank
// of the result in out: len(in) == Size*len(out), c.Count is the number of
// elements of in (a multiple of Size). in is not modified.
func (r *Ring) ReduceScatter(ctx context.Context, c Call, in, out []byte) error {
	c, err := r.begin(ReduceScatter, c)
	if err != nil {
		return err
	}
	defer r.end()
	esz := c.DType.Size()
	if err := checkLen(c, "input", in, c.Count*esz); err != nil {
		return err
	}
	if c.Count%r.size != 0 {
		return fmt.Errorf("ring: %s #%d: count %d is not a multiple of the ring size %d", c.Kind, c.Seq, c.Count, r.size)
	}
	if err := checkLen(c, "output", out, c.Count/r.size*esz); err != nil {
		return err
	}
	if r.size == 1 {
		copy(out, in)
		return nil
	}
	p := r.setup(c, r.size, c.Count, r.size-1)
	r.work = growAligned(r.work, len(in))
	p.bufs[bIn] = in
	p.bufs[bWork] = r.work[:len(in)]
	p.bufs[bOut] = out
	p.base[bOut] = r.rank * len(out)
	return r.run(ctx)
}
