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
}

// newStream opens a stream with a dial if needed, unless the host closed.
// ctx must end when the owner closes, or close waits for the dial.
func (g *hostGuard) newStream(ctx context.Context, h host.Host, pid peer.ID, proto protocol.ID) (network.Stream, error) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.closed {
		return nil, errHostClosed
	}
	return h.NewStream(ctx, pid, proto)
}

// close closes h once no dial runs.
func (g *hostGuard) close(h host.Host) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	return h.Close()
}
