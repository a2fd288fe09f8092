package p2p

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// mixedModes gives a job of three ranks every kind of data listener: rank 0
// (plaintext) a unix socket and a tcp-plaintext port, rank 1 (auto) a unix
// socket and a tcp-tls port, rank 2 (tls) a tcp-tls port.
var mixedModes = []string{DataPlanePlaintext, DataPlaneAuto, DataPlaneTLS}

// stranger is a connection to a rank's data listener that never says a word.
type stranger struct {
	rank int
	kind string
	c    net.Conn
}

// dialSilently connects to every data listener of every rank and sends
// nothing, as anyone who can reach the ports could.
func dialSilently(t *testing.T, nodes []*Node) []stranger {
	t.Helper()
	var out []stranger
	for r, n := range nodes {
		addrs := map[string][2]string{}
		if n.data.unixLn != nil {
			addrs[LinkUnix] = [2]string{"unix", n.data.unixName}
		}
		if n.data.tcpLn != nil {
			addrs[LinkTCPPlaintext] = [2]string{"tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(n.data.tcpPort))}
		}
		if n.data.tlsLn != nil {
			addrs[LinkTCPTLS] = [2]string{"tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(n.data.tlsPort))}
		}
		for kind, a := range addrs {
			c, err := net.Dial(a[0], a[1])
			if err != nil {
				t.Fatalf("dial rank %d's %s listener: %v", r, kind, err)
			}
			t.Cleanup(func() { c.Close() })
			out = append(out, stranger{r, kind, c})
		}
	}
	kinds := map[string]bool{}
	for _, s := range out {
		kinds[s.kind] = true
	}
	if len(kinds) != 3 {
		t.Fatalf("silent dials cover %v, want unix, tcp-plaintext and tcp-tls", kinds)
	}
	return out
}

// TestSilentDialerCutAtHandshakeDeadline: a connection to a data port that
// never completes its handshake is dropped at the short handshake deadline,
// not at the collective timeout (60 s here), and the job's real links work
// while it hangs.
func TestSilentDialerCutAtHandshakeDeadline(t *testing.T) {
	j := startJob(t, jobOpts{size: 3, modeOf: func(r int) string { return mixedModes[r] }, hostID: otherHosts, timeout: time.Minute})
	if got := j.nodes[0].handshakeTimeout(); got != defaultHandshakeIdle {
		t.Fatalf("handshake timeout %v with a 1m collective timeout, want %v", got, defaultHandshakeIdle)
	}
	start := time.Now()
	strangers := dialSilently(t, j.nodes)
	meshExchange(t, j.nodes, []int{100, 1 << 20})

	var wg sync.WaitGroup
	for _, s := range strangers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Far beyond the handshake deadline, far below the timeout.
			s.c.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, err := io.Copy(io.Discard, s.c) // a unix or plaintext acceptor sends its challenge first
			if el := time.Since(start); err != nil {
				t.Errorf("rank %d's %s acceptor did not drop a silent dialer after %v: %v", s.rank, s.kind, el.Round(time.Millisecond), err)
			} else {
				t.Logf("rank %d's %s acceptor dropped the silent dialer after %v", s.rank, s.kind, el.Round(time.Millisecond))
			}
		}()
	}
	wg.Wait()
	for _, kind := range []string{LinkUnix, LinkTCPPlaintext, LinkTCPTLS} {
		waitLog(t, j.log, "refused "+kind+" data connection from")
	}
	if !j.log.has("data handshake deadline passed") || !j.log.has(envHandshakeTimeout) {
		t.Error("no refusal says the handshake deadline passed and how to raise it")
	}
	for _, n := range j.nodes {
		if n.Err() != nil {
			t.Fatal(n.Err())
		}
	}
}

