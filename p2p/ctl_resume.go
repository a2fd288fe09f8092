package p2p

// A rank's side of a replicated rendezvous (rz_group.go): it learns the
// group's replicas from the welcome and the pings, and when its control
// stream with the leader ends it reconnects to the group, follows a
// follower's redirect to the new leader, takes up its place there
// (Resume, with its membership id) and sends again what the old leader
// may not have taken.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	ma "github.com/multiformats/go-multiaddr"
)

// errRefused marks a rendezvous' refusal (tError): asking again does not
// help.
var errRefused = errors.New("refused")

// redirectError: the replica reached does not lead the group; leader does
// (0: none known yet).
type redirectError struct {
	leader uint64
	group  []groupItem
}

func (e *redirectError) Error() string {
	if e.leader == 0 {
		return "the rendezvous group has no leader yet"
	}
	return fmt.Sprintf("replica %d leads the rendezvous group", e.leader)
}

// leaderItem is the leader's entry of the group the redirect gave (nil
// if it named none).
func (e *redirectError) leaderItem() *groupItem {
	for _, it := range e.group {
		if it.ID == e.leader && e.leader != 0 {
			return &it
		}
	}
	return nil
}

// groupClient is what a rank knows of a replicated rendezvous.
type groupClient struct {
	mu      sync.Mutex
	members []groupItem // every replica, as last heard
	mid     int64       // this process' membership id (0: a lone rendezvous)
	current uint64      // the replica this rank's stream is with (1 first)
	// up is closed while the stream is usable, open while the rank
	// reconnects.
	up chan struct{}
	// again: the last message of each kind that the new leader must have
	// (sent again after a reconnection); growSeq numbers Grow requests.
	again   map[string]*msg
	growSeq uint64
	hint    uint64 // the replica a redirect on the stream named as leader
}

func closedChan() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

// replicated says whether the rank can reconnect: the rendezvous is a
// group of more than one replica.
func (g *groupClient) replicated() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mid != 0 && len(g.members) > 1
}

// learn takes what m says of the group, and lets its replicas through the
// gater.
func (c *ctlClient) learn(m *msg) {
	g := &c.group
	if m.T == tWelcome && m.MID != 0 {
		g.mu.Lock()
		g.mid = m.MID
		g.mu.Unlock()
	}
	if len(m.Group) == 0 {
		return
	}
	g.mu.Lock()
	changed := !slices.Equal(g.members, m.Group)
	g.members = slices.Clone(m.Group)
	g.mu.Unlock()
	if !changed {
		return
	}
	for _, it := range m.Group {
		if _, pid, err := replicaIdentity(c.n.cfg.JobKey, it.ID); err == nil {
			c.n.g.allow(pid)
		}
	}
}

