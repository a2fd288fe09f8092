package p2p

// Polling receive.
//
// A ring step on a small message is one hop of latency, and a blocking read
// that parks the thread costs a wake-up when the data arrives: on a virtual
// machine an idle vCPU halts, and waking it takes tens of microseconds,
// several times the cost of the hop itself. Like MPI implementations, a
// receiver therefore polls its socket for a short while before it parks.
// When the machine runs more ranks than it has CPUs (counting the ranks of
// every network namespace on it: namespace "hosts" and containers of one
// node share its cores), a hot poll would steal the CPU the sender needs,
// so a poll yields the CPU between checks (sched_yield, as OpenMPI's
// mpi_yield_when_idle), which hands it to a runnable peer of the same
// session at once (launcher.startLocal says why the session matters).

import (
	"io"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

// defaultPollBudget bounds how long a receive polls before it parks.
const defaultPollBudget = 50 * time.Microsecond

// pollConfig says how this rank's receives poll: for how long before they
// park, and whether they yield the CPU between checks. GORUN_POLL_US
// overrides the budget (0 turns polling off).
func pollConfig(machineRanks int) (budget time.Duration, yield bool) {
	budget = defaultPollBudget
	set := false
	if s := os.Getenv("GORUN_POLL_US"); s != "" {
		if us, err := strconv.Atoi(s); err == nil && us >= 0 {
			budget, set = time.Duration(us)*time.Microsecond, true
		}
	}
	if machineRanks > runtime.NumCPU() {
		// A hot poll would keep the sender off the CPU it needs (see
		// above): polls yield the CPU between checks, for no longer than
		// a shared-memory link's.
		if !set {
			budget = shmYieldBudget
		}
		return budget, true
	}
	return budget, false
}

// poller is one receive's polling: how long it may check for data before
// it waits in the runtime's poller, and whether it yields the CPU between
// checks.
type poller struct {
	budget  time.Duration
	yield   bool
	start   time.Time
	polled  int
	expired bool
}

// again is called when a read found no data: it reports whether to check
// once more (after yielding the CPU, if asked) rather than wait.
func (p *poller) again() bool {
	if p.expired || p.budget <= 0 {
		return false
	}
	if p.polled == 0 {
		p.start = time.Now()
	}
	p.polled++
	if p.polled&15 == 0 && time.Since(p.start) > p.budget {
		p.expired = true
		return false
	}
	if p.yield {
		runtime.Gosched()
		syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
	}
	return true
}

// pollReadFull reads exactly len(buf) bytes from rc, polling for up to
// budget before waiting in the runtime's poller. Read deadlines set on the
// connection still apply to the waiting part.
func pollReadFull(rc syscall.RawConn, buf []byte, budget time.Duration, yield bool) error {
	n := 0
	var rerr error
	p := poller{budget: budget, yield: yield}
	err := rc.Read(func(fd uintptr) bool {
		for n < len(buf) {
			m, err := syscall.Read(int(fd), buf[n:])
			switch {
			case m > 0:
				n += m
			case err == syscall.EINTR:
			case err == syscall.EAGAIN:
				// The budget is the whole message's: its first bytes are
				// what a poll waits for, and the rest follows at once.
				if !p.again() {
					return false
				}
			case m == 0 && err == nil:
				rerr = io.ErrUnexpectedEOF
				if n == 0 {
					rerr = io.EOF
				}
				return true
			default:
				rerr = err
				return true
			}
		}
		return true
	})
	if err != nil {
		return err
	}
	return rerr
}

// pollRead reads what rc has, at least one byte (or the end of the
// stream), polling for up to budget before it waits in the runtime's
// poller.
func pollRead(rc syscall.RawConn, buf []byte, budget time.Duration, yield bool) (int, error) {
	if len(buf) == 0 {
		return 0, nil
	}
	var n int
	var rerr error
	p := poller{budget: budget, yield: yield}
	err := rc.Read(func(fd uintptr) bool {
		for {
			m, err := syscall.Read(int(fd), buf)
			switch {
			case m > 0:
				n = m
				return true
			case err == syscall.EINTR:
			case err == syscall.EAGAIN:
				if !p.again() {
					return false
				}
			case m == 0 && err == nil:
				rerr = io.EOF
				return true
			default:
				rerr = err
				return true
			}
		}
	})
	if err != nil {
		return n, err
	}
	return n, rerr
}
