package p2p

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSameMachine: host identities of one kernel (equal boot ids) share
// CPUs whatever their network namespace or host name; identities set by
// hand compare as they are.
func TestSameMachine(t *testing.T) {
	boot := "0b8d6b4e-3c4f-4c6a-9d59-3f1a0c2d7e11"
	other := "7f00aa5e-1111-4c6a-9d59-3f1a0c2d7e11"
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"vm/net:[4026531840]/" + boot, "vm/net:[4026531840]/" + boot, true},
		{"vm/net:[4026531840]/" + boot, "vm/net:[4026532301]/" + boot, true}, // another namespace
		{"pod-a/net:[1]/" + boot, "pod-b/net:[2]/" + boot, true},             // containers of one node
		{"vm/net:[4026531840]/" + boot, "vm/net:[4026531840]/" + other, false},
		{"hostA", "hostB", false},
		{"hostA", "hostA", true},
		{"a/noboot", "b/noboot", false}, // no boot id: nothing shared known
	} {
		if got := sameMachine(c.a, c.b); got != c.want {
			t.Errorf("sameMachine(%q, %q) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
	peers := []Peer{{HostID: "h0/n1/" + boot}, {HostID: "h0/n1/" + boot}, {HostID: "h1/n2/" + boot}, {HostID: "h2/n3/" + other}, {HostID: "x"}}
	if got := machineRanks(peers, "h0/n1/"+boot); got != 3 {
		t.Errorf("machineRanks = %d, want 3", got)
	}
	if got := machineRanks(peers, "x"); got != 1 {
		t.Errorf("machineRanks of a hand-set identity = %d, want 1", got)
	}
	if id := detectHostID(); !sameMachine(id, id[:strings.IndexByte(id, '/')]+"/elsewhere/"+id[strings.LastIndexByte(id, '/')+1:]) {
		t.Errorf("detectHostID %q: another namespace of this kernel is not the same machine", id)
	}
}

// TestPollConfig: a rank polls hot where the machine has a CPU per rank,
// and yields between checks, for the shared-memory budget, where it does
// not; GORUN_POLL_US sets the budget either way.
func TestPollConfig(t *testing.T) {
	cpus := runtime.NumCPU()
	for _, c := range []struct {
		ranks  int
		env    string
		budget time.Duration
		yield  bool
	}{
		{cpus, "", defaultPollBudget, false},
		{cpus + 1, "", shmYieldBudget, true},
		{cpus + 1, "0", 0, true},
		{cpus, "30", 30 * time.Microsecond, false},
	} {
		t.Setenv("GORUN_POLL_US", c.env)
		if b, y := pollConfig(c.ranks); b != c.budget || y != c.yield {
			t.Errorf("%d ranks on %d CPUs, GORUN_POLL_US=%q: budget %v yield %v, want %v %v",
				c.ranks, cpus, c.env, b, y, c.budget, c.yield)
		}
	}
}

// TestPollRead: pollRead returns what has arrived, polling or waiting in
// the runtime's poller for the first bytes, yielding or not; then the end
// of the stream; and a read deadline still ends a wait.
func TestPollRead(t *testing.T) {
	for _, c := range []struct {
		name   string
		budget time.Duration
		yield  bool
	}{{"hot", 50 * time.Microsecond, false}, {"yield", 50 * time.Microsecond, true}, {"long", time.Second, true}} {
		t.Run(c.name, func(t *testing.T) {
			a, b := tcpPair(t)
			rc, err := b.(syscall.Conn).SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			sent := make(chan error, 1)
			go func() {
				// A first piece, then, once the reader has it, a second:
				// the reader's second read finds nothing at first.
				_, err := a.Write([]byte("hello "))
				sent <- err
			}()
			buf := make([]byte, 64)
			n, err := pollRead(rc, buf, c.budget, c.yield)
			if err != nil || string(buf[:n]) != "hello " {
				t.Fatalf("first read: %q, %v", buf[:n], err)
			}
			if err := <-sent; err != nil {
				t.Fatal(err)
			}
			go func() {
				_, err := a.Write([]byte("world"))
				if err == nil {
					err = a.(*net.TCPConn).CloseWrite()
				}
				sent <- err
			}()
			var got []byte
			for {
				n, err := pollRead(rc, buf, c.budget, c.yield)
				got = append(got, buf[:n]...)
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("read: %v", err)
				}
			}
			if string(got) != "world" {
				t.Fatalf("then read %q, want %q", got, "world")
			}
			if err := <-sent; err != nil {
				t.Fatal(err)
			}
			// Nothing more will come on a fresh pair: the deadline ends the wait.
			_, b2 := tcpPair(t)
			rc2, _ := b2.(syscall.Conn).SyscallConn()
			b2.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			if _, err := pollRead(rc2, buf, c.budget, c.yield); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read past the deadline: %v, want %v", err, os.ErrDeadlineExceeded)
			}
		})
	}
}

// tcpPair returns two ends of a loopback TCP connection, closed at the
// end of the test.
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- nil
			return
		}
		accepted <- c
	}()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b := <-accepted
	if b == nil {
		a.Close()
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}
