package membership

import (
	"fmt"
	"slices"
	"time"
)

// disconnected handles the end of a control connection: before the start
// the rank is forgotten (it may register again); in a fixed-size job any
// other end but a clean leave aborts the job; in an elastic job a member
// is lost and the next epoch starts.
func (m *Machine) disconnected(now time.Time, e Disconnected) {
	p := m.procs[e.ID]
	if p == nil || p.gone {
		return
	}
	p.gone = true
	if e.Quit != "" {
		p.quitWhy = e.Quit
	}
	started := m.tableSent
	if !started || p.joiner && !p.member {
		// Before the table nobody depends on this rank yet (nor ever on a
		// joiner not admitted yet): forget it so it can register again.
		delete(m.regs, p.key)
	}
	if started && !m.allGone && len(m.conns()) == 0 {
		m.allGone = true
		m.emit(AllGone{})
	}
	switch {
	case p.joiner && !started:
		m.elasticLost(now, p, e)
	case !started:
		m.logf("rendezvous: rank %d (%s) dropped before the job started: %s", p.rank, p.info.Addr, e.Err)
		m.afterRegister(now)
	case m.cfg.Elastic:
		m.elasticLost(now, p, e)
	case !p.left:
		m.fixedLost(p, e.Timeout)
	}
}

// fixedLost aborts a fixed-size job for a rank that went without a clean
// leave.
func (m *Machine) fixedLost(p *proc, timeout bool) {
	if timeout {
		// No heartbeat: the process is frozen, stopped or cut off.
		why := fmt.Sprintf("no heartbeat within %v", m.cfg.Heartbeat)
		m.abort(Abort{Cause: fmt.Sprintf("rank %d (%s) stopped responding: %s", p.rank, p.info.Addr, why),
			Unresponsive: true, Rank: p.rank, Addr: p.info.Addr, Why: why})
		return
	}
	if d := m.departureBefore(p); d != nil {
		// It failed because a rank left early: say that, so a rank that
		// had not reached the later call yet blames the departure, not
		// this rank's exit.
		m.abort(Abort{LeftEarly: true, Rank: d.rank, Seq: d.lastCall,
			Cause: fmt.Sprintf("rank %d closed its communicator after call #%d; rank %d (%s) was in a later call and exited", d.rank, d.lastCall, p.rank, p.info.Addr)})
		return
	}
	m.abort(Abort{Cause: fmt.Sprintf("rank %d (%s) disconnected", p.rank, p.info.Addr)})
}

// departureBefore returns the rank that left first (earliest last call) if
// p reported being behind a departure.
func (m *Machine) departureBefore(p *proc) *proc {
	if !p.behind {
		return nil
	}
	var d *proc
	for _, o := range m.regs {
		if o.leaving && (d == nil || o.lastCall < d.lastCall || o.lastCall == d.lastCall && o.rank < d.rank) {
			d = o
		}
	}
	return d
}

const noMembers = "the job has no members left (its last member finished or was lost) before this joiner was admitted"

// elasticLost handles the end of a control connection in an elastic job:
// a joiner is forgotten, a member that left cleanly is let go, any other
// member is lost and the next epoch starts.
func (m *Machine) elasticLost(now time.Time, p *proc, e Disconnected) {
	el := &m.el
	if m.aborted {
		return
	}
	if i := slices.Index(el.pending, p); i >= 0 {
		el.pending = slices.Delete(el.pending, i, i+1)
		m.logf("rendezvous: joiner %s (%s) went before it was admitted: %s", p.info.PeerID, p.info.Addr, e.Err)
		return
	}
	if !p.member {
		return
	}
	if p.left && !el.goSent {
		// It closed (after a membership change, most likely) while the
		// others form an epoch that counts on it: they go on without it.
		el.leftClean = true
		l := m.drop(p, "closed during a reconfiguration")
		m.sendAwayPending(noMembers)
		m.change(now, fmt.Sprintf("rank %d (%s) closed during a reconfiguration", l.Rank, p.info.Addr), []Lost{l})
		return
	}
	if p.left {
		p.member = false
		el.members = slices.DeleteFunc(el.members, func(o *proc) bool { return o == p })
		el.leftClean = true
		m.procEvent(ProcLeft, p, p.rank, "")
		// The job is over once nobody is left: nobody will admit the
		// joiners.
		m.sendAwayPending("the job ended before this joiner was admitted")
		return
	}
	cause := "disconnected"
	if e.Cause != "" {
		cause = e.Cause
	} else if p.quitWhy != "" {
		cause = "left the job outside a commit: " + p.quitWhy
	} else if e.Timeout {
		cause = fmt.Sprintf("stopped responding: no heartbeat within %v", m.cfg.Heartbeat)
	}
	l := m.drop(p, cause)
	m.sendAwayPending(noMembers)
	m.change(now, fmt.Sprintf("rank %d (%s) %s", l.Rank, p.info.Addr, cause), []Lost{l})
}

