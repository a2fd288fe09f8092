package p2p

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
)

// waitLog waits (bounded) for a log line containing want.
func waitLog(t *testing.T, log *logRec, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !log.has(want) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !log.has(want) {
		t.Errorf("no log line %q", want)
	}
}

// TestTCPTLSRefusals: on a rank's tcp-tls port, a foreign libp2p identity is
// refused before it can even try the key; a rank of the job that claims
// another rank's number (with the key, but its own identity) is refused; a
// dialer that finds another identity than the table's at the address does
// not proceed. The job is unaffected.
func TestTCPTLSRefusals(t *testing.T) {
	j := startJob(t, jobOpts{size: 3, hostID: otherHosts})
	n1 := j.nodes[1]
	if n1.data.tlsPort == 0 {
		t.Fatal("rank 1 has no tcp-tls port in auto mode")
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(n1.data.tlsPort))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		return c
	}

	// 1. A stranger with its own identity and the right address, no key.
	sk, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := libp2ptls.New(libp2ptls.ID, sk, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := dial()
	// In TLS 1.3 the client's handshake ends before the server has checked
	// its certificate, so the refusal shows on the first read.
	if sc, err := stranger.SecureOutbound(ctx, c, n1.PeerID()); err == nil {
		if m, err := readMsg(sc); err == nil {
			t.Errorf("acceptor sent %q to a stranger", m.T)
		}
	}
	c.Close()
	strangerID, err := peer.IDFromPrivateKey(sk)
	if err != nil {
		t.Fatal(err)
	}
	waitLog(t, j.log, "refused tcp-tls data connection from 127.0.0.1:")
	waitLog(t, j.log, "peer "+strangerID.String()+" is not in the job table")

	// 2. Rank 2's identity, with the key, claiming to be rank 0.
	c = dial()
	sc, err := j.nodes[2].data.sec.SecureOutbound(ctx, c, n1.PeerID())
	if err != nil {
		t.Fatal(err)
	}
	ch, err := readMsg(sc)
	if err != nil || ch.T != tDChal {
		t.Fatalf("challenge: %v %v", ch, err)
	}
	nonce := make([]byte, nonceLen)
	writeMsg(sc, &msg{T: tDHello, Rank: 0, Link: 0, Nonce: nonce, Proof: dataProof(j.key, ch.Nonce, 0, 0, 0)})
	if m, err := readMsg(sc); err == nil {
		t.Errorf("acceptor answered an impostor with %q", m.T)
	}
	c.Close()
	waitLog(t, j.log, fmt.Sprintf("peer %s claims rank 0", j.nodes[2].PeerID()))

	// 3. Rank 0 dialing rank 1's port but expecting rank 2's identity.
	c = dial()
	if _, err := j.nodes[0].newTLSLink(ctx, c, j.nodes[2].PeerID()); err == nil || !strings.Contains(err.Error(), "peer id mismatch") {
		t.Errorf("TLS with the wrong identity at the address: %v", err)
	}

	// 4. The job is unaffected.
	meshExchange(t, j.nodes, []int{100, 1 << 20})
	for _, n := range j.nodes {
		if n.Err() != nil {
			t.Fatal(n.Err())
		}
	}
}

// TestMixedModes: the dialer picks a kind the peer listens for, and falls
// back to a libp2p stream when the peer advertises no TCP port for it.
func TestMixedModes(t *testing.T) {
	modes := []string{DataPlanePlaintext, DataPlaneAuto, DataPlaneTLS}
	j := startJob(t, jobOpts{size: 3, modeOf: func(r int) string { return modes[r] }, hostID: otherHosts})
	want := map[[2]int]string{
		{0, 1}: LinkLibp2pTLS, // rank 1 (auto) has no plaintext port
		{0, 2}: LinkLibp2pTLS, // nor rank 2 (tls)
		{1, 2}: LinkTCPTLS,
	}
	for r, n := range j.nodes {
		for p, ps := range n.Peers() {
			if p == r {
				continue
			}
			if w := want[[2]int{min(r, p), max(r, p)}]; ps.Link != w {
				t.Errorf("rank %d: link to rank %d is %q, want %q", r, p, ps.Link, w)
			}
		}
	}
	t.Logf("links: %s", linkKinds(j.nodes))
	meshExchange(t, j.nodes, []int{1, 1000, 200 << 10})
}

