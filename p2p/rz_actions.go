package p2p

import (
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/gorun/gorun/membership"
)

// The rendezvous' side of the membership machine's actions: messages on
// the ranks' control streams, the launcher's callbacks and the timers the
// machine asks for (it reads no clock itself).

// outbox collects messages to send: in order per connection, concurrently
// across connections.
type outbox struct {
	order []*rzConn
	msgs  map[*rzConn][]*msg
}

func (o *outbox) add(c *rzConn, m *msg) {
	if o.msgs == nil {
		o.msgs = map[*rzConn][]*msg{}
	}
	if _, ok := o.msgs[c]; !ok {
		o.order = append(o.order, c)
	}
	o.msgs[c] = append(o.msgs[c], m)
}

// deliver sends everything and empties o; the caller holds relayMu, not
// mu.
func (r *Rendezvous) deliver(o *outbox) {
	var wg sync.WaitGroup
	for _, c := range o.order {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, m := range o.msgs[c] {
				if err := c.send(m, r.cfg.Timeout); err != nil {
					c.s.Reset() // its reader reports it
					return
				}
			}
		}()
	}
	wg.Wait()
	*o = outbox{}
}

// do carries out one step's actions in order. Messages go out together
// (an abort, an established epoch or a timer waits for those before it);
// log lines and the launcher's process events come at once, so that the
// launcher hears what became of a process before the epoch that follows
// is established. The caller holds relayMu, not mu.
func (r *Rendezvous) do(acts []membership.Action) {
	out := &outbox{}
	for _, a := range acts {
		switch a := a.(type) {
		case membership.Send:
			if a.Msg.Kind == membership.Welcome {
				if r.grp != nil {
					r.welcomeNow(a.To)
				}
				continue // a lone rendezvous' register wrote it
			}
			r.mu.Lock()
			c := r.conns[a.To]
			m := r.wireLocked(a.Msg)
			r.mu.Unlock()
			if c != nil {
				out.add(c, m)
			}
			continue
		case membership.Refuse:
			if r.grp != nil {
				r.refuseNow(a)
			}
			continue // a lone rendezvous' register read it
		case membership.Log:
			r.cfg.Logf("%s", a.Text)
			continue
		case membership.ProcEvent:
			if r.cfg.OnProc != nil {
				r.cfg.OnProc(ProcEvent{Kind: ProcEventKind(a.Kind), Member: memberOf(a.Rank, a.Info), Cause: a.Cause,
					AfterLeave: a.AfterLeave, Members: a.Members})
			}
			continue
		case membership.ResetProgress:
			r.doLocal(a)
			continue
		}
		r.deliver(out)
		switch a := a.(type) {
		case membership.Abort:
			m := &msg{T: tAbort, Text: a.Cause}
			if a.LeftEarly {
				m.Left, m.Rank, m.Seq = true, a.Rank, a.Seq
			}
			r.abortWith(m, Abort{Unresponsive: a.Unresponsive, Rank: a.Rank, Addr: a.Addr, Why: a.Why})
		case membership.WaitForMembers:
			r.afterWaiting(a.Since)
		case membership.CheckLinkLater:
			r.afterLinkCheck(a)
		default:
			r.doLocal(a)
		}
	}
	r.deliver(out)
}

// doLocal carries out an action that concerns only this process: the
// launcher's callbacks and the rendezvous' own state. Every replica of a
// group does (report), not only the leader.
func (r *Rendezvous) doLocal(a membership.Action) {
	switch a := a.(type) {
	case membership.ResetProgress:
		r.mu.Lock()
		r.progress = nil
		r.mu.Unlock()
	case membership.Established:
		if r.cfg.OnChange != nil {
			ch := Change{Epoch: a.Epoch, Lost: lostMembers(a.Lost), Size: a.Size, Took: a.Took}
			for _, j := range a.Joined {
				ch.Joined = append(ch.Joined, memberOf(j.Rank, j.Info))
			}
			r.cfg.OnChange(ch)
		}
	case membership.AllRegistered:
		close(r.allReg)
	case membership.AllGone:
		close(r.allGone)
	case membership.LeaveNotice:
		if r.cfg.OnLeave != nil {
			r.cfg.OnLeave(a.Rank, a.LastCall)
		}
	}
}

// welcomeNow writes the welcome of a registration the group applied,
// before anything else goes to that process.
func (r *Rendezvous) welcomeNow(id membership.ID) {
	r.mu.Lock()
	c := r.conns[id]
	r.mu.Unlock()
	if c == nil || c.welcome == nil {
		return // registered through another replica, or its stream is gone
	}
	c.welcomeErr = c.send(c.welcome, r.hb)
	c.welcome = nil
	close(c.registered)
}

// refuseNow ends a registration the group refused.
func (r *Rendezvous) refuseNow(f membership.Refuse) {
	r.mu.Lock()
	c := r.conns[f.To]
	if c != nil && c.welcome != nil {
		delete(r.conns, f.To)
	}
	r.mu.Unlock()
	if c == nil || c.welcome == nil {
		return
	}
	c.refused, c.welcome = f.Why, nil
	close(c.registered)
}

