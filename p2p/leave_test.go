package p2p

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"
)

// departures records RendezvousConfig.OnLeave calls.
type departures struct {
	mu  sync.Mutex
	got map[int]uint64
}

func (d *departures) onLeave(rank int, lastCall uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.got == nil {
		d.got = map[int]uint64{}
	}
	if _, dup := d.got[rank]; dup {
		panic(fmt.Sprintf("OnLeave called twice for rank %d", rank))
	}
	d.got[rank] = lastCall
}

func (d *departures) snapshot() map[int]uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.got)
}

// checkPeerLeft checks that err is a *PeerLeftError with the given fields
// and says so in words.
func checkPeerLeft(t *testing.T, what string, err error, want PeerLeftError) {
	t.Helper()
	var pl *PeerLeftError
	if !errors.As(err, &pl) || *pl != want {
		t.Errorf("%s: %v; want a *PeerLeftError %+v", what, err, want)
		return
	}
	words := fmt.Sprintf("rank %d closed its communicator after call #%d while rank %d was in call #%d", want.Rank, want.LastCall, want.Self, want.Call)
	if !strings.Contains(err.Error(), words) {
		t.Errorf("%s: %q does not say %q", what, err, words)
	}
}

// A rank that closes after call #3 while the others are in call #4 (here,
// blocked receiving from it) fails them at once with the cause, not, after
// a grace second, with a bare EOF; its own Close names them; the launcher
// learns who left after which call.
func TestLeaveEarlyFailsRanksInLaterCall(t *testing.T) {
	for _, c := range []struct {
		mode   string
		hostID func(int) string
	}{{DataPlaneAuto, nil}, {DataPlaneAuto, otherHosts}, {DataPlaneLibp2p, otherHosts}} {
		t.Run(fmt.Sprintf("%s/%s", c.mode, map[bool]string{true: "crosshost", false: "samehost"}[c.hostID != nil]), func(t *testing.T) {
			var left departures
			j := startJob(t, jobOpts{size: 3, mode: c.mode, hostID: c.hostID, timeout: time.Minute, onLeave: left.onLeave})
			for _, n := range j.nodes {
				n.SetProgress(3)
			}
			exchange(t, j.nodes, []int{1000}) // call #3
			start := time.Now()
			recvErrs := make([]error, 3)
			var wg sync.WaitGroup
			for _, r := range []int{0, 2} {
				j.nodes[r].SetProgress(4)
				wg.Add(1)
				go func() {
					defer wg.Done()
					// Call #4 waits for data rank 1 will never send.
					recvErrs[r] = j.nodes[r].Mesh().RecvFrom(context.Background(), 1, make([]byte, 100))
				}()
			}
			closeErr := j.nodes[1].Close()
			wg.Wait()
			el := time.Since(start)
			for _, r := range []int{0, 2} {
				want := PeerLeftError{Rank: 1, LastCall: 3, Self: r, Call: 4}
				checkPeerLeft(t, fmt.Sprintf("rank %d: RecvFrom", r), recvErrs[r], want)
				checkPeerLeft(t, fmt.Sprintf("rank %d: Err", r), j.nodes[r].Err(), want)
				t.Logf("rank %d: %v", r, recvErrs[r])
			}
			var early *EarlyCloseError
			if !errors.As(closeErr, &early) || early.Rank != 1 || early.LastCall != 3 || !maps.Equal(early.Behind, map[int]uint64{0: 4, 2: 4}) {
				t.Errorf("rank 1: Close: %v; want an *EarlyCloseError naming ranks 0 and 2 in call #4", closeErr)
			} else if want := "close: rank 0 and rank 2 were still in call #4 after this rank's last call #3"; !strings.Contains(closeErr.Error(), want) {
				t.Errorf("rank 1: Close: %q does not say %q", closeErr, want)
			}
			t.Logf("rank 1: Close: %v", closeErr)
			if got := left.snapshot(); !maps.Equal(got, map[int]uint64{1: 3}) {
				t.Errorf("OnLeave saw %v, want rank 1 after call 3", got)
			}
			// Far below the 1 m timeout: nobody waited for it.
			if el > 10*time.Second {
				t.Errorf("the departure took %v to surface", el)
			}
			t.Logf("surfaced after %v", el.Round(time.Millisecond))
		})
	}
}

