package p2p

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

func meshPattern(from, to, round, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(from*31 + to*17 + round*7 + i*13)
	}
	return b
}

// meshExchange: every rank sends a distinct pattern to every other rank and
// receives from every other rank, all concurrently (a goroutine per peer and
// direction), and checks what it got from each.
func meshExchange(t testing.TB, nodes []*Node, sizes []int) {
	t.Helper()
	size := len(nodes)
	var wg sync.WaitGroup
	errs := make(chan error, 2*size*size)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for r, n := range nodes {
		m := n.Mesh()
		for p := range size {
			if p == r {
				continue
			}
			wg.Add(2)
			go func() {
				defer wg.Done()
				for round, sz := range sizes {
					b := meshPattern(r, p, round, sz)
					if err := m.SendTo(ctx, p, b[:sz/2], nil, b[sz/2:]); err != nil {
						errs <- fmt.Errorf("rank %d send to %d: %w", r, p, err)
						return
					}
				}
			}()
			go func() {
				defer wg.Done()
				for round, sz := range sizes {
					got := make([]byte, sz)
					if err := m.RecvFrom(ctx, p, got); err != nil {
						errs <- fmt.Errorf("rank %d recv from %d: %w", r, p, err)
						return
					}
					if !bytes.Equal(got, meshPattern(p, r, round, sz)) {
						errs <- fmt.Errorf("rank %d round %d: wrong data from rank %d", r, round, p)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestMesh(t *testing.T) {
	cases := []struct {
		mode   string
		hostID func(int) string
		kind   string
		sizes  []int
	}{
		{DataPlaneAuto, nil, LinkShm, []int{2, 3, 4}},
		{DataPlaneAuto, nil, LinkUnix, []int{3}},
		{DataPlaneAuto, otherHosts, LinkTCPTLS, []int{2, 4}},
		{DataPlaneTLS, nil, LinkTCPTLS, []int{3}},
		{DataPlanePlaintext, otherHosts, LinkTCPPlaintext, []int{3}},
		{DataPlaneLibp2p, otherHosts, LinkLibp2pTLS, []int{3}},
	}
	for _, c := range cases {
		for _, size := range c.sizes {
			t.Run(fmt.Sprintf("%s/%s/N=%d", c.mode, c.kind, size), func(t *testing.T) {
				j := startJob(t, jobOpts{size: size, mode: c.mode, hostID: c.hostID, noShm: c.kind == LinkUnix})
				for r, n := range j.nodes {
					if n.Mesh() == nil || n.Transport() == nil {
						t.Fatalf("rank %d: nil mesh/transport", r)
					}
					if n.Mesh() != n.Transport() {
						t.Errorf("rank %d: Mesh and Transport differ", r)
					}
					for p, ps := range n.Peers() {
						if p != r && ps.Link != c.kind {
							t.Errorf("rank %d: link to rank %d is %q, want %q", r, p, ps.Link, c.kind)
						}
					}
					if err := n.Mesh().SendTo(context.Background(), r, []byte("x")); err == nil {
						t.Errorf("rank %d: SendTo self succeeded", r)
					}
					if err := n.Mesh().RecvFrom(context.Background(), size, make([]byte, 1)); err == nil {
						t.Errorf("rank %d: RecvFrom out of range succeeded", r)
					}
				}
				t.Logf("links: %s", linkKinds(j.nodes))
				meshExchange(t, j.nodes, []int{1, 1000, 200 << 10, 7})
				// SendNext / RecvPrev are the streams to next / from prev.
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				var wg sync.WaitGroup
				for r, n := range j.nodes {
					next, prev := (r+1)%size, (r-1+size)%size
					wg.Add(2)
					go func() {
						defer wg.Done()
						if err := n.Transport().SendNext(ctx, meshPattern(r, next, 9, 64)); err != nil {
							t.Error(err)
						}
						if err := n.Mesh().SendTo(ctx, next, meshPattern(r, next, 10, 64)); err != nil {
							t.Error(err)
						}
					}()
					go func() {
						defer wg.Done()
						for round := 9; round <= 10; round++ {
							got := make([]byte, 64)
							var err error
							if round == 9 {
								err = n.Mesh().RecvFrom(ctx, prev, got)
							} else {
								err = n.Transport().RecvPrev(ctx, got)
							}
							if err != nil {
								t.Error(err)
							} else if !bytes.Equal(got, meshPattern(prev, r, round, 64)) {
								t.Errorf("rank %d round %d: wrong data from rank %d", r, round, prev)
							}
						}
					}()
				}
				wg.Wait()
			})
		}
	}
}

func TestMeshSize1(t *testing.T) {
	j := startJob(t, jobOpts{size: 1})
	if j.nodes[0].Mesh() != nil || j.nodes[0].Transport() != nil {
		t.Fatal("size 1: want nil mesh and transport")
	}
}

// TestMeshAbort: an abort on one rank releases a blocked RecvFrom between
// two other, non-adjacent ranks, and a blocked SendTo, with the abort cause.
func TestMeshAbort(t *testing.T) {
	j := startJob(t, jobOpts{size: 4})
	recvErr := make(chan error, 1)
	go func() {
		recvErr <- j.nodes[2].Mesh().RecvFrom(context.Background(), 0, make([]byte, 10))
	}()
	sendErr := make(chan error, 1)
	go func() { // fills the socket buffers to rank 1, which never reads
		big := make([]byte, 1<<20)
		var err error
		for err == nil {
			err = j.nodes[3].Mesh().SendTo(context.Background(), 1, big)
		}
		sendErr <- err
	}()
	time.Sleep(100 * time.Millisecond)
	j.nodes[1].Abort(errors.New("boom"))
	for _, n := range j.nodes {
		waitDone(t, n, 5*time.Second, "rank 1 aborted: boom")
	}
	for what, ch := range map[string]chan error{"RecvFrom": recvErr, "SendTo": sendErr} {
		select {
		case err := <-ch:
			if err == nil || !strings.Contains(err.Error(), "rank 1 aborted: boom") {
				t.Errorf("blocked %s returned %v", what, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("blocked %s not released by abort", what)
		}
	}
	if err := j.nodes[0].Mesh().SendTo(context.Background(), 2, []byte("x")); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("SendTo after abort: %v", err)
	}
}

// TestMeshPeerClosedError: a broken link between non-neighbours names the
// peer and its address.
func TestMeshPeerClosedError(t *testing.T) {
	j := startJob(t, jobOpts{size: 4})
	for _, l := range j.nodes[0].links.all {
		l.close()
	}
	err := j.nodes[2].Mesh().RecvFrom(context.Background(), 0, make([]byte, 4))
	if err == nil || !strings.Contains(err.Error(), "recv from rank 0 (@gorun-") {
		t.Errorf("RecvFrom: %v", err)
	}
}

// TestMeshHandshakeRefusals: with the right key, a dialer still can not
// open a link twice, dial a lower rank, or claim a link of other ranks.
func TestMeshHandshakeRefusals(t *testing.T) {
	j := startJob(t, jobOpts{size: 3})
	n1 := j.nodes[1]
	try := func(rank, link int) error {
		c, err := net.Dial("unix", n1.data.unixName)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		ch, err := readMsg(c)
		if err != nil {
			return err
		}
		nonce := make([]byte, nonceLen)
		writeMsg(c, &msg{T: tDHello, Rank: rank, Link: link, Nonce: nonce, Proof: dataProof(j.key, ch.Nonce, rank, link, 0)})
		m, err := readMsg(c)
		if err != nil {
			return err
		}
		return fmt.Errorf("acceptor answered %q", m.T)
	}
	for _, c := range []struct{ rank, link int }{{0, 0}, {0, 1}, {2, 2}, {2, 1}, {0, 2}} {
		if err := try(c.rank, c.link); err != nil && strings.HasPrefix(err.Error(), "acceptor answered") {
			t.Errorf("hello rank %d link %d: %v", c.rank, c.link, err)
		}
	}
	for _, want := range []string{"unexpected or duplicate link 0 -> 1", "unexpected or duplicate link 1 -> 0",
		"rank 2 is not the dialer", "does not join"} {
		deadline := time.Now().Add(5 * time.Second)
		for !j.log.has(want) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if !j.log.has(want) {
			t.Errorf("no log line %q", want)
		}
	}
	meshExchange(t, j.nodes, []int{100})
}

// TestMeshSetupTime logs how long Join takes with a full mesh.
func TestMeshSetupTime(t *testing.T) {
	for _, size := range []int{4, 8} {
		start := time.Now()
		j := startJob(t, jobOpts{size: size})
		t.Logf("N=%d: job up (rendezvous + %d links) in %v", size, size*(size-1), time.Since(start))
		meshExchange(t, j.nodes, []int{1 << 10})
		j.close(t)
	}
}

func TestMissingLinksErr(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("timed out"))
	l := &link{}
	err := missingLinksErr(ctx, 1, []*link{l, nil, l, nil}, []*link{l, nil, nil, nil})
	want := "waiting for data links with ranks [2 3] (from rank 2, to rank 3, from rank 3): timed out"
	if err == nil || err.Error() != want {
		t.Errorf("got %v, want %q", err, want)
	}
}