// TestCloseNotDelayedBySilentDialer: connections still in their handshake
// are closed by Close at once: a stranger connected to every data listener
// of every rank delays no rank's Close, which returns far below both the
// collective timeout (60 s) and the handshake deadline, leaving no handshake
// goroutine behind.
func TestCloseNotDelayedBySilentDialer(t *testing.T) {
	j := startJob(t, jobOpts{size: 3, modeOf: func(r int) string { return mixedModes[r] }, hostID: otherHosts, timeout: time.Minute})
	strangers := dialSilently(t, j.nodes)
	// Every stranger is in its handshake: each has been accepted (a unix or
	// plaintext acceptor has sent its challenge; a TLS one waits for the
	// ClientHello), so Close finds them in the middle of it.
	for _, s := range strangers {
		if s.kind == LinkTCPTLS {
			continue
		}
		s.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if m, err := readMsg(s.c); err != nil || m.T != tDChal {
			t.Fatalf("rank %d's %s acceptor: %v %v", s.rank, s.kind, m, err)
		}
	}
	meshExchange(t, j.nodes, []int{100})

	start := time.Now()
	errs := make([]error, len(j.nodes))
	took := make([]time.Duration, len(j.nodes))
	var wg sync.WaitGroup
	for r, n := range j.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = n.Close()
			took[r] = time.Since(start)
		}()
	}
	wg.Wait()
	for r := range j.nodes {
		if errs[r] != nil {
			t.Errorf("rank %d: Close: %v", r, errs[r])
		}
		// Well below the handshake deadline, so not by waiting it out.
		if took[r] > defaultHandshakeIdle/2 {
			t.Errorf("rank %d: Close took %v with strangers in the handshake", r, took[r].Round(time.Millisecond))
		}
	}
	t.Logf("Close took %v", took)
	buf := make([]byte, 1<<20)
	if stacks := string(buf[:runtime.Stack(buf, true)]); strings.Contains(stacks, "p2p.(*Node).accept(") {
		t.Errorf("a data handshake goroutine outlived Close:\n%s", stacks)
	}
	for _, s := range strangers {
		s.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.Copy(io.Discard, s.c); err != nil {
			t.Errorf("rank %d's %s acceptor did not close the stranger's connection: %v", s.rank, s.kind, err)
		}
	}
}

// expectDialer makes every node wait for one more link that a peer would
// dial, as while a job's links are being set up.
func expectDialer(nodes []*Node, on bool) {
	const never = -1 // no link has this key
	for _, n := range nodes {
		n.mu.Lock()
		if on {
			n.links.expect[never] = true
		} else {
			delete(n.links.expect, never)
		}
		n.mu.Unlock()
	}
}

// readChallenges reads every stranger's challenge (not over TLS, whose
// acceptor waits for the ClientHello).
func readChallenges(t *testing.T, strangers []stranger) {
	t.Helper()
	for _, s := range strangers {
		if s.kind == LinkTCPTLS {
			continue
		}
		s.c.SetReadDeadline(time.Now().Add(30 * time.Second))
		if m, err := readMsg(s.c); err != nil || m.T != tDChal {
			t.Fatalf("rank %d's %s acceptor: %v, %v; want its challenge", s.rank, s.kind, m, err)
		}
	}
}

// silentUntilDropped reads what each stranger's acceptor sends after the
// challenge until it closes the connection (within limit): if it says why
// it ends the handshake, that. It returns, per stranger, what it said and
// when the connection closed.
func silentUntilDropped(t *testing.T, strangers []stranger, limit time.Duration) (told []*msg, closed []time.Time) {
	t.Helper()
	told, closed = make([]*msg, len(strangers)), make([]time.Time, len(strangers))
	var wg sync.WaitGroup
	for i, s := range strangers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.c.SetReadDeadline(time.Now().Add(limit))
			if s.kind != LinkTCPTLS {
				if m, err := readMsg(s.c); err == nil {
					told[i] = m
				}
			}
			if _, err := io.Copy(io.Discard, s.c); err != nil {
				t.Errorf("rank %d's %s acceptor did not close a silent connection: %v", s.rank, s.kind, err)
			}
			closed[i] = time.Now()
		}()
	}
	wg.Wait()
	return told, closed
}

