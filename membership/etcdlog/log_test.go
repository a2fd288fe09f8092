package etcdlog

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv/etcdtest"
	"github.com/gorun/gorun/membership"
)

var jobConfig = membership.Config{Size: 64, Heartbeat: 3 * time.Second, Elastic: true, MinSize: 2, MaxSize: 64, WaitTimeout: time.Minute}

// driver drives one Log as the rendezvous does: Ready whenever it changed.
type driver struct {
	l    *Log
	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex
	applied []Applied
	leading bool
	err     error
}

func start(t *testing.T, c *etcdtest.Cluster, job string, id uint64, candidate bool) *driver {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := Start(ctx, Config{Endpoints: c.Endpoints(), Job: job, ID: id, Addr: fmt.Sprintf("127.0.0.1:%d", 1000+id),
		Candidate: candidate, Membership: jobConfig, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	d := &driver{l: l, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(d.done)
		for {
			select {
			case <-d.stop:
				return
			case <-l.Changed():
			}
			rd, err := l.Ready()
			d.mu.Lock()
			d.applied = append(d.applied, rd.Applied...)
			d.leading = rd.Leader
			if err != nil && d.err == nil {
				d.err = err
			}
			d.mu.Unlock()
		}
	}()
	t.Cleanup(func() { _ = d.halt(false) })
	return d
}

// halt stops the driver, and its Log (crash: as a killed process); it
// returns what Close returned.
func (d *driver) halt(crash bool) error {
	select {
	case <-d.stop:
		return nil
	default:
	}
	close(d.stop)
	<-d.done
	if crash {
		d.l.Abandon()
		return nil
	}
	return d.l.Close()
}

func (d *driver) state() ([]Applied, bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Applied(nil), d.applied...), d.leading, d.err
}

func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// leader waits until exactly one of ds leads, as its own Ready says.
func leader(t *testing.T, ds []*driver) *driver {
	t.Helper()
	var l *driver
	eventually(t, 15*time.Second, "one replica leads", func() bool {
		l = nil
		n := 0
		for _, d := range ds {
			if _, leading, _ := d.state(); leading {
				l, n = d, n+1
			}
		}
		return n == 1
	})
	return l
}

func register(i int) membership.Event {
	return membership.Register{ID: membership.ID(i), Rank: i, Heartbeat: 3000,
		Info: membership.Info{PeerID: fmt.Sprintf("peer-%d", i), Host: fmt.Sprintf("host-%d", i)}}
}

// propose proposes events from..to-1 on d, in order.
func propose(t *testing.T, d *driver, from, to int) {
	t.Helper()
	at := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	for i := from; i < to; i++ {
		if err := d.l.Propose(at.Add(time.Duration(i)*time.Millisecond), register(i)); err != nil {
			t.Fatalf("propose %d: %v", i, err)
		}
	}
}

// checkLog waits until every driver applied entries 1..n, events
// 0..n-1 in that order.
func checkLog(t *testing.T, ds []*driver, n int) {
	t.Helper()
	for _, d := range ds {
		eventually(t, 20*time.Second, fmt.Sprintf("replica %d applies %d entries", d.l.ID(), n), func() bool {
			a, _, _ := d.state()
			return len(a) >= n
		})
		a, _, err := d.state()
		if err != nil {
			t.Fatalf("replica %d: %v", d.l.ID(), err)
		}
		if len(a) != n {
			t.Fatalf("replica %d applied %d entries, want %d", d.l.ID(), len(a), n)
		}
		for i, e := range a {
			if e.Index != uint64(i+1) || e.Event.(membership.Register).ID != membership.ID(i) {
				t.Fatalf("replica %d: entry %d is %d %+v, want index %d, register %d", d.l.ID(), i, e.Index, e.Event, i+1, i)
			}
		}
	}
}

// Three candidates: one leads, and every replica applies what it
// proposes, in order, once.
func TestEtcdLogOrder(t *testing.T) {
	c := etcdtest.Start(t)
	ds := []*driver{start(t, c, "order", 2, true), start(t, c, "order", 3, true), start(t, c, "order", 4, true)}
	l := leader(t, ds)
	propose(t, l, 0, 30)
	checkLog(t, ds, 30)
	for _, d := range ds {
		if got := d.l.Leader(); got != l.l.ID() {
			t.Errorf("replica %d says %d leads, want %d", d.l.ID(), got, l.l.ID())
		}
		if n := len(d.l.Replicas()); n != 3 {
			t.Errorf("replica %d knows %d replicas, want 3", d.l.ID(), n)
		}
	}
}

// A leader whose session is gone (revoked here, as etcd does when it
// expires) can not append, even with the index free; the next leader
// continues the log where it ended, and a replica that starts afterwards
// catches up with all of it.
func TestEtcdLogDeposedLeaderCannotAppend(t *testing.T) {
	c := etcdtest.Start(t)
	ds := []*driver{start(t, c, "deposed", 2, true), start(t, c, "deposed", 3, true), start(t, c, "deposed", 4, true)}
	old := leader(t, ds)
	propose(t, old, 0, 5)
	checkLog(t, ds, 5)
	old.l.mu.Lock()
	key, rev, lease, term := old.l.myKey, old.l.myRev, old.l.lease, old.l.term
	old.l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Client().Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	if old.l.append(6, []byte("stale"), key, rev, term) != deposed {
		t.Fatal("a deposed leader appended")
	}
	others := slices.DeleteFunc(slices.Clone(ds), func(d *driver) bool { return d == old })
	next := leader(t, others)
	propose(t, next, 5, 10)
	late := start(t, c, "deposed", 5, false)
	checkLog(t, append(ds, late), 10)
	r, err := c.Client().Get(ctx, old.l.logKey(11))
	if err != nil || len(r.Kvs) != 0 {
		t.Fatalf("entry 11: %v %v, want none", r, err)
	}
	if got, want := late.l.Machine().Registered(), ds[0].l.Machine().Registered(); got != want || got != 10 {
		t.Errorf("the late replica's membership has %d registered, the first's %d, want 10", got, want)
	}
}

// A leader that closes hands the lead on at once (its session revoked,
// not left to expire); one killed (Abandon) within the TTL.
func TestEtcdLogLeaderClosedThenKilled(t *testing.T) {
	c := etcdtest.Start(t)
	ds := []*driver{start(t, c, "handover", 2, true), start(t, c, "handover", 3, true), start(t, c, "handover", 4, true)}
	first := leader(t, ds)
	propose(t, first, 0, 3)
	checkLog(t, ds, 3)
	// Close revokes the session: etcd deletes its keys at once. A lease
	// that had expired instead would make the revoke fail (not found).
	if err := first.halt(false); err != nil {
		t.Fatalf("Close of the leader: %v, want its session revoked", err)
	}
	rest := slices.DeleteFunc(slices.Clone(ds), func(d *driver) bool { return d == first })
	second := leader(t, rest)
	propose(t, second, 3, 6)
	checkLog(t, rest, 6)
	second.halt(true)
	last := slices.DeleteFunc(slices.Clone(rest), func(d *driver) bool { return d == second })
	third := leader(t, last)
	propose(t, third, 6, 9)
	checkLog(t, last, 9)
}

// The etcd cluster's leader is killed while the log's leader appends:
// the replica keeps its lead (its lease outlives etcd's election), no
// proposal is lost, and the order holds.
func TestEtcdLogEtcdLeaderKilled(t *testing.T) {
	c := etcdtest.Start(t)
	ds := []*driver{start(t, c, "etcdkill", 2, true), start(t, c, "etcdkill", 3, true), start(t, c, "etcdkill", 4, true)}
	l := leader(t, ds)
	propose(t, l, 0, 10)
	checkLog(t, ds, 10)
	c.KillLeader()
	propose(t, l, 10, 40)
	checkLog(t, ds, 40)
	for _, d := range ds {
		if _, leading, _ := d.state(); leading != (d == l) {
			t.Errorf("replica %d leads: %v after the etcd leader's loss; want only replica %d", d.l.ID(), leading, l.l.ID())
		}
	}
}

// etcd unreachable: Start fails within its bound and names the endpoints.
func TestEtcdLogUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	began := time.Now()
	_, err = Start(context.Background(), Config{Endpoints: []string{addr}, Job: "none", ID: 2, Addr: "127.0.0.1:1",
		CallTimeout: time.Second, Membership: jobConfig})
	if err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Start with etcd down: %v, want an error naming %s", err, addr)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("Start took %v to fail, want about its 1 s bound", took)
	}
	if _, err := Start(context.Background(), Config{Endpoints: []string{addr}, Job: "a/b", ID: 2}); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a rendezvous id with '/': %v", err)
	}
}

