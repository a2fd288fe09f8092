package p2p

import (
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type elasticOpts struct {
	size, min, max int
	hb, wait       time.Duration
	timeout        time.Duration
	hostID         func(int) string
	noShm          bool
}

type changes struct {
	mu sync.Mutex
	cs []Change
}

func (c *changes) add(ch Change) {
	c.mu.Lock()
	c.cs = append(c.cs, ch)
	c.mu.Unlock()
}

func (c *changes) last() (Change, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.cs) == 0 {
		return Change{}, 0
	}
	return c.cs[len(c.cs)-1], len(c.cs)
}

type elasticJob struct {
	*job
	o       elasticOpts
	changes *changes
	extra   []*Node // joiners, closed at cleanup
	mu      sync.Mutex
}

func (o *elasticOpts) defaults() {
	if o.hb == 0 {
		o.hb = 2 * time.Second
	}
	if o.timeout == 0 {
		o.timeout = 20 * time.Second
	}
	if o.min == 0 {
		o.min = 1
	}
}

func (j *elasticJob) config(rank int) Config {
	c := Config{Rank: rank, Size: j.o.size, JobKey: j.key, Rendezvous: j.rz.Addr(),
		Timeout: j.o.timeout, Logf: j.log.logf, Elastic: true, HeartbeatTimeout: j.o.hb, NoShm: j.o.noShm}
	if j.o.hostID != nil && rank >= 0 {
		c.HostID = j.o.hostID(rank)
	}
	return c
}

// startElastic runs an elastic rendezvous and o.size members in this process.
func startElastic(t *testing.T, o elasticOpts) *elasticJob {
	t.Helper()
	o.defaults()
	j := &elasticJob{job: &job{key: NewJobKey(), log: &logRec{}}, o: o, changes: &changes{}}
	err := j.launch(t, RendezvousConfig{Size: o.size, Timeout: o.timeout, OnChange: j.changes.add,
		Elastic: &ElasticConfig{MinSize: o.min, MaxSize: o.max, WaitTimeout: o.wait, HeartbeatTimeout: o.hb}}, j.config)
	t.Cleanup(func() {
		j.mu.Lock()
		j.job.nodes = append(j.job.nodes, j.extra...)
		j.mu.Unlock()
		j.close(t)
	})
	if err != nil {
		t.Fatal(err)
	}
	for r, n := range j.nodes {
		if n.Epoch() != 0 || n.Rank() != r || n.Size() != o.size {
			t.Fatalf("rank %d: epoch %d rank %d size %d at start", r, n.Epoch(), n.Rank(), n.Size())
		}
	}
	return j
}

// join starts a joiner; its Join result arrives on the returned channel.
func (j *elasticJob) join(ctx context.Context) <-chan error {
	done := make(chan error, 1)
	go func() {
		n, err := Join(ctx, j.config(-1))
		if n != nil {
			j.mu.Lock()
			j.extra = append(j.extra, n)
			j.mu.Unlock()
		}
		done <- err
	}()
	return done
}

func (j *elasticJob) joiner(i int) *Node {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.extra[i]
}

// eventually polls cond (for state with no event to wait on) up to within.
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

// reconfigureAll calls Reconfigure on every node at once.
func reconfigureAll(t *testing.T, nodes []*Node) []View {
	t.Helper()
	return onAllNodes(t, nodes, (*Node).Reconfigure)
}

