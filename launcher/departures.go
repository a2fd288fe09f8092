// What the rendezvous told gorun of the ranks that closed their
// communicator and of the job's abort, for the error that ends the job.

package launcher

import (
	"fmt"
	"sync"

	"github.com/gorun/gorun/p2p"
)

// departureLog records, from the rendezvous, the ranks that closed their
// communicator and the last collective call each had made.
type departureLog struct {
	mu       sync.Mutex
	lastCall map[int]uint64
	abort    p2p.Abort // the first abort (Cause "": none yet)
}

func (d *departureLog) aborted(a p2p.Abort) {
	d.mu.Lock()
	if d.abort.Cause == "" {
		d.abort = a
	}
	d.mu.Unlock()
}

func (d *departureLog) firstAbort() p2p.Abort {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.abort
}

func (d *departureLog) abortCause() string { return d.firstAbort().Cause }

func (d *departureLog) record(rank int, lastCall uint64) {
	d.mu.Lock()
	d.lastCall[rank] = lastCall
	d.mu.Unlock()
}

// leftEarly names the ranks of a failed job that closed their
// communicator while it ran: the others were still calling collectives
// they could never finish. (Such a rank may still be in Close, waiting for
// its links to drain, when gorun stops the job, so its exit status says
// nothing.)
//
// When every rank closed, only those that closed before another rank's last
// call left early: ranks that all closed after the same call (each failing
// on its own afterwards, e.g. on a bad flag checked after Init) left
// nobody behind.
func (d *departureLog) leftEarly(procs []*rankProc) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	allLeft, last := true, uint64(0)
	for _, p := range procs {
		call, left := d.lastCall[p.rank]
		allLeft = allLeft && left
		last = max(last, call)
	}
	var out []string
	for _, p := range procs {
		if call, left := d.lastCall[p.rank]; left && !(allLeft && call == last) {
			out = append(out, fmt.Sprintf("rank %d%s closed its communicator after call #%d", p.rank, onHost(p.host), call))
		}
	}
	return out
}
