package p2p

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/ring"
	"golang.org/x/sys/unix"
)

// shmLinkOf returns the shm link of n's transport to (send) or from rank
// p, failing the test if that link is not on shared memory.
func shmLinkOf(t testing.TB, n *Node, p int, send bool) *shmLink {
	t.Helper()
	n.mu.Lock()
	tr := n.links.tr
	n.mu.Unlock()
	l := tr.from[p]
	if send {
		l = tr.to[p]
	}
	s, ok := l.conn.(*shmLink)
	if l.kind != LinkShm || !ok {
		t.Fatalf("rank %d's link with rank %d is %s, want shm", n.rank(), p, l.kind)
	}
	return s
}

func wantKinds(t testing.TB, nodes []*Node, kind func(r, p int) string) {
	t.Helper()
	for r, n := range nodes {
		for p, ps := range n.Peers() {
			if p != r && ps.Link != kind(r, p) {
				t.Errorf("rank %d: link to rank %d is %q, want %q", r, p, ps.Link, kind(r, p))
			}
		}
	}
}

func allShm(int, int) string { return LinkShm }

// shmMaps counts this process's mappings of shm rings; memfds counts its
// open memfds (every ring's fd is closed once mapped, so none is expected
// outside a setup).
func shmMaps(t testing.TB) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "memfd:gorun-shm")
}

func openFDs(t testing.TB) (total, memfds int) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.Contains(target, "memfd:") {
			memfds++
		}
	}
	return len(ents), memfds
}

func devShm(t testing.TB) map[string]bool {
	t.Helper()
	ents, err := os.ReadDir("/dev/shm")
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	m := map[string]bool{}
	for _, e := range ents {
		m[e.Name()] = true
	}
	return m
}

func newDevShm(t testing.TB, before map[string]bool) []string {
	var added []string
	for name := range devShm(t) {
		if !before[name] {
			added = append(added, name)
		}
	}
	return added
}

// TestShm runs rings and meshes of 1 to 4 ranks over shm links, with a
// default ring and with the smallest one (minShmBytes), so messages many times the ring's
// capacity, odd sizes and wrapping writes stream through, every rank
// sending to and receiving from every other concurrently.
func TestShm(t *testing.T) {
	for _, ringBytes := range []string{"", strconv.Itoa(minShmBytes)} {
		for size := 1; size <= 4; size++ {
			t.Run(fmt.Sprintf("ring=%s/N=%d", ringBytes, size), func(t *testing.T) {
				if ringBytes != "" {
					t.Setenv(envShmBytes, ringBytes)
				}
				j := startJob(t, jobOpts{size: size})
				if size == 1 {
					if j.nodes[0].Mesh() != nil {
						t.Fatal("size 1: want no mesh")
					}
					return
				}
				wantKinds(t, j.nodes, allShm)
				want := defaultShmBytes
				if ringBytes != "" {
					want = minShmBytes
				}
				if c := len(shmLinkOf(t, j.nodes[0], 1, true).ring.data); c != want {
					t.Fatalf("ring of %d bytes, want %d", c, want)
				}
				// The ring runs steps up to half of it on one goroutine,
				// unless the host runs more ranks than CPUs and this
				// process one thread of Go code.
				if size > runtime.NumCPU() && runtime.GOMAXPROCS(0) == 1 {
					want = 0
				}
				if lb := j.nodes[0].Mesh().(ring.LinkBuffers).LinkBuffer(1); lb != want {
					t.Fatalf("LinkBuffer(1) = %d, want %d (%d ranks on %d CPUs)", lb, want, size, runtime.NumCPU())
				}
				sizes := []int{1, 7, 4095, 4097, 100_003, 3<<20 + 5, 0, 56}
				exchange(t, j.nodes, sizes)
				meshExchange(t, j.nodes, sizes)
			})
		}
	}
}

