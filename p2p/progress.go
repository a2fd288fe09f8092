package p2p

// Progress: the last collective call each rank entered, reported to the
// rendezvous on the control stream, so that any rank can ask which ranks
// have not reached a call (QueryProgress) and the rendezvous can warn of
// a stall.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// progressReport is the control client's progress state.
type progressReport struct {
	last   atomic.Uint64 // last collective entered (SetProgress); stored under leaveTracker.mu
	sent   uint64        // last value reported, owned by reportProgress
	query  sync.Mutex    // one QueryProgress at a time
	answer chan []uint64 // the rendezvous' answer to a query
}

// progressInterval is how often a changed SetProgress value is reported to
// the rendezvous: cheap (one small control message), and fresh enough for
// stall warnings, which fire after tens of seconds.
const progressInterval = 200 * time.Millisecond

// reportProgress sends the last SetProgress value every progressInterval
// if it changed.
func (c *ctlClient) reportProgress() {
	p := &c.progress
	c.tick(progressInterval, func() *msg {
		s := p.last.Load()
		if s == p.sent {
			return nil
		}
		p.sent = s // a failed send ends the loop, so this is never stale
		return &msg{T: tProgress, Rank: max(c.n.rank(), 0), Seq: s}
	})
}

// QueryProgress asks the rendezvous for every rank's last reported
// SetProgress value (indexed by rank; 0 if a rank reported none). This
// rank's own value is reported first, so it is current.
func (n *Node) QueryProgress(ctx context.Context) ([]uint64, error) {
	c := n.ctl
	c.progress.query.Lock()
	defer c.progress.query.Unlock()
	select { // drop a stale answer to an earlier, abandoned query
	case <-c.progress.answer:
	default:
	}
	if err := c.send(&msg{T: tProgress, Rank: max(n.rank(), 0), Seq: c.progress.last.Load()}); err != nil {
		return nil, fmt.Errorf("p2p: progress query: %w", err)
	}
	if err := c.send(&msg{T: tProgQuery, Rank: max(n.rank(), 0)}); err != nil {
		return nil, fmt.Errorf("p2p: progress query: %w", err)
	}
	select {
	case p := <-c.progress.answer:
		if len(p) != n.size() {
			return nil, fmt.Errorf("p2p: progress query: the rendezvous answered for %d ranks, want %d (an older rendezvous?)", len(p), n.size())
		}
		return p, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("p2p: progress query: no answer from the rendezvous: %w", context.Cause(ctx))
	case <-c.dead:
		return nil, errors.New("p2p: progress query: control path to the rendezvous is closed")
	}
}
