package p2p

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The rendezvous side of elastic membership (see elastic.go).
//
// Every change of membership goes through changeLocked: the epoch number
// goes up, every remaining member is told (reconfig), and formLocked sends
// the new table (survivors in their order, then joiners) or, below
// MinSize, a status while it waits for joiners. An epoch is established
// when every member of its table acknowledged it: then "go", OnChange, and
// it becomes the reference ("stable") that the next View's Lost and Joined
// are relative to. All of it runs under relayMu (so the messages of epoch
// e reach every member before those of e+1) and mu.

// rzElastic is the rendezvous' elastic state, under Rendezvous.mu.
type rzElastic struct {
	epoch       int       // the newest epoch (being formed, or established)
	members     []*rzConn // its members in rank order (while waiting: the survivors)
	tableSent   bool      // its table went out
	goSent      bool      // it is established
	pending     []*rzConn // joiners not admitted yet, in arrival order
	lostView    []lostItem
	changeStart time.Time // when the change from the last established epoch began
	waiting     bool      // below MinSize, waiting for joiners
	waitSince   time.Time
	nextID      int  // regs key of the next joiner
	leftClean   bool // a member left the job cleanly: it is finishing
	// args: the arguments every rank of epoch 0 started with, which a
	// joiner must have too; argsVary: they differed, so nothing is
	// checked.
	args     []string
	argsVary bool
	// linkCheck is epoch+1 of the epoch whose broken link is being looked
	// at (0: none); relinked is the pair whose link broke, and the epoch
	// that re-formed the ring because of it.
	linkCheck int
	relinked  struct {
		a, b  *rzConn
		epoch int
	}
}

// outbox collects messages to send after mu is released: in order per
// connection, concurrently across connections.
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

// deliver sends everything; the caller holds relayMu, not mu.
func (r *Rendezvous) deliver(o *outbox) {
	if o == nil {
		return
	}
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
}

// startElasticLocked makes the registered ranks the members of epoch 0.
func (r *Rendezvous) startElasticLocked() {
	el := &r.el
	el.members = make([]*rzConn, r.cfg.Size)
	for i := range r.cfg.Size {
		c := r.regs[i]
		c.member = true
		el.members[i] = c
		if i == 0 {
			el.args = c.args
		} else if !slices.Equal(c.args, el.args) {
			el.argsVary = true
		}
	}
	el.tableSent = true
	el.changeStart = time.Now()
}

// admissibleLocked is how many pending joiners the next epoch would admit.
func (r *Rendezvous) admissibleLocked() int {
	if r.cfg.Elastic == nil {
		return 0
	}
	return max(0, min(len(r.el.pending), r.cfg.Elastic.MaxSize-len(r.el.members)))
}

func (r *Rendezvous) registerJoinerLocked(c *rzConn) error {
	switch {
	case r.cfg.Elastic == nil:
		return errors.New("this job is not elastic: a joiner (rank -1) can not join it")
	case r.aborted:
		return errors.New("job already aborted")
	case r.tableSent && len(r.el.members) == 0:
		// Nobody could admit it, nor give it the job's state.
		return errors.New("the job has no members left (its last member finished or was lost): there is nobody to join")
	case r.tableSent && r.argsRefusalLocked(c.args) != "":
		// Admitted, it would train something else or call other
		// collectives, and fail the job that ran fine before it came.
		return errors.New(r.argsRefusalLocked(c.args))
	}
	c.id = r.el.nextID
	r.el.nextID++
	r.regs[c.id] = c
	r.el.pending = append(r.el.pending, c)
	return nil
}

// argsRefusalLocked is why a joiner with arguments args may not join, or
// "" if it may.
func (r *Rendezvous) argsRefusalLocked(args []string) string {
	if r.el.argsVary || slices.Equal(args, r.el.args) {
		return ""
	}
	return fmt.Sprintf("its program arguments %s differ from those the job's ranks started with, %s: start it with the job's arguments (gorun --job-key-file prints the whole command)",
		quoteArgs(args), quoteArgs(r.el.args))
}

// refuseEarlyJoinersLocked sends away the joiners that registered before
// the job's ranks did (their arguments could not be compared then) and
// whose arguments differ from the ranks'.
func (r *Rendezvous) refuseEarlyJoinersLocked(out *outbox) {
	el := &r.el
	el.pending = slices.DeleteFunc(el.pending, func(p *rzConn) bool {
		why := r.argsRefusalLocked(p.args)
		if why == "" {
			return false
		}
		r.cfg.Logf("rendezvous: refused joiner %s from %s: %s", p.item.ID, p.addr, why)
		out.add(p, &msg{T: tAbort, Text: why})
		r.procEventLocked(ProcEvent{Kind: ProcSentAway, Member: r.memberOf(p, -1), Cause: why})
		return true
	})
}

