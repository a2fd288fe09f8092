package ring

import "context"

// Ring barrier: N-1 steps of header-only messages, each forwarded only after
// the previous one arrived (a token passed N-1 times around the ring, from
// every rank at once).
//
// At step t rank r receives a message that rank r-1 sent after it had
// received step t-1 from rank r-2, and so on, so the message rank r receives
// at step N-2 causally follows the entry of ranks r-1, r-2, ..., r-(N-1):
// every other rank has entered the barrier before any rank leaves it. Each
// message carries the Barrier fingerprint (Seq), so a rank calling something
// else meanwhile is reported as *MismatchError.

func barrierStep(t int) step {
	return step{send: 0, recv: 0, dep: t > 0, src: bMain, dst: bMain}
}

// Dissemination barrier over a Mesh (Hensgen, Finkel & Manber 1988; the
// barrier of MPICH and Gloo): ceil(log2 N) rounds; in round k rank r sends
// a header-only message to rank r+2^k and waits for the one from rank
// r-2^k (mod N). After round k a rank has heard, directly or through the
// messages it waited for, from the 2^(k+1)-1 ranks before it, so after the
// last round from all others: no rank leaves before every rank entered.
// Round k travels as step k; the header carries the Barrier fingerprint
// with Algo = AlgoDirect, so a rank that called something else, or runs the
// ring barrier, is reported as *MismatchError.

// Barrier returns once every rank has called Barrier with the same Seq.
// Only c.Seq and c.Name are used. Over a Mesh it is the dissemination
// barrier (ceil(log2 N) hops), otherwise the ring barrier (N-1 hops).
func (r *Ring) Barrier(ctx context.Context, c Call) error {
	c, err := r.begin(Barrier, c)
	if err != nil {
		return err
	}
	defer r.end()
	if r.size == 1 {
		return nil
	}
	if r.mesh == nil {
		c.Algo = AlgoRing
		r.setup(c, r.size, 0, r.size-1)
		return r.run(ctx)
	}
	c.Algo = AlgoDirect
	r.setup(c, r.size, 0, 0)
	r.startPhases(0)
	s := r.newSenderOnce()
	for k, d := 0, 1; d < r.size; k, d = k+1, d*2 {
		to, from := mod(r.rank+d, r.size), mod(r.rank-d, r.size)
		if err := r.send(ctx, s, to, k, 0, 0, nil); err != nil {
			return err
		}
		h, err := r.recvHeader(ctx, from, r.rhdr[:], k)
		if err != nil {
			return err
		}
		if err := r.checkPos(&h, from, k, 0, 0, 0); err != nil {
			return err
		}
		r.markFirstRecv()
	}
	r.reportSimplePhases(c.Kind.String())
	return nil
}
