package collective

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/p2p"
)

// Leaving an elastic job gracefully.
//
// Clusters take nodes away with SIGTERM and a grace period: Kubernetes
// deletes or evicts a pod, Slurm preempts or cancels a job, a spot VM is
// reclaimed. A rank that is told so (RequestLeave, or LeaveOnSignal for
// the signal) finishes the step it is in; its next ElasticState.Commit
// takes that step on every rank as usual (its unique state goes to its
// buddy in the commit's ring shift), the ranks agree in the commit's own
// allreduce that somebody leaves, and the rendezvous lets the leavers go
// and forms the next epoch with the others, which go on from that commit:
// no step is run again. On the leaving rank Commit (hence RunElastic)
// returns an error matching ErrLeft; the program exits 0 on it.
//
// A rank of an elastic job whose context ends in a collective (a program
// that cancels on SIGTERM itself) leaves at once instead: the others lose
// the step it interrupted, as after kill -9, but the job is never aborted
// for it.

// ErrLeft matches (errors.Is) the error of a rank that left an elastic job
// gracefully: Commit and RunElastic return it on that rank once it is out
// of the job, and every later call of its Comm fails with it. LeftError
// says at which rank and why.
var ErrLeft = p2p.ErrLeft

// LeftError is the error of a rank that left an elastic job (ErrLeft).
type LeftError = p2p.LeftError

// RequestLeave asks that this rank leave the elastic job gracefully at its
// next ElasticState.Commit: the step under way finishes and is committed
// on every rank, then this rank hands over and leaves, and the others go
// on from that commit. why says what asked (e.g. "SIGTERM"); it appears in
// every rank's and gorun's messages. It does not block and may be called
// from any goroutine, more than once (the first reason counts). In a job
// that is not elastic it does nothing: Commit is a no-op there.
func (c *Comm) RequestLeave(why string) {
	if !c.elastic {
		return
	}
	if why == "" {
		why = "asked to"
	}
	if c.leaveWhy.CompareAndSwap(nil, &why) {
		c.logf("gorun: rank %d: leaving the elastic job at the next commit (%s)", c.Rank(), why)
	}
}

// LeaveOnSignal makes the first of the given signals (SIGTERM if none is
// given) a graceful leave of this rank at its next Commit (RequestLeave),
// as clusters expect of a pod being deleted or a job being preempted. The
// handler is then removed, so a second signal ends the process at once
// (the default action: the others go on without it, as after kill -9), as
// does the grace period's SIGKILL. In a job that is not elastic it does
// nothing. stop removes the handler.
//
// Don't also turn the same signal into a cancelled context (e.g. with
// signal.NotifyContext): a context that ends in a collective makes the
// rank leave at once and the others lose that step.
func (c *Comm) LeaveOnSignal(sigs ...os.Signal) (stop func()) {
	if !c.elastic {
		return func() {}
	}
	if len(sigs) == 0 {
		sigs = []os.Signal{syscall.SIGTERM}
	}
	ch := make(chan os.Signal, 1)
	done := make(chan struct{})
	signal.Notify(ch, sigs...)
	go func() {
		select {
		case sig := <-ch:
			// Reset, not Stop: a second signal takes its default action
			// (ends the process) even if the program handles it elsewhere.
			signal.Reset(sigs...)
			c.warnf("gorun: rank %d: %v: leaving the job at the next commit (the step under way finishes; a second signal ends this rank at once)",
				c.Rank(), signalName(sig))
			c.RequestLeave(signalName(sig))
		case <-done:
			signal.Stop(ch)
		}
	}()
	return func() {
		select {
		case <-done:
		default:
			close(done)
		}
	}
}

// signalName is "SIGTERM" for syscall.SIGTERM, else the signal's text.
func signalName(sig os.Signal) string {
	if s, ok := sig.(syscall.Signal); ok {
		if name := unix.SignalName(s); name != "" {
			return name
		}
	}
	return sig.String()
}

// leaving is the reason of a pending RequestLeave, "" if none.
func (c *Comm) leaving() string {
	if p := c.leaveWhy.Load(); p != nil {
		return *p
	}
	return ""
}

// depart takes this rank out of the job at the commit every rank just
// took (every member calls grow or depart there). It returns the error the
// leaving rank's Commit returns: ErrLeft once it is out, or the
// *MembershipChangeError of a change that came first (the leave then
// happens at the next commit).
func (c *Comm) depart(ctx context.Context, why string) error {
	ctx, release, err := c.holdRing(ctx)
	if err != nil {
		return err
	}
	defer release()
	v := c.cur()
	if err := c.node.Depart(ctx, why); err != nil {
		if isMembershipChange(err) {
			return fmt.Errorf("gorun: rank %d: leaving at a commit: %w", v.rank, err)
		}
		return c.membershipFailed(v.rank, "leaving the job at a commit", err)
	}
	left := &LeftError{Rank: v.rank, Why: why}
	c.cancel(left)
	v.end(left)
	return fmt.Errorf("gorun: %w", left)
}
