package collective

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gorun/gorun/p2p"
	"github.com/gorun/gorun/ring"
)

// The Comm's side of elastic membership: epochs, numbering, failures and
// reconfiguration. The state and the run wrapper that training loops use
// are in elastic.go.

// DefaultHeartbeatTimeout is how long a member of an elastic job may be
// silent (frozen, cut off) before the job goes on without it, unless
// WithElastic or GORUN_HEARTBEAT_TIMEOUT says otherwise.
const DefaultHeartbeatTimeout = 3 * time.Second

// MembershipChangeError is why the collectives of an elastic job fail when
// a member is lost or joiners are admitted: the membership epoch they were
// numbered in has ended. Every survivor gets it, at once, for the call it is
// in and every call queued behind it; RunElastic reconfigures the Comm and
// resumes from the last commit. Match it with errors.As.
//
// CutOffError is final: this rank lost the rendezvous and the job goes on
// without it. LostMember describes a member that left without a Close.
type (
	MembershipChangeError = p2p.MembershipChangeError
	CutOffError           = p2p.CutOffError
	LostMember            = p2p.LostMember
)

// WithElastic makes the Comm a member of an elastic job, as GORUN_ELASTIC=1
// does: a lost member makes the current collectives fail with a
// *MembershipChangeError instead of aborting the job, and RunElastic
// re-forms the ring with the ranks that are left (and joiners) and goes on.
// heartbeat is how long a frozen or cut-off member may stay silent before
// it counts as lost (0: GORUN_HEARTBEAT_TIMEOUT, or 3 s); every member and
// the rendezvous must use the same value. With WithRank(-1, n) the process
// is a joiner: Init waits, bounded only by its ctx (a job may run a long
// time before it has room), until the members admit it at a commit. The
// job's rendezvous must be elastic and outlive every rank (gorun's, or
// StartLocal's): rank 0 can not host it.
func WithElastic(heartbeat time.Duration) Option {
	return func(c *config) { c.elastic, c.heartbeat = true, heartbeat }
}

// Elastic reports whether the Comm is a member of an elastic job.
func (c *Comm) Elastic() bool { return c.elastic }

// Joiner reports whether this process joined a running elastic job (it
// started with rank -1: GORUN_RANK=-1, or WithRank(-1, n)) instead of
// starting with it. A joiner holds no state of its own: it gets the state
// from a live rank at its first reset in RunElastic, and must not restore
// a checkpoint or make the start-up collectives of the initial members.
// It stays true once the joiner is admitted. Epoch is no substitute: an
// initial member's Init returns in a later epoch when a member was lost
// during the start.
func (c *Comm) Joiner() bool { return c.joiner }

// PendingJoiners is how many processes, as far as this rank has heard,
// wait to join the elastic job at its next Commit (0 in a job that is not
// elastic). The ranks hear of them at different times; Commit agrees.
func (c *Comm) PendingJoiners() int {
	if !c.elastic || c.node == nil {
		return 0
	}
	return c.node.PendingJoiners()
}

// Epoch is the membership epoch the Comm is in: 0 at the start of a job
// (always, in a fixed-size job), one more at every reconfiguration.
func (c *Comm) Epoch() int { return c.cur().epoch }

// commView is one membership epoch of the Comm: the rank and size calls are
// numbered with and the ring they run on. It never changes once stored,
// except that ctx ends (with the epoch's *MembershipChangeError, or a fatal
// cause) when the epoch does.
type commView struct {
	rank, size, epoch int
	ring              *ring.Ring
	ctx               context.Context
	end               context.CancelCauseFunc // nil in a fixed-size job
	lost              []p2p.LostMember        // since the previous epoch
	joined            []int
	base              ring.Stats // the wire traffic of the rings of earlier epochs
	// refine times the links' allreduce choices on the first calls of
	// each size (links_refine.go); nil where the policy is not the links'.
	refine *policyRefiner
	links  *AgreedLinks // the links the ring's policy came from (nil: none)
}

// endErr is why the epoch ended, or nil.
func (v *commView) endErr() error {
	if v.ctx.Err() == nil {
		return nil
	}
	return context.Cause(v.ctx)
}

