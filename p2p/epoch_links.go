package p2p

// An epoch's links: which links a rank dials and which it waits for, setting
// up all of them (to and from every other rank) as the epoch's transport,
// and ending them in order on a clean Close.

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"
)

// epochLinks are the links of the epoch a node is in.
type epochLinks struct {
	expect map[int]bool // link ids we accept (linkKey)
	have   map[int]bool // link ids accepted so far
	// all are the links set up so far, accepted or dialed: the end of the
	// epoch closes them.
	all      []*link
	accepted chan *link // accepted links, for connectEpochLinks
	tr       *transport // once every link is up
}

// newEpochLinks makes the (empty) link set of an epoch of size ranks.
func newEpochLinks(size int) epochLinks {
	return epochLinks{expect: map[int]bool{}, have: map[int]bool{}, accepted: make(chan *link, 2*size)}
}

// connectLinks establishes this rank's links to and from every other rank:
// it dials both links of every pair of which it is the lower rank and waits
// for the higher ranks to dial the others. Setup is bounded by ctx and
// Timeout; a timeout names the ranks whose links are missing.
func (n *Node) connectLinks(ctx context.Context) error {
	_, err := n.connectEpochLinks(ctx, n.cur.Load())
	return err
}

// connectEpochLinks connects the links of epoch ep. On failure it also
// returns the peers whose links failed or are missing.
func (n *Node) connectEpochLinks(ctx context.Context, ep *epochRun) (blame []int, _ error) {
	size, me := ep.size, ep.rank
	if size == 1 {
		return nil, nil
	}
	n.mu.Lock()
	accepted := n.links.accepted
	n.mu.Unlock()
	sctx, cancel := n.stepCtx(ctx, fmt.Sprintf("connecting data links (rank %d of %d, to and from every peer)", me, size))
	defer cancel()
	type res struct {
		l    *link
		peer int
		err  error
	}
	dials := make(chan res, 2*size)
	ndial, nwait := 0, 0
	for p := range size {
		if p == me {
			continue
		}
		if dialerOf(me, p) != me {
			nwait += 2
			continue
		}
		for _, id := range []int{me, p} { // me -> p, then p -> me
			ndial++
			go func() {
				l, err := n.dialLink(sctx, ep, id, p)
				dials <- res{l, p, err}
			}()
		}
	}
	to, from := make([]*link, size), make([]*link, size)
	var firstErr error
	put := func(l *link, dialed bool) {
		n.mu.Lock()
		aborted := ep.err != nil || n.cur.Load() != ep
		if dialed && !aborted {
			n.links.all = append(n.links.all, l)
		}
		n.mu.Unlock()
		if aborted {
			l.close()
		}
		if l.id == me {
			to[l.peer] = l
		} else {
			from[l.peer] = l
		}
	}
	stepDone, nodeDone := sctx.Done(), ep.done
	for ndial > 0 || nwait > 0 {
		select {
		case r := <-dials:
			ndial--
			if r.err != nil {
				if firstErr == nil {
					firstErr = r.err
					blame = append(blame, r.peer)
					cancel()
				}
				continue
			}
			put(r.l, true)
		case l := <-accepted:
			nwait--
			put(l, false)
		case <-stepDone:
			stepDone = nil
			if firstErr == nil {
				firstErr = missingLinksErr(sctx, me, to, from)
				blame = missingPeers(me, to, from)
			}
			nwait = 0 // stop waiting for accepts; dials end via ctx
		case <-nodeDone:
			nodeDone = nil
			if firstErr == nil {
				firstErr = n.epochErr(ep)
				cancel()
			}
			nwait = 0
		}
	}
	if firstErr != nil {
		return blame, firstErr
	}
	// The ranks that share this rank's CPUs: those of its host, and those
	// of other network namespaces on the same kernel (containers of one
	// node, or namespace "hosts"), which its links reach over TCP but
	// which compete for the same cores.
	n.mu.Lock()
	cpuShare := machineRanks(n.job.peers, n.cfg.HostID)
	tr := &transport{n: n, ep: ep, me: me, size: size, to: to, from: from}
	tr.pollBudget, tr.pollYield = pollConfig(cpuShare)
	tr.groupSteps = cpuShare <= runtime.NumCPU() && 2*cpuShare > runtime.NumCPU()
	if n.cur.Load() != ep || ep.err != nil {
		err := ep.err
		n.mu.Unlock()
		if err == nil {
			err = fmt.Errorf("membership epoch %d ended while its links were set up", ep.epoch)
		}
		return nil, err
	}
	n.links.tr = tr
	kinds := map[string]int{}
	for p, l := range to {
		if l == nil {
			continue
		}
		kinds[l.kind]++
		if n.job.peers[p].Link == "" {
			n.job.peers[p].Link = l.kind
		}
	}
	n.mu.Unlock()
	next, prev := (me+1)%size, (me-1+size)%size
	n.logf("data links up to and from %d peers %v; ring: to rank %d via %s (%s), from rank %d via %s (%s)",
		size-1, kinds, next, to[next].kind, to[next].addr, prev, from[prev].kind, from[prev].addr)
	return nil, nil
}

