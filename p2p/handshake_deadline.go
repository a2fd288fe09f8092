package p2p

// The deadlines of a data handshake, on the acceptor's side (the dialer's
// is its setup step's, Timeout).
//
// Until the dialer's hello proves the job key, an acceptor does not know
// who connected: anyone who can reach a data port can open a connection
// and say nothing, and must not hold a goroutine and a socket for long.
// Once the rank has all its links, only such a stranger can still be in
// that part, and it gets the handshake idle time (GORUN_HANDSHAKE_TIMEOUT,
// 5 s, or Timeout if shorter). But while the rank still waits for links
// its peers dial, a silent connection may be one of them, and a real
// dialer can be slow: with hundreds of ranks on one host, every rank dials
// hundreds of links at once on a few cores, and a dialer's turn to answer
// comes after many others. A fixed 5 s cut such jobs off (128 ranks on 2
// cores failed to start), and so did 5 s counted from the last link of the
// acceptor that came up: an acceptor that had all but a few of its links
// saw no progress while their dialers, starved of CPU, worked through
// hundreds of others (256 ranks). So then the wait is bounded as the
// dialers' own setup step is: by Timeout. When a deadline ends a
// handshake, the dialer is told, and both ends' messages say which
// deadline it was and how to raise it.
//
// Once the hello is proved, the dialer is a rank of the job, and the rest
// of the handshake (the answer, shared memory) is bounded by Timeout too.

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

// awaitsDialers reports whether this rank still waits for links of its
// epoch that its peers dial.
func (n *Node) awaitsDialers() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.links.have) < len(n.links.expect)
}

// helloWatch ends an acceptor's handshake that waited for the dialer's
// hello too long (see the top of the file): it sets a past deadline on the
// connection (which wakes a blocked read or write) and cancels the
// handshake's context, if it has one.
type helloWatch struct {
	n      *Node
	cancel context.CancelCauseFunc // nil: nothing but rw to end
	idle   time.Duration
	start  time.Time

	mu sync.Mutex
	// rw is the stream the handshake runs on; tell says whether the
	// dialer can read a message on it (not before TLS is up).
	rw      deadliner
	tell    bool
	t       *time.Timer
	expired error // why it ended the handshake; nil while it has not
	stopped bool
}

// watchHello starts the wait for a hello on rw. tell says whether
// the dialer would read a message written on rw (use says when it can).
func (n *Node) watchHello(rw deadliner, tell bool, cancel context.CancelCauseFunc) *helloWatch {
	w := &helloWatch{n: n, rw: rw, tell: tell, cancel: cancel, idle: n.handshakeTimeout(), start: time.Now()}
	rw.SetDeadline(time.Time{})
	w.mu.Lock()
	w.t = time.AfterFunc(w.idle, w.check)
	w.mu.Unlock()
	return w
}

// use moves the watch to the stream the handshake goes on with (the TLS
// connection over the socket it watched), on which the dialer can be told
// why it ended.
func (w *helloWatch) use(rw deadliner) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.rw, w.tell = rw, true
	if w.expired != nil {
		rw.SetDeadline(time.Unix(1, 0))
	}
}

// check runs when the idle time is up: while the rank still waits for
// dialers, it waits on, up to Timeout; otherwise it ends the handshake.
func (w *helloWatch) check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	waited := time.Since(w.start)
	if !w.n.awaitsDialers() {
		w.expired = &HandshakeDeadlineError{Waited: waited, Idle: w.idle}
	} else if left := w.n.cfg.Timeout - waited; left > 0 {
		w.t.Reset(min(w.idle, left))
		return
	} else {
		w.expired = &HandshakeDeadlineError{Waited: waited, Setup: w.n.cfg.Timeout}
	}
	w.rw.SetDeadline(time.Unix(1, 0))
	if w.cancel != nil {
		w.cancel(w.expired)
	}
}

// stop ends the watch (the dialer proved itself, or the handshake failed)
// and returns why it ended the handshake, nil if it did not.
func (w *helloWatch) stop() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	w.t.Stop()
	return w.expired
}

// HandshakeDeadlineError says that an acceptor ended a data handshake at
// a deadline, without a hello from the dialer after Waited: the idle time
// Idle, once the rank expected no more links, or the setup step's bound
// Setup (Timeout) while it still did.
type HandshakeDeadlineError struct {
	Waited, Idle, Setup time.Duration
}

func (e *HandshakeDeadlineError) Error() string {
	if e.Setup > 0 {
		return fmt.Sprintf("the data handshake deadline passed: no hello from the dialer after %v, the setup step's bound, while this rank waited for its links (raise it with gorun --timeout or GORUN_TIMEOUT)",
			e.Setup)
	}
	return fmt.Sprintf("the data handshake deadline passed: no hello from the dialer after %v, and this rank expects no more links (raise the %v with %s, e.g. %s=%v)",
		e.Waited.Round(time.Millisecond), e.Idle, envHandshakeTimeout, envHandshakeTimeout, 6*e.Idle)
}

// endedByWatch ends a failed handshake of the acceptor: if its watch ended
// it, it returns why instead of the i/o error that caused, and tells the
// dialer so (best effort: it may be gone).
func (w *helloWatch) endedByWatch(err error) error {
	reason := w.stop()
	if reason == nil {
		return err
	}
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