// drop takes p out of the members as lost and records it for the next
// table.
func (m *Machine) drop(p *proc, cause string) Lost {
	return m.remove(p, p.lost(cause), ProcLost, cause)
}

// remove takes p out of the members, tells the launcher (kind, cause) and
// records l for the next table.
func (m *Machine) remove(p *proc, l Lost, kind ProcKind, cause string) Lost {
	el := &m.el
	p.member, p.removed = false, true
	el.members = slices.DeleteFunc(el.members, func(o *proc) bool { return o == p })
	m.procEvent(kind, p, l.Rank, cause)
	if p.stableRank >= 0 {
		v := l
		v.Rank = p.stableRank
		el.lostView = append(el.lostView, v)
	}
	return l
}

// linkFailed handles a member's report that its link with another member
// broke. If that member is really gone, its control connection ends too
// within a moment and the loss starts the next epoch; so the check waits a
// little (CheckLinkLater).
func (m *Machine) linkFailed(e LinkFailed) {
	el := &m.el
	p := m.procs[e.ID]
	if !m.cfg.Elastic || p == nil || m.aborted || e.Epoch != el.epoch || !p.member || el.linkCheck == e.Epoch+1 ||
		e.Rank < 0 || e.Rank >= len(el.members) || el.members[e.Rank] == p {
		return
	}
	el.linkCheck = e.Epoch + 1
	m.logf("rendezvous: rank %d reports, in epoch %d: %s", p.rank, e.Epoch, e.Text)
	m.emit(CheckLinkLater{Epoch: e.Epoch, Reporter: p.id, Peer: el.members[e.Rank].id, Text: e.Text})
}

// linkCheck: if both ends of the broken link are still members, the ring
// is re-formed with the same members; if the same link failed already in
// that epoch, the member that could not be reached is dropped.
func (m *Machine) linkCheck(now time.Time, c CheckLinkLater) {
	el := &m.el
	p, peer := m.procs[c.Reporter], m.procs[c.Peer]
	if p == nil || peer == nil || m.aborted || el.epoch != c.Epoch || !p.member || !peer.member {
		return // a loss (or another change) came first
	}
	if rl := el.relinked; rl.epoch == c.Epoch && (rl.a == p && rl.b == peer || rl.a == peer && rl.b == p) {
		cause := fmt.Sprintf("unreachable: rank %d could not set up its link with it again (%s)", p.rank, c.Text)
		prank := peer.rank
		l := m.drop(peer, cause)
		m.change(now, fmt.Sprintf("rank %d (%s) %s", prank, peer.info.Addr, cause), []Lost{l})
		m.send(peer, Message{Kind: Dropped, Text: fmt.Sprintf(
			"rank %d: dropped from the job in membership epoch %d: rank %d could not set up its link with it (%s); this rank stops, the job goes on without it",
			prank, c.Epoch, p.rank, c.Text)})
		return
	}
	m.change(now, fmt.Sprintf("the link between rank %d and rank %d broke (%s); re-forming with the same members", p.rank, peer.rank, c.Text), nil)
	el.relinked.a, el.relinked.b, el.relinked.epoch = p, peer, el.epoch
}

// leavingAfter records that a rank leaves after call lastCall and tells
// every rank that may be behind it: all but those that announced their own
// leave, which made no later call (it could not have completed).
func (m *Machine) leavingAfter(e Leaving) {
	p := m.procs[e.ID]
	if p == nil || !m.tableSent || p.leaving || p.departed {
		// A member that departed at a commit already: its Close says
		// nothing the others must act on.
		return
	}
	p.leaving, p.lastCall = true, e.LastCall
	if m.cfg.Elastic && p.member {
		m.el.leftClean = true // the job is finishing
	}
	m.logf("rendezvous: rank %d leaves after call #%d", p.rank, e.LastCall)
	m.emit(LeaveNotice{Rank: p.rank, LastCall: e.LastCall})
	if m.aborted {
		return // every rank has been told why already
	}
	for _, o := range m.conns() {
		if o != p && !o.leaving {
			m.send(o, Message{Kind: LeavingNotice, Rank: p.rank, Seq: e.LastCall})
		}
	}
}

// late passes on a rank's report that it is in call e.Call, after ranks
// left following earlier calls, to those ranks if they are still here:
// their Close says whom they left behind.
func (m *Machine) late(e Late) {
	p := m.procs[e.ID]
	if p == nil {
		return
	}
	p.behind = true
	for _, o := range m.conns() {
		if o.leaving && !o.left && o.lastCall < e.Call {
			m.logf("rendezvous: rank %d was in call #%d when rank %d left after call #%d", p.rank, e.Call, o.rank, o.lastCall)
			m.send(o, Message{Kind: LateNotice, Rank: p.rank, Seq: e.Call})
		}
	}
}
