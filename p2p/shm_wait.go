package p2p

// How either end of an shm link waits for the other: polling, then
// parking on a futex word in the mapping.
//
// Both ends wait the same way: first poll for the budget of pollConfig
// (shmYieldBudget when the machine runs more ranks than CPUs): a few hot
// checks, then checks with the CPU yielded in between (sched_yield), so
// that a poll does not keep a peer that needs this CPU off it. Then park on a futex word in the mapping
// (FUTEX_WAIT, not the private variant: the waker is another process). To
// park, a side sets its word to 1, checks again, then waits while the
// word is 1; the other side publishes its counter, and only if the word
// is 1 swaps it to 0 and calls FUTEX_WAKE, so the fast path makes no
// system call. A parked wait is bounded by the ctx deadline (the futex timeout),
// and cancellation, Close and the end of the link's epoch (which closes
// the links) wake it: they set the word to 0 and wake it themselves. The
// context callback is only registered once an operation parks.

import (
	"context"
	"math"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	// shmSpins are the hot checks of a wait before it yields the CPU
	// between checks (see await).
	shmSpins = 64
	// shmYieldBudget is how long a wait polls (yielding the CPU between
	// checks, see await) before it parks when the machine runs more ranks
	// than CPUs (pollConfig's budget then, sockets' too). A check costs
	// no system call, and the yield hands the CPU to a peer that is
	// runnable on it, which a park-and-wake would make wait for a
	// wake-up. A longer budget helps small messages no more, and
	// large ones less.
	shmYieldBudget = 50 * time.Microsecond
	// maxPark bounds one futex wait. Every wake-up that matters is
	// explicit; this only caps the cost of one missed.
	maxPark = time.Second
)

// ready reports whether this side can make progress: data or the end of
// the stream for the reader, space for the writer.
func (s *shmLink) ready() bool {
	r := s.ring
	if s.writer {
		return s.pos-s.loadTail() < uint64(len(r.data))
	}
	return r.head.Load() != s.pos || r.closed.Load() != 0
}

// notify wakes the other side if it is parked on w: only then is there a
// system call.
func notify(w *atomic.Uint32) {
	if w.Load() != 0 && w.CompareAndSwap(1, 0) {
		futexWake(w)
	}
}

// interrupt wakes this process's waiter on w whatever the flag says; the
// waiter then finds out why (ctx, broken link).
func interrupt(w *atomic.Uint32) {
	w.Store(0)
	futexWake(w)
}

const (
	futexWaitOp = 0 // FUTEX_WAIT: shared, the waker is another process
	futexWakeOp = 1 // FUTEX_WAKE
)

func futexWait(w *atomic.Uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWaitOp, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

func futexWake(w *atomic.Uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWakeOp, math.MaxInt32, 0, 0, 0)
}

// parked is the context callback of a transfer that parked (registered on
// the first park, never on the fast path).
type parked struct {
	stop  func() bool
	fired chan struct{}
	// waiting: the transfer parked and set its link's waitingSince.
	waiting bool
}

// end unregisters the callback, waiting for it if it is running: it
// touches the mapping, which must outlive it. It clears s.waitingSince if
// the transfer set it.
func (p *parked) end(s *shmLink) {
	if p.waiting {
		s.waitingSince.Store(0)
	}
	if p.stop != nil && !p.stop() {
		<-p.fired
	}
}

// await returns once this side may make progress (ready) or the link is
// broken; or with ctx's cause, or os.ErrDeadlineExceeded at its deadline.
// It polls for budget (pollConfig's; shmYieldBudget if GORUN_POLL_US=0
// turned polling off where the machine runs more ranks than CPUs, which
// yield says), then parks on this side's futex word.
//
// A poll is a few hot checks, which catch a peer that answers within a
// microsecond or so without any system call, then checks with the CPU
// yielded in between: a peer that takes longer is likely waiting for a
// CPU, maybe this one, and a hot spin would keep it off.
func (s *shmLink) await(ctx context.Context, p *parked, wait linkWait) error {
	budget := wait.budget
	if budget <= 0 && wait.yield {
		budget = shmYieldBudget
	}
	var start time.Time
	for i := 0; ; i++ {
		if s.ready() || s.broken.Load() {
			return nil
		}
		if i < shmSpins {
			continue
		}
		if budget <= 0 {
			break
		}
		if i == shmSpins {
			start = time.Now()
			if wait.gosched {
				runtime.Gosched() // see below: a readied sender starts now, not after the poll
			}
		} else if time.Since(start) > budget {
			break
		}
		syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
	}
	// Let other goroutines run before this one parks: the ring's sender,
	// just readied by this receiver, or the training loop's own goroutines
	// computing while an async collective waits, may sit on this P, and a
	// futex wait holds the P until sysmon takes it back, which takes
	// hundreds of microseconds. Only the early Gosched, before polling, is
	// left to collectives of several goroutines (wait.gosched): in a small
	// collective that waits a few microseconds it would only wake another
	// thread; the wait has lasted the poll budget by the time it parks.
	runtime.Gosched()
	if !p.waiting {
		// From here on the transfer waits for the peer: say so to a hang
		// diagnosis (the spins and yields above are too short to matter).
		p.waiting = true
		s.waitingSince.Store(time.Now().UnixNano())
	}
	w := s.myWord()
	if p.stop == nil && ctx.Done() != nil {
		p.fired = make(chan struct{})
		p.stop = context.AfterFunc(ctx, func() {
			interrupt(w)
			close(p.fired)
		})
	}
	deadline, hasDeadline := ctx.Deadline()
	for {
		w.Store(1)
		// Checked after the flag is up: whoever changes one of these
		// afterwards sees the flag and wakes us.
		if s.ready() || s.broken.Load() {
			w.Store(0)
			return nil
		}
		if ctx.Err() != nil {
			w.Store(0)
			return context.Cause(ctx)
		}
		d := maxPark
		if hasDeadline {
			left := time.Until(deadline)
			if left <= 0 {
				w.Store(0)
				return os.ErrDeadlineExceeded
			}
			d = min(d, left)
		}
		futexWait(w, 1, d)
	}
}