// TestCloseDrains: a rank that sends and closes at once does not lose the
// data in flight: the peer reads all of it and then EOF, on every kind of
// link, and both Closes end without waiting out the timeout. Rank 0's Close
// waits in drainLinks for rank 1's EOF until rank 1 closes, so the EOF rank
// 1 reads comes from the half-close (for tcp-tls: TLS close_notify), not
// from rank 0's sockets being closed. (Without the drain, libp2p-tls loses
// the tail: closing the connection resets the stream.)
func TestCloseDrains(t *testing.T) {
	cases := []struct {
		kind, mode string
		hostID     func(int) string
	}{
		{LinkShm, DataPlaneAuto, nil},
		{LinkUnix, DataPlaneAuto, nil},
		{LinkTCPTLS, DataPlaneAuto, otherHosts},
		{LinkTCPPlaintext, DataPlanePlaintext, otherHosts},
		{LinkLibp2pTLS, DataPlaneLibp2p, otherHosts},
	}
	for _, c := range cases {
		t.Run(c.kind, func(t *testing.T) {
			j := startJob(t, jobOpts{size: 2, mode: c.mode, hostID: c.hostID, timeout: 10 * time.Second, noShm: c.kind == LinkUnix})
			if k := j.nodes[0].Peers()[1].Link; k != c.kind {
				t.Fatalf("link is %s, want %s", k, c.kind)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			data := pattern(0, 1, 6<<20) // more than the socket buffers hold
			closed := make(chan error, 1)
			go func() {
				if err := j.nodes[0].Transport().SendNext(ctx, data[:100], data[100:]); err != nil {
					closed <- err
					return
				}
				closed <- j.nodes[0].Close()
			}()
			got := make([]byte, len(data))
			if err := j.nodes[1].Transport().RecvPrev(ctx, got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				t.Fatal("wrong data")
			}
			l := j.nodes[1].links.tr.from[0]
			l.rw.SetReadDeadline(time.Now().Add(10 * time.Second))
			if n, err := l.rw.Read(make([]byte, 1)); n != 0 || err != io.EOF {
				t.Errorf("after the data: read %d bytes, %v; want EOF", n, err)
			}
			start := time.Now()
			if err := j.nodes[1].Close(); err != nil {
				t.Error(err)
			}
			if err := <-closed; err != nil {
				t.Error(err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("closing took %v", d)
			}
			for _, bad := range []string{"did not finish", "closing link"} {
				if j.log.has(bad) {
					t.Errorf("log has %q", bad)
				}
			}
		})
	}
}

// TestWriteTLSRecords: writeTLS sends a message's bytes in order in as few
// TLS records as they fit in (every Write but the last is whole records).
func TestWriteTLSRecords(t *testing.T) {
	rng := mrand.New(mrand.NewPCG(1, 2))
	shapes := [][]int{{56, 256 << 10}, {56, 4 << 10}, {56}, {tlsRecord}, {56, 0, tlsRecord - 56},
		{100, 100, 40000, 10, 20000}, {tlsRecord + 1}, {1 << 20}, {}}
	for range 200 {
		s := make([]int, 1+rng.IntN(5))
		for i := range s {
			s[i] = rng.IntN(3 * tlsRecord)
			if rng.IntN(2) == 0 {
				s[i] = rng.IntN(100)
			}
		}
		shapes = append(shapes, s)
	}
	pool := make([]byte, 2<<20)
	mrand.NewChaCha8([32]byte{}).Read(pool)
	rc := &recConn{}
	l := &tlsConn{tc: rc}
	for _, shape := range shapes {
		rc.writes, rc.data = nil, bytes.Buffer{}
		var bufs [][]byte
		var all []byte
		for _, n := range shape {
			off := rng.IntN(len(pool) - n)
			b := pool[off : off+n]
			bufs = append(bufs, b)
			all = append(all, b...)
		}
		if err := l.writeTLS(bufs); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(rc.data.Bytes(), all) {
			t.Fatalf("shape %v: wrong bytes", shape)
		}
		records := 0
		for i, w := range rc.writes {
			records += (w + tlsRecord - 1) / tlsRecord
			if i < len(rc.writes)-1 && w%tlsRecord != 0 {
				t.Errorf("shape %v: write %d of %d bytes is not whole records", shape, i, w)
			}
		}
		if want := (len(all) + tlsRecord - 1) / tlsRecord; records != want {
			t.Errorf("shape %v: %d records (writes %v), want %d", shape, records, rc.writes, want)
		}
	}
}

// recConn records the Writes made to it.
type recConn struct {
	net.Conn
	writes []int
	data   bytes.Buffer
}

func (r *recConn) Write(p []byte) (int, error) {
	r.writes = append(r.writes, len(p))
	r.data.Write(p)
	return len(p), nil
}

// TestBatchConn: while batching, records reach the socket in writes of at
// most batchSize, in order; otherwise writes go straight through after what
// was gathered; a failed write is sticky.
func TestBatchConn(t *testing.T) {
	rc := &recConn{}
	b := &batchConn{Conn: rc}
	b.Write([]byte("hs")) // handshake: straight through
	b.batch()
	var want bytes.Buffer
	want.WriteString("hs")
	for i := range 40 {
		rec := bytes.Repeat([]byte{byte(i)}, tlsRecord+22)
		want.Write(rec)
		if _, err := b.Write(rec); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.flush(); err != nil {
		t.Fatal(err)
	}
	b.Write([]byte("alert"))
	want.WriteString("alert")
	if !bytes.Equal(rc.data.Bytes(), want.Bytes()) {
		t.Fatal("bytes differ")
	}
	if len(rc.writes) != 1+3+1 { // 40 records of 16406 bytes: 15 + 15 + 10 per write
		t.Errorf("writes %v", rc.writes)
	}
	for _, w := range rc.writes {
		if w > batchSize {
			t.Errorf("write of %d bytes > batchSize", w)
		}
	}
	fail := &batchConn{Conn: failConn{}}
	fail.batch()
	fail.Write([]byte("x"))
	if err := fail.flush(); err == nil {
		t.Fatal("flush to a failing socket succeeded")
	}
	if _, err := fail.Write([]byte("y")); err == nil {
		t.Error("write after a failed write succeeded")
	}
}

type failConn struct{ net.Conn }

func (failConn) Write([]byte) (int, error) { return 0, io.ErrClosedPipe }
