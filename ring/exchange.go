package ring

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Point-to-point framing shared by the Mesh schedules (direct.go,
// scattergather.go, recdoubling.go, rabenseifner.go, the dissemination
// barrier and the direct broadcast).
//
// Every message is the usual header (the call's fingerprint including
// Call.Algo, sender, step, chunk, element offset, payload length, epoch)
// and payload. A receiver reads the header first and checks, before it
// reads any payload: the epoch (*EpochError), the fingerprint
// (*MismatchError naming both ranks and both calls), the sender, and the
// position it expects (step, chunk, offset, length); anything else is a
// protocol error naming the peer. A range of elements travels as chunks
// of at most Config.ChunkBytes; an empty range as one header-only message,
// so every link a schedule uses carries at least one checked header.

// msgHeader returns the header of this rank's messages in the running call
// (position fields zero).
func (r *Ring) msgHeader() Header {
	c := r.p.call
	return Header{Kind: c.Kind, Op: c.Op, DType: c.DType, Seq: c.Seq, Count: uint64(c.Count), Root: uint32(c.Root),
		Sender: uint32(r.rank), Codec: c.Codec, Algo: c.Algo, Epoch: r.epoch}
}

// stepPrefix starts an error message of the running call: "allreduce #7
// step 2 (rabenseifner)".
func (r *Ring) stepPrefix(step int) string {
	c := r.p.call
	if c.Kind == Allreduce || c.Algo != AlgoRing {
		return fmt.Sprintf("%s #%d step %d (%s)", c.Kind, c.Seq, step, c.Algo)
	}
	return fmt.Sprintf("%s #%d step %d", c.Kind, c.Seq, step)
}

// sender holds what one sending goroutine needs: a header being filled in
// and the two-buffer list handed to SendTo (kept so sending allocates
// nothing).
type sender struct {
	h    Header
	hdr  [HeaderSize]byte
	bufs [2][]byte
}

func (r *Ring) newSender() *sender { return &sender{h: r.msgHeader()} }

// send sends one message to rank to.
func (r *Ring) send(ctx context.Context, s *sender, to, step, chunk, off int, payload []byte) error {
	s.h.Step, s.h.Chunk, s.h.Offset, s.h.Length = uint32(step), uint32(chunk), uint64(off), uint32(len(payload))
	EncodeHeader(s.hdr[:], &s.h)
	s.bufs[0], s.bufs[1] = s.hdr[:], payload
	bufs := s.bufs[:]
	if len(payload) == 0 {
		bufs = bufs[:1]
	}
	err := r.mesh.SendTo(ctx, to, bufs...)
	s.bufs[1] = nil
	if err != nil {
		return fmt.Errorf("%s: send to rank %d: %w", r.stepPrefix(step), to, err)
	}
	r.payloadSent.Add(uint64(len(payload)))
	r.headerSent.Add(HeaderSize)
	r.msgs.Add(1)
	return nil
}

// sendRange sends elements [off, off+n) of buf to rank to as the chunks of
// step; after chunk c has been handed to the transport it calls sent(c)
// (if set).
func (r *Ring) sendRange(ctx context.Context, s *sender, to, step int, buf []byte, off, n int, sent func(c int)) error {
	p := &r.p
	for c, nc := 0, numChunks(n, p.ce); c < nc; c++ {
		lo := c * p.ce
		k := min(p.ce, n-lo)
		if err := r.send(ctx, s, to, step, c, off+lo, buf[(off+lo)*p.esz:(off+lo+k)*p.esz]); err != nil {
			return err
		}
		if sent != nil {
			sent(c)
		}
	}
	return nil
}

// recvHeader reads the next header from rank from into hdr and checks the
// epoch, the fingerprint and the sender. want names the step expected, for
// errors.
func (r *Ring) recvHeader(ctx context.Context, from int, hdr []byte, want int) (Header, error) {
	if err := r.mesh.RecvFrom(ctx, from, hdr); err != nil {
		return Header{}, fmt.Errorf("%s: recv from rank %d: %w", r.stepPrefix(want), from, err)
	}
	h, err := DecodeHeader(hdr)
	if err != nil {
		return h, fmt.Errorf("%s: recv from rank %d: %w", r.stepPrefix(want), from, err)
	}
	if err := r.checkEpoch(&h, r.p.call, from); err != nil {
		return h, err
	}
	if remote := h.Call(); !sameFingerprint(r.p.call, remote) {
		return h, &MismatchError{Local: r.p.call, Remote: remote, LocalRank: r.rank, RemoteRank: int(h.Sender)}
	}
	if h.Sender != uint32(from) {
		return h, fmt.Errorf("%s: recv from rank %d: message claims to come from rank %d", r.stepPrefix(want), from, h.Sender)
	}
	return h, nil
}

// checkPos checks that h is chunk c (element offset off, nb payload bytes)
// of step.
func (r *Ring) checkPos(h *Header, from, step, c, off, nb int) error {
	if h.Step != uint32(step) || h.Chunk != uint32(c) || h.Offset != uint64(off) || h.Length != uint32(nb) {
		return fmt.Errorf("%s: recv from rank %d: protocol error: got step %d chunk %d offset %d length %d, want step %d chunk %d offset %d length %d",
			r.stepPrefix(step), from, h.Step, h.Chunk, h.Offset, h.Length, step, c, off, nb)
	}
	return nil
}

// recvPayload reads nb payload bytes of step from rank from into dst.
func (r *Ring) recvPayload(ctx context.Context, from, step int, dst []byte) error {
	if len(dst) == 0 {
		return nil
	}
	if err := r.mesh.RecvFrom(ctx, from, dst); err != nil {
		return fmt.Errorf("%s: recv from rank %d: %w", r.stepPrefix(step), from, err)
	}
	r.payloadRecv.Add(uint64(len(dst)))
	return nil
}

// pairXfer is one round of a pairwise schedule: send elements
// [sOff, sOff+sN) of the buffer to peer and receive elements
// [rOff, rOff+rN) from it (either may be absent), all as chunks of step.
type pairXfer struct {
	peer, step int
	send, recv bool
	sOff, sN   int
	rOff, rN   int
	// reduce combines each received chunk with the buffer instead of
	// copying it in: buf = theirs op mine when theirsFirst (the peer is
	// the lower rank), else buf = mine op theirs, so that both sides of a
	// pair compute the same expression.
	reduce, theirsFirst bool
	// overlap: the received range is the sent range (a whole-buffer
	// exchange), so chunk c may be reduced only once chunk c has been sent.
	overlap bool
}

// exchange runs x on buf. Small rounds (the sent bytes fit the link's
// buffer, see SmallBytes and LinkBuffers) send, then receive, on the
// caller's goroutine; larger ones send from a goroutine while the caller
// receives and reduces, chunk by chunk.
func (r *Ring) exchange(ctx context.Context, buf []byte, x pairXfer) error {
	p := &r.p
	if !x.recv {
		return r.sendRange(ctx, r.newSenderOnce(), x.peer, x.step, buf, x.sOff, x.sN, nil)
	}
	if !x.send || x.sN*p.esz+numChunks(x.sN, p.ce)*HeaderSize <= r.sendFirstBound(x.peer) {
		if x.send {
			if err := r.sendRange(ctx, r.newSenderOnce(), x.peer, x.step, buf, x.sOff, x.sN, nil); err != nil {
				return err
			}
		}
		return r.recvXfer(ctx, buf, x, nil)
	}
	r.concurrent(true)
	defer r.concurrent(false)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var sent atomic.Int64
	wake := make(chan struct{}, 1)
	first := make(chan struct{}, 1)
	serrc := make(chan error, 1)
	go func() {
		err := r.sendRange(ctx, r.newSenderOnce(), x.peer, x.step, buf, x.sOff, x.sN, func(c int) {
			if c == 0 {
				first <- struct{}{}
			}
			sent.Store(int64(c + 1))
			notify(wake)
		})
		if err != nil {
			cancel(err)
		}
		serrc <- err
	}()
	var waitSent func(c int) error
	if x.overlap {
		waitSent = func(c int) error {
			for sent.Load() <= int64(c) {
				select {
				case <-wake:
				case <-ctx.Done():
					return fmt.Errorf("%s: waiting to send chunk %d to rank %d: %w", r.stepPrefix(x.step), c, x.peer, context.Cause(ctx))
				}
			}
			return nil
		}
	}
	rerr := r.recvXfer(ctx, buf, x, waitSent)
	if rerr != nil {
		var me *MismatchError
		if errors.As(rerr, &me) {
			awaitFirst(ctx, first)
		}
		cancel(rerr)
	}
	serr := <-serrc
	return rootCause(ctx, rerr, serr)
}

// newSenderOnce returns the Ring's sender for the caller's goroutine or
// the one sending goroutine of an exchange (never both at once).
func (r *Ring) newSenderOnce() *sender {
	r.snd.h = r.msgHeader()
	return &r.snd
}

// awaitFirst waits (at most mismatchGrace) for a sender's first message,
// so that a peer that called something else hears our fingerprint too.
func awaitFirst(ctx context.Context, first <-chan struct{}) {
	t := time.NewTimer(mismatchGrace)
	defer t.Stop()
	select {
	case <-first:
	case <-ctx.Done():
	case <-t.C:
	}
}

// rootCause picks the error to report from a call whose goroutines were
// canceled by the first failure.
func rootCause(ctx context.Context, errs ...error) error {
	cause := context.Cause(ctx)
	var first error
	for _, e := range errs {
		if e == nil {
			continue
		}
		if cause != nil && e == cause {
			return e
		}
		if first == nil {
			first = e
		}
	}
	return first
}

// recvXfer receives the chunks of x.
func (r *Ring) recvXfer(ctx context.Context, buf []byte, x pairXfer, waitSent func(c int) error) error {
	p := &r.p
	dt, op := p.call.DType, p.call.Op
	for c, nc := 0, numChunks(x.rN, p.ce); c < nc; c++ {
		lo := c * p.ce
		k := min(p.ce, x.rN-lo)
		off, nb := x.rOff+lo, k*p.esz
		h, err := r.recvHeader(ctx, x.peer, r.rhdr[:], x.step)
		if err != nil {
			return err
		}
		if err := r.checkPos(&h, x.peer, x.step, c, off, nb); err != nil {
			return err
		}
		r.markFirstRecv()
		dst := buf[off*p.esz : off*p.esz+nb]
		if !x.reduce {
			if err := r.recvPayload(ctx, x.peer, x.step, dst); err != nil {
				return err
			}
			continue
		}
		if r.view != nil && waitSent == nil {
			// Folded as it arrives. Not when the received range is the
			// one being sent (waitSent): chunk c may be folded only once
			// it is sent, and waiting for that before receiving would
			// leave the link full and the peer's sender stuck.
			r.fold.start(dst, nil, false, true, x.theirsFirst)
			if err := r.view.RecvFromView(ctx, x.peer, nb, r.foldSpan); err != nil {
				return fmt.Errorf("%s: recv from rank %d: %w", r.stepPrefix(x.step), x.peer, err)
			}
			r.payloadRecv.Add(uint64(nb))
			continue
		}
		sc := r.scratch[:nb]
		if err := r.recvPayload(ctx, x.peer, x.step, sc); err != nil {
			return err
		}
		if waitSent != nil {
			if err := waitSent(c); err != nil {
				return err
			}
		}
		if x.theirsFirst {
			reduceBytes(dt, op, dst, sc, dst)
		} else {
			reduceBytes(dt, op, dst, dst, sc)
		}
	}
	return nil
}

func (r *Ring) markFirstRecv() {
	if r.phase != nil && r.firstRecv.IsZero() {
		r.firstRecv = time.Now()
	}
}

// ---------------------------------------------------------------------------
// The power-of-two core of recursive doubling and Rabenseifner.
//
// With P the largest power of two <= N and rem = N-P, the standard fold
// (MPICH, Thakur et al. 2005) makes P ranks out of N: ranks 0..2rem-1 pair
// up, the even rank 2i sends its whole buffer to 2i+1, which reduces
// x[2i] op x[2i+1] and takes part as "new rank" i; ranks 2rem..N-1 take
// part as new rank r-rem. After the power-of-two schedule, 2i+1 sends the
// result back to 2i. New ranks keep the order of ranks, so "the lower rank
// first" is the same rule in both numberings.

type fold struct {
	p, rem, log int // P, N-P, log2(P)
}

func foldOf(n int) fold {
	f := fold{p: 1}
	for f.p*2 <= n {
		f.p *= 2
		f.log++
	}
	f.rem = n - f.p
	return f
}

// newRank returns rank's new rank, or -1 for an even rank folded into its
// odd neighbour.
func (f fold) newRank(rank int) int {
	switch {
	case rank >= 2*f.rem:
		return rank - f.rem
	case rank%2 == 1:
		return rank / 2
	}
	return -1
}

// rank returns the rank of new rank nr.
func (f fold) rank(nr int) int {
	if nr < f.rem {
		return 2*nr + 1
	}
	return nr + f.rem
}

// alignedBuf returns buf, or an aligned copy of it when buf is misaligned
// for esz (the kernels need aligned views); restore copies the result back.
func (r *Ring) alignedBuf(buf []byte, esz int) (work []byte, restore func()) {
	if aligned(buf, esz) {
		return buf, func() {}
	}
	r.align = growAligned(r.align, len(buf))
	w := r.align[:len(buf)]
	copy(w, buf)
	return w, func() { copy(buf, w) }
}
