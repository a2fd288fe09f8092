package p2p

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"crypto/rand"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	ma "github.com/multiformats/go-multiaddr"
)

// logRec collects log lines from all goroutines (t.Logf may not be called
// after a test ends, and hosts log from background goroutines).
type logRec struct {
	mu    sync.Mutex
	lines []string
}

func (r *logRec) logf(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	r.mu.Lock()
	r.lines = append(r.lines, s)
	r.mu.Unlock()
	if testing.Verbose() && os.Getenv("P2P_LOG") != "" {
		fmt.Fprintln(os.Stderr, s)
	}
}

// waitFor reports whether every sub was logged within limit (it looks
// every few milliseconds).
func (r *logRec) waitFor(limit time.Duration, subs ...string) bool {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if !slices.ContainsFunc(subs, func(s string) bool { return !r.has(s) }) {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

func (r *logRec) has(sub string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.lines {
		if strings.Contains(l, sub) {
			return true
		}
	}
	return false
}

type jobOpts struct {
	size    int
	mode    string
	modeOf  func(rank int) string // overrides mode per rank
	hostID  func(rank int) string
	timeout time.Duration
	noShm   bool // Config.NoShm: ranks of one host use unix sockets
	log     *logRec
	onLeave func(rank int, lastCall uint64) // RendezvousConfig.OnLeave
}

type job struct {
	key   []byte
	rz    *Rendezvous
	nodes []*Node
	log   *logRec
}

func (j *job) close(t testing.TB) {
	var wg sync.WaitGroup
	for _, n := range j.nodes {
		if n == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.Close()
		}()
	}
	wg.Wait()
	if j.rz != nil {
		j.rz.Close()
	}
}

func baseConfig(j *job, o jobOpts, rank int) Config {
	c := Config{Rank: rank, Size: o.size, JobKey: j.key, Rendezvous: j.rz.Addr(),
		DataPlane: o.mode, Timeout: o.timeout, Logf: j.log.logf, NoShm: o.noShm}
	if o.hostID != nil {
		c.HostID = o.hostID(rank)
	}
	if o.modeOf != nil {
		c.DataPlane = o.modeOf(rank)
	}
	return c
}

// otherHosts gives every rank a host of its own.
func otherHosts(r int) string { return fmt.Sprintf("testhost-%d", r) }

// linkKinds describes which kind of link every rank uses to every other
// rank, for test logs: "0->1 tcp-tls, ...".
func linkKinds(nodes []*Node) string {
	var parts []string
	for r, n := range nodes {
		for p, ps := range n.Peers() {
			if p != r {
				parts = append(parts, fmt.Sprintf("%d->%d %s", r, p, ps.Link))
			}
		}
	}
	return strings.Join(parts, ", ")
}

// startJob runs a rendezvous and o.size ranks in this process.
func startJob(t testing.TB, o jobOpts) *job {
	t.Helper()
	if o.timeout == 0 {
		o.timeout = 10 * time.Second
	}
	if o.log == nil {
		o.log = &logRec{}
	}
	j := &job{key: NewJobKey(), log: o.log}
	err := j.launch(t, RendezvousConfig{Size: o.size, Timeout: o.timeout, OnLeave: o.onLeave},
		func(r int) Config { return baseConfig(j, o, r) })
	t.Cleanup(func() { j.close(t) })
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// launch starts the rendezvous rc (on loopback, with j's key and log) and
// rc.Size ranks, rank r joining with cfg(r), in this process. It returns
// the ranks' Join errors; the caller registers j's cleanup first.
func (j *job) launch(t testing.TB, rc RendezvousConfig, cfg func(rank int) Config) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rc.ListenAddr, rc.JobKey, rc.Logf = "127.0.0.1:0", j.key, j.log.logf
	rz, err := StartRendezvous(ctx, rc)
	if err != nil {
		t.Fatal(err)
	}
	j.rz = rz
	j.nodes = make([]*Node, rc.Size)
	errs := make([]error, rc.Size)
	var wg sync.WaitGroup
	for r := range rc.Size {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j.nodes[r], errs[r] = Join(ctx, cfg(r))
		}()
	}
	if err := rz.WaitRegistered(ctx); err != nil {
		t.Error(err)
	}
	wg.Wait()
	return errors.Join(errs...)
}

func pattern(rank, round, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rank*31 + round*7 + i*13)
	}
	return b
}

