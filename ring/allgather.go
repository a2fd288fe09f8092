package ring

import "context"

// Ring allgather: the second half of ring allreduce (allreduce.go). The
// output of Size*len(in) bytes is split into N equal blocks; rank r first
// copies its input into block r.
//
// Steps t = 0 .. N-2, for rank r (indices mod N):
//
//	send block r-t (its own block at t = 0, afterwards the block received
//	    at step t-1), receive block r-t-1 directly into out.
//
// Each block is chunked and forwarded chunk by chunk as soon as it has
// arrived. Each rank sends (N-1) blocks, which is optimal.

func allgatherStep(rank, size, t int) step {
	return step{
		send: mod(rank-t, size), recv: mod(rank-t-1, size),
		dep: t > 0, src: bMain, dst: bMain,
	}
}

// Allgather concatenates every rank's in, in rank order, into out:
// len(out) == Size*len(in) and block r of out is rank r's in. c.Count is the
// number of elements of in. Uint8 (raw bytes) is allowed.
func (r *Ring) Allgather(ctx context.Context, c Call, in, out []byte) error {
	c, err := r.begin(Allgather, c)
	if err != nil {
		return err
	}
	defer r.end()
	esz := c.DType.Size()
	if err := checkLen(c, "input", in, c.Count*esz); err != nil {
		return err
	}
	if err := checkLen(c, "output", out, r.size*len(in)); err != nil {
		return err
	}
	copy(out[r.rank*len(in):], in)
	if r.size == 1 {
		return nil
	}
	p := r.setup(c, r.size, r.size*c.Count, r.size-1)
	p.bufs[bMain] = out
	return r.run(ctx)
}
