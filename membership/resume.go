package membership

// Resuming a process after the rendezvous' leader changed (a replicated
// rendezvous, p2p's rz_group.go). The process' control connection ended
// with the old leader, and whatever the old leader had not sent yet, or
// sent into a connection that was breaking, may be missing on it. The new
// leader holds the same Machine (every replica Steps the same log), so
// Resync can say what the process must be told again. Everything in it is
// something a process already takes twice without harm (a table or go of
// an epoch it has, a reconfiguration to an epoch it is in); what the
// process itself sent and the old leader may have lost, it sends again,
// and the Machine takes each request once (Ack and LinkFailed are
// idempotent, Grow carries a sequence number).

// Info returns what the Machine keeps about a registered process.
func (m *Machine) Info(id ID) (Info, bool) {
	p := m.procs[id]
	if p == nil {
		return Info{}, false
	}
	return p.info, true
}

// Resync returns what process id, which reconnected to a new leader, must
// be told again, in order; or, if it is not in the job any more, why
// (refused, "" if it is).
func (m *Machine) Resync(id ID) (msgs []Message, refused string) {
	p := m.procs[id]
	switch {
	case p == nil:
		return nil, "the rendezvous does not know this process"
	case p.departed:
		return []Message{{Kind: Departed, Epoch: p.departEpoch, Text: p.departText}}, ""
	case m.aborted:
		return []Message{{Kind: SentAway, Text: m.abortText}}, ""
	case p.gone:
		return nil, "the rendezvous counted this process as lost before the new leader took over"
	}
	if !m.cfg.Elastic {
		if !m.tableSent {
			return []Message{{Kind: Missing, Ranks: m.missing()}}, ""
		}
		table := make([]ID, m.cfg.Size)
		for i := range m.cfg.Size {
			table[i] = m.regs[i].id
		}
		msgs = append(msgs, Message{Kind: Table, Members: table})
		if m.goSent {
			msgs = append(msgs, Message{Kind: Go})
		}
		return msgs, ""
	}
	el := &m.el
	if !p.member {
		if !m.tableSent {
			return []Message{{Kind: Missing, Ranks: m.missing()}}, ""
		}
		return nil, "" // a joiner waiting to be admitted: nothing to tell yet
	}
	if el.epoch > 0 && p.ackEpoch != el.epoch {
		msgs = append(msgs, Message{Kind: Reconfig, Epoch: el.epoch, Lost: append([]Lost(nil), el.lostView...), Text: el.reason})
	}
	switch {
	case el.waiting:
		msgs = append(msgs, Message{Kind: Waiting, Epoch: el.epoch, Text: m.waitText(el.waitSince)})
	case el.tableSent:
		table := make([]ID, len(el.members))
		var joined []int
		for i, o := range el.members {
			table[i] = o.id
			if o.stableRank < 0 && el.epoch > 0 {
				joined = append(joined, i)
			}
		}
		msgs = append(msgs, Message{Kind: Table, Epoch: el.epoch, Members: table, Lost: append([]Lost(nil), el.lostView...), JoinedRanks: joined})
		if el.goSent {
			msgs = append(msgs, Message{Kind: Go, Epoch: el.epoch, Pending: m.admissible()})
		}
	}
	if p.grewNone && p.grewNoneAt == el.epoch {
		msgs = append(msgs, Message{Kind: GrowNone, Epoch: el.epoch})
	}
	return msgs, ""
}
