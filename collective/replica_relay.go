package collective

import (
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
)

// The group's port on a pod of an elastic job on Kubernetes, relayed to
// the replica the pod hosts on a port of its own (elastic_pod.go says
// why).

// replicaRelay relays the connections to the group's port on a pod to the
// replica the pod hosts on a port of its own.
type replicaRelay struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	conns  map[net.Conn]struct{} // under mu; nil once closed
	wg     sync.WaitGroup
}

// startReplicaRelay listens on port (every interface of the pod) and
// relays to target.
func startReplicaRelay(port int, target string) (*replicaRelay, error) {
	l, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(port)))
	if err != nil {
		return nil, err
	}
	r := &replicaRelay{l: l, target: target, conns: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go r.serve()
	return r, nil
}

func (r *replicaRelay) serve() {
	defer r.wg.Done()
	for {
		in, err := r.l.Accept()
		if err != nil {
			return // closed
		}
		r.wg.Add(1)
		go r.relay(in)
	}
}

// track adds c to the open connections, or closes it if the relay closed.
func (r *replicaRelay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conns == nil {
		c.Close()
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *replicaRelay) relay(in net.Conn) {
	defer r.wg.Done()
	if !r.track(in) {
		return
	}
	// The replica is on this pod: it answers at once, or is gone.
	out, err := net.DialTimeout("tcp", r.target, podProbeTimeout)
	if err != nil || !r.track(out) {
		in.Close()
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src)
		// Half-close, so that the other direction drains first.
		if tc, ok := dst.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	<-done
	in.Close()
	out.Close()
	r.mu.Lock()
	delete(r.conns, in)
	delete(r.conns, out)
	r.mu.Unlock()
}

// Close stops listening, ends every relayed connection and waits for the
// relay's goroutines.
func (r *replicaRelay) Close() error {
	err := r.l.Close()
	r.mu.Lock()
	for c := range r.conns {
		c.Close()
	}
	r.conns = nil
	r.mu.Unlock()
	r.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
