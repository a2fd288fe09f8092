package ring

import "context"

// Reducing received bytes into a buffer: recvReduce for a ring step, and
// viewFold, which reduces straight from the spans a ViewReceiver hands
// over, for the ring and the pairwise exchanges (exchange.go) alike.
// reduce goes through aligned scratch space where a user buffer is
// misaligned. The element kernels are in kernels.go.

// recvReduce receives len(dst) bytes from the previous rank and reduces
// them: dst = a op received, straight from a ViewReceiver's spans, else
// through scratch.
func (r *Ring) recvReduce(ctx context.Context, dst, a []byte, final bool) error {
	if r.view != nil {
		r.fold.start(dst, a, final, false, false)
		return r.view.RecvFromView(ctx, r.prev, len(dst), r.foldSpan)
	}
	sc := r.scratch[:len(dst)]
	if err := r.t.RecvPrev(ctx, sc); err != nil {
		return err
	}
	r.reduce(dst, a, sc, final)
	return nil
}

// viewFold reduces one received chunk from the spans a ViewReceiver hands
// over, where they lie (no copy): runs of whole, aligned elements are
// reduced in place; an element split between two spans, or a span not
// aligned for the element type, goes through scratch space.
type viewFold struct {
	r           *Ring
	dst, a      []byte // ring: dst = a op received
	final       bool   // ring: the final reduce-scatter step (Avg divides)
	pair        bool   // a pairwise exchange: dst = dst op received, or received op dst when theirsFirst
	theirsFirst bool
	pos, held   int     // bytes of dst done; bytes of a split element held
	carry       [8]byte // the start of an element split between spans
}

func (f *viewFold) start(dst, a []byte, final, pair, theirsFirst bool) {
	*f = viewFold{r: f.r, dst: dst, a: a, final: final, pair: pair, theirsFirst: theirsFirst}
}

// span folds the next received bytes.
func (f *viewFold) span(span []byte) {
	esz := f.r.p.esz
	if f.held > 0 { // complete the split element
		k := copy(f.carry[f.held:esz], span)
		f.held += k
		span = span[k:]
		if f.held < esz {
			return
		}
		f.apply(f.carry[:esz])
		f.held = 0
	}
	whole := len(span) - len(span)%esz
	if whole > 0 {
		b := span[:whole]
		if !aligned(b, esz) {
			f.r.scratch = growAligned(f.r.scratch, whole)
			b = f.r.scratch[:whole]
			copy(b, span)
		}
		f.apply(b)
	}
	f.held = copy(f.carry[:], span[whole:])
}

// apply reduces b, the received bytes at f.pos, into dst.
func (f *viewFold) apply(b []byte) {
	p, n := f.pos, len(b)
	f.pos += n
	d := f.dst[p : p+n]
	switch {
	case !f.pair:
		f.r.reduce(d, f.a[p:p+n], b, f.final)
	case f.theirsFirst:
		reduceBytes(f.r.p.call.DType, f.r.p.call.Op, d, b, d)
	default:
		reduceBytes(f.r.p.call.DType, f.r.p.call.Op, d, d, b)
	}
}

// reduce computes dst = a op b (then divides by Size on the final Avg step),
// going through aligned scratch space if a user buffer is misaligned.
func (r *Ring) reduce(dst, a, b []byte, final bool) {
	dt, op, esz := r.p.call.DType, r.p.call.Op, r.p.esz
	out := dst
	if !aligned(dst, esz) || !aligned(a, esz) {
		r.tmp = growAligned(r.tmp, len(dst))
		out = r.tmp[:len(dst)]
		copy(out, a)
		a = out
	}
	reduceBytes(dt, op, out, a, b)
	if final && op == Avg {
		divBytes(dt, out, r.size)
	}
	if len(out) > 0 && &out[0] != &dst[0] {
		copy(dst, out)
	}
}
