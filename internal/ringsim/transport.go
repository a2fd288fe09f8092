package ringsim

import (
	"context"
	"fmt"

	"github.com/gorun/gorun/ring"
)

// transport is one rank's ring.Mesh over the simulated network. A send
// hands a copy of its bytes to the simulator and returns at once (links
// buffer without bound: doc.go, "The model"); a receive returns when the
// bytes it asks for have arrived, in virtual time.
type transport struct {
	e    *engine
	rank int
}

var (
	_ ring.Mesh        = (*transport)(nil)
	_ ring.LinkBuffers = (*transport)(nil)
)

// shmLinkBytes is what gorun's shared-memory links hold (p2p's default
// GORUN_SHM_BYTES), which decides, through ring.LinkBuffers, which steps
// of a schedule are sent before they are received.
const shmLinkBytes = 2 << 20

// LinkBuffer implements ring.LinkBuffers as gorun's transport does: a link
// within a host holds a shared-memory ring, one between hosts promises
// nothing beyond ring.SmallBytes. In a scaled run (doc.go, "Large
// buffers") the ring holds as many of the run's bytes as it would hold
// of the full-size ones.
func (t *transport) LinkBuffer(rank int) int {
	if t.e.layout.HostOf(rank) != t.e.layout.HostOf(t.rank) {
		return 0
	}
	return int(shmLinkBytes / t.e.scale)
}

// SendNext implements ring.Transport.
func (t *transport) SendNext(ctx context.Context, bufs ...[]byte) error {
	return t.SendTo(ctx, (t.rank+1)%t.e.layout.Size(), bufs...)
}

// RecvPrev implements ring.Transport.
func (t *transport) RecvPrev(ctx context.Context, buf []byte) error {
	n := t.e.layout.Size()
	return t.RecvFrom(ctx, (t.rank+n-1)%n, buf)
}

func (t *transport) check(rank int) error {
	if rank < 0 || rank >= t.e.layout.Size() || rank == t.rank {
		return fmt.Errorf("ringsim: rank %d cannot talk to rank %d", t.rank, rank)
	}
	return nil
}

// SendTo implements ring.Mesh. The message is one SendTo call: the ring
// sends a header and a payload in one, so the first ring.HeaderSize bytes
// are framing and the rest payload, which a scaled run multiplies.
func (t *transport) SendTo(ctx context.Context, rank int, bufs ...[]byte) error {
	if err := t.check(rank); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	data := make([]byte, 0, total)
	for _, b := range bufs {
		data = append(data, b...)
	}
	frame := int64(min(total, ring.HeaderSize))
	wire := frame + (int64(total)-frame)*t.e.scale
	e := t.e
	e.mu.Lock()
	e.sent = append(e.sent, &message{link: e.link(t.rank, rank), data: data, wire: wire})
	e.mu.Unlock()
	return nil
}

// RecvFrom implements ring.Mesh.
func (t *transport) RecvFrom(ctx context.Context, rank int, buf []byte) error {
	if err := t.check(rank); err != nil {
		return err
	}
	if len(buf) == 0 {
		return nil
	}
	e := t.e
	e.mu.Lock()
	l := e.link(rank, t.rank)
	if l.want != nil {
		e.mu.Unlock()
		return fmt.Errorf("ringsim: rank %d: two receives from rank %d at once", t.rank, rank)
	}
	l.want = buf
	if l.fill() {
		l.want = nil
		e.mu.Unlock()
		return nil
	}
	e.mu.Unlock()
	select {
	case <-l.wake:
		return nil
	case <-ctx.Done():
		e.mu.Lock()
		waiting := l.want != nil
		l.want = nil
		e.mu.Unlock()
		if !waiting { // it came anyway: take the wake-up, keep the bytes
			<-l.wake
			return nil
		}
		return fmt.Errorf("ringsim: rank %d: receive from rank %d: %w", t.rank, rank, context.Cause(ctx))
	}
}