// Ranks that closed after call #3 fail a rank that enters call #4 later, at
// once and before it sends anything, and both Closes name it.
func TestLeaveEarlyFailsRankEnteringLaterCall(t *testing.T) {
	var left departures
	j := startJob(t, jobOpts{size: 3, timeout: time.Minute, onLeave: left.onLeave})
	for _, n := range j.nodes {
		n.SetProgress(3)
	}
	closeErrs := make([]error, 3)
	var wg sync.WaitGroup
	for _, r := range []int{1, 2} {
		wg.Add(1)
		go func() { defer wg.Done(); closeErrs[r] = j.nodes[r].Close() }()
	}
	// Rank 0 is between calls while it hears of both departures...
	waitLog(t, j.log, "rank 0: rank 1 leaves the job after call #3")
	waitLog(t, j.log, "rank 0: rank 2 leaves the job after call #3")
	if err := j.nodes[0].Err(); err != nil {
		t.Fatalf("rank 0 failed between calls: %v", err)
	}
	// ... and then enters call #4.
	j.nodes[0].SetProgress(4)
	select {
	case <-j.nodes[0].Done():
	default:
		t.Fatal("rank 0 entered call #4 after every peer left and did not fail")
	}
	var pl *PeerLeftError
	if !errors.As(j.nodes[0].Err(), &pl) || pl.LastCall != 3 || pl.Call != 4 || pl.Self != 0 || (pl.Rank != 1 && pl.Rank != 2) {
		t.Errorf("rank 0: Err = %v, want a *PeerLeftError", j.nodes[0].Err())
	}
	t.Logf("rank 0: %v", j.nodes[0].Err())
	if err := j.nodes[0].Mesh().SendTo(context.Background(), 1, []byte("x")); !errors.As(err, &pl) {
		t.Errorf("rank 0: SendTo in call #4: %v", err)
	}
	wg.Wait()
	for _, r := range []int{1, 2} {
		var early *EarlyCloseError
		if !errors.As(closeErrs[r], &early) || !maps.Equal(early.Behind, map[int]uint64{0: 4}) ||
			!strings.Contains(closeErrs[r].Error(), "close: rank 0 was still in call #4 after this rank's last call #3") {
			t.Errorf("rank %d: Close: %v; want it to name rank 0 in call #4", r, closeErrs[r])
		}
	}
	if got := left.snapshot(); !maps.Equal(got, map[int]uint64{1: 3, 2: 3}) {
		t.Errorf("OnLeave saw %v", got)
	}
}

// When every rank closes after the same call nobody is behind: no errors,
// no failure, and Close is as quick as before.
func TestCleanCloseAfterSameCall(t *testing.T) {
	for _, c := range []struct {
		mode   string
		hostID func(int) string
	}{{DataPlaneAuto, nil}, {DataPlaneAuto, otherHosts}} {
		t.Run(map[bool]string{true: "crosshost", false: "samehost"}[c.hostID != nil], func(t *testing.T) {
			var left departures
			j := startJob(t, jobOpts{size: 4, mode: c.mode, hostID: c.hostID, timeout: time.Minute, onLeave: left.onLeave})
			for _, n := range j.nodes {
				n.SetProgress(7)
			}
			exchange(t, j.nodes, []int{1 << 20})
			start := time.Now()
			errs := make([]error, len(j.nodes))
			var wg sync.WaitGroup
			for r, n := range j.nodes {
				wg.Add(1)
				go func() { defer wg.Done(); errs[r] = n.Close() }()
			}
			wg.Wait()
			t.Logf("4 ranks closed in %v", time.Since(start).Round(time.Microsecond))
			for r, n := range j.nodes {
				if errs[r] != nil {
					t.Errorf("rank %d: Close: %v", r, errs[r])
				}
				if !errors.Is(n.Err(), ErrClosed) {
					t.Errorf("rank %d: Err after Close = %v", r, n.Err())
				}
			}
			if got := left.snapshot(); !maps.Equal(got, map[int]uint64{0: 7, 1: 7, 2: 7, 3: 7}) {
				t.Errorf("OnLeave saw %v", got)
			}
			if j.log.has("was still in call") || j.log.has("was in call") {
				t.Error("a rank was reported behind")
			}
		})
	}
}

func TestEarlyCloseErrorText(t *testing.T) {
	for _, c := range []struct {
		behind map[int]uint64
		want   string
	}{
		{map[int]uint64{2: 4}, "close: rank 2 was still in call #4 after this rank's last call #3"},
		{map[int]uint64{2: 4, 0: 4}, "close: rank 0 and rank 2 were still in call #4 after"},
		{map[int]uint64{3: 4, 0: 4, 2: 4}, "close: rank 0, rank 2 and rank 3 were still in call #4 after"},
		{map[int]uint64{2: 5, 0: 4}, "close: rank 0 (call #4) and rank 2 (call #5) were still in later calls after"},
	} {
		err := &EarlyCloseError{Rank: 1, LastCall: 3, Behind: c.behind}
		if !strings.HasPrefix(err.Error(), c.want) || !strings.HasSuffix(err.Error(), "; every rank must make the same collective calls before Close") {
			t.Errorf("%v: %q, want %q...", c.behind, err, c.want)
		}
	}
}