// TestShmCapacityEnv: GORUN_SHM_BYTES is rounded up to a power of two and
// clamped.
func TestShmCapacityEnv(t *testing.T) {
	for env, want := range map[string]int{"": defaultShmBytes, "300000": 512 << 10, "1": minShmBytes, "1M": 1 << 20,
		"1048576": 1 << 20, "99999999999": maxShmBytes} {
		t.Setenv(envShmBytes, env)
		if got, err := shmCapacity(); err != nil || got != want {
			t.Errorf("%s=%q: %d, %v; want %d", envShmBytes, env, got, err, want)
		}
	}
	for _, bad := range []string{"junk", "0", "-5", "2X"} {
		t.Setenv(envShmBytes, bad)
		if _, err := shmCapacity(); err == nil || !strings.Contains(err.Error(), envShmBytes) {
			t.Errorf("%s=%q: error %v, want one naming the variable", envShmBytes, bad, err)
		}
	}
}

// TestShmRingBytes: without GORUN_SHM_BYTES, the rings of a host's links
// are as large as the host's ranks allow together (shmHostBytes), never
// below what the ring's schedules need (minShmBytes).
func TestShmRingBytes(t *testing.T) {
	for local, want := range map[int]int{1: defaultShmBytes, 4: defaultShmBytes, 23: defaultShmBytes, 24: 1 << 20,
		32: 1 << 20, 64: 256 << 10, 65: minShmBytes, 256: minShmBytes} {
		got := shmRingBytes(local)
		if got != want {
			t.Errorf("%d ranks on a host: rings of %d bytes, want %d", local, got, want)
		}
		if got > minShmBytes && local*(local-1)*got > shmHostBytes {
			t.Errorf("%d ranks on a host: %d bytes of rings, above %d", local, local*(local-1)*got, shmHostBytes)
		}
	}
}

// TestShmDisabled: GORUN_SHM=0, or NoShm on either rank of a pair, keeps
// that pair on unix sockets; the others still use shared memory.
func TestShmDisabled(t *testing.T) {
	t.Run("env", func(t *testing.T) {
		t.Setenv(envShm, "0")
		j := startJob(t, jobOpts{size: 3})
		wantKinds(t, j.nodes, func(int, int) string { return LinkUnix })
		if lb := j.nodes[0].Mesh().(ring.LinkBuffers).LinkBuffer(1); lb != 0 {
			t.Errorf("LinkBuffer(1) of a unix socket = %d, want 0 (a kernel buffer is not promised)", lb)
		}
		exchange(t, j.nodes, []int{10, 70000})
	})
	t.Run("one rank", func(t *testing.T) {
		log := &logRec{}
		j := &job{key: NewJobKey(), log: log}
		o := jobOpts{size: 3, timeout: 10 * time.Second, log: log}
		err := j.launch(t, RendezvousConfig{Size: 3, Timeout: o.timeout}, func(r int) Config {
			c := baseConfig(j, o, r)
			c.NoShm = r == 1
			return c
		})
		t.Cleanup(func() { j.close(t) })
		if err != nil {
			t.Fatal(err)
		}
		wantKinds(t, j.nodes, func(r, p int) string {
			if r == 1 || p == 1 {
				return LinkUnix
			}
			return LinkShm
		})
		meshExchange(t, j.nodes, []int{10, 70000})
		if log.has("shared memory with rank") {
			t.Error("a disabled pair was logged as a failed setup")
		}
	})
}

// TestShmSetupFailureFallsBack: when no ring can be created, every link
// stays on its unix socket, data flows, and the node says so once.
func TestShmSetupFailureFallsBack(t *testing.T) {
	orig := createShmRing
	createShmRing = func(shmIdentity, int) ([]byte, int, error) { return nil, -1, errors.New("no memfd today") }
	t.Cleanup(func() { createShmRing = orig })
	log := &logRec{}
	j := startJob(t, jobOpts{size: 3, log: log})
	wantKinds(t, j.nodes, func(int, int) string { return LinkUnix })
	meshExchange(t, j.nodes, []int{10, 70000})
	for r := range 3 {
		n := 0
		log.mu.Lock()
		for _, l := range log.lines {
			if strings.HasPrefix(l, fmt.Sprintf("rank %d: shared memory with rank", r)) {
				n++
			}
		}
		log.mu.Unlock()
		if n != 1 {
			t.Errorf("rank %d logged the fallback %d times, want once", r, n)
		}
	}
}