// streamFor returns the stream to send m on, waiting while the rank
// reconnects (bounded by Timeout), and keeps what the next leader must
// have.
func (c *ctlClient) streamFor(m *msg) (network.Stream, error) {
	g := &c.group
	g.mu.Lock()
	switch m.T {
	case tGrow:
		g.growSeq++
		m.Seq = g.growSeq
		fallthrough
	case tAck, tLinkFail, tLeaving:
		if g.again == nil {
			g.again = map[string]*msg{}
		}
		g.again[m.T] = m
	}
	up := g.up
	g.mu.Unlock()
	select {
	case <-up:
	default:
		t := time.NewTimer(c.n.cfg.Timeout)
		defer t.Stop()
		select {
		case <-up:
		case <-c.dead:
			return nil, errors.New("the control stream with the rendezvous is closed")
		case <-t.C:
			return nil, fmt.Errorf("still reconnecting to the rendezvous group after %v", c.n.cfg.Timeout)
		}
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	return c.s, nil
}

// reconnect finds the group's leader after the stream with the old one
// ended (cause) and takes up this rank's place there, within three
// heartbeat bounds: a new leader is elected within one, and waits two for
// the ranks to come back.
func (c *ctlClient) reconnect(cause error) error {
	n, g := c.n, &c.group
	g.mu.Lock()
	g.up = make(chan struct{})
	lost := g.current
	members := slices.Clone(g.members)
	hint := g.hint
	g.hint = 0
	g.mu.Unlock()
	n.logf("lost the rendezvous leader (replica %d: %v); reconnecting to the group", lost, cause)
	bound := 3 * n.hbTimeout()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	go func() {
		select {
		case <-n.life.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	// The lost replica last: it is the likeliest to be gone.
	slices.SortStableFunc(members, func(a, b groupItem) int {
		switch {
		case a.ID == lost && b.ID != lost:
			return 1
		case b.ID == lost && a.ID != lost:
			return -1
		}
		return 0
	})
	var last error = cause
	delay := 20 * time.Millisecond
	for i := 0; ; i++ {
		if ctx.Err() != nil {
			return fmt.Errorf("no replica of the rendezvous group took this rank back within %v (last: %v)", bound, last)
		}
		target := members[i%len(members)]
		if hint != 0 {
			for _, it := range members {
				if it.ID == hint {
					target = it
				}
			}
			hint = 0
		}
		s, pid, err := c.dialReplica(ctx, target)
		var w *msg
		if err == nil {
			// Each replica gets one heartbeat bound to answer. A stream
			// opens at once over a connection whose far end is gone (a
			// host cut off sends no reset, and its connection looks alive
			// until its keep-alive fails), and the hello would then wait
			// out the whole search while another replica leads.
			hctx, hcancel := context.WithTimeout(ctx, n.hbTimeout())
			w, err = n.hello(hctx, s, pid, true)
			hcancel()
		}
		if err == nil {
			c.writeMu.Lock()
			old := c.s
			c.s = s
			c.writeMu.Unlock()
			old.Reset()
			c.learn(w)
			g.mu.Lock()
			g.current = target.ID
			again := g.again
			close(g.up)
			g.mu.Unlock()
			n.logf("reconnected to the rendezvous group through replica %d", target.ID)
			for _, t := range []string{tAck, tLinkFail, tGrow, tLeaving} {
				if m := again[t]; m != nil {
					_ = c.send(m)
				}
			}
			return nil
		}
		last = err
		if errors.Is(err, errRefused) {
			return fmt.Errorf("the new rendezvous leader (replica %d) did not take this rank back: %w", target.ID, err)
		}
		var re *redirectError
		if errors.As(err, &re) {
			if len(re.group) > 0 {
				members = slices.Clone(re.group)
			}
			if re.leader != 0 && re.leader != target.ID {
				hint = re.leader
				continue
			}
		}
		if (i+1)%len(members) == 0 || re != nil {
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
			delay = min(2*delay, n.hbTimeout()/8)
		}
	}
}

// replicaAddrs returns replica it's peer ID and addresses, and lets it
// through the gater.
func (n *Node) replicaAddrs(ctx context.Context, it groupItem) (peer.ID, []ma.Multiaddr, error) {
	_, pid, err := replicaIdentity(n.cfg.JobKey, it.ID)
	if err != nil {
		return "", nil, err
	}
	addrs, err := resolveHostPort(ctx, it.Addr)
	if err != nil {
		return "", nil, err
	}
	n.g.allow(pid)
	return pid, addrs, nil
}

// dialReplica opens a control stream with replica it.
func (c *ctlClient) dialReplica(ctx context.Context, it groupItem) (network.Stream, peer.ID, error) {
	n := c.n
	pid, addrs, err := n.replicaAddrs(ctx, it)
	if err != nil {
		return nil, "", err
	}
	n.h.Peerstore().AddAddrs(pid, addrs, peerstore.PermanentAddrTTL)
	dctx, cancel := context.WithTimeout(ctx, n.hbTimeout()/2)
	defer cancel()
	s, err := n.hosts.newStream(network.WithForceDirectDial(dctx, "gorun rendezvous"), n.h, pid, rendezvousProto)
	return s, pid, err
}
