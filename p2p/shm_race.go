//go:build race

package p2p

// The race detector's view of shm rings: the order a ring's counters
// make, told to the detector (see below).

import "sync"

// The race detector learns of an order between goroutines only through Go's
// own synchronisation. Data that crosses a shared-memory ring is ordered by
// the ring's counters in memory the detector does not see, and the order
// can run through other ranks: a ring's sender goroutine reads a segment of
// the user's buffer and sends it on; the receiver goroutine of the same
// rank later writes that segment with what came back from the previous
// rank, which could not have been sent before the first send. Over sockets
// the standard library orders every read after every earlier write of the
// process (internal/poll's ioSync); shmSync does the same for shm links, in
// race-enabled builds only.
var shmSync sync.Mutex

// raceReleaseIO is called before data written to a ring is published.
func raceReleaseIO() {
	shmSync.Lock()
	shmSync.Unlock()
}

// raceAcquireIO is called after a reader saw newly published data.
func raceAcquireIO() {
	shmSync.Lock()
	shmSync.Unlock()
}
