package p2p

// Polling receive.
//
// A ring step on a small message is one hop of latency, and a blocking read
// that parks the thread costs a wake-up when the data arrives: on a virtual
// machine an idle vCPU halts, and waking it takes tens of microseconds,
// several times the cost of the hop itself. Like MPI implementations, a
// receiver therefore polls its socket for a short while before it parks.
// When the host runs more ranks than it has CPUs, polling would steal the
// CPU the sender needs, so receives park at once.

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

// pollConfig says how this rank's receives poll. GORUN_POLL_US overrides the
// budget (0 turns polling off).
func pollConfig(localRanks int) (budget time.Duration, yield bool) {
	budget = defaultPollBudget
	set := false
	if s := os.Getenv("GORUN_POLL_US"); s != "" {
		if us, err := strconv.Atoi(s); err == nil && us >= 0 {
			budget, set = time.Duration(us)*time.Microsecond, true
		}
	}
	if localRanks > runtime.NumCPU() {
		// A poll, hot or yielding, would keep the sender off the CPU it
		// needs (see above). Shared-memory links poll yielding for
		// shmYieldBudget unless GORUN_POLL_US says otherwise.
		if !set {
			budget = 0
		}
		return budget, true
	}
	return budget, false
}

// pollReadFull reads exactly len(buf) bytes from rc, polling for up to
// budget before waiting in the runtime's poller. Read deadlines set on the
// connection still apply to the waiting part.
func pollReadFull(rc syscall.RawConn, buf []byte, budget time.Duration, yield bool) error {
	n := 0
	var rerr error
	var start time.Time
	polled := 0
	err := rc.Read(func(fd uintptr) bool {
		for n < len(buf) {
			m, err := syscall.Read(int(fd), buf[n:])
			switch {
			case m > 0:
				n += m
				continue
			case err == syscall.EINTR:
				continue
			case err == syscall.EAGAIN:
				// Poll only while waiting for the first bytes of a
				// message; the rest of a message follows at once.
				if budget <= 0 {
					return false
				}
				if polled == 0 {
					start = time.Now()
				}
				polled++
				if polled&15 == 0 && time.Since(start) > budget {
					return false
				}
				if yield {
					runtime.Gosched()
					syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
				}
				continue
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
