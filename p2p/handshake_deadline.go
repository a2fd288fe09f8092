package p2p

// The deadlines of a data handshake, on the acceptor's side (the dialer's
// is its setup step's, Timeout).
//
// Until the dialer's hello proves the job key, an acceptor does not know
// who connected: anyone who can reach a data port can open a connection
// and say nothing, and must not hold a goroutine and a socket for long.
// So that part is bounded by the handshake idle time
// (GORUN_HANDSHAKE_TIMEOUT, 5 s, or Timeout if shorter). But a real dialer
// can be slow too while a job sets its links up: with hundreds of ranks on
// one host, every rank dials hundreds of links at once on a few cores, and
// a dialer's turn to answer comes after many others. A fixed bound cut
// such jobs off (128 ranks on 2 cores failed to start). So the idle time
// runs from the last data link of this rank that came up, dialed or
// accepted: while the setup makes progress here, a pending handshake
// waits; once no link has come up for the idle time, it ends, the dialer
// is told why, and both ends' messages say which deadline it was and how
// to raise it.
//
// Once the hello is proved, the dialer is a rank of the job, and the rest
// of the handshake (the answer, shared memory) is bounded as the dialer's
// side is: by Timeout, the bound of every setup step.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

const (
	// envHandshakeTimeout overrides defaultHandshakeIdle.
	envHandshakeTimeout = "GORUN_HANDSHAKE_TIMEOUT"
	// defaultHandshakeIdle: a dialer on a host with a core to spare
	// answers within milliseconds; seconds leave room for a loaded one.
	defaultHandshakeIdle = 5 * time.Second
)

// handshakeIdleTimeout reads GORUN_HANDSHAKE_TIMEOUT (a Go duration), or
// returns the default.
func handshakeIdleTimeout() (time.Duration, error) {
	s := os.Getenv(envHandshakeTimeout)
	if s == "" {
		return defaultHandshakeIdle, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s=%q: want how long a data handshake may wait without progress, e.g. 30s", envHandshakeTimeout, s)
	}
	return d, nil
}

// handshakeTimeout is the handshake idle time: GORUN_HANDSHAKE_TIMEOUT,
// or the collective timeout if that is shorter.
func (n *Node) handshakeTimeout() time.Duration { return min(n.data.handshakeIdle, n.cfg.Timeout) }

// linkUp records that a data link of this rank came up: progress, which
// keeps the handshakes still waiting for their dialer going.
func (n *Node) linkUp() { n.data.linksUp.Add(1) }

// idleWatch ends an acceptor's handshake once neither it nor any other
// data link of the rank has made progress for the idle time: it sets a
// past deadline on the connection (which wakes a blocked read or write)
// and cancels the handshake's context, if it has one.
type idleWatch struct {
	n      *Node
	cancel context.CancelCauseFunc // nil: nothing but rw to end
	idle   time.Duration

	mu sync.Mutex
	// rw is the stream the handshake runs on; tell says whether the
	// dialer can read a message on it (not before TLS is up).
	rw      deadliner
	tell    bool
	t       *time.Timer
	seen    int64 // n.data.linksUp when the idle time last started
	expired bool
	stopped bool
}

// watchIdle starts the idle time of a handshake on rw. tell says whether
// the dialer would read a message written on rw (use says when it can).
func (n *Node) watchIdle(rw deadliner, tell bool, cancel context.CancelCauseFunc) *idleWatch {
	w := &idleWatch{n: n, rw: rw, tell: tell, cancel: cancel, idle: n.handshakeTimeout(), seen: n.data.linksUp.Load()}
	rw.SetDeadline(time.Time{})
	w.mu.Lock()
	w.t = time.AfterFunc(w.idle, w.check)
	w.mu.Unlock()
	return w
}

// use moves the watch to the stream the handshake goes on with (the TLS
// connection over the socket it watched), on which the dialer can be told
// why it ended.
func (w *idleWatch) use(rw deadliner) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.rw, w.tell = rw, true
	if w.expired {
		rw.SetDeadline(time.Unix(1, 0))
	}
}

// check runs when the idle time is up: it starts it again if a link came
// up meanwhile, and ends the handshake otherwise.
func (w *idleWatch) check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	if up := w.n.data.linksUp.Load(); up != w.seen {
		w.seen = up
		w.t.Reset(w.idle)
		return
	}
	w.expired = true
	w.rw.SetDeadline(time.Unix(1, 0))
	if w.cancel != nil {
		w.cancel(w.err())
	}
}

// stop ends the watch (the dialer proved itself, or the handshake failed)
// and reports whether the idle time had passed.
func (w *idleWatch) stop() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	w.t.Stop()
	return w.expired
}

func (w *idleWatch) err() error { return &HandshakeDeadlineError{Idle: w.idle} }

// HandshakeDeadlineError says that an acceptor ended a data handshake at
// its deadline: no hello from the dialer while none of its links came up
// for Idle.
type HandshakeDeadlineError struct {
	Idle time.Duration
}

func (e *HandshakeDeadlineError) Error() string {
	return fmt.Sprintf("the data handshake deadline passed: no hello from the dialer while no data link of this rank came up for %v (raise it with %s, e.g. %s=%v)",
		e.Idle, envHandshakeTimeout, envHandshakeTimeout, 6*e.Idle)
}

// endedByIdle ends a failed handshake of the acceptor: if its idle time
// had passed, it returns that reason instead of the i/o error it caused,
// and tells the dialer so (best effort: it may be gone).
func (w *idleWatch) endedByIdle(err error) error {
	if !w.stop() {
		return err
	}
	reason := w.err()
	if w.tell {
		w.rw.SetWriteDeadline(time.Now().Add(time.Second))
		writeMsg(w.rw, &msg{T: tError, Text: reason.Error()})
	}
	return reason
}

// afterProof says, of an acceptor's handshake that failed after the
// dialer proved itself, whether the setup step's deadline ended it.
func (n *Node) afterProof(err error) error {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%w (the setup step's deadline, the collective timeout of %v, passed: raise it with gorun --timeout or GORUN_TIMEOUT)", err, n.cfg.Timeout)
}

// setupDeadline says which deadline ended a dialer's handshake whose ctx
// (its setup step) ended, and how to raise it.
func setupDeadline(ctx context.Context) error {
	cause := context.Cause(ctx)
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return cause
	}
	return fmt.Errorf("%w (the setup step's deadline, the collective timeout: raise it with gorun --timeout or GORUN_TIMEOUT)", cause)
}

// peerEnded reads, after an error on a dialer's handshake, whether the
// acceptor said why it ended the handshake (a tError it sent before
// closing, which may still be buffered even though writing failed); it
// returns that, or err.
func peerEnded(rw deadliner, to int, err error) error {
	rw.SetReadDeadline(time.Now().Add(time.Second))
	if m, rerr := readMsgMax(rw, maxSmallFrame); rerr == nil && m.T == tError {
		return fmt.Errorf("rank %d ended the handshake: %s", to, m.Text)
	}
	return err
}