// onAllNodes calls call on every node at once and returns their views.
func onAllNodes(t *testing.T, nodes []*Node, call func(*Node, context.Context) (View, error)) []View {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	views := make([]View, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			views[i], errs[i] = call(n, ctx)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return views
}

func membershipErr(t *testing.T, what string, err error) *MembershipChangeError {
	t.Helper()
	var mc *MembershipChangeError
	if !errors.As(err, &mc) {
		t.Fatalf("%s: %v (%T), want a *MembershipChangeError", what, err, err)
	}
	return mc
}

func lostRanks(l []LostMember) []int {
	var r []int
	for _, m := range l {
		r = append(r, m.Rank)
	}
	slices.Sort(r)
	return r
}

// checkViews checks that the nodes form epoch `epoch` of len(nodes) members
// with ranks in the order given, and agree on the lost and joined.
func checkViews(t *testing.T, views []View, nodes []*Node, epoch int, lost []int, joined []int) {
	t.Helper()
	for i, v := range views {
		if v.Epoch != epoch || v.Rank != i || v.Size != len(nodes) || len(v.Peers) != len(nodes) {
			t.Errorf("node %d: view epoch %d rank %d size %d (%d peers), want epoch %d rank %d size %d",
				i, v.Epoch, v.Rank, v.Size, len(v.Peers), epoch, i, len(nodes))
		}
		if n := nodes[i]; n.Epoch() != epoch || n.Rank() != i || n.Size() != len(nodes) || n.Err() != nil {
			t.Errorf("node %d: Epoch %d Rank %d Size %d Err %v", i, n.Epoch(), n.Rank(), n.Size(), n.Err())
		}
		for p, peer := range v.Peers {
			if peer.ID != nodes[p].PeerID() {
				t.Errorf("node %d: peer %d is %s, want %s", i, p, peer.ID, nodes[p].PeerID())
			}
		}
		if got := lostRanks(v.Lost); !slices.Equal(got, lost) {
			t.Errorf("node %d: lost %v, want %v", i, got, lost)
		}
		if !slices.Equal(v.Joined, joined) {
			t.Errorf("node %d: joined %v, want %v", i, v.Joined, joined)
		}
	}
}

// TestElasticCrash: a member is killed while the others are blocked in
// transfers; each blocked transfer fails at once with a
// *MembershipChangeError naming it, the survivors re-form the ring in
// epoch 1 in their old order, data flows, and nothing of epoch 0 does.
func TestElasticCrash(t *testing.T) {
	for _, c := range []struct {
		kind   string
		hostID func(int) string
	}{{LinkShm, nil}, {LinkUnix, nil}, {LinkTCPTLS, otherHosts}} {
		t.Run(c.kind, func(t *testing.T) {
			j := startElastic(t, elasticOpts{size: 4, min: 2, hostID: c.hostID, noShm: c.kind == LinkUnix})
			oldTr := j.nodes[0].Mesh()
			// Blocked: rank 0 on a live peer, rank 1 on the victim, rank 3
			// sending to rank 0, which does not read from it.
			errs := make(chan error, 3)
			go func() { errs <- j.nodes[0].Mesh().RecvFrom(context.Background(), 1, make([]byte, 10)) }()
			go func() { errs <- j.nodes[1].Mesh().RecvFrom(context.Background(), 2, make([]byte, 10)) }()
			go func() {
				big := make([]byte, 1<<20)
				for {
					if err := j.nodes[3].Mesh().SendTo(context.Background(), 0, big); err != nil {
						errs <- err
						return
					}
				}
			}()
			start := time.Now()
			j.nodes[2].crash()
			for i := range 3 {
				select {
				case err := <-errs:
					mc := membershipErr(t, fmt.Sprintf("blocked transfer %d", i), err)
					if len(mc.Lost) != 1 || mc.Lost[0].Rank != 2 || mc.Lost[0].Cause != "disconnected" || mc.Epoch != 0 || mc.Next != 1 {
						t.Errorf("blocked transfer: %v", mc)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("a blocked transfer was not released by the crash")
				}
			}
			t.Logf("transfers released %v after the crash: %v", time.Since(start), j.nodes[0].Err())
			survivors := []*Node{j.nodes[0], j.nodes[1], j.nodes[3]}
			for _, n := range survivors {
				waitDone(t, n, 5*time.Second, "rank 2 (", "disconnected", "call Reconfigure to go on in epoch 1")
			}
			views := reconfigureAll(t, survivors)
			t.Logf("re-formed %v after the crash", time.Since(start))
			checkViews(t, views, survivors, 1, []int{2}, nil)
			exchange(t, survivors, []int{1, 1000, 300 << 10})
			meshExchange(t, survivors, []int{100, 70 << 10})
			if ch, n := j.changes.last(); n != 1 || ch.Epoch != 1 || ch.Size != 3 || !slices.Equal(lostRanks(ch.Lost), []int{2}) ||
				len(ch.Joined) != 0 || ch.Took <= 0 {
				t.Errorf("OnChange: %d calls, last %+v", n, ch)
			}
			// The old epoch's transport delivers nothing any more.
			if err := oldTr.SendTo(context.Background(), 1, []byte("old")); err == nil {
				t.Error("old epoch's SendTo succeeded")
			} else {
				membershipErr(t, "old SendTo", err)
			}
			if err := oldTr.RecvFrom(context.Background(), 3, make([]byte, 1)); err == nil {
				t.Error("old epoch's RecvFrom succeeded")
			}
			// A dial with epoch 0's proof is refused by an epoch-1 member.
			n1 := survivors[1]
			conn, err := net.Dial("unix", n1.data.unixName)
			if c.kind == LinkTCPTLS {
				conn, err = nil, errors.New("skip")
			}
			if err == nil {
				conn.SetDeadline(time.Now().Add(10 * time.Second))
				if ch, err := readMsg(conn); err == nil {
					writeMsg(conn, &msg{T: tDHello, Rank: 0, Link: 0, Nonce: make([]byte, nonceLen), Proof: dataProof(j.key, ch.Nonce, 0, 0, 0)})
					if m, err := readMsg(conn); err == nil {
						t.Fatalf("epoch-1 acceptor answered an epoch-0 hello with %q", m.T)
					}
				}
				conn.Close()
				waitLog(t, j.log, "link from membership epoch 0, this rank is in epoch 1")
			}
			exchange(t, survivors, []int{10})
		})
	}
}

// TestElasticFrozen: a frozen member is lost within the heartbeat bound;
// after it thaws it finds itself cut off (not in a new epoch).
func TestElasticFrozen(t *testing.T) {
	j := startElastic(t, elasticOpts{size: 3, min: 2, hb: 2 * time.Second})
	start := time.Now()
	j.nodes[1].freeze()
	survivors := []*Node{j.nodes[0], j.nodes[2]}
	for _, n := range survivors {
		waitDone(t, n, 2*time.Second+5*time.Second, "rank 1 (", "stopped responding: no heartbeat within 2s")
		membershipErr(t, "survivor", n.Err())
	}
	t.Logf("frozen member lost after %v", time.Since(start))
	views := reconfigureAll(t, survivors)
	checkViews(t, views, survivors, 1, []int{1}, nil)
	exchange(t, survivors, []int{1000, 300 << 10})

	frozen := j.nodes[1]
	frozen.unfreeze()
	waitDone(t, frozen, 10*time.Second, "rank 1: cut off from the rendezvous at "+j.rz.Addr(), "this rank stops")
	var co *CutOffError
	if !errors.As(frozen.Err(), &co) || co.Silence < 2*time.Second {
		t.Errorf("thawed member: %v, want a *CutOffError after >= 2s of silence", frozen.Err())
	}
	if _, err := frozen.Reconfigure(context.Background()); !errors.As(err, &co) {
		t.Errorf("Reconfigure of the cut-off member: %v", err)
	}
	t.Log(frozen.Err())
}

// TestElasticTwoCrash: two members killed at once; the survivors converge
// on one epoch without both.
func TestElasticTwoCrash(t *testing.T) {
	j := startElastic(t, elasticOpts{size: 4, min: 2})
	var wg sync.WaitGroup
	for _, r := range []int{1, 2} {
		wg.Add(1)
		go func() { defer wg.Done(); j.nodes[r].crash() }()
	}
	wg.Wait()
	survivors := []*Node{j.nodes[0], j.nodes[3]}
	for _, n := range survivors {
		waitDone(t, n, 10*time.Second)
		membershipErr(t, "survivor", n.Err())
	}
	views := reconfigureAll(t, survivors)
	epoch := j.rz.Epoch()
	if epoch != 1 && epoch != 2 {
		t.Errorf("rendezvous in epoch %d, want 1 or 2", epoch)
	}
	checkViews(t, views, survivors, epoch, []int{1, 2}, nil)
	exchange(t, survivors, []int{1000, 300 << 10})
}

// TestElasticCrashDuringReconfigure: a member is lost while the others
// wait for it to ack the next table: the rendezvous moves on to epoch 2
// and every Reconfigure follows.
func TestElasticCrashDuringReconfigure(t *testing.T) {
	j := startElastic(t, elasticOpts{size: 4, min: 2})
	j.nodes[3].crash()
	for _, n := range j.nodes[:3] {
		waitDone(t, n, 10*time.Second, "rank 3 (")
	}
	survivors := []*Node{j.nodes[0], j.nodes[1]}
	views := make(chan []View, 1)
	go func() { views <- reconfigureAll(t, survivors) }()
	// Ranks 0 and 1 acked epoch 1; rank 2 never will.
	eventually(t, 20*time.Second, "ranks 0 and 1 acked epoch 1", func() bool {
		j.rz.mu.Lock()
		defer j.rz.mu.Unlock()
		return j.rz.m.Epoch() == 1 && j.rz.m.Acked(1) == 2
	})
	j.nodes[2].crash()
	v := <-views
	checkViews(t, v, survivors, 2, []int{2, 3}, nil)
	exchange(t, survivors, []int{1000, 300 << 10})
	if ch, n := j.changes.last(); n != 1 || ch.Epoch != 2 || !slices.Equal(lostRanks(ch.Lost), []int{2, 3}) {
		t.Errorf("OnChange: %d calls, last %+v", n, ch)
	}
}

// TestElasticBelowMinJoiner: below MinSize the survivors wait; a joiner
// brings the job back to MinSize and it goes on.
func TestElasticBelowMinJoiner(t *testing.T) {
	j := startElastic(t, elasticOpts{size: 3, min: 3})
	j.nodes[1].crash()
	survivors := []*Node{j.nodes[0], j.nodes[2]}
	for _, n := range survivors {
		waitDone(t, n, 10*time.Second, "rank 1 (")
	}
	views := make(chan []View, 1)
	go func() { views <- reconfigureAll(t, survivors) }()
	waitLog(t, j.log, "waiting for 1 more member (--min-np 3), ")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := <-j.join(ctx); err != nil {
		t.Fatal(err)
	}
	joiner := j.joiner(0)
	v := <-views
	all := append(survivors, joiner)
	jv, _ := joiner.Reconfigure(ctx) // the current view
	checkViews(t, append(v, jv), all, 1, []int{1}, []int{2})
	exchange(t, all, []int{1000, 300 << 10})
	meshExchange(t, all, []int{100})
}

// TestElasticBelowMinAbort: nobody joins within WaitTimeout (longer than
// Timeout: members wait as long as the rendezvous says it waits): the job
// is aborted with a message saying so.
func TestElasticBelowMinAbort(t *testing.T) {
	j := startElastic(t, elasticOpts{size: 2, min: 2, wait: 6500 * time.Millisecond, timeout: 3 * time.Second})
	j.nodes[1].crash()
	waitDone(t, j.nodes[0], 10*time.Second, "rank 1 (")
	start := time.Now()
	_, err := j.nodes[0].Reconfigure(context.Background())
	waitLog(t, j.log, "rank 0: rendezvous: waiting for 1 more member (--min-np 2), ")
	want := "p2p: rank 0: job below --min-np 2 for 6.5s: 1 member left (rank 0 on "
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "after losing rank 1 (") {
		t.Fatalf("Reconfigure: %v, want %q", err, want)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("abort after %v", d)
	}
	select {
	case <-j.rz.AbortDelivered():
	case <-time.After(10 * time.Second):
		t.Error("rendezvous did not abort")
	}
	t.Log(err)
}

// TestElasticGrow: a joiner waits while the job runs; every member learns
// of it; once all call Grow, everyone (the joiner too) is in epoch 1.
func TestElasticGrow(t *testing.T) {
	j := startElastic(t, elasticOpts{size: 4, min: 2, max: 5})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Nobody waiting: Grow changes nothing.
	grow := func() []View {
		views := make([]View, 4)
		errs := make([]error, 4)
		var wg sync.WaitGroup
		for i, n := range j.nodes {
			wg.Add(1)
			go func() { defer wg.Done(); views[i], errs[i] = n.Grow(ctx) }()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		return views
	}
	checkViews(t, grow(), j.nodes, 0, nil, nil)
	exchange(t, j.nodes, []int{100})

	joined := j.join(ctx)
	eventually(t, 20*time.Second, "every member sees the pending joiner", func() bool {
		for _, n := range j.nodes {
			if n.PendingJoiners() != 1 {
				return false
			}
		}
		return true
	})
	// Still in epoch 0, links up.
	exchange(t, j.nodes, []int{100})
	views := grow()
	if err := <-joined; err != nil {
		t.Fatal(err)
	}
	joiner := j.joiner(0)
	all := append(slices.Clone(j.nodes), joiner)
	jv, err := joiner.Reconfigure(ctx)
	if err != nil {
		t.Fatal(err)
	}
	checkViews(t, append(views, jv), all, 1, nil, []int{4})
	exchange(t, all, []int{1000, 300 << 10})
	meshExchange(t, all, []int{100})
	if ch, n := j.changes.last(); n != 1 || ch.Epoch != 1 || ch.Size != 5 || len(ch.Joined) != 1 || ch.Joined[0].Rank != 4 || ch.Joined[0].ID != joiner.PeerID() {
		t.Errorf("OnChange: %d calls, last %+v", n, ch)
	}
	for _, n := range all {
		if n.PendingJoiners() != 0 {
			t.Errorf("rank %d: %d pending joiners after Grow", n.Rank(), n.PendingJoiners())
		}
	}
}

// TestElasticLinkBroken: a link breaks while both of its ends are alive:
// the rendezvous re-forms the ring with the same members.
func TestElasticLinkBroken(t *testing.T) {
	j := startElastic(t, elasticOpts{size: 3, min: 2})
	for _, l := range j.nodes[0].links.all {
		if l.peer == 1 {
			l.close()
		}
	}
	err := j.nodes[1].Mesh().RecvFrom(context.Background(), 0, make([]byte, 4))
	mc := membershipErr(t, "RecvFrom over the broken link", err)
	if len(mc.Lost) != 0 || !strings.Contains(mc.Reason, "the link between rank 1 and rank 0 broke") {
		t.Errorf("got %v", mc)
	}
	for _, n := range j.nodes {
		waitDone(t, n, 10*time.Second, "the link between rank 1 and rank 0 broke", "re-forming with the same members")
	}
	views := reconfigureAll(t, j.nodes)
	checkViews(t, views, j.nodes, 1, nil, nil)
	exchange(t, j.nodes, []int{1000, 300 << 10})
}

// TestElasticDataProofEpoch: a data-link proof binds the epoch; epoch 0's
// is the fixed-size job's.
func TestElasticDataProofEpoch(t *testing.T) {
	key, nonce := NewJobKey(), make([]byte, nonceLen)
	p0 := dataProof(key, nonce, 1, 2, 0)
	if !hmac.Equal(p0, mac(key, "gorun data", nonce, u64(1), u64(2))) {
		t.Error("epoch 0 proof differs from the fixed-size job's")
	}
	for _, e := range []int{1, 2} {
		if hmac.Equal(p0, dataProof(key, nonce, 1, 2, e)) || hmac.Equal(dataOKProof(key, nonce, 1, 2, 0), dataOKProof(key, nonce, 1, 2, e)) {
			t.Errorf("epoch %d proof equals epoch 0's", e)
		}
	}
	if hmac.Equal(dataProof(key, nonce, 1, 2, 1), dataProof(key, nonce, 1, 2, 2)) {
		t.Error("epochs 1 and 2 share a proof")
	}
}

// TestElasticHeartbeatUnderLoad: with busy CPUs (twice as many spinning
// goroutines as Ps, under -race, on a machine shared with others) and big
// transfers on every link, no member is taken for lost with the default
// heartbeat bound. (Measured: pings, due every 750 ms, arrive up to ~0.3 s
// late here; at a bound of 1.5 s a false alarm was seen once.)
func TestElasticHeartbeatUnderLoad(t *testing.T) {
	j := startElastic(t, elasticOpts{size: 4, min: 2, hb: defaultHeartbeatTimeout})
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) * 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := 0
			for !stop.Load() {
				x++
			}
			_ = x
		}()
	}
	deadline := time.Now().Add(2*defaultHeartbeatTimeout + time.Second)
	rounds := 0
	for time.Now().Before(deadline) && !t.Failed() {
		exchange(t, j.nodes, []int{4 << 20, 1, 1 << 20})
		rounds++
	}
	stop.Store(true)
	wg.Wait()
	for _, n := range j.nodes {
		if n.Err() != nil || n.Epoch() != 0 {
			t.Errorf("rank %d: epoch %d, Err %v", n.Rank(), n.Epoch(), n.Err())
		}
	}
	t.Logf("%d rounds of 5 MiB per rank, no false alarm", rounds)
}