// socketPair returns the two ends of a connected unix stream socket.
func socketPair(t *testing.T) (a, b *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(10 * time.Second))
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// TestShmSetupRejects: the reader of a link refuses, without crashing and
// without keeping any fd or mapping, every offer that is not a fresh ring
// for exactly this link; the writer then keeps the unix link too.
func TestShmSetupRejects(t *testing.T) {
	id := shmIdentity{from: 2, to: 1, epoch: 0}
	offer := func(capacity uint64) []byte {
		b := make([]byte, shmOfferLen)
		copy(b, shmOfferMagic)
		b[8] = byte(capacity)
		b[9], b[10], b[11] = byte(capacity>>8), byte(capacity>>16), byte(capacity>>24)
		return b
	}
	memfd := func(t *testing.T, size int) int {
		fd, err := unix.MemfdCreate("gorun-test", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Ftruncate(fd, int64(size)); err != nil {
			t.Fatal(err)
		}
		return fd
	}
	ring := func(t *testing.T, id shmIdentity) int {
		mem, fd, err := createShm(id, minShmBytes)
		if err != nil {
			t.Fatal(err)
		}
		unix.Munmap(mem)
		return fd
	}
	// send writes one offer with fds attached, then closes the test's own
	// copies: what is left open afterwards is the reader's.
	send := func(t *testing.T, c *net.UnixConn, b []byte, fds ...int) {
		var oob []byte
		if len(fds) > 0 {
			oob = unix.UnixRights(fds...)
		}
		if _, _, err := c.WriteMsgUnix(b, oob, nil); err != nil {
			t.Fatal(err)
		}
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	cases := []struct {
		name  string
		send  func(t *testing.T, c *net.UnixConn)
		wantE string
	}{
		{"no fd", func(t *testing.T, c *net.UnixConn) { send(t, c, offer(minShmBytes)) }, "0 fds"},
		{"garbage", func(t *testing.T, c *net.UnixConn) { send(t, c, []byte("0123456789abcdef"), ring(t, id)) }, "bad offer"},
		{"credentials, not rights", func(t *testing.T, c *net.UnixConn) {
			ucred := unix.UnixCredentials(&unix.Ucred{Pid: int32(os.Getpid()), Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())})
			if _, _, err := c.WriteMsgUnix(offer(minShmBytes), ucred, nil); err != nil {
				t.Fatal(err)
			}
		}, "0 fds"},
		{"two fds", func(t *testing.T, c *net.UnixConn) { send(t, c, offer(minShmBytes), ring(t, id), ring(t, id)) }, "2 fds"},
		{"wrong size memfd", func(t *testing.T, c *net.UnixConn) { send(t, c, offer(minShmBytes), memfd(t, 4096)) }, "not a"},
		{"unsealed memfd", func(t *testing.T, c *net.UnixConn) { send(t, c, offer(minShmBytes), memfd(t, shmHdrSize+minShmBytes)) }, "sealed"},
		{"not a file", func(t *testing.T, c *net.UnixConn) {
			var p [2]int
			if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
				t.Fatal(err)
			}
			unix.Close(p[1])
			send(t, c, offer(minShmBytes), p[0])
		}, "not a"},
		{"odd capacity", func(t *testing.T, c *net.UnixConn) { send(t, c, offer(minShmBytes-1), ring(t, id)) }, fmt.Sprintf("offer of %d bytes", minShmBytes-1)},
		{"other link", func(t *testing.T, c *net.UnixConn) {
			send(t, c, offer(minShmBytes), ring(t, shmIdentity{from: 0, to: 1}))
		}, "ring of link 0 -> 1"},
		{"other epoch", func(t *testing.T, c *net.UnixConn) {
			send(t, c, offer(minShmBytes), ring(t, shmIdentity{from: 2, to: 1, epoch: 3}))
		}, "(epoch 3)"},
		{"writer failed", func(t *testing.T, c *net.UnixConn) { send(t, c, offer(0)) }, "could not create"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fds0, _ := openFDs(t)
			maps0 := shmMaps(t)
			w, r := socketPair(t)
			c.send(t, w)
			s, fallback, ioErr := receiveShm(r, id)
			if s != nil || ioErr != nil || fallback == nil || !strings.Contains(fallback.Error(), c.wantE) {
				t.Fatalf("receiveShm: link %v, fallback %v, error %v; want fallback %q", s != nil, fallback, ioErr, c.wantE)
			}
			if ok, err := readAck(w); ok || err != nil {
				t.Errorf("ack: %v, %v; want a refusal", ok, err)
			}
			w.Close()
			r.Close()
			if fds, memfds := openFDs(t); fds > fds0 || memfds > 0 {
				t.Errorf("%d fds open (%d memfds), %d before", fds, memfds, fds0)
			}
			if m := shmMaps(t); m != maps0 {
				t.Errorf("%d ring mappings, %d before", m, maps0)
			}
		})
	}
	t.Run("writer sees the refusal", func(t *testing.T) {
		w, r := socketPair(t)
		type res struct {
			s              *shmLink
			fallback, ioEr error
		}
		got := make(chan res, 1)
		go func() {
			s, f, e := receiveShm(r, shmIdentity{from: 5, to: 1})
			got <- res{s, f, e}
		}()
		s, fallback, ioErr := offerShm(w, id, minShmBytes)
		if s != nil || ioErr != nil || fallback == nil {
			t.Errorf("offerShm: link %v, fallback %v, error %v; want a fallback", s != nil, fallback, ioErr)
		}
		if rr := <-got; rr.s != nil || rr.ioEr != nil || rr.fallback == nil {
			t.Errorf("receiveShm: %+v", rr)
		}
		if m := shmMaps(t); m != 0 {
			t.Errorf("%d ring mappings left", m)
		}
	})
	t.Run("accepted", func(t *testing.T) {
		w, r := socketPair(t)
		got := make(chan *shmLink, 1)
		go func() {
			s, f, e := receiveShm(r, id)
			if f != nil || e != nil {
				t.Error(f, e)
			}
			got <- s
		}()
		ws, fallback, ioErr := offerShm(w, id, minShmBytes)
		if ws == nil || fallback != nil || ioErr != nil {
			t.Fatalf("offerShm: %v %v", fallback, ioErr)
		}
		rs := <-got
		if rs == nil {
			t.FailNow()
		}
		w.SetDeadline(time.Time{})
		r.SetDeadline(time.Time{})
		ws.start()
		rs.start()
		if m := shmMaps(t); m != 2 {
			t.Errorf("%d ring mappings, want 2", m)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		data := pattern(3, 1, 100_000)
		sent := make(chan error, 1)
		go func() { sent <- ws.send(ctx, [][]byte{data[:5], data[5:]}, linkWait{}) }()
		buf := make([]byte, len(data))
		if err := rs.recv(ctx, buf, linkWait{}); err != nil || !bytes.Equal(buf, data) {
			t.Errorf("read: %v (equal: %v)", err, bytes.Equal(buf, data))
		}
		if err := <-sent; err != nil {
			t.Error(err)
		}
		w.Close()
		ws.close()
		r.Close()
		rs.close()
		if m := shmMaps(t); m != 0 {
			t.Errorf("%d ring mappings after close", m)
		}
	})
}

