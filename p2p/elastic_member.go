package p2p

// A member's side of elastic membership: the calls that move a node from
// one epoch to the next (Reconfigure, Grow), out of the job (Depart, Quit),
// and the steps of forming an epoch.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Epoch returns the membership epoch the node is in (always 0 in a
// fixed-size job; -1 for a joiner not yet admitted).
func (n *Node) Epoch() int { return n.cur.Load().epoch }

// PendingJoiners returns how many joiners the rendezvous would admit if
// the members called Grow now (as of its last ping, every quarter of the
// heartbeat bound). Always 0 in a fixed-size job.
func (n *Node) PendingJoiners() int { return int(n.el.pending.Load()) }

// Reconfigure moves this node into the next membership epoch after its
// current one ended with a *MembershipChangeError: it waits for the new
// table, installs it in the gater, acknowledges it, waits for every member
// to do so and connects the new epoch's links. If the membership changes
// again meanwhile it follows into the newer epoch. Each step is bounded by
// ctx and Timeout, except that the wait for a table is not bounded by
// Timeout while the rendezvous reports that it waits for members (it
// aborts the job itself after its WaitTimeout). Afterwards Rank, Size,
// Peers, Transport, Mesh, Done and Err describe the new epoch.
//
// If the current epoch has not ended, Reconfigure returns its View at
// once. An error is final: the node can not take part any more (the job
// was aborted, this node was cut off or dropped, or a step timed out).
func (n *Node) Reconfigure(ctx context.Context) (View, error) {
	if !n.cfg.Elastic {
		return View{}, fmt.Errorf("p2p: rank %d: Reconfigure needs an elastic job (Config.Elastic)", n.rank())
	}
	v, err := n.reconfigure(ctx, true)
	return v, n.wrapErr(err)
}

// wrapErr names this node in an error of Reconfigure, Grow or an elastic
// Join, unless the error already does.
func (n *Node) wrapErr(err error) error {
	if err == nil {
		return nil
	}
	who := fmt.Sprintf("rank %d", n.rank())
	if n.rank() < 0 {
		who = "joiner"
	}
	if text := err.Error(); strings.HasPrefix(text, "p2p: ") || strings.HasPrefix(text, who+": ") {
		return err
	}
	return fmt.Errorf("p2p: %s: %w", who, err)
}

// Grow admits the joiners that are waiting (PendingJoiners) into a new
// epoch. Every member must call it at the same point of its program (a
// commit boundary): the rendezvous decides once all members asked, and
// admits the joiners waiting at that moment (up to MaxSize), then every
// member, and every admitted joiner's Join, forms the new epoch as in
// Reconfigure. If nobody is waiting, Grow returns the current View and the
// links stay as they are. If a member is lost meanwhile, Grow follows into
// that reconfiguration (which admits the waiting joiners too) and returns
// its View. Waiting for the other members is bounded by ctx and Timeout.
func (n *Node) Grow(ctx context.Context) (View, error) {
	if !n.cfg.Elastic {
		return View{}, fmt.Errorf("p2p: rank %d: Grow needs an elastic job (Config.Elastic)", n.rank())
	}
	v, err := n.grow(ctx)
	return v, n.wrapErr(err)
}

func (n *Node) grow(ctx context.Context) (View, error) {
	ep := n.cur.Load()
	if n.epochErr(ep) != nil {
		return n.reconfigure(ctx, true)
	}
	// One Grow at a time per epoch: the rendezvous answers once every
	// member asked, so the answer is this call's.
	none := make(chan struct{})
	n.mu.Lock()
	n.el.growNone, n.el.growEpoch = none, ep.epoch
	n.mu.Unlock()
	if err := n.ctl.send(&msg{T: tGrow, Rank: ep.rank, Epoch: ep.epoch}); err != nil {
		return View{}, fmt.Errorf("grow: telling the rendezvous: %w", err)
	}
	sctx, cancel := n.stepCtx(ctx, "waiting for every member to call Grow")
	defer cancel()
	select {
	case <-none:
		return n.viewOf(ep), nil
	case <-ep.done:
		return n.reconfigure(ctx, true)
	case <-sctx.Done():
		return View{}, fmt.Errorf("grow of epoch %d: %w", ep.epoch, context.Cause(sctx))
	}
}