// TestJoinerRefusedByFixedJob: a joiner can not join a job that is not
// elastic, and says why.
func TestJoinerRefusedByFixedJob(t *testing.T) {
	j := startJob(t, jobOpts{size: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := Join(ctx, Config{Rank: -1, JobKey: j.key, Rendezvous: j.rz.Addr(), Timeout: 10 * time.Second, Elastic: true})
	if err == nil {
		n.Close()
		t.Fatal("a joiner joined a fixed-size job")
	}
	if !strings.Contains(err.Error(), "this job is not elastic") {
		t.Errorf("joiner: %v", err)
	}
	// Nor can an elastic member join it, nor a fixed-size member an
	// elastic job, nor a member with another heartbeat bound.
	cfg := Config{Rank: 0, Size: 2, JobKey: j.key, Rendezvous: j.rz.Addr(), Timeout: 10 * time.Second, Elastic: true}
	if _, err := Join(ctx, cfg); err == nil || !strings.Contains(err.Error(), "this job is not elastic") {
		t.Errorf("elastic member in a fixed-size job: %v", err)
	}
	ej := startElastic(t, elasticOpts{size: 1})
	fixed := ej.config(0)
	fixed.Elastic = false
	if _, err := Join(ctx, fixed); err == nil || !strings.Contains(err.Error(), "this job is elastic: join it with Config.Elastic") {
		t.Errorf("fixed-size member in an elastic job: %v", err)
	}
	other := ej.config(-1)
	other.HeartbeatTimeout = 5 * time.Second
	if _, err := Join(ctx, other); err == nil || !strings.Contains(err.Error(), "heartbeat bound 5s differs from the job's 2s") {
		t.Errorf("joiner with another heartbeat bound: %v", err)
	}
	exchange(t, j.nodes, []int{100})
}

// TestElasticCloseDuringReconfigure: a member that closes instead of
// re-forming counts as lost, and the others go on without it.
func TestElasticCloseDuringReconfigure(t *testing.T) {
	j := startElastic(t, elasticOpts{size: 3, min: 1})
	j.nodes[2].crash()
	for _, n := range j.nodes[:2] {
		waitDone(t, n, 10*time.Second, "rank 2 (")
	}
	views := make(chan []View, 1)
	go func() { views <- reconfigureAll(t, j.nodes[:1]) }()
	if err := j.nodes[1].Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	v := <-views
	checkViews(t, v, j.nodes[:1], j.rz.Epoch(), []int{1, 2}, nil)
	if e := j.rz.Epoch(); e != 2 {
		t.Errorf("epoch %d, want 2", e)
	}
	if !strings.Contains(fmt.Sprint(j.nodes[0].cur.Load().view.Lost), "closed during a reconfiguration") {
		t.Errorf("lost: %v", j.nodes[0].cur.Load().view.Lost)
	}
}

// TestElasticLinkUnreachable: a link breaks, and in the re-formed epoch the
// member at its end can not be reached at all: it is dropped (and told),
// and the others go on without it.
func TestElasticLinkUnreachable(t *testing.T) {
	j := startElastic(t, elasticOpts{size: 3, min: 2})
	for _, l := range j.nodes[0].links.all {
		if l.peer == 1 {
			l.close()
		}
	}
	membershipErr(t, "RecvFrom over the broken link", j.nodes[1].Mesh().RecvFrom(context.Background(), 0, make([]byte, 4)))
	for _, n := range j.nodes {
		waitDone(t, n, 10*time.Second, "re-forming with the same members")
	}
	j.nodes[1].data.unixLn.Close() // rank 0 can not dial rank 1 any more
	dropped := make(chan error, 1)
	go func() {
		_, err := j.nodes[1].Reconfigure(context.Background())
		dropped <- err
	}()
	survivors := []*Node{j.nodes[0], j.nodes[2]}
	views := reconfigureAll(t, survivors)
	checkViews(t, views, survivors, 2, []int{1}, nil)
	if l := views[0].Lost; len(l) != 1 || !strings.Contains(l[0].Cause, "unreachable: rank 0 could not set up its link with it again") {
		t.Errorf("lost: %v", l)
	}
	exchange(t, survivors, []int{1000, 300 << 10})
	err := <-dropped
	if err == nil || !strings.HasPrefix(err.Error(), "rank 1: dropped from the job in membership epoch 1: rank 0 could not set up its link with it") {
		t.Errorf("dropped member's Reconfigure: %v", err)
	}
}

// TestElasticDepart: a member that departs at a commit boundary (where the
// others call Grow) is let go, the others form the next epoch without it
// (admitting a waiting joiner in the same change) and the departed node's
// Close announces nothing the others act on.
func TestElasticDepart(t *testing.T) {
	j := startElastic(t, elasticOpts{size: 4, min: 2, max: 5})
	var procs []ProcEvent
	var pmu sync.Mutex
	j.rz.mu.Lock() // OnProc is called under it
	j.rz.cfg.OnProc = func(ev ProcEvent) { pmu.Lock(); procs = append(procs, ev); pmu.Unlock() }
	j.rz.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	joined := j.join(ctx)
	eventually(t, 20*time.Second, "every member sees the pending joiner", func() bool {
		for _, n := range j.nodes {
			if n.PendingJoiners() != 1 {
				return false
			}
		}
		return true
	})
	const leaver = 1
	views := make([]View, 4)
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for i, n := range j.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i == leaver {
				errs[i] = n.Depart(ctx, "SIGTERM")
				return
			}
			views[i], errs[i] = n.Grow(ctx)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if err := <-joined; err != nil {
		t.Fatal(err)
	}
	var le *LeftError
	if err := j.nodes[leaver].Err(); !errors.Is(err, ErrLeft) || !errors.As(err, &le) || le.Why != "SIGTERM" || le.Rank != leaver {
		t.Errorf("the departed node's Err: %v, want a *LeftError of rank %d for SIGTERM", err, leaver)
	}
	joiner := j.joiner(0)
	jv, err := joiner.Reconfigure(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rest := []*Node{j.nodes[0], j.nodes[2], j.nodes[3], joiner}
	vs := []View{views[0], views[2], views[3], jv}
	for i, v := range vs {
		if v.Epoch != 1 || v.Size != 4 || v.Rank != i {
			t.Errorf("member %d: view %+v, want rank %d of 4 in epoch 1", i, v, i)
		}
	}
	for _, v := range vs[:3] {
		if len(v.Lost) != 1 || v.Lost[0].Rank != leaver || !v.Lost[0].Left || v.Lost[0].Cause != "left the job (SIGTERM)" {
			t.Errorf("rank %d: lost %+v, want rank %d, left the job (SIGTERM)", v.Rank, v.Lost, leaver)
		}
	}
	exchange(t, rest, []int{100, 300 << 10})
	if ch, n := j.changes.last(); n != 1 || ch.Size != 4 || len(ch.Lost) != 1 || !ch.Lost[0].Left || len(ch.Joined) != 1 {
		t.Errorf("OnChange: %d calls, last %+v", n, ch)
	}
	// Its Close tells the others nothing: they go on exchanging.
	if err := j.nodes[leaver].Close(); err != nil {
		t.Errorf("closing the departed node: %v", err)
	}
	exchange(t, rest, []int{100})
	for _, n := range rest {
		if err := n.Err(); err != nil {
			t.Errorf("rank %d after the leaver closed: %v", n.Rank(), err)
		}
	}
	pmu.Lock()
	defer pmu.Unlock()
	if len(procs) != 1 || procs[0].Kind != ProcDeparted || procs[0].Cause != "SIGTERM" || procs[0].Member.Rank != leaver || procs[0].Members != 3 {
		t.Errorf("OnProc: %+v, want one ProcDeparted of rank %d for SIGTERM, 3 members left", procs, leaver)
	}
}

// TestElasticJoinerArgs: a joiner whose program arguments differ from the
// job's is refused, naming both; one with the same arguments is admitted.
func TestElasticJoinerArgs(t *testing.T) {
	j := startElastic(t, elasticOpts{size: 2, min: 1, max: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := j.config(-1)
	cfg.Args = []string{"--epochs", "10"}
	n, err := Join(ctx, cfg)
	if err == nil {
		n.Close()
		t.Fatal("a joiner with other arguments was admitted")
	}
	if want := `its program arguments ["--epochs" "10"] differ from those the job's ranks started with, [`; !strings.Contains(err.Error(), want) {
		t.Errorf("refusal: %v\nwant it to contain %q", err, want)
	}
	for _, n := range j.nodes {
		if err := n.Err(); err != nil {
			t.Errorf("rank %d after the refusal: %v", n.Rank(), err)
		}
	}
	joined := j.join(ctx)
	eventually(t, 20*time.Second, "the members see the joiner with the job's arguments", func() bool {
		return j.nodes[0].PendingJoiners() == 1 && j.nodes[1].PendingJoiners() == 1
	})
	var wg sync.WaitGroup
	for _, n := range j.nodes {
		wg.Add(1)
		go func() { defer wg.Done(); n.Grow(ctx) }()
	}
	wg.Wait()
	if err := <-joined; err != nil {
		t.Fatal(err)
	}
}

// TestElasticEarlyJoinerArgs: a joiner that registers before the job's
// ranks (its arguments could not be compared yet) is refused once they
// have, when its arguments differ from theirs.
func TestElasticEarlyJoinerArgs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key, log := NewJobKey(), &logRec{}
	rz, err := StartRendezvous(ctx, RendezvousConfig{ListenAddr: "127.0.0.1:0", Size: 2, JobKey: key, Logf: log.logf,
		Elastic: &ElasticConfig{MinSize: 1, MaxSize: 3, HeartbeatTimeout: 2 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	defer rz.Close()
	cfg := func(rank int, args ...string) Config {
		return Config{Rank: rank, Size: 2, JobKey: key, Rendezvous: rz.Addr(), Timeout: 20 * time.Second, Logf: log.logf,
			Elastic: true, HeartbeatTimeout: 2 * time.Second, Args: args}
	}
	joined := make(chan error, 1)
	go func() {
		n, err := Join(ctx, cfg(-1, "--epochs", "10"))
		if n != nil {
			n.Close()
		}
		joined <- err
	}()
	eventually(t, 20*time.Second, "the joiner registered", func() bool {
		rz.mu.Lock()
		defer rz.mu.Unlock()
		return rz.m.PendingJoiners() == 1
	})
	nodes := make([]*Node, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); nodes[r], errs[r] = Join(ctx, cfg(r, "--epochs", "30")) }()
	}
	wg.Wait()
	defer func() { // concurrently: a clean Close waits for its peers' side of the links
		var cw sync.WaitGroup
		for _, n := range nodes {
			if n != nil {
				cw.Add(1)
				go func() { defer cw.Done(); n.Close() }()
			}
		}
		cw.Wait()
	}()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-joined:
		if want := `its program arguments ["--epochs" "10"] differ from those the job's ranks started with, ["--epochs" "30"]`; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("the early joiner: %v, want it refused saying %s", err, want)
		}
	case <-ctx.Done():
		t.Fatal("the early joiner was neither admitted nor refused")
	}
	for _, n := range nodes {
		if n.PendingJoiners() != 0 {
			t.Errorf("rank %d: %d pending joiners", n.Rank(), n.PendingJoiners())
		}
	}
}