// parkedOn waits (bounded) until the futex word w says its side parked.
func parkedOn(t *testing.T, w *atomic.Uint32) {
	t.Helper()
	eventually(t, 10*time.Second, "the transfer to park", func() bool { return w.Load() == 1 })
}

// TestShmWakeParked: a parked reader and a parked writer (ring full) wake
// at once on cancellation, at their deadline, and when the node aborts
// (which closes the links, as the end of an epoch does); an idle parked
// reader burns no CPU. (A peer's end breaking wakes them too: see
// TestPeerClosedError/shm and TestShmPeerKilled.)
func TestShmWakeParked(t *testing.T) {
	t.Setenv(envShmBytes, strconv.Itoa(minShmBytes))
	j := startJob(t, jobOpts{size: 2, timeout: 10 * time.Second})
	wantKinds(t, j.nodes, allShm)
	tr := j.nodes[0].Mesh()
	rd := shmLinkOf(t, j.nodes[0], 1, false)
	wr := shmLinkOf(t, j.nodes[0], 1, true)
	cause := errors.New("my cause")
	const bound = 2 * time.Second

	t.Run("reader cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancelCause(context.Background())
		done := make(chan error, 1)
		go func() { done <- tr.RecvFrom(ctx, 1, make([]byte, 8)) }()
		parkedOn(t, rd.ring.dataWait)
		start := time.Now()
		cancel(cause)
		select {
		case err := <-done:
			if err != cause {
				t.Errorf("RecvFrom: %v, want the cause", err)
			}
			t.Logf("woke after %v", time.Since(start))
		case <-time.After(bound):
			t.Fatal("a parked reader did not wake on cancel")
		}
	})
	t.Run("reader deadline", func(t *testing.T) {
		cpu0 := cpuTime()
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := tr.RecvFrom(ctx, 1, make([]byte, 8))
		took := time.Since(start)
		if !errors.Is(err, context.DeadlineExceeded) || took > 300*time.Millisecond+bound {
			t.Errorf("RecvFrom: %v after %v", err, took)
		}
		// Parked, not spinning: far less CPU than wall time (the whole
		// process: other goroutines may run meanwhile).
		if cpu := cpuTime() - cpu0; cpu > took/2 {
			t.Errorf("waiting %v took %v of CPU", took, cpu)
		}
	})
	fill := func(ctx context.Context) chan error {
		done := make(chan error, 1)
		go func() {
			big := make([]byte, 1<<20)
			for {
				if err := tr.SendTo(ctx, 1, big); err != nil {
					done <- err
					return
				}
			}
		}()
		return done
	}
	t.Run("writer cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancelCause(context.Background())
		done := fill(ctx)
		parkedOn(t, wr.ring.spaceWait)
		cancel(cause)
		select {
		case err := <-done:
			if err != cause {
				t.Errorf("SendTo: %v, want the cause", err)
			}
		case <-time.After(bound):
			t.Fatal("a parked writer did not wake on cancel")
		}
	})
	t.Run("writer deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		select {
		case err := <-fill(ctx):
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("SendTo: %v", err)
			}
		case <-time.After(300*time.Millisecond + bound):
			t.Fatal("a parked writer did not wake at its deadline")
		}
	})
	t.Run("abort", func(t *testing.T) {
		// Rank 1 neither reads nor sends: rank 0's writer and reader park.
		rdone := make(chan error, 1)
		go func() { rdone <- tr.RecvFrom(context.Background(), 1, make([]byte, 8)) }()
		wdone := fill(context.Background())
		parkedOn(t, wr.ring.spaceWait)
		parkedOn(t, rd.ring.dataWait)
		j.nodes[0].Abort(cause)
		for what, ch := range map[string]chan error{"writer": wdone, "reader": rdone} {
			select {
			case err := <-ch:
				if err == nil || !strings.Contains(err.Error(), "my cause") {
					t.Errorf("%s: %v, want the abort", what, err)
				}
			case <-time.After(bound + linkGrace):
				t.Fatalf("parked %s did not wake on abort", what)
			}
		}
	})
}

