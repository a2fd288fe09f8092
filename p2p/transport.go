package p2p

// The ring.Transport adapter: an epoch's links as a ring.Mesh, with the
// optional ring interfaces the links can back (views, link buffers,
// grouped steps, concurrency), and how a failed transfer is explained.

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/gorun/gorun/ring"
)

// linkGrace is how long a failed transfer waits for the control path to
// explain the failure.
const linkGrace = time.Second

// transport implements ring.Mesh over the node's links: one ordered stream
// to and one from every other rank. SendNext and RecvPrev use the streams
// to rank+1 and from rank-1.
type transport struct {
	n          *Node
	ep         *epochRun // the epoch whose links these are
	me, size   int
	to, from   []*link // indexed by peer rank; nil at me
	pollBudget time.Duration
	pollYield  bool
	// linkBufferTest, set only by tests, overrides LinkBuffer's choice for
	// shm links: +1 promises the ring's capacity even with pollYield and
	// GOMAXPROCS 1 (the send-first path on any host), -1 promises nothing
	// (a sender goroutine, as a rank that chose otherwise would run).
	linkBufferTest int8
	// groupSteps: every rank of the job on this host has a CPU, but not
	// two (GroupedSteps). groupStepsTest, set only by tests, overrides
	// it: +1 true, -1 false.
	groupSteps     bool
	groupStepsTest int8
	// concurrent counts the collectives that run goroutines of their own
	// now (ring.Concurrency): a shm wait then lets them run before it
	// polls and before it parks.
	concurrent atomic.Int32
}

var (
	_ ring.Mesh         = (*transport)(nil)
	_ ring.Concurrency  = (*transport)(nil)
	_ ring.LinkBuffers  = (*transport)(nil)
	_ ring.ViewReceiver = (*transport)(nil)
	_ ring.GroupedSteps = (*transport)(nil)
)

// RecvFromView implements ring.ViewReceiver: from a shared-memory link the
// bytes are handed over in place; from a socket they are read into the
// link's buffer first.
func (t *transport) RecvFromView(ctx context.Context, rank, n int, use func(span []byte)) error {
	if rank < 0 || rank >= t.size || rank == t.me {
		return fmt.Errorf("p2p: rank %d cannot receive from rank %d (size %d)", t.me, rank, t.size)
	}
	if err := t.pre(ctx); err != nil {
		return err
	}
	l := t.from[rank]
	if err := l.conn.recvView(ctx, n, use, t.waitPolicy()); err != nil {
		return t.fail(ctx, err, "recv from", l)
	}
	return nil
}

// LinkBuffer implements ring.LinkBuffers: a shared-memory link holds its
// ring's capacity; a socket's kernel buffer is not promised (0).
//
// On a host with more ranks than CPUs (pollYield) it promises nothing
// either while this process runs Go code on one thread (GOMAXPROCS 1, as
// the MNIST example sets when 4 ranks share 2 CPUs): there the sender
// goroutine did better. With more threads, sending a whole step before
// receiving did better (BENCHMARKS.md).
func (t *transport) LinkBuffer(rank int) int {
	if rank < 0 || rank >= len(t.to) || t.to[rank] == nil {
		return 0
	}
	s, ok := t.to[rank].conn.(*shmLink)
	if !ok {
		return 0
	}
	switch {
	case t.linkBufferTest < 0:
		return 0
	case t.linkBufferTest == 0 && t.pollYield && runtime.GOMAXPROCS(0) == 1:
		return 0
	}
	return len(s.ring.data)
}

// GroupedSteps implements ring.GroupedSteps: true where the host has a
// CPU for every rank of the job on it but not two, so that a sender
// goroutine beside the receiver would only take turns with it (see
// ring.Ring.runGrouped). With more ranks than CPUs the groups were not
// faster (BENCHMARKS.md).
func (t *transport) GroupedSteps() bool {
	if t.groupStepsTest != 0 {
		return t.groupStepsTest > 0
	}
	return t.groupSteps
}

// waitPolicy is how a transfer of this transport waits.
func (t *transport) waitPolicy() linkWait {
	return linkWait{budget: t.pollBudget, yield: t.pollYield, gosched: t.concurrent.Load() > 0}
}

// Concurrent implements ring.Concurrency.
func (t *transport) Concurrent(on bool) {
	if on {
		t.concurrent.Add(1)
	} else {
		t.concurrent.Add(-1)
	}
}

func (t *transport) pre(ctx context.Context) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	select {
	case <-t.ep.done:
		return t.n.epochErr(t.ep)
	default:
		return nil
	}
}

// fail turns a link error into the error the caller should see: the
// context's cause if ctx ended, the node's abort cause if the job was
// aborted, otherwise the error naming the peer.
func (t *transport) fail(ctx context.Context, err error, op string, l *link) error {
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		// The socket deadline can fire a hair before the context's timer.
		tm := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-tm.C:
		}
		tm.Stop()
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	// A link usually breaks because a peer aborted or died; the control
	// path brings the real cause a moment later. Wait for it briefly so the
	// caller sees "rank 1 aborted: ..." rather than a bare EOF.
	grace := linkGrace
	if t.n.cfg.Elastic {
		// The rendezvous decides what a broken link means (a lost member,
		// or a link to set up again) and always answers with a new epoch;
		// it needs at most a heartbeat bound to see a member is gone.
		t.n.reportLinkFailure(t.ep, l.peer, fmt.Errorf("%s rank %d (%s): %w", op, l.peer, l.addr, err))
		grace = t.n.cfg.HeartbeatTimeout + t.n.cfg.Timeout
	}
	tm := time.NewTimer(grace)
	defer tm.Stop()
	select {
	case <-t.ep.done:
		return t.n.epochErr(t.ep)
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-tm.C:
	}
	return fmt.Errorf("%s rank %d (%s): %w", op, l.peer, l.addr, err)
}

// SendNext writes bufs, in order, to rank+1 (one writev for socket links).
func (t *transport) SendNext(ctx context.Context, bufs ...[]byte) error {
	return t.SendTo(ctx, (t.me+1)%t.size, bufs...)
}

// RecvPrev reads exactly len(buf) bytes from rank-1.
func (t *transport) RecvPrev(ctx context.Context, buf []byte) error {
	return t.RecvFrom(ctx, (t.me-1+t.size)%t.size, buf)
}

// SendTo writes bufs, in order, to rank (one writev for socket links). Calls
// for different ranks may run concurrently.
func (t *transport) SendTo(ctx context.Context, rank int, bufs ...[]byte) error {
	if rank < 0 || rank >= t.size || rank == t.me {
		return fmt.Errorf("p2p: rank %d cannot send to rank %d (size %d)", t.me, rank, t.size)
	}
	if err := t.pre(ctx); err != nil {
		return err
	}
	l := t.to[rank]
	if err := l.conn.send(ctx, bufs, t.waitPolicy()); err != nil {
		return t.fail(ctx, err, "send to", l)
	}
	return nil
}

// RecvFrom reads exactly len(buf) bytes from rank. Calls for different
// ranks may run concurrently.
func (t *transport) RecvFrom(ctx context.Context, rank int, buf []byte) error {
	if rank < 0 || rank >= t.size || rank == t.me {
		return fmt.Errorf("p2p: rank %d cannot receive from rank %d (size %d)", t.me, rank, t.size)
	}
	if err := t.pre(ctx); err != nil {
		return err
	}
	l := t.from[rank]
	if err := l.conn.recv(ctx, buf, t.waitPolicy()); err != nil {
		return t.fail(ctx, err, "recv from", l)
	}
	return nil
}