// TestHandshakeWaitsWhileDialersAreExpected: while a rank still waits for
// links its peers dial, an accepted connection that has not said its
// hello is kept beyond the idle time (a real dialer may be starved of
// CPU), up to the setup step's bound, Timeout; the dialer is then told
// that deadline and how to raise it.
func TestHandshakeWaitsWhileDialersAreExpected(t *testing.T) {
	const idle, timeout = time.Second, 6 * time.Second
	t.Setenv(envHandshakeTimeout, idle.String())
	j := startJob(t, jobOpts{size: 3, modeOf: func(r int) string { return mixedModes[r] }, hostID: otherHosts, timeout: timeout})
	expectDialer(j.nodes, true)
	start := time.Now()
	strangers := dialSilently(t, j.nodes)
	readChallenges(t, strangers)
	told, closed := silentUntilDropped(t, strangers, 30*time.Second)
	for i, s := range strangers {
		if took := closed[i].Sub(start); took < timeout-time.Second {
			t.Errorf("rank %d's %s acceptor dropped a silent connection after %v while it waited for a dialer, before Timeout %v", s.rank, s.kind, took, timeout)
		}
		if m := told[i]; s.kind != LinkTCPTLS && (m == nil || m.T != tError || !strings.Contains(m.Text, "setup step") || !strings.Contains(m.Text, "GORUN_TIMEOUT")) {
			t.Errorf("rank %d's %s acceptor said %+v, want the setup step's deadline and GORUN_TIMEOUT", s.rank, s.kind, m)
		}
	}
}

// TestHandshakeIdleOnceNoDialerIsExpected: once a rank has all its links,
// a silent connection is dropped at the idle time, and told it was that
// deadline and how to raise it.
func TestHandshakeIdleOnceNoDialerIsExpected(t *testing.T) {
	const idle = time.Second
	t.Setenv(envHandshakeTimeout, idle.String())
	j := startJob(t, jobOpts{size: 3, modeOf: func(r int) string { return mixedModes[r] }, hostID: otherHosts, timeout: time.Minute})
	if got := j.nodes[0].handshakeTimeout(); got != idle {
		t.Fatalf("handshake timeout %v with %s=%v", got, envHandshakeTimeout, idle)
	}
	// While a dialer is expected, the strangers stay beyond the idle time:
	// nothing comes for three of them, not even the end of the stream.
	expectDialer(j.nodes, true)
	strangers := dialSilently(t, j.nodes)
	readChallenges(t, strangers)
	for _, s := range strangers {
		s.c.SetReadDeadline(time.Now().Add(3 * idle))
	}
	for _, s := range strangers {
		var b [1]byte
		if _, err := s.c.Read(b[:]); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("rank %d's %s acceptor, waiting for a dialer: read %v, want nothing until the reader's deadline", s.rank, s.kind, err)
		}
	}
	expectDialer(j.nodes, false)
	none := time.Now()
	told, closed := silentUntilDropped(t, strangers, 30*time.Second)
	for i, s := range strangers {
		if took := closed[i].Sub(none); took > 10*idle {
			t.Errorf("rank %d's %s acceptor kept a silent connection %v after it expected no dialer (idle time %v)", s.rank, s.kind, took, idle)
		}
		if m := told[i]; s.kind != LinkTCPTLS && (m == nil || m.T != tError || !strings.Contains(m.Text, "expects no more links") || !strings.Contains(m.Text, envHandshakeTimeout)) {
			t.Errorf("rank %d's %s acceptor said %+v, want the idle deadline and %s", s.rank, s.kind, m, envHandshakeTimeout)
		}
	}
	for _, n := range j.nodes {
		if n.Err() != nil {
			t.Fatal(n.Err())
		}
	}
}

// TestDialerHearsWhyHandshakeEnded: a dialer whose hello the acceptor
// would not wait for any more learns why from the acceptor's last message,
// even when its own write failed because the acceptor closed.
func TestDialerHearsWhyHandshakeEnded(t *testing.T) {
	ln, err := net.Listen("unix", "@gorun-test-"+strconv.Itoa(int(time.Now().UnixNano())))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	reason := (&HandshakeDeadlineError{Idle: 5 * time.Second}).Error()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		writeMsg(c, &msg{T: tError, Text: reason})
		c.Close()
	}()
	c, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := peerEnded(c, 7, io.ErrClosedPipe)
	if !strings.Contains(got.Error(), "rank 7 ended the handshake: "+reason) {
		t.Fatalf("got %v", got)
	}
}
