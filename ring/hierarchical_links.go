package ring

import (
	"context"
	"fmt"
	"time"
)

// The hierarchical allreduce's work per link (hierarchical.go explains the
// schedule and starts it): a sender per peer that writes its queue in
// order (sendLoop), a receiver per local peer for phases (a) and (c)
// (recvLocal), the receiver of the cross-host ring (b), which reduces,
// forwards and hands final chunks to the local peers (recvCross), and the
// host fold of phase (a) on the caller's goroutine (fold).

// sendLoop writes the total messages queued for peer to, in order, after a
// header-only hello if asked.
func (x *hier) sendLoop(to int, hello bool, total int) error {
	r, q := x.r, x.queues[to]
	first := true
	signal := func() {
		if first {
			first = false
			x.firstWG.Done()
		}
	}
	defer signal()
	h := Header{Kind: x.c.Kind, Op: x.c.Op, DType: x.c.DType, Seq: x.c.Seq, Count: uint64(x.c.Count),
		Sender: uint32(r.rank), Codec: x.c.Codec, Algo: x.c.Algo, Epoch: r.epoch}
	var hdr [HeaderSize]byte
	bufs := make([][]byte, 2)
	send := func(m hmsg) error {
		h.Step, h.Chunk, h.Offset, h.Length = m.step, m.chunk, uint64(m.off), uint32(len(m.payload))
		EncodeHeader(hdr[:], &h)
		bufs[0], bufs[1] = hdr[:], m.payload
		b := bufs
		if len(m.payload) == 0 {
			b = bufs[:1]
		}
		if err := x.mesh.SendTo(x.ctx, to, b...); err != nil {
			return fmt.Errorf("%s: send to rank %d: %w", x.prefix(m.step), to, err)
		}
		r.payloadSent.Add(uint64(len(m.payload)))
		r.headerSent.Add(HeaderSize)
		r.msgs.Add(1)
		signal()
		return nil
	}
	if hello {
		if err := send(hmsg{step: x.stepHello()}); err != nil {
			return err
		}
	}
	for range total {
		var m hmsg
		select {
		case m = <-q:
		case <-x.ctx.Done():
			return &sendIdleError{fmt.Errorf("%s #%d hierarchical: waiting for data to send to rank %d: %w", x.c.Kind, x.c.Seq, to, context.Cause(x.ctx))}
		}
		if err := send(m); err != nil {
			return err
		}
	}
	return nil
}

// sendIdleError is a sender's failure while it waited for data to send.
type sendIdleError struct{ err error }

func (e *sendIdleError) Error() string { return e.err.Error() }
func (e *sendIdleError) Unwrap() error { return e.err }

// recvHeader reads the next header from rank from and checks it against
// the call and the expected position before any payload is read.
func (x *hier) recvHeader(hdr []byte, from int, step uint32, chunk, off, nb int) error {
	r := x.r
	if err := x.mesh.RecvFrom(x.ctx, from, hdr); err != nil {
		return fmt.Errorf("%s: recv from rank %d: %w", x.prefix(step), from, err)
	}
	h, err := DecodeHeader(hdr)
	if err != nil {
		return fmt.Errorf("%s: recv from rank %d: %w", x.prefix(step), from, err)
	}
	if err := r.checkEpoch(&h, x.c, from); err != nil {
		return err
	}
	if remote := h.Call(); !sameFingerprint(x.c, remote) {
		return &MismatchError{Local: x.c, Remote: remote, LocalRank: r.rank, RemoteRank: int(h.Sender)}
	}
	if h.Sender != uint32(from) || h.Step != step || h.Chunk != uint32(chunk) || h.Offset != uint64(off) || h.Length != uint32(nb) {
		return fmt.Errorf("%s: recv from rank %d: protocol error: got sender %d step %d chunk %d offset %d length %d, want sender %d step %d chunk %d offset %d length %d",
			x.prefix(step), from, h.Sender, h.Step, h.Chunk, h.Offset, h.Length, from, step, chunk, off, nb)
	}
	return nil
}

func (x *hier) recvPayload(from int, step uint32, dst []byte) error {
	if len(dst) == 0 {
		return nil
	}
	if err := x.mesh.RecvFrom(x.ctx, from, dst); err != nil {
		return fmt.Errorf("%s: recv from rank %d: %w", x.prefix(step), from, err)
	}
	x.r.payloadRecv.Add(uint64(len(dst)))
	return nil
}

// slotA is the copy of our segment that local index j sent, in scratchA.
func (x *hier) slotA(j int) []byte {
	if j > x.lay.idx {
		j--
	}
	n := x.segLen * x.esz
	return x.scratchA[j*n : (j+1)*n]
}

// recvLocal receives everything local index j sends: its copy of our
// segment (a), into scratch, then its final segment j (c), into the buffer.
func (x *hier) recvLocal(j int) error {
	from := x.peer(x.lay.host, j)
	slot := x.slotA(j)
	var hdr [HeaderSize]byte
	for s := range x.lay.h {
		off, n := x.sub(x.lay.idx, x.foldOrder(s))
		for c := range numChunks(n, x.ce) {
			lo, k := x.chunk(off, n, c)
			nb := max(k, 0) * x.esz
			if err := x.recvHeader(hdr[:], from, x.stepA(s), c, lo, nb); err != nil {
				return err
			}
			b := (lo - x.segOff) * x.esz
			if err := x.recvPayload(from, x.stepA(s), slot[b:b+nb]); err != nil {
				return err
			}
			x.arrivedA[j] <- struct{}{} // buffered for every chunk: never blocks
		}
	}
	for s := range x.lay.h {
		off, n := x.sub(j, x.finalOrder(s))
		for c := range numChunks(n, x.ce) {
			lo, k := x.chunk(off, n, c)
			k = max(k, 0)
			if err := x.recvHeader(hdr[:], from, x.stepC(s), c, lo, k*x.esz); err != nil {
				return err
			}
			if err := x.recvPayload(from, x.stepC(s), x.bytes(lo, k)); err != nil {
				return err
			}
		}
	}
	return nil
}