// quoteArgs shows arguments as Go quotes them, in brackets: [] for none.
func quoteArgs(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = strconv.Quote(a)
	}
	return "[" + strings.Join(q, " ") + "]"
}

// sendAwayPendingLocked aborts the joiners not admitted yet once the job
// has no member left: nobody will admit them (nor has the state to give
// them).
func (r *Rendezvous) sendAwayPendingLocked(out *outbox, why string) {
	el := &r.el
	if len(el.members) > 0 {
		return
	}
	for _, p := range el.pending {
		out.add(p, &msg{T: tAbort, Text: why})
		r.procEventLocked(ProcEvent{Kind: ProcSentAway, Member: r.memberOf(p, -1), Cause: why})
	}
	el.pending = nil
}

// joinerRegistered forms the waiting epoch if the job was below MinSize.
func (r *Rendezvous) joinerRegistered() {
	r.relayMu.Lock()
	defer r.relayMu.Unlock()
	r.mu.Lock()
	var out *outbox
	if r.el.waiting && !r.closed && !r.aborted {
		out = &outbox{}
		r.formLocked(out)
	}
	r.mu.Unlock()
	r.deliver(out)
}

// changeLocked starts the next epoch: it tells every remaining member why
// (lost: who is gone) and forms the epoch.
func (r *Rendezvous) changeLocked(reason string, lost []lostItem) *outbox {
	el := &r.el
	if el.goSent || el.changeStart.IsZero() {
		el.changeStart = time.Now()
	}
	el.epoch++
	el.tableSent, el.goSent = false, false
	out := &outbox{}
	rc := &msg{T: tReconfig, Epoch: el.epoch, Lost: lost, Text: reason}
	for _, c := range el.members {
		c.growReq, c.leaveReq = false, false
		out.add(c, rc)
	}
	r.cfg.Logf("rendezvous: %s: starting membership epoch %d", reason, el.epoch)
	r.formLocked(out)
	return out
}

// formLocked sends the table of the current epoch, or a status while the
// job is below MinSize.
func (r *Rendezvous) formLocked(out *outbox) {
	el := &r.el
	admit := r.admissibleLocked()
	if len(el.members)+admit < r.cfg.Elastic.MinSize {
		if !el.waiting {
			el.waiting, el.waitSince = true, time.Now()
			r.wg.Add(1) // under mu, and callers checked !closed
			go r.waitForMembers(el.waitSince)
		}
		text := r.waitTextLocked()
		r.cfg.Logf("rendezvous: epoch %d: %s", el.epoch, text)
		for _, c := range el.members {
			out.add(c, &msg{T: tWaiting, Epoch: el.epoch, Text: text})
		}
		return
	}
	el.waiting = false
	el.members = append(el.members, el.pending[:admit]...)
	el.pending = slices.Delete(el.pending, 0, admit)
	table := make([]tableItem, len(el.members))
	var joined []int
	for i, c := range el.members {
		c.rank, c.member, c.ackEpoch = i, true, -1
		it := c.item
		it.Rank = i
		table[i] = it
		if c.stableRank < 0 {
			joined = append(joined, i)
		}
	}
	el.tableSent = true
	r.cfg.Logf("rendezvous: sending the table of membership epoch %d (%d members, %d joined)", el.epoch, len(table), len(joined))
	tm := &msg{T: tTable, Epoch: el.epoch, Table: table, Lost: slices.Clone(el.lostView), Joined: joined}
	for _, c := range el.members {
		out.add(c, tm)
	}
}

// waitTextLocked is the status members are sent while the job is below
// MinSize.
func (r *Rendezvous) waitTextLocked() string {
	el := &r.el
	need := r.cfg.Elastic.MinSize - len(el.members) - r.admissibleLocked()
	left := time.Until(el.waitSince.Add(r.cfg.Elastic.WaitTimeout))
	s := ""
	if need != 1 {
		s = "s"
	}
	return fmt.Sprintf("waiting for %d more member%s (--min-np %d), %d s left", need, s, r.cfg.Elastic.MinSize, int(max(left, 0).Round(time.Second).Seconds()))
}

