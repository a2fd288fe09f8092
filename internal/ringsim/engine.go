package ringsim

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// The discrete-event loop (doc.go, "The method"): the ranks' goroutines run
// until all of them wait (settle), the sends they made are put on the
// network in a fixed order, and the clock jumps to the next event.

// engine is one simulation: the network's state, the clock, and the
// ranks' calls.
type engine struct {
	layout                Layout
	net                   Network
	scale                 int64 // wire bytes per payload byte
	latency, localLatency Time
	hosts                 []*host

	// mu guards everything below (and the links and hosts): the ranks'
	// goroutines call in through their transports while the simulator
	// runs between settles (after a preemption).
	mu     sync.Mutex
	now    Time
	events eventHeap
	seq    uint64
	links  map[int]*link // src*size + dst
	sent   []*message    // SendTo calls since the last settle
	done   int           // ranks whose work returned
	finish []Time        // per rank: when its work returned
	errs   []error       // per rank: what its work returned
	stats  Stats
}

// Stats count what a simulation moved.
type Stats struct {
	Messages       int64 // SendTo calls
	WireBytes      int64 // bytes they stand for (framing and scaled payload)
	CrossHostBytes int64 // of which between hosts
	Events         int64 // events the clock stopped at
}

func newEngine(lay Layout, nw Network, scale int64) *engine {
	e := &engine{
		layout: lay, net: nw, scale: scale,
		latency: timeOf(nw.Latency), localLatency: timeOf(nw.LocalLatency),
		links:  map[int]*link{},
		finish: make([]Time, lay.Size()),
		errs:   make([]error, lay.Size()),
	}
	for range lay.Hosts {
		full := bucket{tokens: float64(nw.Burst)} // idle links have all their tokens
		e.hosts = append(e.hosts, &host{outTokens: full, inTokens: full})
	}
	return e
}

// link returns the link src -> dst (made on first use: most pairs of a
// large job never talk). Called under mu.
func (e *engine) link(src, dst int) *link {
	k := src*e.layout.Size() + dst
	l := e.links[k]
	if l == nil {
		l = &link{src: src, dst: dst, local: e.layout.HostOf(src) == e.layout.HostOf(dst), wake: make(chan struct{}, 1)}
		e.links[k] = l
	}
	return l
}

// run starts work(rank) for every rank on a goroutine of its own, all at
// virtual time 0, and runs the clock until every one has returned. It
// returns the first rank's error, if any, or the simulation's own (a
// schedule that waits for a message nobody sent). It must run under
// exclusive.
func (e *engine) run(ctx context.Context, work func(ctx context.Context, rank int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	size := e.layout.Size()
	for r := range size {
		go func() {
			err := work(ctx, r)
			e.mu.Lock()
			e.finish[r], e.errs[r] = e.now, err
			e.done++
			e.mu.Unlock()
			if err != nil {
				cancel(fmt.Errorf("rank %d failed: %w", r, errPeerFailed))
			}
		}()
	}
	s := newSettler()
	var stuck error
	for {
		s.settle()
		e.mu.Lock()
		e.putSent()
		if e.done == size {
			e.mu.Unlock()
			break
		}
		if len(e.events) == 0 {
			// Nothing will ever arrive: the ranks wait for each other.
			// Once canceled they return; say why they were.
			if stuck == nil && ctx.Err() == nil {
				stuck = e.stuckError()
				cancel(stuck)
			}
			e.mu.Unlock()
			continue
		}
		e.now = e.events[0].at
		e.stats.Events++
		for len(e.events) > 0 && e.events[0].at == e.now {
			e.process(heap.Pop(&e.events).(*event))
		}
		e.mu.Unlock()
	}
	if stuck != nil {
		return stuck
	}
	return e.firstErr()
}

// putSent puts the messages sent since the last settle on the network, at
// e.now. The ranks' goroutines made them in whatever order the Go
// scheduler ran them; they go out sorted by sender, receiver and their
// order on the link, so that the NICs serve them in the same order on
// every run. Called under mu.
func (e *engine) putSent() {
	if len(e.sent) == 0 {
		return
	}
	// Stable: messages of one link keep the order they were sent in.
	slices.SortStableFunc(e.sent, func(a, b *message) int {
		if c := cmp.Compare(a.link.src, b.link.src); c != 0 {
			return c
		}
		return cmp.Compare(a.link.dst, b.link.dst)
	})
	for i, m := range e.sent {
		e.inject(m)
		e.sent[i] = nil
	}
	e.sent = e.sent[:0]
}

// stuckError says which ranks wait for which peers when nothing is left
// to arrive. Called under mu.
func (e *engine) stuckError() error {
	var waits []string
	keys := make([]int, 0, len(e.links))
	for k, l := range e.links {
		if l.want != nil {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		l := e.links[k]
		if len(waits) == 8 {
			waits = append(waits, "...")
			break
		}
		waits = append(waits, fmt.Sprintf("rank %d for %d bytes from rank %d", l.dst, len(l.want), l.src))
	}
	return fmt.Errorf("ringsim: the schedule is stuck at %v: %d of %d ranks have not finished and no message is on its way (waiting: %s)",
		e.now, e.layout.Size()-e.done, e.layout.Size(), strings.Join(waits, ", "))
}

// errPeerFailed is the cause the ranks are canceled with when one fails.
var errPeerFailed = errors.New("another rank failed")

// firstErr returns the error of the lowest rank that failed for a reason
// of its own rather than because another one's failure canceled it.
func (e *engine) firstErr() error {
	var first error
	for r, err := range e.errs {
		if err == nil {
			continue
		}
		err = fmt.Errorf("rank %d: %w", r, err)
		if !errors.Is(err, errPeerFailed) {
			return err
		}
		if first == nil {
			first = err
		}
	}
	return first
}

// elapsed is when the last rank's work returned.
func (e *engine) elapsed() Time { return slices.Max(e.finish) }
