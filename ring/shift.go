package ring

import "context"

// Ring shift: every rank sends its buffer to the next rank and receives
// the previous rank's, in one step (MPI's Sendrecv along the ring). It
// moves each rank's data to one neighbour only, e.g. to keep a copy of a
// rank's own state on its "buddy" so that it survives the rank.
//
// The segment space is Size blocks of Count elements: rank r sends block r
// (its in) and receives block r-1 into out. Large blocks are chunked and
// pipelined like every other collective, so a shift of any size never
// waits for a peer's receive before its own.

func shiftStep(rank, size int) step {
	return step{send: rank, recv: mod(rank-1, size), src: bIn, dst: bMain}
}

// Shift sends in to rank Rank+1 and receives rank Rank-1's in into out
// (modulo Size); len(in) == len(out) == c.Count*c.DType.Size() on every
// rank. With one rank, out is a copy of in. Uint8 (raw bytes) is allowed.
func (r *Ring) Shift(ctx context.Context, c Call, in, out []byte) error {
	c, err := r.begin(Shift, c)
	if err != nil {
		return err
	}
	defer r.end()
	esz := c.DType.Size()
	if err := checkLen(c, "input", in, c.Count*esz); err != nil {
		return err
	}
	if err := checkLen(c, "output", out, c.Count*esz); err != nil {
		return err
	}
	if r.size == 1 {
		copy(out, in)
		return nil
	}
	p := r.setup(c, r.size, r.size*c.Count, 1)
	p.bufs[bIn] = in
	p.base[bIn] = r.rank * len(in)
	p.bufs[bMain] = out
	p.base[bMain] = r.prev * len(out)
	return r.run(ctx)
}