// waitForMembers sends the waiting status now and then and aborts the job
// if it is still below MinSize after WaitTimeout.
func (r *Rendezvous) waitForMembers(since time.Time) {
	defer r.wg.Done()
	wt := r.cfg.Elastic.WaitTimeout
	deadline := time.NewTimer(time.Until(since.Add(wt)))
	defer deadline.Stop()
	tick := time.NewTicker(min(10*time.Second, max(wt/10, 100*time.Millisecond)))
	defer tick.Stop()
	still := func() bool { return r.el.waiting && r.el.waitSince == since && !r.aborted && !r.closed }
	for {
		select {
		case <-r.closeCh:
			return
		case <-deadline.C:
			r.mu.Lock()
			ok := still()
			text := r.belowMinTextLocked()
			r.mu.Unlock()
			if ok {
				r.abort(fmt.Sprintf("job below --min-np %d for %s: %s", r.cfg.Elastic.MinSize, seconds(wt), text))
			}
			return
		case <-tick.C:
			r.relayMu.Lock()
			r.mu.Lock()
			ok := still()
			out := &outbox{}
			if ok {
				m := &msg{T: tWaiting, Epoch: r.el.epoch, Text: r.waitTextLocked()}
				for _, c := range r.el.members {
					out.add(c, m)
				}
			}
			r.mu.Unlock()
			r.deliver(out)
			r.relayMu.Unlock()
			if !ok {
				return
			}
		}
	}
}

// belowMinTextLocked says who is left and who was lost.
func (r *Rendezvous) belowMinTextLocked() string {
	el := &r.el
	var left []string
	for _, c := range el.members {
		left = append(left, fmt.Sprintf("rank %d on %s", c.rank, cmp.Or(c.hostName, c.item.HostID)))
	}
	s := ""
	if len(left) != 1 {
		s = "s"
	}
	text := fmt.Sprintf("%d member%s left (%s)", len(left), s, strings.Join(left, ", "))
	if len(el.lostView) > 0 {
		lost := make([]string, len(el.lostView))
		for i, l := range lostFromWire(el.lostView) {
			lost[i] = l.String()
		}
		text += " after losing " + strings.Join(lost, "; ")
	}
	return text + "; no joiner came to take their place"
}

func seconds(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
}

// elasticAck records that c installed the table of epoch; after the last
// member: go, and the epoch is established.
func (r *Rendezvous) elasticAck(c *rzConn, epoch int) {
	r.relayMu.Lock()
	r.mu.Lock()
	el := &r.el
	if r.closed || r.aborted || epoch != el.epoch || !el.tableSent || el.goSent || !c.member {
		r.mu.Unlock()
		r.relayMu.Unlock()
		return
	}
	c.ackEpoch = epoch
	for _, m := range el.members {
		if m.ackEpoch != epoch {
			r.mu.Unlock()
			r.relayMu.Unlock()
			return
		}
	}
	el.goSent = true
	change := Change{Epoch: epoch, Lost: lostFromWire(el.lostView), Size: len(el.members), Took: time.Since(el.changeStart)}
	out := &outbox{}
	// With the number of joiners still waiting, so that no member acts on
	// the count from before the epoch (the pings bring it up to date later).
	g := &msg{T: tGo, Epoch: epoch, Pending: r.admissibleLocked()}
	for i, m := range el.members {
		if m.stableRank < 0 && epoch > 0 {
			change.Joined = append(change.Joined, r.memberOf(m, i))
		}
		m.stableRank = i
		out.add(m, g)
	}
	el.lostView = nil
	el.changeStart = time.Time{}
	if epoch > 0 {
		r.progress = nil // ranks changed
	}
	r.mu.Unlock()
	r.deliver(out)
	r.relayMu.Unlock()
	r.cfg.Logf("rendezvous: membership epoch %d established: %d members, took %v", epoch, change.Size, change.Took)
	if epoch > 0 && r.cfg.OnChange != nil {
		r.cfg.OnChange(change)
	}
}

func (r *Rendezvous) memberOf(c *rzConn, rank int) Member {
	m := Member{Rank: rank, Host: c.item.HostID, HostName: c.hostName, Addr: c.addr, Proc: c.proc}
	m.ID, _ = peerIDOf(c.item)
	return m
}

// lostItemLocked describes c as lost (rank: in the newest epoch).
func lostItemLocked(c *rzConn, cause string) lostItem {
	return lostItem{Rank: c.rank, ID: c.item.ID, Host: c.item.HostID, Addr: c.addr, Cause: cause, Proc: c.proc, Name: c.hostName}
}

// dropLocked takes c out of the members and records it for the next View.
func (r *Rendezvous) dropLocked(c *rzConn, cause string) lostItem {
	return r.removeLocked(c, lostItemLocked(c, cause), ProcLost, cause)
}

