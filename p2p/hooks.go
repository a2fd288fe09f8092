package p2p

// Hooks for tests that simulate a process killed, stopped (SIGSTOP) or
// continued, as the rendezvous and the peers would see it.

import (
	"slices"
	"sync/atomic"
)

// simHooks is a node's simulated process state.
type simHooks struct {
	frozen atomic.Bool   // stopped: no heartbeats, control messages held
	thaw   chan struct{} // under Node.mu; closed by unfreeze
}

// crash closes the host and the data links without telling the rendezvous
// or draining anything (tests: simulates a killed process, whose sockets
// the kernel closes). Its goroutines go on, and fail as their sockets
// did; a dial meets the closed host (hostGuard).
func (n *Node) crash() {
	n.mu.Lock()
	links := slices.Clone(n.links.all)
	n.mu.Unlock()
	for _, l := range links {
		l.close()
	}
	n.hosts.close(n.h)
}

// SimulateCrash makes the node drop every connection at once without a
// word to anybody, as the kernel does for a process killed with kill -9:
// its data links and its control stream to the rendezvous break, so peers
// and the rendezvous see a crash, not a Close. It is for tests of elastic
// jobs that run their ranks in one process (collective.LocalJob.Crash); the
// node is unusable afterwards, and Close only releases what is left.
func (n *Node) SimulateCrash() { n.crash() }

// SimulateFreeze makes the node look to the rendezvous like a process
// stopped with SIGSTOP: it sends no heartbeats, and what the rendezvous
// sends is held until SimulateThaw, when the node finds out what happened
// meanwhile. Its data links stay open, as a stopped process' sockets do.
// For tests of elastic jobs run in one process (collective.LocalJob.Freeze).
func (n *Node) SimulateFreeze() { n.freeze() }

// SimulateThaw ends SimulateFreeze, as SIGCONT does.
func (n *Node) SimulateThaw() { n.unfreeze() }

// freeze stops the heartbeat and holds what the control reader receives
// until unfreeze (tests: simulates a SIGSTOPped process as seen by the
// rendezvous; after SIGCONT it finds what happened meanwhile).
func (n *Node) freeze() {
	n.mu.Lock()
	n.sim.thaw = make(chan struct{})
	n.mu.Unlock()
	n.sim.frozen.Store(true)
}

func (n *Node) unfreeze() {
	n.mu.Lock()
	if n.sim.thaw != nil {
		close(n.sim.thaw)
		n.sim.thaw = nil
	}
	n.mu.Unlock()
	n.sim.frozen.Store(false)
}

// waitThaw holds the control reader while the node is frozen (tests). It
// reports false if the node stops meanwhile.
func (n *Node) waitThaw() bool {
	n.mu.Lock()
	thaw := n.sim.thaw
	n.mu.Unlock()
	if thaw == nil {
		return true
	}
	select {
	case <-thaw:
		return true
	case <-n.life.stop:
		return false
	}
}

// crash stops the rendezvous at once, as kill -9 does its process: its
// streams break and nothing is said to anybody (tests of a replicated
// rendezvous losing a replica).
func (r *Rendezvous) crash() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	close(r.closeCh)
	r.mu.Unlock()
	r.hosts.close(r.h)
	if r.grp != nil {
		r.abandonGroup()
	}
}
