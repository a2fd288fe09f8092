package ring

import "context"

// Direct allreduce: every rank sends its whole buffer to every other rank
// and folds the N buffers itself, in rank order
// ((x0 op x1) op x2) op ... op x(N-1); Avg divides the sum by N once. Every
// rank computes the same expression on the same bytes, so results are
// bitwise identical everywhere, and the order depends only on N.
//
// Over a Mesh it is one hop: the scatter half of the scatter-gather engine
// (scattergather.go) with every rank owning the whole buffer (step 1 on
// every link; small buffers are sent, then received, on the caller's
// goroutine; large ones, if a policy forces it, by a sender and a receiver
// per peer, folding chunk by chunk as the buffers arrive). Over a plain
// Transport it is an allgather of whole buffers around the ring (N-1
// dependent hops, the ring engine's allgather schedule) followed by the
// same fold.
//
// Each rank sends (N-1)*S payload bytes instead of the ring's 2(N-1)/N*S,
// which is nothing for tiny buffers, where an allreduce is bound by
// latency: the ring's 2(N-1) dependent hops cost far more than the bytes.

// TinyAllreduceBytes is the largest buffer the default policy reduces with
// the direct allreduce (see defaultRules).
const TinyAllreduceBytes = 4 << 10

func (r *Ring) allreduceDirect(ctx context.Context, c Call, buf []byte) error {
	if r.mesh != nil {
		r.setup(c, r.size, c.Count, 0)
		work, restore := r.alignedBuf(buf, c.DType.Size())
		if err := r.meshReduce(ctx, work, true); err != nil {
			return err
		}
		restore()
		return nil
	}
	n := len(buf)
	r.gather = growAligned(r.gather, r.size*n)
	all := r.gather[:r.size*n]
	copy(all[r.rank*n:], buf)
	p := r.setup(c, r.size, r.size*c.Count, r.size-1)
	p.gather = true
	p.bufs[bMain] = all
	if err := r.run(ctx); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	r.tmp = growAligned(r.tmp, n)
	acc := r.tmp[:n]
	r.foldInOrder(acc, func(j int) []byte { return all[j*n : (j+1)*n] })
	copy(buf, acc)
	return nil
}
