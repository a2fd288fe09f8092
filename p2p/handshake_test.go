package p2p

import (
	"io"
	"net"
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
	if got := j.nodes[0].handshakeTimeout(); got != maxHandshake {
		t.Fatalf("handshake timeout %v with a 1m collective timeout, want %v", got, maxHandshake)
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
	if !j.log.has("i/o timeout") {
		t.Error("no refusal says the handshake timed out")
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
		if took[r] > maxHandshake/2 {
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