func isMembershipChange(err error) bool {
	var mc *MembershipChangeError
	return errors.As(err, &mc)
}

// staleErr fails a call numbered in an epoch that has ended (queued behind
// the call that broke), without touching the network.
func (c *Comm) staleErr(h *Handle) error {
	v := h.view
	err := v.endErr()
	if err == nil && v != c.cur() {
		// Replaced while it was queued (e.g. joiners admitted at a commit
		// the caller raced with): a membership change all the same.
		err = &MembershipChangeError{Rank: v.rank, Epoch: v.epoch, Next: c.cur().epoch, Reason: "membership epoch ended before the call ran"}
	}
	if err == nil {
		return nil
	}
	return fmt.Errorf("gorun: rank %d: %s #%d: %w", v.rank, h.call.Kind, h.call.Seq, err)
}

// membershipCause decides, for a call of epoch v that failed with err,
// whether a membership change is the cause. A dead peer breaks its links
// at once, usually before the rendezvous has told this rank that the epoch
// ended; aborting the job then would kill every survivor. So the rank
// waits, at most the heartbeat bound and a little more, for the verdict.
// A mismatch (ranks that called different things) is a bug of the program
// and fails the job as in a fixed-size job, and so does an error the
// membership does not explain.
func (c *Comm) membershipCause(v *commView, err error) error {
	var me *ring.MismatchError
	var ee *ring.EpochError
	if errors.As(err, &me) || errors.As(err, &ee) {
		return nil
	}
	if isMembershipChange(err) {
		return err
	}
	return c.awaitEpochEnd(v)
}

// awaitEpochEnd waits, at most the heartbeat bound and a little more, for
// the rendezvous to end epoch v, and returns the membership change, or nil
// if none came.
func (c *Comm) awaitEpochEnd(v *commView) error {
	t := time.NewTimer(c.heartbeat + 2*time.Second)
	defer t.Stop()
	select {
	case <-v.ctx.Done():
	case <-c.life.Done():
		return nil
	case <-t.C:
		return nil
	}
	if end := v.endErr(); isMembershipChange(end) {
		return end
	}
	return nil
}

// newcomerMismatch handles a call mismatch (err) between a member that
// joined in epoch v and one that did not: the job ran fine before the
// newcomer came, so the newcomer leaves, naming both calls, and the others
// go on from their last commit instead of aborting. A newcomer that sees
// the mismatch quits; a member that sees it waits for the newcomer's
// departure to end the epoch. It returns nil when err is no such mismatch
// (or the newcomer did not go in time): the job then aborts as for any
// mismatch.
func (c *Comm) newcomerMismatch(v *commView, err error) error {
	var me *ring.MismatchError
	if !errors.As(err, &me) || c.node == nil {
		return nil
	}
	localNew, remoteNew := slices.Contains(v.joined, me.LocalRank), slices.Contains(v.joined, me.RemoteRank)
	switch {
	case localNew && !remoteNew:
		c.node.Quit(fmt.Sprintf("it joined and called %s where rank %d, which ran before it came, called %s (another program, version or arguments?)", me.Local, me.RemoteRank, me.Remote))
		lerr := fmt.Errorf("gorun: joiner (rank %d of membership epoch %d): %w: it leaves the job, which goes on without it; start the job's own program, with its arguments", v.rank, v.epoch, err)
		c.cancel(lerr)
		return lerr
	case remoteNew && !localNew:
		if mc := c.awaitEpochEnd(v); mc != nil {
			return fmt.Errorf("gorun: rank %d: %s #%d: %w", v.rank, me.Local.Kind, me.Local.Seq, mc)
		}
	}
	return nil
}

