package ring

import (
	"context"
	"fmt"
	"sync"
)

// MemPipeCapacity is the buffer size of each in-memory link, comparable to a
// TCP socket buffer.
const MemPipeCapacity = 1 << 20

// MemTransport is an in-memory Mesh for tests and benchmarks, in the spirit
// of etcd/raft's in-memory network: rank i writes into a bounded byte pipe
// that rank j reads, one pipe per ordered pair. Blocking calls honour ctx
// cancellation.
type MemTransport struct {
	rank  int
	pipes [][]*memPipe // pipes[i][j]: rank i -> rank j (shared by all ranks)
}

// NewMemRing returns n connected in-memory transports; element i is for rank
// i and is a *MemTransport (a Mesh; use Close to inject failures).
func NewMemRing(n int) []Transport {
	if n < 1 {
		return nil
	}
	pipes := make([][]*memPipe, n)
	for i := range pipes {
		pipes[i] = make([]*memPipe, n)
		for j := range pipes[i] {
			pipes[i][j] = &memPipe{
				from: i, to: j,
				rd: make(chan struct{}, 1), wr: make(chan struct{}, 1),
			}
		}
	}
	ts := make([]Transport, n)
	for i := range ts {
		ts[i] = &MemTransport{rank: i, pipes: pipes}
	}
	return ts
}

// LinkBuffer implements LinkBuffers: every pipe holds MemPipeCapacity.
func (m *MemTransport) LinkBuffer(rank int) int { return MemPipeCapacity }

func (m *MemTransport) to(rank int) *memPipe   { return m.pipes[m.rank][rank] }
func (m *MemTransport) from(rank int) *memPipe { return m.pipes[rank][m.rank] }

// SendNext implements Transport.
func (m *MemTransport) SendNext(ctx context.Context, bufs ...[]byte) error {
	return m.SendTo(ctx, (m.rank+1)%len(m.pipes), bufs...)
}

// RecvPrev implements Transport.
func (m *MemTransport) RecvPrev(ctx context.Context, buf []byte) error {
	return m.RecvFrom(ctx, (m.rank+len(m.pipes)-1)%len(m.pipes), buf)
}

// SendTo implements Mesh.
func (m *MemTransport) SendTo(ctx context.Context, rank int, bufs ...[]byte) error {
	if rank < 0 || rank >= len(m.pipes) || rank == m.rank {
		return fmt.Errorf("mem transport: rank %d cannot send to rank %d", m.rank, rank)
	}
	for _, b := range bufs {
		if err := m.to(rank).write(ctx, b); err != nil {
			return err
		}
	}
	return nil
}

// RecvFrom implements Mesh.
func (m *MemTransport) RecvFrom(ctx context.Context, rank int, buf []byte) error {
	if rank < 0 || rank >= len(m.pipes) || rank == m.rank {
		return fmt.Errorf("mem transport: rank %d cannot receive from rank %d", m.rank, rank)
	}
	return m.from(rank).read(ctx, buf)
}

// Close simulates a crash of this rank: all of its links break with err
// (wrapped), waking every blocked reader and writer on them. Buffered data
// is discarded. Close is idempotent; the first error wins.
func (m *MemTransport) Close(err error) {
	for j := range m.pipes {
		if j != m.rank {
			m.to(j).close(err)
			m.from(j).close(err)
		}
	}
}

// memPipe is a single-producer single-consumer bounded byte ring buffer. The
// writer copies into free space and the reader copies out of filled space
// without holding the lock (the regions are disjoint); the mutex only guards
// the indices, and the cap-1 channels carry wake-ups so waits can select on
// ctx.Done().
type memPipe struct {
	from, to int
	buf      []byte
	rd, wr   chan struct{} // "data available" / "space available"

	mu   sync.Mutex
	head int // read position
	n    int // buffered bytes
	err  error
}

func notify(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (p *memPipe) close(err error) {
	p.mu.Lock()
	if p.err == nil {
		p.err = fmt.Errorf("mem transport: link rank %d -> rank %d closed: %w", p.from, p.to, err)
		p.n = 0
	}
	p.mu.Unlock()
	notify(p.rd)
	notify(p.wr)
}

func (p *memPipe) write(ctx context.Context, b []byte) error {
	for len(b) > 0 {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		p.mu.Lock()
		if p.buf == nil { // allocated on first use: most pairs of a big mesh never talk
			p.buf = make([]byte, MemPipeCapacity)
		}
		err, free, tail := p.err, len(p.buf)-p.n, (p.head+p.n)%len(p.buf)
		p.mu.Unlock()
		if err != nil {
			return err
		}
		if free == 0 {
			select {
			case <-p.wr:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			continue
		}
		k := copy(p.buf[tail:min(len(p.buf), tail+free)], b)
		b = b[k:]
		p.mu.Lock()
		p.n += k
		p.mu.Unlock()
		notify(p.rd)
	}
	return nil
}

func (p *memPipe) read(ctx context.Context, b []byte) error {
	for len(b) > 0 {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		p.mu.Lock()
		err, n, head, buf := p.err, p.n, p.head, p.buf
		p.mu.Unlock()
		if err != nil {
			return err
		}
		if n == 0 {
			select {
			case <-p.rd:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			continue
		}
		k := copy(b, buf[head:min(len(buf), head+n)])
		b = b[k:]
		p.mu.Lock()
		if p.err == nil {
			p.head = (p.head + k) % len(p.buf)
			p.n -= k
		}
		p.mu.Unlock()
		notify(p.wr)
	}
	return nil
}