// fold is phase (a) on the caller's goroutine: every chunk of our segment,
// in the order the cross-host ring needs them, folded over the host in
// local-rank order as soon as all local peers' copies have arrived.
func (x *hier) fold(next int) error {
	lay, c := x.lay, x.c
	for s := range lay.h {
		off, n := x.sub(lay.idx, x.foldOrder(s))
		for ci := range numChunks(n, x.ce) {
			lo, k := x.chunk(off, n, ci)
			k = max(k, 0)
			for j := range lay.l {
				if j == lay.idx {
					continue
				}
				select {
				case <-x.arrivedA[j]:
				case <-x.ctx.Done():
					return fmt.Errorf("%s: waiting for chunk %d from rank %d: %w", x.prefix(x.stepA(s)), ci, x.peer(lay.host, j), context.Cause(x.ctx))
				}
			}
			dst := x.bytes(lo, k)
			if k > 0 && lay.l > 1 {
				b := (lo - x.segOff) * x.esz
				operand := func(j int) []byte {
					if j == lay.idx {
						return dst
					}
					return x.slotA(j)[b : b+k*x.esz]
				}
				acc := operand(0)
				for j := 1; j < lay.l; j++ {
					reduceBytes(c.DType, c.Op, acc, acc, operand(j))
				}
				if lay.h == 1 && c.Op == Avg {
					divBytes(c.DType, acc, x.r.size)
				}
				if &acc[0] != &dst[0] {
					copy(dst, acc)
				}
			}
			if lay.h == 1 { // final: straight to the local peers
				x.queueFinal(s, ci, lo, dst)
			} else if s == 0 { // the first subsegment the cross-host ring sends
				x.queues[next] <- hmsg{step: x.stepB(0), chunk: uint32(ci), off: lo, payload: dst}
			}
			x.aProgress.Add(1)
			select {
			case x.aWake <- struct{}{}:
			default:
			}
		}
	}
	x.tA = time.Now()
	return nil
}

// queueFinal sends a final chunk of our segment (the s-th subsegment to be
// final) to every other rank of the host.
func (x *hier) queueFinal(s, c, off int, payload []byte) {
	for j := range x.lay.l {
		if j != x.lay.idx {
			x.queues[x.peer(x.lay.host, j)] <- hmsg{step: x.stepC(s), chunk: uint32(c), off: off, payload: payload}
		}
	}
}

// recvCross is the receiving side of the cross-host ring (b): the hello,
// then every step's chunks from the previous host, reduced (reduce-scatter)
// or copied (allgather), each forwarded to the next host and, once final,
// to the local peers.
func (x *hier) recvCross(prev, next int) error {
	lay, c := x.lay, x.c
	var hdr [HeaderSize]byte
	if err := x.recvHeader(hdr[:], prev, x.stepHello(), 0, 0, 0); err != nil {
		return err
	}
	steps := 2 * (lay.h - 1)
	// need counts the (a) chunks folded before the one we reduce next: the
	// first subsegment folded is the one sent at step 0, then the one
	// received at step 0, 1, ...
	_, n0 := x.sub(lay.idx, x.foldOrder(0))
	need := int64(numChunks(n0, x.ce))
	for t := range steps {
		step := x.stepB(t)
		reduce := t < lay.h-1
		off, n := x.sub(lay.idx, x.recvSub(t))
		for ci := range numChunks(n, x.ce) {
			lo, k := x.chunk(off, n, ci)
			k = max(k, 0)
			nb := k * x.esz
			if err := x.recvHeader(hdr[:], prev, step, ci, lo, nb); err != nil {
				return err
			}
			dst := x.bytes(lo, k)
			if reduce {
				sc := x.scratchB[:nb]
				if err := x.recvPayload(prev, step, sc); err != nil {
					return err
				}
				// Our own operand is the host fold of this chunk.
				need++
				for x.aProgress.Load() < need {
					select {
					case <-x.aWake:
					case <-x.ctx.Done():
						return fmt.Errorf("%s: waiting for the host reduction of chunk %d: %w", x.prefix(step), ci, context.Cause(x.ctx))
					}
				}
				if nb > 0 {
					reduceBytes(c.DType, c.Op, dst, dst, sc)
					if t == lay.h-2 && c.Op == Avg {
						divBytes(c.DType, dst, x.r.size)
					}
				}
			} else if err := x.recvPayload(prev, step, dst); err != nil {
				return err
			}
			if t+1 < steps {
				x.queues[next] <- hmsg{step: x.stepB(t + 1), chunk: uint32(ci), off: lo, payload: dst}
			}
			if t >= lay.h-2 {
				x.queueFinal(t-(lay.h-2), ci, lo, dst)
			}
		}
	}
	x.tB = time.Now()
	return nil
}