// missingPeers lists the peers with a link missing.
func missingPeers(me int, to, from []*link) []int {
	var ranks []int
	for p := range to {
		if p != me && (to[p] == nil || from[p] == nil) {
			ranks = append(ranks, p)
		}
	}
	return ranks
}

// missingLinksErr names the peers whose links did not come up in time.
func missingLinksErr(ctx context.Context, me int, to, from []*link) error {
	var ranks []int
	var miss []string
	for p := range to {
		if p == me || (to[p] != nil && from[p] != nil) {
			continue
		}
		ranks = append(ranks, p)
		if to[p] == nil {
			miss = append(miss, fmt.Sprintf("to rank %d", p))
		}
		if from[p] == nil {
			miss = append(miss, fmt.Sprintf("from rank %d", p))
		}
	}
	return fmt.Errorf("waiting for data links with ranks %v (%s): %w", ranks, strings.Join(miss, ", "), context.Cause(ctx))
}

// dialerOf returns which rank of a pair dials both links between them: the
// lower one, so a pair never dials each other at the same time
// (go-libp2p#2925).
func dialerOf(a, b int) int { return min(a, b) }

// linkKey identifies the ordered link from -> to among size ranks.
func linkKey(from, to, size int) int { return from*size + to }

// expectLinks lists the links this rank accepts: both links of every pair
// with a lower rank. Called with n.mu held.
func (n *Node) expectLinks() {
	ep := n.cur.Load()
	size, me := ep.size, ep.rank
	for p := range size {
		if p != me && dialerOf(me, p) == p {
			n.links.expect[linkKey(p, me, size)] = true
			n.links.expect[linkKey(me, p, size)] = true
		}
	}
}

// drainLinks ends the data links in order before a clean Close: it
// half-closes every link this rank sends on, so the peer reads all data and
// then EOF, and waits, bounded by Timeout, for EOF on every link it receives
// on. Closing a socket or a libp2p connection outright while a peer's data
// is in flight resets it, and the peer would lose the end of the last
// collective. On a job that was aborted there is nothing to save.
//
// A half-close can block (tcp-tls sends close_notify, which waits while
// the socket's send buffer is full), so the half-closes run concurrently
// with the drain of the incoming links, which is what lets the peers make
// room.
func (n *Node) drainLinks() {
	select {
	case <-n.Done():
		return
	default:
	}
	me := n.rank()
	n.mu.Lock()
	links := slices.Clone(n.links.all)
	n.mu.Unlock()
	deadline := time.Now().Add(n.cfg.Timeout)
	var wg sync.WaitGroup
	for _, l := range links {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if l.id == me {
				if err := l.conn.closeWrite(); err != nil {
					n.logf("closing link to rank %d (%s): %v", l.peer, l.addr, err)
				}
				return
			}
			if !l.conn.drain(deadline) && time.Now().After(deadline) {
				n.logf("rank %d did not finish its side of the link within %v", l.peer, n.cfg.Timeout)
			}
		}()
	}
	wg.Wait()
}