// A process that joins finds the leader from etcd alone; with nobody
// standing it waits, bounded by its context.
func TestEtcdLogFindLeader(t *testing.T) {
	c := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	_, _, err := FindLeader(ctx, c.Endpoints(), nil, "find")
	cancel()
	if err == nil || !strings.Contains(err.Error(), "no leader of rendezvous \"find\"") {
		t.Fatalf("FindLeader with no candidate: %v", err)
	}
	ds := []*driver{start(t, c, "find", 3, true), start(t, c, "find", 4, true)}
	l := leader(t, ds)
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, addr, err := FindLeader(ctx, c.Endpoints(), nil, "find")
	if err != nil || id != l.l.ID() || addr != l.l.cfg.Addr {
		t.Fatalf("FindLeader: %d %q %v, want %d %q", id, addr, err, l.l.ID(), l.l.cfg.Addr)
	}
}

// A leader whose client gave up on its lease while etcd kept it (etcd's
// own election took longer than the TTL) keeps its key and leads again,
// after a step down while it is unsure of its lease; what it appended or
// proposed before goes on in the log, and what it proposes after follows,
// even when an append from before the step down lands after it leads
// again.
func TestEtcdLogLeaderKeepsKeyThroughOutage(t *testing.T) {
	c := etcdtest.Start(t)
	ds := []*driver{start(t, c, "outage", 2, true), start(t, c, "outage", 3, true), start(t, c, "outage", 4, true)}
	l := leader(t, ds)
	at := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	for i := range 6 {
		l.l.Propose(at, register(i)) // kept through the step down below
	}
	l.l.mu.Lock()
	lease := l.l.lease
	l.l.mu.Unlock()
	if !l.l.leaseOutlived(lease) {
		t.Fatal("the lease did not outlive the client's giving up on it")
	}
	eventually(t, 15*time.Second, "the leader leads again", func() bool {
		_, leading, _ := l.state()
		return leading && l.l.Leader() == l.l.ID()
	})
	for i := 100; i < 106; i++ {
		if err := l.l.Propose(at, register(i)); err != nil {
			t.Fatal(err)
		}
	}
	var want []membership.ID
	for _, d := range ds {
		eventually(t, 20*time.Second, fmt.Sprintf("replica %d applies entries 100..105", d.l.ID()), func() bool {
			a, _, _ := d.state()
			return len(a) > 0 && a[len(a)-1].Event.(membership.Register).ID == 105
		})
		a, _, err := d.state()
		if err != nil {
			t.Fatal(err)
		}
		var got []membership.ID
		for i, e := range a {
			if e.Index != uint64(i+1) {
				t.Fatalf("replica %d: entry %d has index %d", d.l.ID(), i, e.Index)
			}
			got = append(got, e.Event.(membership.Register).ID)
		}
		if want == nil {
			want = got
		} else if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("replica %d applied %v, replica %d %v", d.l.ID(), got, ds[0].l.ID(), want)
		}
	}
	tail := want[len(want)-6:]
	for i, id := range tail {
		if id != membership.ID(100+i) {
			t.Fatalf("the log ends with %v, want 100..105 in order", tail)
		}
	}
}