// Depart leaves the elastic job gracefully, where the other members call
// Grow: at a commit boundary every member holds (the same point as
// Grow). The rendezvous decides once every member asked: the members that
// depart are let go, and the others form the next epoch without them
// (admitting waiting joiners too), going on from that commit. Depart
// returns nil once this node is out of the job; it takes no further part
// (Err is a *LeftError) and Close just disconnects. If the membership
// changes first (a member lost meanwhile), Depart returns that
// *MembershipChangeError: call Reconfigure and depart at the next commit.
// Waiting for the other members is bounded by ctx and Timeout.
func (n *Node) Depart(ctx context.Context, why string) error {
	if !n.cfg.Elastic {
		return fmt.Errorf("p2p: rank %d: Depart needs an elastic job (Config.Elastic)", n.rank())
	}
	ep := n.cur.Load()
	if err := n.epochErr(ep); err != nil {
		return err
	}
	ch := make(chan struct{})
	n.mu.Lock()
	n.el.departed, n.el.growEpoch = ch, ep.epoch
	n.mu.Unlock()
	if err := n.ctl.send(&msg{T: tGrow, Rank: ep.rank, Epoch: ep.epoch, Leave: true, Text: why}); err != nil {
		return n.wrapErr(fmt.Errorf("depart: telling the rendezvous: %w", err))
	}
	sctx, cancel := n.stepCtx(ctx, "waiting for every member to reach the commit this rank leaves at")
	defer cancel()
	select {
	case <-ch:
		n.life.departedJob.Store(true)
		n.abortLocal(&LeftError{Rank: ep.rank, Why: why})
		n.logf("left the job at a commit (%s)", why)
		return nil
	case <-ep.done:
		return n.epochErr(ep)
	case <-sctx.Done():
		return n.wrapErr(fmt.Errorf("depart from epoch %d: %w", ep.epoch, context.Cause(sctx)))
	}
}

// Quit leaves the elastic job at once, outside a commit (the program gave
// up, e.g. its context was cancelled): the rendezvous counts it as lost,
// with why as the cause, and the others go on from their last commit,
// running the interrupted step again. This node takes no further part.
func (n *Node) Quit(why string) {
	if !n.cfg.Elastic || n.fatalErr() != nil {
		return
	}
	if n.ctl.registered() {
		if err := n.ctl.send(&msg{T: tQuit, Rank: max(n.rank(), 0), Text: why}); err != nil {
			n.logf("could not tell the rendezvous this rank quits: %v", err)
		}
	}
	n.life.departedJob.Store(true)
	n.abortLocal(&LeftError{Rank: n.rank(), Why: why + ", outside a commit"})
	if n.ctl.registered() {
		// After the quit message, in order (a reset could overtake it):
		// the rendezvous counts this member as lost at once.
		n.ctl.s.CloseWrite()
	}
}

// viewOf returns the View of ep, with the current peers.
func (n *Node) viewOf(ep *epochRun) View {
	v := ep.view
	v.Lost = slices.Clone(v.Lost)
	v.Joined = slices.Clone(v.Joined)
	v.Peers = n.Peers()
	return v
}

func (n *Node) fatalErr() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.fatal
}

