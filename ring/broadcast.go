package ring

import "context"

// Pipelined chain broadcast along the ring: root -> root+1 -> ... -> root-1.
//
// One step, one segment (the whole buffer), cut into chunks. The root only
// sends; rank root-1 (the end of the chain) only receives; every other rank
// receives each chunk directly into its buffer and forwards it to the next
// rank as soon as it has arrived, while the following chunk is already
// arriving. With C chunks the broadcast takes about (N-1+C) chunk times
// instead of (N-1)*C, i.e. close to one buffer transfer time for C >> N.
// Each rank except root-1 sends the buffer once.

func broadcastStep(rank, size, root int) step {
	st := step{send: 0, recv: 0, dep: true, src: bMain, dst: bMain}
	if rank == root {
		st.recv, st.dep = -1, false
	}
	if rank == mod(root-1, size) {
		st.send = -1
	}
	return st
}

// Broadcast copies c.Root's buf into buf on every other rank. len(buf) must
// be c.Count*c.DType.Size(). Uint8 (raw bytes) is allowed.
func (r *Ring) Broadcast(ctx context.Context, c Call, buf []byte) error {
	c, err := r.begin(Broadcast, c)
	if err != nil {
		return err
	}
	defer r.end()
	if err := checkLen(c, "buffer", buf, c.Count*c.DType.Size()); err != nil {
		return err
	}
	if r.size == 1 {
		return nil
	}
	if r.mesh != nil && len(buf)+numChunks(c.Count, max(1, r.chunkBytes/c.DType.Size()))*HeaderSize <= SmallBytes {
		c.Algo = AlgoDirect
		return r.broadcastDirect(ctx, c, buf)
	}
	p := r.setup(c, 1, c.Count, 1)
	p.bufs[bMain] = buf
	return r.run(ctx)
}

// Direct broadcast over a Mesh, for buffers that fit a transport's buffer
// (SmallBytes): the root sends the whole buffer straight to every other
// rank (step 0, as chunks of Config.ChunkBytes), one hop instead of the
// chain's N-1. The header carries Algo = AlgoDirect. The root's sends never
// wait for a receiver, since every message fits the link's buffer.
func (r *Ring) broadcastDirect(ctx context.Context, c Call, buf []byte) error {
	r.setup(c, 1, c.Count, 0)
	r.startPhases(0)
	if r.rank == c.Root {
		s := r.newSenderOnce()
		for k := 1; k < r.size; k++ {
			if err := r.sendRange(ctx, s, mod(c.Root+k, r.size), 0, buf, 0, c.Count, nil); err != nil {
				return err
			}
		}
	} else if err := r.recvRange(ctx, c.Root, 0, buf, 0, c.Count); err != nil {
		return err
	}
	r.reportSimplePhases(c.Kind.String())
	return nil
}