// removeLocked takes c out of the members, tells OnProc (kind, cause) and
// records li for the next View.
func (r *Rendezvous) removeLocked(c *rzConn, li lostItem, kind ProcEventKind, cause string) lostItem {
	el := &r.el
	c.member = false
	el.members = slices.DeleteFunc(el.members, func(o *rzConn) bool { return o == c })
	r.procEventLocked(ProcEvent{Kind: kind, Member: r.memberOf(c, li.Rank), Cause: cause})
	if c.stableRank >= 0 {
		v := li
		v.Rank = c.stableRank
		el.lostView = append(el.lostView, v)
	}
	return li
}

// elasticLost handles the end of a control stream in an elastic job: a
// joiner is forgotten, a member that left cleanly is let go, any other
// member is lost and the next epoch starts.
func (r *Rendezvous) elasticLost(c *rzConn, err error, left bool) {
	r.relayMu.Lock()
	defer r.relayMu.Unlock()
	r.mu.Lock()
	el := &r.el
	if r.closed || r.aborted {
		r.mu.Unlock()
		return
	}
	if i := slices.Index(el.pending, c); i >= 0 {
		el.pending = slices.Delete(el.pending, i, i+1)
		r.mu.Unlock()
		r.cfg.Logf("rendezvous: joiner %s (%s) went before it was admitted: %v", c.item.ID, c.addr, err)
		return
	}
	const noMembers = "the job has no members left (its last member finished or was lost) before this joiner was admitted"
	if !c.member {
		r.mu.Unlock()
		return
	}
	var out *outbox
	if left && !el.goSent {
		// It closed (after a membership change, most likely) while the
		// others form an epoch that counts on it: they go on without it.
		el.leftClean = true
		li := r.dropLocked(c, "closed during a reconfiguration")
		pre := &outbox{}
		r.sendAwayPendingLocked(pre, noMembers)
		out = r.changeLocked(fmt.Sprintf("rank %d (%s) closed during a reconfiguration", li.Rank, c.addr), []lostItem{li})
		r.mu.Unlock()
		r.deliver(pre)
		r.deliver(out)
		return
	}
	if left {
		c.member = false
		el.members = slices.DeleteFunc(el.members, func(o *rzConn) bool { return o == c })
		el.leftClean = true
		r.procEventLocked(ProcEvent{Kind: ProcLeft, Member: r.memberOf(c, c.rank)})
		// The job is over once nobody is left: nobody will admit the
		// joiners.
		out = &outbox{}
		r.sendAwayPendingLocked(out, "the job ended before this joiner was admitted")
		r.mu.Unlock()
		r.deliver(out)
		return
	}
	cause := "disconnected"
	var timeout interface{ Timeout() bool }
	if c.quitWhy != "" {
		cause = "left the job outside a commit: " + c.quitWhy
	} else if errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &timeout) && timeout.Timeout()) {
		cause = fmt.Sprintf("stopped responding: no heartbeat within %v", r.hb)
	}
	li := r.dropLocked(c, cause)
	pre := &outbox{}
	r.sendAwayPendingLocked(pre, noMembers)
	out = r.changeLocked(fmt.Sprintf("rank %d (%s) %s", li.Rank, c.addr, cause), []lostItem{li})
	r.mu.Unlock()
	r.deliver(pre)
	r.deliver(out)
}

// linkFailed handles a member's report that its link with another member
// broke. If that member is really gone, its control stream ends too within
// a moment and the loss starts the next epoch; so the rendezvous waits a
// little. If both are still there, the ring is re-formed with the same
// members; if the same link fails again in that epoch, the member that
// could not be reached is dropped.
func (r *Rendezvous) linkFailed(c *rzConn, m *msg) {
	if r.cfg.Elastic == nil {
		return
	}
	r.mu.Lock()
	el := &r.el
	if r.closed || r.aborted || m.Epoch != el.epoch || !c.member || el.linkCheck == m.Epoch+1 ||
		m.Rank < 0 || m.Rank >= len(el.members) || el.members[m.Rank] == c {
		r.mu.Unlock()
		return
	}
	peer := el.members[m.Rank]
	el.linkCheck = m.Epoch + 1
	r.wg.Add(1) // under mu and !closed
	rank := c.rank
	r.mu.Unlock()
	r.cfg.Logf("rendezvous: rank %d reports, in epoch %d: %s", rank, m.Epoch, m.Text)
	go func() {
		defer r.wg.Done()
		t := time.NewTimer(r.hb / 2)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.closeCh:
			return
		}
		r.relayMu.Lock()
		defer r.relayMu.Unlock()
		r.mu.Lock()
		if r.closed || r.aborted || el.epoch != m.Epoch || !c.member || !peer.member {
			r.mu.Unlock()
			return // a loss (or another change) came first
		}
		var out *outbox
		if rl := el.relinked; rl.epoch == m.Epoch && (rl.a == c && rl.b == peer || rl.a == peer && rl.b == c) {
			cause := fmt.Sprintf("unreachable: rank %d could not set up its link with it again (%s)", c.rank, m.Text)
			prank := peer.rank
			li := r.dropLocked(peer, cause)
			out = r.changeLocked(fmt.Sprintf("rank %d (%s) %s", prank, peer.addr, cause), []lostItem{li})
			out.add(peer, &msg{T: tDropped, Text: fmt.Sprintf(
				"rank %d: dropped from the job in membership epoch %d: rank %d could not set up its link with it (%s); this rank stops, the job goes on without it",
				prank, m.Epoch, c.rank, m.Text)})
		} else {
			out = r.changeLocked(fmt.Sprintf("the link between rank %d and rank %d broke (%s); re-forming with the same members", c.rank, peer.rank, m.Text), nil)
			el.relinked.a, el.relinked.b, el.relinked.epoch = c, peer, el.epoch
		}
		r.mu.Unlock()
		r.deliver(out)
	}()
}

