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

// Barrier returns once every rank has called Barrier with the same Seq.
// Only c.Seq and c.Name are used.
func (r *Ring) Barrier(ctx context.Context, c Call) error {
	c, err := r.begin(Barrier, c)
	if err != nil {
		return err
	}
	defer r.end()
	if r.size == 1 {
		return nil
	}
	r.setup(c, r.size, 0, r.size-1)
	return r.run(ctx)
}