// TestShmReleased: a job of several ranks over shm links leaves no mapping,
// no fd and nothing in /dev/shm behind once it closes, also when a peer
// crashed first.
func TestShmReleased(t *testing.T) {
	for _, crash := range []bool{false, true} {
		t.Run(fmt.Sprintf("crash=%v", crash), func(t *testing.T) {
			// A first job warms up what the process keeps (netpoller, ...).
			startJob(t, jobOpts{size: 2}).close(t)
			shm0 := devShm(t)
			fds0, _ := openFDs(t)
			maps0 := shmMaps(t)
			j := startJob(t, jobOpts{size: 4})
			wantKinds(t, j.nodes, allShm)
			if m := shmMaps(t); m != maps0+2*12 {
				t.Errorf("%d ring mappings, want %d (two per link)", m, maps0+2*12)
			}
			if _, memfds := openFDs(t); memfds != 0 {
				t.Errorf("%d memfds open while the job runs, want 0 (the mappings keep the rings)", memfds)
			}
			meshExchange(t, j.nodes, []int{100, 2 << 20})
			if crash {
				j.nodes[3].crash()
				for _, n := range j.nodes[:3] {
					waitDone(t, n, 5*time.Second, "rank 3 (")
				}
			}
			j.close(t)
			if m := shmMaps(t); m != maps0 {
				t.Errorf("%d ring mappings after Close, %d before", m, maps0)
			}
			// Sockets of the libp2p hosts may take a moment to go.
			eventually(t, 10*time.Second, "fds released", func() bool {
				fds, memfds := openFDs(t)
				return fds <= fds0 && memfds == 0
			})
			if added := newDevShm(t, shm0); len(added) > 0 {
				t.Errorf("new in /dev/shm: %v", added)
			}
		})
	}
}