// adopt makes the node's current epoch (pv) the Comm's: a ring on its
// links with its rank, size and epoch, call numbers from 1 again, and a
// watcher that ends it when the node's epoch ends. The caller holds execMu
// or runs before the worker starts, so no call is in flight.
func (c *Comm) adopt(pv p2p.View) error {
	done := c.node.Done()
	prev := c.cur()
	var tr ring.Transport
	if pv.Size > 1 {
		tr = c.node.Transport()
	}
	// No call runs (execMu), so the old ring's counters are final: keep
	// them, or Stats would go back to zero at every reconfiguration.
	v := &commView{rank: pv.Rank, size: pv.Size, epoch: pv.Epoch, lost: pv.Lost, joined: pv.Joined, base: prev.wireStats()}
	v.ctx, v.end = context.WithCancelCause(context.Background())
	if pv.Size > 1 && tr == nil {
		// The epoch ended while it formed: the next reconfiguration
		// follows into the newer one.
		err := c.node.Err()
		if err == nil {
			err = &MembershipChangeError{Rank: pv.Rank, Epoch: pv.Epoch, Next: pv.Epoch + 1, Reason: "membership epoch ended while it formed"}
		}
		v.end(err)
	} else {
		hosts := hostIndices(pv.Peers)
		rc := ring.Config{Rank: pv.Rank, Size: pv.Size, ChunkBytes: c.chunkBytes, Phase: c.phase, Epoch: ring.EpochOf(pv.Epoch), Elastic: true,
			Hosts: hosts, Allreduce: c.allreducePolicy}
		if mesh, ok := tr.(ring.Mesh); ok && spansHosts(hosts) {
			links, err := c.adoptEpochLinks(done, mesh, pv, hosts)
			switch {
			case err == nil:
				v.links, rc.Links = &links, &links.Links
			case c.epochEnded(done):
				// The epoch ended while the links were agreed (a member
				// lost, this rank cut off, the job aborted): the watch
				// below ends v with the node's cause, as for any call.
			default:
				return fmt.Errorf("gorun: rank %d: membership epoch %d: %w", pv.Rank, pv.Epoch, err)
			}
		}
		rg, err := ring.New(rc, tr)
		if err != nil {
			return fmt.Errorf("gorun: rank %d: membership epoch %d: %w", pv.Rank, pv.Epoch, err)
		}
		v.ring = rg
		if v.links != nil {
			c.links = v.links
			c.compression.adoptLinks(*v.links, pv.Size, hosts, c.chunkBytes)
			v.refine = c.refinerFor(rg, *v.links, pv.Size, hosts)
			if pv.Rank == 0 {
				c.logf("gorun: rank 0: membership epoch %d: %s", pv.Epoch, policyReport(rg, v.links, c.compression))
			}
		}
	}
	c.mu.Lock()
	c.seq = 0
	c.view.Store(v)
	c.mu.Unlock()
	c.node.SetProgress(0)
	go func() {
		select {
		case <-done:
		case <-c.life.Done():
			v.end(context.Cause(c.life))
			return
		case <-v.ctx.Done():
			return
		}
		err := c.node.Err()
		if err == nil {
			return // a reconfiguration already ended v and moved on
		}
		if !isMembershipChange(err) {
			c.cancel(err) // aborted, cut off, closed: final
		}
		v.end(err)
	}()
	return nil
}

// quiesce waits until no call is queued or running and returns holding
// execMu, so nothing runs on the ring until the caller releases it with
// unquiesce; calls made meanwhile are queued. Calls
// of an ended epoch fail at once, so this is short; it is bounded by ctx
// and the collective timeout anyway.
func (c *Comm) quiesce(ctx context.Context) error {
	if c.closing.Err() != nil {
		return ErrClosed
	}
	t := time.NewTimer(c.timeout)
	defer t.Stop()
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return ErrClosed
		}
		if c.pending == 0 {
			// From here on calls queue instead of taking execMu inline
			// (which they would do holding mu, the opposite order of
			// adopt's): see Comm.mu. A call already inline ends without
			// mu.
			c.reconfiguring = true
			c.mu.Unlock()
			c.execMu.Lock()
			return nil
		}
		n := c.pending
		c.mu.Unlock()
		select {
		case <-c.drained:
		case <-c.closing.Done():
			return ErrClosed
		case <-ctx.Done():
			return fmt.Errorf("gorun: rank %d: waiting for %d queued calls to finish before reconfiguring: %w", c.Rank(), n, context.Cause(ctx))
		case <-t.C:
			return fmt.Errorf("gorun: rank %d: %d queued calls did not finish within the %v collective timeout before reconfiguring", c.Rank(), n, c.timeout)
		}
	}
}