// wireLocked is m as it goes on a control stream.
func (r *Rendezvous) wireLocked(m membership.Message) *msg {
	switch m.Kind {
	case membership.Missing:
		return &msg{T: tPing, Missing: m.Ranks}
	case membership.Table:
		table := make([]tableItem, len(m.Members))
		for i, id := range m.Members {
			info, _ := r.m.Info(id)
			table[i] = itemOf(info)
			table[i].Rank = i
		}
		return &msg{T: tTable, Epoch: m.Epoch, Table: table, Lost: lostItems(m.Lost), Joined: m.JoinedRanks}
	case membership.Go:
		return &msg{T: tGo, Epoch: m.Epoch, Pending: m.Pending}
	case membership.Reconfig:
		return &msg{T: tReconfig, Epoch: m.Epoch, Lost: lostItems(m.Lost), Text: m.Text}
	case membership.Waiting:
		return &msg{T: tWaiting, Epoch: m.Epoch, Text: m.Text}
	case membership.GrowNone:
		return &msg{T: tGrowNone, Epoch: m.Epoch}
	case membership.Departed:
		return &msg{T: tDeparted, Epoch: m.Epoch, Text: m.Text}
	case membership.Dropped:
		return &msg{T: tDropped, Text: m.Text}
	case membership.SentAway:
		return &msg{T: tAbort, Text: m.Text}
	case membership.LeavingNotice:
		return &msg{T: tLeaving, Rank: m.Rank, Seq: m.Seq}
	case membership.LateNotice:
		return &msg{T: tLate, Rank: m.Rank, Seq: m.Seq}
	}
	return nil // Welcome: written by register
}

func lostItems(ls []membership.Lost) []lostItem {
	var out []lostItem
	for _, l := range ls {
		out = append(out, lostItem{Rank: l.Rank, ID: l.Info.PeerID, Host: l.Info.Host, Addr: l.Info.Addr,
			Cause: l.Cause, Proc: l.Info.Proc, Left: l.Left, Name: l.Info.HostName})
	}
	return out
}

func lostMembers(ls []membership.Lost) []LostMember {
	return lostFromWire(lostItems(ls))
}

func memberOf(rank int, i membership.Info) Member {
	m := Member{Rank: rank, Host: i.Host, HostName: i.HostName, Addr: i.Addr, Proc: i.Proc}
	m.ID, _ = peer.Decode(i.PeerID)
	return m
}

// abortWith relays the job's abort, m, to every connected rank; a
// describes it to OnAbort (its Cause is m.Text). The caller holds relayMu.
func (r *Rendezvous) abortWith(m *msg, a Abort) {
	text := m.Text
	r.cfg.Logf("rendezvous: job aborted: %s", text)
	if r.cfg.OnAbort != nil {
		a.Cause = text
		r.cfg.OnAbort(a)
	}
	r.mu.Lock()
	conns := r.connsLocked()
	// Acknowledgements may come before the broadcast ends: count every
	// recipient as unread first. Only ranks heard from within half the
	// heartbeat bound (two pings) are waited for: a rank on a host that
	// died or froze would never answer, and under srun, which ends the
	// step as soon as another rank exits, the rank hosting the rendezvous
	// would be killed waiting, before it printed why the job failed.
	recent := time.Now().Add(-r.hb / 2).UnixNano()
	r.abortUnread = make(map[*rzConn]bool, len(conns))
	for _, c := range conns {
		if c.heard.Load() >= recent {
			r.abortUnread[c] = true
		}
	}
	r.mu.Unlock()
	r.broadcast(conns, m)
	r.abortRead(nil)
}

// afterWaiting runs the timers of a wait below MinSize that began at
// since: the members hear how long is left now and then, and the job is
// aborted when the wait runs out.
func (r *Rendezvous) afterWaiting(since time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.wg.Add(1) // under mu and !closed: never races with Close's Wait
	wt := r.cfg.Elastic.WaitTimeout
	go func() {
		defer r.wg.Done()
		deadline := time.NewTimer(time.Until(since.Add(wt)))
		defer deadline.Stop()
		tick := time.NewTicker(min(10*time.Second, max(wt/10, 100*time.Millisecond)))
		defer tick.Stop()
		for {
			select {
			case <-r.closeCh:
				return
			case <-deadline.C:
				r.step(membership.WaitExpired{Since: since})
				return
			case <-tick.C:
				r.step(membership.WaitTick{Since: since})
				r.mu.Lock()
				still := r.m.Waiting(since)
				r.mu.Unlock()
				if !still {
					return
				}
			}
		}
	}()
}

// afterLinkCheck steps c after half the heartbeat bound: time for a
// member that is really gone to show as lost.
func (r *Rendezvous) afterLinkCheck(c membership.CheckLinkLater) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.wg.Add(1) // under mu and !closed: never races with Close's Wait
	go func() {
		defer r.wg.Done()
		t := time.NewTimer(r.hb / 2)
		defer t.Stop()
		select {
		case <-t.C:
			r.step(membership.LinkCheck{CheckLinkLater: c})
		case <-r.closeCh:
		}
	}()
}

// Epoch returns the newest membership epoch (0 in a fixed-size job).
func (r *Rendezvous) Epoch() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m.Epoch()
}
