package membership

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The epochs of an elastic job.
//
// Every change of membership goes through change: the epoch number goes
// up, every remaining member is told (Reconfig), and form sends the new
// table (survivors in their order, then joiners) or, below MinSize, a
// status while it waits for joiners. An epoch is established when every
// member of its table acknowledged it: then Go, Established, and it
// becomes the reference ("stable") that the next table's Lost and joined
// ranks are relative to.

// change starts the next epoch: it tells every remaining member why (lost:
// who is gone) and forms the epoch.
func (m *Machine) change(now time.Time, reason string, lost []Lost) {
	el := &m.el
	if el.goSent || el.changeStart.IsZero() {
		el.changeStart = now
	}
	el.epoch++
	el.tableSent, el.goSent, el.reason = false, false, reason
	rc := Message{Kind: Reconfig, Epoch: el.epoch, Lost: lost, Text: reason}
	for _, p := range el.members {
		p.growReq, p.leaveReq = false, false
		m.send(p, rc)
	}
	m.logf("rendezvous: %s: starting membership epoch %d", reason, el.epoch)
	m.form(now)
}

// form sends the table of the current epoch, or a status while the job is
// below MinSize.
func (m *Machine) form(now time.Time) {
	el := &m.el
	admit := m.admissible()
	if len(el.members)+admit < m.cfg.MinSize {
		if !el.waiting {
			el.waiting, el.waitSince = true, now
			m.emit(WaitForMembers{Since: now})
		}
		text := m.waitText(now)
		m.logf("rendezvous: epoch %d: %s", el.epoch, text)
		for _, p := range el.members {
			m.send(p, Message{Kind: Waiting, Epoch: el.epoch, Text: text})
		}
		return
	}
	el.waiting = false
	el.members = append(el.members, el.pending[:admit]...)
	el.pending = slices.Delete(el.pending, 0, admit)
	table := make([]ID, len(el.members))
	var joined []int
	for i, p := range el.members {
		p.rank, p.member, p.ackEpoch = i, true, -1
		table[i] = p.id
		if p.stableRank < 0 {
			joined = append(joined, i)
		}
	}
	el.tableSent = true
	m.logf("rendezvous: sending the table of membership epoch %d (%d members, %d joined)", el.epoch, len(table), len(joined))
	tm := Message{Kind: Table, Epoch: el.epoch, Members: table, Lost: slices.Clone(el.lostView), JoinedRanks: joined}
	for _, p := range el.members {
		m.send(p, tm)
	}
}

// waitText is the status members are sent while the job is below MinSize.
func (m *Machine) waitText(now time.Time) string {
	el := &m.el
	need := m.cfg.MinSize - len(el.members) - m.admissible()
	left := el.waitSince.Add(m.cfg.WaitTimeout).Sub(now)
	s := ""
	if need != 1 {
		s = "s"
	}
	return fmt.Sprintf("waiting for %d more member%s (--min-np %d), %d s left", need, s, m.cfg.MinSize, int(max(left, 0).Round(time.Second).Seconds()))
}

// waitTick tells the members again how long the job may still wait.
func (m *Machine) waitTick(now time.Time, since time.Time) {
	if !m.Waiting(since) {
		return
	}
	msg := Message{Kind: Waiting, Epoch: m.el.epoch, Text: m.waitText(now)}
	for _, p := range m.el.members {
		m.send(p, msg)
	}
}

// waitExpired aborts the job if it is still below MinSize.
func (m *Machine) waitExpired(now time.Time, since time.Time) {
	if !m.Waiting(since) {
		return
	}
	m.abort(Abort{Cause: fmt.Sprintf("job below --min-np %d for %s: %s", m.cfg.MinSize, seconds(m.cfg.WaitTimeout), m.belowMinText())})
}

// belowMinText says who is left and who was lost.
func (m *Machine) belowMinText() string {
	el := &m.el
	var left []string
	for _, p := range el.members {
		left = append(left, fmt.Sprintf("rank %d on %s", p.rank, cmp.Or(p.info.HostName, p.info.Host)))
	}
	s := ""
	if len(left) != 1 {
		s = "s"
	}
	text := fmt.Sprintf("%d member%s left (%s)", len(left), s, strings.Join(left, ", "))
	if len(el.lostView) > 0 {
		lost := make([]string, len(el.lostView))
		for i, l := range el.lostView {
			lost[i] = l.String()
		}
		text += " after losing " + strings.Join(lost, "; ")
	}
	return text + "; no joiner came to take their place"
}

func seconds(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
}

// String describes l as the members' messages do.
func (l Lost) String() string {
	return fmt.Sprintf("rank %d (host %s, %s) %s", l.Rank, l.Info.label(), l.Info.Addr, l.Cause)
}

// label is the name of the host for messages: HostName, or else the host
// name part of its Host.
func (i Info) label() string {
	if i.HostName != "" {
		return i.HostName
	}
	name, _, _ := strings.Cut(i.Host, "/")
	return name
}

// elasticAck records that p installed the table of epoch; after the last
// member: Go, and the epoch is established.
func (m *Machine) elasticAck(now time.Time, p *proc, epoch int) {
	el := &m.el
	if m.aborted || epoch != el.epoch || !el.tableSent || el.goSent || !p.member {
		return
	}
	p.ackEpoch = epoch
	for _, o := range el.members {
		if o.ackEpoch != epoch {
			return
		}
	}
	el.goSent = true
	est := Established{Epoch: epoch, Lost: el.lostView, Size: len(el.members), Took: now.Sub(el.changeStart)}
	// With the number of joiners still waiting, so that no member acts on
	// the count from before the epoch (the pings bring it up to date later).
	g := Message{Kind: Go, Epoch: epoch, Pending: m.admissible()}
	if epoch > 0 {
		m.emit(ResetProgress{}) // the ranks changed
	}
	for i, o := range el.members {
		if o.stableRank < 0 && epoch > 0 {
			est.Joined = append(est.Joined, Joined{Rank: i, Info: o.info})
		}
		o.stableRank = i
		m.send(o, g)
	}
	el.lostView = nil
	el.changeStart = time.Time{}
	m.logf("rendezvous: membership epoch %d established: %d members, took %v", epoch, est.Size, est.Took)
	if epoch > 0 {
		m.emit(est)
	}
}