// unquiesce ends what quiesce started: the queued calls may run.
func (c *Comm) unquiesce() {
	c.execMu.Unlock()
	c.mu.Lock()
	c.reconfiguring = false
	c.mu.Unlock()
}

// closable is ctx that also ends when Close is called, so a
// reconfiguration (which may wait up to --elastic-timeout for members)
// does not hold Close up.
func (c *Comm) closable(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(c.closing, func() { cancel(ErrClosed) })
	return ctx, func() { stop(); cancel(nil) }
}

// closedNow says Close cut a reconfiguration short: its error is
// ErrClosed, not a failure of the job (the Comm just leaves).
func (c *Comm) closedNow() bool {
	return c.closing.Err() != nil && errors.Is(context.Cause(c.closing), ErrClosed)
}

// holdRing readies a membership step: ctx also ends when the Comm is
// closed, and no call runs on the ring until release.
func (c *Comm) holdRing(ctx context.Context) (_ context.Context, release func(), err error) {
	ctx, stop := c.closable(ctx)
	if err := c.quiesce(ctx); err != nil {
		stop()
		return nil, nil, err
	}
	if c.testReconfigHook != nil {
		c.testReconfigHook()
	}
	return ctx, func() { c.unquiesce(); stop() }, nil
}

// membershipFailed is the error of a membership step (what) of this rank
// that failed with err: final for the Comm, unless Close ended it.
func (c *Comm) membershipFailed(rank int, what string, err error) error {
	if c.closedNow() {
		return fmt.Errorf("gorun: rank %d: closed while %s: %w", rank, what, ErrClosed)
	}
	c.cancel(err)
	return fmt.Errorf("gorun: rank %d: %s: %w", rank, what, err)
}

// reconfigure moves the Comm into the next membership epoch once the
// current one has ended: it waits until no call runs, lets the node form
// the new epoch (p2p.Node.Reconfigure) and rebuilds the ring on it. It
// returns the views before and after; they are the same when the epoch
// had not ended (nothing to do). An error is final for this rank.
func (c *Comm) reconfigure(ctx context.Context) (old, now *commView, err error) {
	if !c.elastic {
		return nil, nil, fmt.Errorf("gorun: rank %d: the job is not elastic (launch with gorun --min-np/--max-np, or WithElastic)", c.Rank())
	}
	ctx, release, err := c.holdRing(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer release()
	old = c.cur()
	if c.life.Err() != nil {
		return old, old, c.unusable(context.Cause(c.life))
	}
	select {
	case <-c.node.Done():
	default:
		if old.endErr() == nil {
			return old, old, nil
		}
	}
	if err := c.node.Err(); err != nil {
		old.end(err)
	}
	pv, err := c.node.Reconfigure(ctx)
	if err != nil {
		return old, nil, c.membershipFailed(old.rank, "re-forming the job after a membership change", err)
	}
	if err := c.adopt(pv); err != nil {
		c.cancel(err)
		return old, nil, err
	}
	c.logf("gorun: rank %d -> rank %d of %d in membership epoch %d", old.rank, pv.Rank, pv.Size, pv.Epoch)
	return old, c.cur(), nil
}

// grow admits the joiners that wait, if any, and lets the members that
// leave go (depart): every member must call one of them at the same point
// (Commit does, when they agreed that somebody waits or leaves). It
// returns the view before and after; they are the same when nobody was
// admitted.
func (c *Comm) grow(ctx context.Context) (old, now *commView, err error) {
	ctx, release, err := c.holdRing(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer release()
	old = c.cur()
	pv, err := c.node.Grow(ctx)
	if err != nil {
		return old, nil, c.membershipFailed(old.rank, "admitting joiners", err)
	}
	if pv.Epoch == old.epoch {
		return old, old, nil
	}
	old.end(&MembershipChangeError{Rank: old.rank, Epoch: old.epoch, Next: pv.Epoch, Reason: "membership changed at a commit (joiners admitted, or members left)"})
	if err := c.adopt(pv); err != nil {
		c.cancel(err)
		return old, nil, err
	}
	return old, c.cur(), nil
}