// Environment of the child process of TestShmPeerKilled.
const (
	envChildRz  = "P2P_SHM_CHILD_RENDEZVOUS"
	envChildKey = "P2P_SHM_CHILD_KEY"
)

// TestShmChildRank is rank 1 of TestShmPeerKilled, in a process of its
// own: it sends to rank 0 without end and never reads, until it is killed.
func TestShmChildRank(t *testing.T) {
	rz := os.Getenv(envChildRz)
	if rz == "" {
		t.Skip("child process of TestShmPeerKilled")
	}
	key, err := hex.DecodeString(os.Getenv(envChildKey))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := Join(ctx, Config{Rank: 1, Size: 2, JobKey: key, Rendezvous: rz, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("child: joined via %s\n", n.Peers()[0].Link)
	big := make([]byte, 1<<20)
	for {
		if err := n.Mesh().SendTo(ctx, 0, big); err != nil {
			t.Fatal(err)
		}
	}
}

// TestShmPeerKilled: a peer process killed with SIGKILL while rank 0 both
// reads from it and is parked writing to it (its ring full) makes both
// transfers fail naming rank 1 within the bound of a unix link, and leaves
// nothing behind in /dev/shm or mapped once rank 0 closes.
func TestShmPeerKilled(t *testing.T) {
	// A first job warms up what the process keeps (netpoller, ...).
	startJob(t, jobOpts{size: 2}).close(t)
	shm0 := devShm(t)
	maps0 := shmMaps(t)
	fds0, _ := openFDs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	log := &logRec{}
	key := NewJobKey()
	const timeout = 5 * time.Second
	rz, err := StartRendezvous(ctx, RendezvousConfig{Size: 2, Timeout: timeout, ListenAddr: "127.0.0.1:0", JobKey: key, Logf: log.logf})
	if err != nil {
		t.Fatal(err)
	}
	defer rz.Close()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestShmChildRank$", "-test.v")
	cmd.Env = append(os.Environ(), envChildRz+"="+rz.Addr(), envChildKey+"="+hex.EncodeToString(key))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waited sync.Once
	wait := func() { waited.Do(func() { cmd.Wait() }) }
	defer wait()
	defer cmd.Process.Kill()
	joined := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if l := sc.Text(); strings.HasPrefix(l, "child: joined via ") {
				joined <- strings.TrimPrefix(l, "child: joined via ")
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	n, err := Join(ctx, Config{Rank: 0, Size: 2, JobKey: key, Rendezvous: rz.Addr(), Timeout: timeout, Logf: log.logf})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	select {
	case kind := <-joined:
		if kind != LinkShm {
			t.Fatalf("child's link is %s, want shm", kind)
		}
	case <-ctx.Done():
		t.Fatal("child did not join")
	}
	wantKinds(t, []*Node{n}, allShm)
	m := n.Mesh()
	// Mid-transfer: data is flowing from the child, and rank 0's writer
	// is parked on a full ring the child never reads.
	buf := make([]byte, 4<<20)
	if err := m.RecvFrom(ctx, 1, buf); err != nil {
		t.Fatal(err)
	}
	recvErr, sendErr := make(chan error, 1), make(chan error, 1)
	go func() {
		for {
			if err := m.RecvFrom(ctx, 1, buf); err != nil {
				recvErr <- err
				return
			}
		}
	}()
	go func() {
		big := make([]byte, 1<<20)
		for {
			if err := m.SendTo(ctx, 1, big); err != nil {
				sendErr <- err
				return
			}
		}
	}()
	parkedOn(t, shmLinkOf(t, n, 1, true).ring.spaceWait)
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	wait()
	for what, ch := range map[string]chan error{"recv": recvErr, "send": sendErr} {
		select {
		case err := <-ch:
			took := time.Since(start)
			t.Logf("%s failed after %v: %v", what, took, err)
			if !strings.Contains(err.Error(), "rank 1 (") {
				t.Errorf("%s: %v, want an error naming rank 1", what, err)
			}
			if took > timeout {
				t.Errorf("%s: failed after %v, more than the %v bound", what, took, timeout)
			}
		case <-time.After(timeout + linkGrace):
			t.Fatalf("%s still blocked %v after the peer was killed", what, timeout+linkGrace)
		}
	}
	n.Close()
	rz.Close()
	if m := shmMaps(t); m != maps0 {
		t.Errorf("%d ring mappings after Close, %d before", m, maps0)
	}
	if added := newDevShm(t, shm0); len(added) > 0 {
		t.Errorf("new in /dev/shm: %v", added)
	}
	// Sockets of the libp2p host may take a moment to go.
	eventually(t, 10*time.Second, "fds released", func() bool {
		fds, memfds := openFDs(t)
		return fds <= fds0 && memfds == 0
	})
}

// TestShmPeerLinksGone: when the peer's end of shm links goes (here its
// links are closed behind its back, so only the links' sockets can tell,
// not the control path), a parked writer and a parked reader wake and
// fail naming the peer, as on a unix link.
func TestShmPeerLinksGone(t *testing.T) {
	t.Setenv(envShmBytes, strconv.Itoa(minShmBytes))
	j := startJob(t, jobOpts{size: 2})
	wantKinds(t, j.nodes, allShm)
	tr := j.nodes[0].Mesh()
	recvErr, sendErr := make(chan error, 1), make(chan error, 1)
	go func() { recvErr <- tr.RecvFrom(context.Background(), 1, make([]byte, 8)) }()
	go func() {
		big := make([]byte, 1<<20)
		for {
			if err := tr.SendTo(context.Background(), 1, big); err != nil {
				sendErr <- err
				return
			}
		}
	}()
	parkedOn(t, shmLinkOf(t, j.nodes[0], 1, true).ring.spaceWait)
	parkedOn(t, shmLinkOf(t, j.nodes[0], 1, false).ring.dataWait)
	for _, l := range j.nodes[1].links.all {
		l.close()
	}
	for what, c := range map[string]struct {
		ch   chan error
		want string
	}{
		"recv": {recvErr, "recv from rank 1 (@gorun-"},
		"send": {sendErr, "send to rank 1 (@gorun-"},
	} {
		select {
		case err := <-c.ch:
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: %v, want %q", what, err, c.want)
			}
			t.Logf("%s: %v", what, err)
		case <-time.After(linkGrace + 5*time.Second):
			t.Fatalf("%s still blocked after the peer's links closed", what)
		}
	}
}

// RecvFromView hands over exactly the bytes sent, in order, from shared
// memory (in place, in pieces where the ring wraps) and from a unix socket
// (through the transport's buffer), messages larger than the ring
// included.
func TestRecvFromView(t *testing.T) {
	for _, kind := range []string{LinkShm, LinkUnix} {
		t.Run(kind, func(t *testing.T) {
			t.Setenv(envShmBytes, strconv.Itoa(minShmBytes))
			j := startJob(t, jobOpts{size: 2, noShm: kind == LinkUnix})
			if k := j.nodes[1].Peers()[0].Link; k != kind {
				t.Fatalf("link is %s, want %s", k, kind)
			}
			send, recv := j.nodes[0].Transport(), j.nodes[1].Transport().(ring.ViewReceiver)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for _, n := range []int{1, 4097, minShmBytes - 3, 3*minShmBytes + 11} {
				want := make([]byte, n)
				for i := range want {
					want[i] = byte(i*7 + n)
				}
				sent := make(chan error, 1)
				go func() { sent <- send.SendNext(ctx, want) }()
				var got []byte
				spans := 0
				if err := recv.RecvFromView(ctx, 0, n, func(span []byte) {
					got = append(got, span...)
					spans++
				}); err != nil {
					t.Fatal(err)
				}
				if err := <-sent; err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("%d bytes in %d spans: not the bytes sent", n, spans)
				}
			}
		})
	}
}

// TestShmRewind streams messages through one ring, reader and writer in
// the same process, and checks that a message written when the reader had
// read everything starts at the ring's first byte (the writer rewound),
// one written while the reader lags goes on where the last one ended, and
// the bytes arrive intact either way: through recv and recvView, with the
// reader parked for the message or not, with messages longer
// than the ring, and up to the end of the stream.
//
// It runs from a fresh ring, and from counters near 2^64, where the
// first rewind wraps them to 0.
func TestShmRewind(t *testing.T) {
	for _, start := range []uint64{0, math.MaxUint64 - minShmBytes + 101} {
		t.Run(fmt.Sprint("from=", start), func(t *testing.T) { testShmRewind(t, start) })
	}
}

func testShmRewind(t *testing.T, start uint64) {
	mem, fd, err := createShm(shmIdentity{from: 0, to: 1}, minShmBytes)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	w, r := newShmLink(mem, true, nil), newShmLink(mem, false, nil)
	mask := w.ring.mask
	// Both ends at start, the ring empty.
	w.ring.head.Store(start)
	w.ring.tail.Store(start)
	w.pos, w.published, w.peerPos = start, start, start
	r.pos, r.peerPos = start, start
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	var readers sync.WaitGroup
	t.Cleanup(func() { // a failed test may leave a reader waiting
		cancel()
		readers.Wait()
		unix.Munmap(mem)
	})

	msg := func(n, seed int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*31 + seed)
		}
		return b
	}
	// receive reads n bytes in a goroutine started before the write, so
	// that it waits for them (view: through recvView); the channel gets
	// the bytes, or nil after the read failed.
	receive := func(n int, view bool) <-chan []byte {
		got := make(chan []byte, 1)
		readers.Add(1)
		go func() {
			defer readers.Done()
			var b []byte
			var err error
			if view {
				err = r.recvView(ctx, n, func(span []byte) { b = append(b, span...) }, linkWait{})
			} else {
				b = make([]byte, n)
				err = r.recv(ctx, b, linkWait{})
			}
			if err != nil {
				b = nil
			}
			got <- b
		}()
		return got
	}

	for i, n := range []int{1, 100, 4096, 70000, minShmBytes - 1, minShmBytes, 7, minShmBytes + 5, 3*minShmBytes + 11, 56} {
		want := msg(n, i)
		got := receive(n, i%2 == 1)
		if i%3 == 0 {
			// Let the reader park first: the rewind must wake it and move it.
			for r.waitingSince.Load() == 0 && ctx.Err() == nil {
				runtime.Gosched()
			}
		}
		if err := w.send(ctx, [][]byte{want[:n/2], want[n/2:]}, linkWait{}); err != nil {
			t.Fatal(err)
		}
		if b := <-got; !bytes.Equal(b, want) {
			t.Fatalf("message %d (%d bytes): not the bytes sent (nil: the read failed): %.8x", i, n, b)
		}
		if start := w.pos - uint64(n); start&mask != 0 {
			t.Fatalf("message %d (%d bytes) started at byte %d of the ring, want 0: the writer did not rewind", i, n, start&mask)
		}
	}

	// The reader lags: the second message follows the first in the ring.
	a, b := msg(1000, 1), msg(3000, 2)
	for _, m := range [][]byte{a, b} {
		if err := w.send(ctx, [][]byte{m}, linkWait{}); err != nil {
			t.Fatal(err)
		}
	}
	if w.pos&mask != uint64(len(a)+len(b)) {
		t.Fatalf("after two messages the reader had not read, the writer is at byte %d of the ring, want %d", w.pos&mask, len(a)+len(b))
	}
	got := make([]byte, len(a)+len(b))
	if err := r.recv(ctx, got, linkWait{}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, append(a, b...)) {
		t.Fatal("two messages written before a read: not the bytes sent")
	}

	// A rewind with nothing written, then a message, then the end.
	if err := w.send(ctx, [][]byte{nil}, linkWait{}); err != nil {
		t.Fatal(err)
	}
	last := msg(10, 3)
	if err := w.send(ctx, [][]byte{last}, linkWait{}); err != nil {
		t.Fatal(err)
	}
	w.closeWrite()
	got = make([]byte, len(last))
	if err := r.recv(ctx, got, linkWait{}); err != nil || !bytes.Equal(got, last) {
		t.Fatalf("the message before the end: %v, %x, want %x", err, got, last)
	}
	if err := r.recv(ctx, got, linkWait{}); err != io.EOF {
		t.Fatalf("after the end: %v, want EOF", err)
	}
}