// reconfigure forms the next epoch (the first one, when called by Join).
// started: the node has been in an epoch before.
func (n *Node) reconfigure(ctx context.Context, started bool) (View, error) {
	if ep := n.cur.Load(); started && n.epochErr(ep) == nil {
		return n.viewOf(ep), nil
	}
	for {
		if err := n.fatalErr(); err != nil {
			return View{}, err
		}
		t, err := n.nextTable(ctx)
		if err != nil {
			return View{}, err
		}
		ep, err := n.installEpoch(t)
		if err != nil {
			// The rendezvous sent something this node can not use: a bug
			// or a mismatch of versions, not a lost member.
			n.Abort(err)
			return View{}, err
		}
		if n.epochErr(ep) != nil {
			continue // overtaken already
		}
		if err := n.ctl.send(&msg{T: tAck, Rank: ep.rank, Epoch: ep.epoch}); err != nil {
			return View{}, n.stepErr(ep, fmt.Errorf("ack to the rendezvous: %w", err))
		}
		if err := n.waitFor(ctx, fmt.Sprintf("waiting for go of epoch %d (members that have not acked its table)", ep.epoch), ep.goCh); err != nil {
			if n.overtaken(ep) {
				continue
			}
			return View{}, n.stepErr(ep, err)
		}
		blame, err := n.connectEpochLinks(ctx, ep)
		if err == nil {
			n.logf("in membership epoch %d: rank %d of %d", ep.epoch, ep.rank, ep.size)
			return n.sinceShown(n.viewOf(ep)), nil
		}
		if n.overtaken(ep) {
			continue
		}
		if ctx.Err() != nil {
			return View{}, n.stepErr(ep, err)
		}
		// The links could not be set up: the rendezvous decides whom to
		// drop and starts the next epoch.
		for _, p := range blame {
			n.reportLinkFailure(ep, p, err)
		}
		if len(blame) == 0 {
			return View{}, n.stepErr(ep, err)
		}
		wctx, cancel := n.stepCtx(ctx, "waiting for the rendezvous to answer a link failure")
		select {
		case <-ep.done:
		case <-wctx.Done():
		}
		cancel()
		if !n.overtaken(ep) {
			return View{}, n.stepErr(ep, err)
		}
	}
}

// overtaken reports whether ep ended because a newer epoch began (rather
// than for good).
func (n *Node) overtaken(ep *epochRun) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	var mc *MembershipChangeError
	return n.fatal == nil && ep.err != nil && errors.As(ep.err, &mc)
}

// stepErr makes a failed step of a reconfiguration final for this node.
func (n *Node) stepErr(ep *epochRun, err error) error {
	if f := n.fatalErr(); f != nil {
		return f
	}
	return n.quit(fmt.Errorf("forming membership epoch %d: %w", ep.epoch, err))
}

// quit ends this node's part in an elastic job for good (a step it could
// not complete, a cancelled Reconfigure): it also ends its control stream,
// so that the rendezvous counts it as lost at once and the others go on
// without it instead of waiting for it to acknowledge their next table.
func (n *Node) quit(err error) error {
	if !n.abortLocal(err) {
		return n.fatalErr()
	}
	if n.ctl.registered() {
		n.ctl.s.Reset()
	}
	return err
}

// nextTable waits for the table of the newest announced epoch.
func (n *Node) nextTable(ctx context.Context) (*msg, error) {
	first := n.cur.Load().epoch < 0
	joiner := n.cfg.Rank < 0
	what := "waiting for the table of the next membership epoch"
	if first && !joiner {
		what = "waiting for the job table (ranks not registered yet)"
	}
	var timeout <-chan time.Time
	if !(first && joiner) { // a joiner waits as long as the job runs without it
		t := time.NewTimer(n.cfg.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	for {
		n.mu.Lock()
		t, fatal, waiting := n.el.table, n.fatal, n.el.waiting
		if t != nil && t.Epoch >= n.el.latest && t.Epoch > n.cur.Load().epoch {
			n.el.table = nil
			n.mu.Unlock()
			return t, nil
		}
		n.mu.Unlock()
		if fatal != nil {
			return nil, fatal
		}
		select {
		case <-n.el.tableCh:
		case <-ctx.Done():
			return nil, n.quit(fmt.Errorf("%s: %w", what, context.Cause(ctx)))
		case <-timeout:
			if waiting != "" {
				// The rendezvous waits for members (and will abort the job
				// itself if none come): so do we.
				t := time.NewTimer(n.cfg.Timeout)
				defer t.Stop()
				timeout = t.C
				continue
			}
			err := fmt.Errorf("%s: timed out after %v", what, n.cfg.Timeout)
			if m := n.getMissing(); len(m) > 0 {
				err = fmt.Errorf("%s: missing ranks %v: timed out after %v", what, m, n.cfg.Timeout)
			}
			return nil, n.quit(err)
		}
	}
}

// installEpoch makes the table t the node's current epoch: gater, peers,
// expected links. The previous epoch has ended (or is the placeholder
// before the first table).
