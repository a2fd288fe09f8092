package membership

import (
	"cmp"
	"fmt"
	"strings"
	"time"
)

// grow records that a member asks, at a commit of epoch, to admit the
// pending joiners, and whether it leaves the job there; when every member
// asked, the leavers go and the joiners are admitted in one new epoch,
// whose members go on from the commit they all hold (or the members are
// told there is nobody to admit and nobody leaving).
func (m *Machine) grow(now time.Time, e Grow) {
	el := &m.el
	p := m.procs[e.ID]
	if !m.cfg.Elastic || p == nil || m.aborted || e.Epoch != el.epoch || !el.goSent || !p.member {
		return // a change is under way: the member follows it
	}
	if e.Seq != 0 {
		if e.Seq <= p.growSeq {
			return // sent again after a leader change: taken already
		}
		p.growSeq, p.grewNone = e.Seq, false
	}
	p.growReq = true
	p.leaveReq, p.leaveWhy = e.Leave, e.Why
	var leavers []*proc
	for _, o := range el.members {
		if !o.growReq {
			return
		}
		if o.leaveReq {
			leavers = append(leavers, o)
		}
	}
	switch n := m.admissible(); {
	case len(leavers) > 0:
		m.depart(now, leavers)
	case n > 0:
		s := ""
		if n != 1 {
			s = "s"
		}
		m.change(now, fmt.Sprintf("admitting %d new member%s", n, s), nil)
	default:
		for _, o := range el.members {
			o.growReq, o.grewNone, o.grewNoneAt = false, true, e.Epoch
			m.send(o, Message{Kind: GrowNone, Epoch: e.Epoch})
		}
	}
}

// depart lets the members that asked to leave go, at the commit every
// member just took: each is told it left (Departed), and the others form
// the next epoch without them (admitting waiting joiners too). The others
// hold the leavers' unique state of that commit (their buddy copies), so
// nothing is re-run. If nobody is left, the job is over.
func (m *Machine) depart(now time.Time, leavers []*proc) {
	el := &m.el
	var lost []Lost
	var names []string
	for _, p := range leavers {
		why := cmp.Or(p.leaveWhy, "asked to")
		cause := "left the job (" + why + ")"
		p.departed = true
		l := p.lost(cause)
		l.Left = true
		lost = append(lost, m.remove(p, l, ProcDeparted, why))
		names = append(names, fmt.Sprintf("rank %d", l.Rank))
		// The leavers learn first: their Depart returns before the
		// others' links to them close.
		p.departText, p.departEpoch = cause, el.epoch
		m.send(p, Message{Kind: Departed, Epoch: el.epoch, Text: cause})
	}
	if len(el.members) == 0 {
		// Everybody left: the job is over, as when the last member
		// finished.
		el.leftClean = true
		m.sendAwayPending("the job ended (every member left) before this joiner was admitted")
		return
	}
	verb := "leaves"
	if len(names) > 1 {
		verb = "leave"
	}
	m.change(now, fmt.Sprintf("%s %s the job at a commit (%s)", strings.Join(names, ", "), verb, cmp.Or(leavers[0].leaveWhy, "asked to")), lost)
}