// errQuit ends the control stream of a member that said it quits (tQuit).
var errQuit = errors.New("the member quit")

// growRequest records that c asks to admit the pending joiners after
// epoch, and whether it leaves the job there (leave, why); when every
// member asked, the rendezvous lets the leavers go and admits the joiners
// in one new epoch, whose members go on from the commit they all hold (or
// tells the members there is nobody to admit and nobody leaving).
func (r *Rendezvous) growRequest(c *rzConn, epoch int, leave bool, why string) {
	if r.cfg.Elastic == nil {
		return
	}
	r.relayMu.Lock()
	defer r.relayMu.Unlock()
	r.mu.Lock()
	el := &r.el
	if r.closed || r.aborted || epoch != el.epoch || !el.goSent || !c.member {
		r.mu.Unlock()
		return // a change is under way: the member follows it
	}
	c.growReq = true
	c.leaveReq, c.leaveWhy = leave, why
	var leavers []*rzConn
	for _, m := range el.members {
		if !m.growReq {
			r.mu.Unlock()
			return
		}
		if m.leaveReq {
			leavers = append(leavers, m)
		}
	}
	var out *outbox
	if len(leavers) > 0 {
		out = r.departLocked(leavers)
	} else if n := r.admissibleLocked(); n > 0 {
		s := ""
		if n != 1 {
			s = "s"
		}
		out = r.changeLocked(fmt.Sprintf("admitting %d new member%s", n, s), nil)
	} else {
		out = &outbox{}
		for _, m := range el.members {
			m.growReq = false
			out.add(m, &msg{T: tGrowNone, Epoch: epoch})
		}
	}
	r.mu.Unlock()
	r.deliver(out)
}

// departLocked lets the members that asked to leave go, at the commit
// every member just took: each is told it left (departed), and the others
// form the next epoch without them (admitting waiting joiners too). The
// others hold the leavers' unique state of that commit (their buddy
// copies), so nothing is re-run. If nobody is left, the job is over.
func (r *Rendezvous) departLocked(leavers []*rzConn) *outbox {
	el := &r.el
	pre := &outbox{}
	var lost []lostItem
	var names []string
	for _, c := range leavers {
		why := cmp.Or(c.leaveWhy, "asked to")
		cause := "left the job (" + why + ")"
		c.departed = true
		li := lostItemLocked(c, cause)
		li.Left = true
		lost = append(lost, r.removeLocked(c, li, ProcDeparted, why))
		names = append(names, fmt.Sprintf("rank %d", li.Rank))
		pre.add(c, &msg{T: tDeparted, Epoch: el.epoch, Text: cause})
	}
	if len(el.members) == 0 {
		// Everybody left: the job is over, as when the last member
		// finished.
		el.leftClean = true
		r.sendAwayPendingLocked(pre, "the job ended (every member left) before this joiner was admitted")
		return pre
	}
	verb := "leaves"
	if len(names) > 1 {
		verb = "leave"
	}
	out := r.changeLocked(fmt.Sprintf("%s %s the job at a commit (%s)", strings.Join(names, ", "), verb, cmp.Or(leavers[0].leaveWhy, "asked to")), lost)
	// The leavers learn first: their Depart returns before the others'
	// links to them close.
	for _, c := range out.order {
		for _, m := range out.msgs[c] {
			pre.add(c, m)
		}
	}
	return pre
}

// Epoch returns the newest membership epoch (0 in a fixed-size job).
func (r *Rendezvous) Epoch() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.el.epoch
}