// exchange sends a pattern around the ring from every rank and checks what
// each rank receives from its predecessor.
func exchange(t testing.TB, nodes []*Node, sizes []int) {
	t.Helper()
	size := len(nodes)
	var wg sync.WaitGroup
	errs := make(chan error, 2*size)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for r, n := range nodes {
		tr := n.Transport()
		wg.Add(2)
		go func() {
			defer wg.Done()
			for round, sz := range sizes {
				// Split into three buffers (one empty) to exercise writev.
				p := pattern(r, round, sz)
				if err := tr.SendNext(ctx, p[:sz/3], nil, p[sz/3:]); err != nil {
					errs <- fmt.Errorf("rank %d send: %w", r, err)
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			prev := (r - 1 + size) % size
			for round, sz := range sizes {
				got := make([]byte, sz)
				if err := tr.RecvPrev(ctx, got); err != nil {
					errs <- fmt.Errorf("rank %d recv: %w", r, err)
					return
				}
				if !bytes.Equal(got, pattern(prev, round, sz)) {
					errs <- fmt.Errorf("rank %d round %d: wrong data from rank %d", r, round, prev)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestRing(t *testing.T) {
	cases := []struct {
		name   string
		mode   string
		hostID func(int) string
		kind   string
	}{
		{"auto", DataPlaneAuto, nil, LinkShm},
		{"auto-noshm", DataPlaneAuto, nil, LinkUnix},
		{"auto-crosshost", DataPlaneAuto, otherHosts, LinkTCPTLS},
		{"tls", DataPlaneTLS, nil, LinkTCPTLS},
		{"plaintext", DataPlanePlaintext, otherHosts, LinkTCPPlaintext},
		{"libp2p-crosshost", DataPlaneLibp2p, otherHosts, LinkLibp2pTLS},
		{"libp2p", DataPlaneLibp2p, nil, LinkShm},
	}
	for _, c := range cases {
		for size := 1; size <= 4; size++ {
			if (c.name == "auto-crosshost" || c.name == "libp2p-crosshost") && size != 3 ||
				(c.name == "libp2p" || c.name == "auto-noshm") && size != 2 {
				continue
			}
			t.Run(fmt.Sprintf("%s/N=%d", c.name, size), func(t *testing.T) {
				j := startJob(t, jobOpts{size: size, mode: c.mode, hostID: c.hostID, noShm: c.kind == LinkUnix})
				if size == 1 {
					if j.nodes[0].Transport() != nil {
						t.Fatal("size 1: want nil transport")
					}
					return
				}
				for r, n := range j.nodes {
					ps := n.Peers()
					if len(ps) != size {
						t.Fatalf("rank %d: %d peers", r, len(ps))
					}
					next := (r + 1) % size
					for p := range size {
						if want := map[bool]string{true: "", false: c.kind}[p == r]; ps[p].Link != want {
							t.Errorf("rank %d: link to rank %d is %q, want %q", r, p, ps[p].Link, want)
						}
					}
					if ps[next].ID != j.nodes[next].PeerID() {
						t.Errorf("rank %d: wrong peer ID for %d", r, next)
					}
				}
				t.Logf("links: %s", linkKinds(j.nodes))
				exchange(t, j.nodes, []int{1, 1000, 300 << 10, 7})
			})
		}
	}
}

// foreignHost is a libp2p host that is not part of the job.
func foreignHost(t *testing.T) host.Host {
	sk, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	h, err := newHost(sk, ma.StringCast("/ip4/127.0.0.1/tcp/0"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestForeignPeerRefused(t *testing.T) {
	rec := &logRec{}
	key := NewJobKey()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rz, err := StartRendezvous(ctx, RendezvousConfig{ListenAddr: "127.0.0.1:0", Size: 2, JobKey: key, Timeout: 10 * time.Second, Logf: rec.logf})
	if err != nil {
		t.Fatal(err)
	}
	j := &job{key: key, rz: rz, log: rec, nodes: make([]*Node, 2)}
	defer j.close(t)

	// 1. A stranger that knows the rendezvous address and peer ID but not
	// the key tries to register as rank 0 before the real rank 0.
	fh := foreignHost(t)
	defer fh.Close()
	rzAddrs, _ := resolveHostPort(ctx, rz.Addr())
	fh.Peerstore().AddAddrs(rz.PeerID(), rzAddrs, peerstore.PermanentAddrTTL)
	s, err := fh.NewStream(ctx, rz.PeerID(), rendezvousProto)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := readMsg(s)
	if err != nil || ch.T != tChallenge {
		t.Fatalf("challenge: %v %v", ch, err)
	}
	wrongKey := NewJobKey()
	nonce := make([]byte, nonceLen)
	writeMsg(s, &msg{T: tHello, Rank: 0, Nonce: nonce, Proof: registerProof(wrongKey, ch.Nonce, fh.ID().String(), 0)})
	s.SetReadDeadline(time.Now().Add(10 * time.Second))
	if m, err := readMsg(s); err == nil {
		t.Fatalf("rendezvous answered a bad proof with %q", m.T)
	}
	s.Reset()
	deadline := time.Now().Add(5 * time.Second)
	for !rec.has("bad job key") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !rec.has("bad job key") {
		t.Error(`rendezvous did not log "bad job key"`)
	}

	// 2. The real job starts fine.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j.nodes[r], errs[r] = Join(ctx, baseConfig(j, jobOpts{size: 2, timeout: 10 * time.Second}, r))
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}

	// 3. The stranger can not connect to a rank: the gater refuses its
	// peer ID after the TLS handshake.
	n1 := j.nodes[1]
	err = fh.Connect(ctx, peer.AddrInfo{ID: n1.PeerID(), Addrs: n1.Addrs()})
	if err == nil {
		// The dial may complete on our side before the remote gater closes
		// it; a stream must fail in any case.
		if _, err = fh.NewStream(ctx, n1.PeerID(), ringProto); err == nil {
			t.Fatal("foreign host opened a stream to a rank")
		}
	}
	deadline = time.Now().Add(5 * time.Second)
	for !rec.has("refused peer "+fh.ID().String()) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !rec.has("refused peer " + fh.ID().String()) {
		t.Error("rank host did not log refusing the foreign peer")
	}

	// 4. Nor over the unix data socket without the key.
	c, err := net.Dial("unix", n1.data.unixName)
	if err == nil {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if ch, err := readMsg(c); err == nil {
			writeMsg(c, &msg{T: tDHello, Rank: 0, Link: 0, Nonce: nonce, Proof: dataProof(wrongKey, ch.Nonce, 0, 0, 0)})
			if m, err := readMsg(c); err == nil {
				t.Fatalf("unix acceptor answered a bad proof with %q", m.T)
			}
		}
		c.Close()
	}

	// 5. The job is unaffected.
	exchange(t, j.nodes, []int{100, 1 << 20})
	for _, n := range j.nodes {
		if n.Err() != nil {
			t.Fatal(n.Err())
		}
	}
}

func waitDone(t *testing.T, n *Node, within time.Duration, want ...string) {
	t.Helper()
	select {
	case <-n.Done():
	case <-time.After(within):
		t.Fatalf("rank %d: Done not closed within %v", n.cfg.Rank, within)
	}
	for _, w := range want {
		if n.Err() == nil || !strings.Contains(n.Err().Error(), w) {
			t.Errorf("rank %d: Err() = %v, want it to contain %q", n.cfg.Rank, n.Err(), w)
		}
	}
}

func TestAbortPropagates(t *testing.T) {
	j := startJob(t, jobOpts{size: 3})
	// Rank 2 blocks receiving from rank 1; the abort must unblock it.
	recvErr := make(chan error, 1)
	go func() {
		buf := make([]byte, 10)
		recvErr <- j.nodes[2].Transport().RecvPrev(context.Background(), buf)
	}()
	time.Sleep(50 * time.Millisecond)
	j.nodes[1].Abort(errors.New("boom"))
	j.nodes[1].Abort(errors.New("second abort is ignored"))
	for _, n := range j.nodes {
		waitDone(t, n, 5*time.Second, "rank 1 aborted: boom")
	}
	select {
	case err := <-recvErr:
		if err == nil || !strings.Contains(err.Error(), "rank 1 aborted: boom") {
			t.Errorf("blocked RecvPrev returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("blocked RecvPrev not released by abort")
	}
	if err := j.nodes[0].Transport().SendNext(context.Background(), []byte("x")); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("SendNext after abort: %v", err)
	}
}

// TestCrashDetected: a killed rank (host and sockets closed, no leave) is
// announced to the others, and a receive blocked on it fails naming it.
func TestCrashDetected(t *testing.T) {
	for _, c := range []struct {
		kind   string
		hostID func(int) string
	}{{LinkShm, nil}, {LinkUnix, nil}, {LinkTCPTLS, otherHosts}} {
		t.Run(c.kind, func(t *testing.T) {
			j := startJob(t, jobOpts{size: 3, hostID: c.hostID, timeout: 4 * time.Second, noShm: c.kind == LinkUnix})
			if k := j.nodes[0].Peers()[2].Link; k != c.kind {
				t.Fatalf("link is %s, want %s", k, c.kind)
			}
			recvErr := make(chan error, 1)
			go func() {
				recvErr <- j.nodes[0].Mesh().RecvFrom(context.Background(), 2, make([]byte, 10))
			}()
			start := time.Now()
			j.nodes[2].crash()
			for _, n := range j.nodes[:2] {
				waitDone(t, n, 4*time.Second, "rank 2 (", "disconnected")
			}
			t.Logf("crash detected after %v: %v", time.Since(start), j.nodes[0].Err())
			select {
			case err := <-recvErr:
				if err == nil || !strings.Contains(err.Error(), "rank 2 (") {
					t.Errorf("blocked RecvFrom returned %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("blocked RecvFrom not released by the crash")
			}
		})
	}
}

// TestFrozenRankDetected: a rank that stops talking (like a SIGSTOPped
// process) is declared unresponsive within Timeout by heartbeat deadlines.
func TestFrozenRankDetected(t *testing.T) {
	j := startJob(t, jobOpts{size: 2, timeout: 2 * time.Second})
	// Freeze rank 1: its heartbeat and control reader stop.
	j.nodes[1].freeze()
	start := time.Now()
	waitDone(t, j.nodes[0], 4*time.Second, "rank 1 (", "stopped responding")
	t.Logf("frozen rank detected after %v", time.Since(start))
	j.nodes[1].unfreeze()
}

func TestOrderlyCloseIsNotACrash(t *testing.T) {
	j := startJob(t, jobOpts{size: 3, timeout: 3 * time.Second})
	if err := j.nodes[2].Close(); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(j.nodes[2].Err(), ErrClosed) {
		t.Errorf("closed node Err = %v", j.nodes[2].Err())
	}
	select {
	case <-j.nodes[0].Done():
		t.Fatalf("rank 0 aborted after rank 2 left: %v", j.nodes[0].Err())
	case <-time.After(500 * time.Millisecond):
	}
}

func TestRegistrationTimeout(t *testing.T) {
	rec := &logRec{}
	key := NewJobKey()
	rz, err := StartRendezvous(context.Background(), RendezvousConfig{ListenAddr: "127.0.0.1:0", Size: 3, JobKey: key, Logf: rec.logf})
	if err != nil {
		t.Fatal(err)
	}
	defer rz.Close()
	// The registration is given up (ctx cancelled) once ranks 0 and 1 both
	// know that only rank 2 is missing, however long registering takes on
	// a loaded machine; the 2-minute bound only keeps a broken test from
	// hanging.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var cancelled time.Time
	go func() {
		if rec.waitFor(time.Minute, "rank 0: waiting for ranks [2] to register", "rank 1: waiting for ranks [2] to register") {
			cancelled = time.Now()
			cancel()
		}
	}()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := Join(ctx, Config{Rank: r, Size: 3, JobKey: key, Rendezvous: rz.Addr(), Logf: rec.logf})
			if n != nil {
				n.Close()
			}
			errs[r] = err
		}()
	}
	// Both ranks give up when WaitRegistered does, so their departures may
	// reach the rendezvous before its error is built ("missing ranks
	// [0 2]"), and one rank's may reach the other's last view of the
	// registration ("missing ranks [1 2]"); rank 2 must be named either way.
	err = rz.WaitRegistered(ctx)
	if err == nil || !regexp.MustCompile(`missing ranks \[(0 )?(1 )?2\]`).MatchString(err.Error()) {
		t.Errorf("WaitRegistered: %v", err)
	}
	wg.Wait()
	missing := regexp.MustCompile(`missing ranks \[([01] )?2\]`)
	for r, err := range errs {
		if err == nil || !missing.MatchString(err.Error()) {
			t.Errorf("rank %d Join: %v", r, err)
		}
	}
	if d := time.Since(cancelled); d > 10*time.Second {
		t.Errorf("Join took %v after its context ended", d)
	}
	t.Log(errs[0])
}

func TestRegistrationErrors(t *testing.T) {
	key := NewJobKey()
	rz, err := StartRendezvous(context.Background(), RendezvousConfig{ListenAddr: "127.0.0.1:0", Size: 2, JobKey: key})
	if err != nil {
		t.Fatal(err)
	}
	defer rz.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := func(r, size int) Config {
		return Config{Rank: r, Size: size, JobKey: key, Rendezvous: rz.Addr(), Timeout: 10 * time.Second}
	}
	type res struct {
		n   *Node
		err error
	}
	first := make(chan res, 1)
	go func() {
		n, err := Join(ctx, cfg(0, 2))
		first <- res{n, err}
	}()
	for !func() bool { rz.mu.Lock(); defer rz.mu.Unlock(); return rz.m.Registered() == 1 }() {
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := Join(ctx, cfg(0, 2)); err == nil || !strings.Contains(err.Error(), "already registered") {
		t.Errorf("duplicate rank: %v", err)
	}
	// Out of range for the rendezvous (the client believes size 5).
	if _, err := Join(ctx, cfg(4, 5)); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Errorf("rank out of range: %v", err)
	}
	// Wrong key: the rendezvous' peer ID does not match, TLS fails.
	bad := cfg(1, 2)
	bad.JobKey = NewJobKey()
	bad.Timeout = 2 * time.Second
	if _, err := Join(ctx, bad); err == nil {
		t.Error("join with wrong key succeeded")
	}
	n1, err := Join(ctx, cfg(1, 2))
	if err != nil {
		t.Fatal(err)
	}
	r0 := <-first
	if r0.err != nil {
		t.Fatal(r0.err)
	}
	exchange(t, []*Node{r0.n, n1}, []int{10})
	(&job{nodes: []*Node{r0.n, n1}}).close(t)
}

func TestContextCancel(t *testing.T) {
	for _, c := range []struct {
		kind, mode string
		hostID     func(int) string
	}{
		{LinkShm, DataPlaneAuto, nil},
		{LinkUnix, DataPlaneAuto, nil},
		{LinkTCPTLS, DataPlaneTLS, nil},
		{LinkLibp2pTLS, DataPlaneLibp2p, otherHosts},
	} {
		t.Run(c.kind, func(t *testing.T) {
			j := startJob(t, jobOpts{size: 2, mode: c.mode, hostID: c.hostID, noShm: c.kind == LinkUnix})
			if k := j.nodes[0].Peers()[1].Link; k != c.kind {
				t.Fatalf("link is %s, want %s", k, c.kind)
			}
			tr := j.nodes[0].Transport()
			cause := errors.New("my cause")
			ctx, cancel := context.WithCancelCause(context.Background())
			time.AfterFunc(50*time.Millisecond, func() { cancel(cause) })
			if err := tr.RecvPrev(ctx, make([]byte, 8)); err != cause {
				t.Errorf("RecvPrev: %v, want cause", err)
			}
			dctx, dcancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer dcancel()
			if err := tr.RecvPrev(dctx, make([]byte, 8)); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("RecvPrev with deadline: %v", err)
			}
			// Sending until the socket buffers fill, then cancel.
			ctx2, cancel2 := context.WithCancelCause(context.Background())
			time.AfterFunc(200*time.Millisecond, func() { cancel2(cause) })
			big := make([]byte, 1<<20)
			var err error
			for err == nil {
				err = tr.SendNext(ctx2, big)
			}
			if err != cause {
				t.Errorf("SendNext: %v, want cause", err)
			}
			// The link stays usable after a cancelled receive with no data
			// lost... (not after a partial send: the ring aborts then).
			if j.nodes[0].Err() != nil {
				t.Error(j.nodes[0].Err())
			}
		})
	}
}

func TestPeerClosedError(t *testing.T) {
	for _, c := range []struct {
		kind   string
		hostID func(int) string
	}{{LinkShm, nil}, {LinkUnix, nil}, {LinkTCPTLS, otherHosts}} {
		t.Run(c.kind, func(t *testing.T) {
			j := startJob(t, jobOpts{size: 2, hostID: c.hostID, noShm: c.kind == LinkUnix})
			want := "recv from rank 0 (@gorun-"
			if c.kind == LinkTCPTLS {
				want = fmt.Sprintf("recv from rank 0 (127.0.0.1:%d): EOF", j.nodes[0].data.tlsPort)
			}
			// Close rank 0's links behind its back: rank 1's receive names rank 0.
			for _, l := range j.nodes[0].links.all {
				l.close()
			}
			err := j.nodes[1].Transport().RecvPrev(context.Background(), make([]byte, 4))
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("RecvPrev: %v, want %q", err, want)
			}
		})
	}
}

func TestRendezvousPeerIDDeterministic(t *testing.T) {
	k := NewJobKey()
	a, _ := RendezvousPeerID(k)
	b, _ := RendezvousPeerID(append([]byte(nil), k...))
	c, _ := RendezvousPeerID(NewJobKey())
	if a != b || a == c || a == "" {
		t.Fatalf("ids %s %s %s", a, b, c)
	}
}

// leakSlack tolerates process-wide goroutines that libp2p starts once.
const leakSlack = 5

func TestMain(m *testing.M) {
	before := runtime.NumGoroutine()
	code := m.Run()
	if code == 0 {
		// Every host, listener and goroutine must be gone.
		deadline := time.Now().Add(10 * time.Second)
		for runtime.NumGoroutine() > before+leakSlack && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if g := runtime.NumGoroutine(); g > before+leakSlack {
			buf := make([]byte, 1<<20)
			fmt.Fprintf(os.Stderr, "goroutine leak: %d before, %d after\n%s\n", before, g, buf[:runtime.Stack(buf, true)])
			code = 1
		}
	}
	os.Exit(code)
}

// TestRendezvousByName: "host:port" with a DNS name is resolved; the
// rendezvous can be reached knowing only the key and the address.
func TestRendezvousByName(t *testing.T) {
	key := NewJobKey()
	rz, err := StartRendezvous(context.Background(), RendezvousConfig{ListenAddr: "127.0.0.1:0", Size: 1, JobKey: key})
	if err != nil {
		t.Fatal(err)
	}
	defer rz.Close()
	_, port, _ := net.SplitHostPort(rz.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := Join(ctx, Config{Rank: 0, Size: 1, JobKey: key, Rendezvous: "localhost:" + port, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if n.Transport() != nil || len(n.Peers()) != 1 || n.HostID() == "" {
		t.Errorf("size-1 node: %v %v %q", n.Transport(), n.Peers(), n.HostID())
	}
	if err := n.Close(); err != nil {
		t.Error(err)
	}
	select {
	case <-n.Done():
	default:
		t.Error("Done not closed after Close")
	}
	if !errors.Is(n.Err(), ErrClosed) {
		t.Errorf("Err after Close = %v", n.Err())
	}
}

// TestRanksStartBeforeRendezvous: Join keeps retrying the rendezvous until
// it comes up (rank 0 hosting it may start last).
func TestRanksStartBeforeRendezvous(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	key := NewJobKey()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	j := &job{key: key, nodes: make([]*Node, 2)}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j.nodes[r], errs[r] = Join(ctx, Config{Rank: r, Size: 2, JobKey: key, Rendezvous: addr, Timeout: 10 * time.Second})
		}()
	}
	time.Sleep(400 * time.Millisecond)
	j.rz, err = StartRendezvous(ctx, RendezvousConfig{ListenAddr: addr, Size: 2, JobKey: key})
	if err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	defer j.close(t)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	exchange(t, j.nodes, []int{4096})
}

// TestAbortDeliveredWaitsForRead: AbortDelivered (what a rank hosting the
// rendezvous waits for before it exits) closes once every rank has read
// the abort, not once it was sent: a frozen rank holds it until it thaws
// and acknowledges. Sending alone let a survivor lose the cause when the
// host's exit reset the connection before it read it.
func TestAbortDeliveredWaitsForRead(t *testing.T) {
	j := startJob(t, jobOpts{size: 3, timeout: 20 * time.Second})
	j.nodes[2].freeze()
	j.nodes[1].Abort(errors.New("boom"))
	for _, n := range j.nodes[:2] {
		waitDone(t, n, 5*time.Second, "rank 1 aborted: boom")
	}
	select {
	case <-j.rz.AbortDelivered():
		t.Fatal("AbortDelivered closed while rank 2 was frozen and had not read the abort")
	default:
	}
	j.nodes[2].unfreeze()
	waitDone(t, j.nodes[2], 5*time.Second, "rank 1 aborted: boom")
	select {
	case <-j.rz.AbortDelivered():
	case <-time.After(5 * time.Second):
		t.Fatal("AbortDelivered not closed after every rank read the abort")
	}
}
