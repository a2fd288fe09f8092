package p2p

import (
	"context"
	"errors"
	"sync"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// errHostClosed: a dial asked for after the host closed.
var errHostClosed = errors.New("the libp2p host is closed")

// hostGuard keeps a libp2p host from being closed in the middle of a
// dial: go-libp2p's swarm can panic (a nil transport) when Close runs
// while one of its dial workers picks the peer's addresses. A replica
// keeps dialing replicas that are gone, and a rank its rendezvous group,
// right up to their Close, so the window is there at every job's end.
type hostGuard struct {
	mu     sync.RWMutex
	closed bool
	// closing ends the dials under way, so that close waits for none to
	// run out its own deadline.
	initOnce, closeOnce sync.Once
	closing             chan struct{}
}

func (g *hostGuard) closingCh() chan struct{} {
	g.initOnce.Do(func() { g.closing = make(chan struct{}) })
	return g.closing
}

// newStream opens a stream with a dial if needed, unless the host closed;
// close cancels it.
func (g *hostGuard) newStream(ctx context.Context, h host.Host, pid peer.ID, proto protocol.ID) (network.Stream, error) {
	closing := g.closingCh()
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.closed {
		return nil, errHostClosed
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	return h.NewStream(ctx, pid, proto)
}

// close cancels the dials under way and closes h once none runs.
func (g *hostGuard) close(h host.Host) error {
	closing := g.closingCh()
	g.closeOnce.Do(func() { close(closing) })
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	return h.Close()
}
