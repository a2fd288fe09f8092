package etcdlog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/gorun/gorun/membership"
)

// Config configures a Log.
type Config struct {
	// Endpoints are the etcd cluster's client addresses, "host:port".
	Endpoints []string
	// Job is the rendezvous id that every process of the job shares: its
	// keys are under /gorun/<Job>/.
	Job string
	// ID is this replica's id, not 0; Addr the "host:port" where the
	// ranks reach it.
	ID   uint64
	Addr string
	// Candidate: this replica stands for leader. Otherwise it only
	// applies the log (a launcher that reports what happens).
	Candidate bool
	// TTL is how long the replica's session outlives the process' last
	// word to etcd: a leader killed is replaced after it. It is rounded
	// up to whole seconds, and to at least MinTTL.
	TTL time.Duration
	// CallTimeout bounds each etcd call; 0 = 5 s.
	CallTimeout time.Duration
	Membership  membership.Config
	// Logf, if set, says what happens to the replica's session; it must
	// not block (it is called with no lock held, but on the paths that
	// keep the session alive).
	Logf func(string, ...any)
}

// MinTTL is the shortest session a replica keeps: etcd's own leader
// election (a second by default) must fit in it with room to spare, or
// the loss of an etcd member would end every replica's session.
const MinTTL = 3 * time.Second

// Applied is what one log entry did: the actions its Step returned, which
// the leader carries out and the others only note.
type Applied struct {
	Index   uint64 // its place in the log
	At      time.Time
	Event   membership.Event
	Actions []membership.Action
}

// Ready is what a Log asks of its caller: on the leader, carry out the
// Applied events' actions in order.
type Ready struct {
	Applied []Applied
	Leader  bool // this replica leads (as of this Ready)
	// GroupChanged: a replica registered or went (see Replicas).
	GroupChanged bool
}

// ErrNotLeader: Propose on a replica that does not lead.
var ErrNotLeader = errors.New("etcdlog: this replica does not lead")

// Log is one replica of a job's membership kept in etcd.
type Log struct {
	cfg      Config
	pfx      string
	client   *clientv3.Client
	m        *membership.Machine // Stepped only by Ready
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	stopOnce sync.Once

	changed  chan struct{} // a Ready has something (cap 1)
	appendCh chan struct{} // a proposal is queued (cap 1)
	resignCh chan struct{} // Resign asked (cap 1)

	mu           sync.Mutex
	pending      []entry // received, not yet applied, in index order
	received     uint64  // the highest index received
	candidates   map[string]candidate
	replicas     map[uint64]string
	groupChanged bool
	lease        clientv3.LeaseID
	myKey        string // this replica's election key ("": none now)
	myRev        int64  // its create revision
	// term counts the changes of myKey: a leader whose term changed may
	// have lost proposals (Ready then reports a step down).
	term       uint64
	leadTerm   uint64 // the term Ready last reported leading in
	leading    bool   // as the last Ready said
	appendNext uint64 // the index the leader appends next
	queue      [][]byte
	err        error // the watch can not go on (Ready returns it)
}

type entry struct {
	index uint64
	data  []byte
}

type candidate struct {
	rev  int64
	id   uint64
	addr string
}

// Start connects to etcd, registers the replica and starts following the
// job's log. It fails, within CallTimeout, if etcd does not answer.
func Start(ctx context.Context, cfg Config) (*Log, error) {
	if cfg.ID == 0 {
		return nil, errors.New("etcdlog: replica id 0")
	}
	if err := CheckJob(cfg.Job); err != nil {
		return nil, fmt.Errorf("etcdlog: %w", err)
	}
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("etcdlog: no etcd endpoints")
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = 5 * time.Second
	}
	cfg.TTL = max(cfg.TTL, MinTTL)
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	client, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: cfg.CallTimeout,
		DialKeepAliveTime: cfg.CallTimeout, DialKeepAliveTimeout: cfg.CallTimeout, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcdlog: etcd at %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}
	lctx, cancel := context.WithCancel(context.Background())
	l := &Log{cfg: cfg, pfx: "/gorun/" + cfg.Job + "/", client: client, m: membership.New(cfg.Membership),
		ctx: lctx, cancel: cancel, changed: make(chan struct{}, 1), appendCh: make(chan struct{}, 1), resignCh: make(chan struct{}, 1),
		candidates: map[string]candidate{}, replicas: map[uint64]string{}}
	fail := func(err error) (*Log, error) {
		cancel()
		client.Close()
		return nil, fmt.Errorf("etcdlog: etcd at %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}
	// What the job's keys hold now: the watch goes on from there.
	gctx, gcancel := context.WithTimeout(ctx, cfg.CallTimeout)
	resp, err := client.Get(gctx, l.pfx, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	gcancel()
	if err != nil {
		return fail(fmt.Errorf("could not read the job's keys within %v: %w", cfg.CallTimeout, err))
	}
	for _, kv := range resp.Kvs {
		if err := l.takeLocked(string(kv.Key), kv.Value, kv.CreateRevision, false); err != nil {
			return fail(err)
		}
	}
	if err := l.join(ctx); err != nil {
		return fail(err)
	}
	l.wg.Add(3)
	go l.watch(resp.Header.Revision + 1)
	go l.keepSession()
	go l.appendLoop()
	return l, nil
}

func (l *Log) logKey(index uint64) string { return fmt.Sprintf("%slog/%020d", l.pfx, index) }

func (l *Log) signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// join takes a new session and registers the replica (and its candidacy)
// under it; each call is bounded by CallTimeout.
func (l *Log) join(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, l.cfg.CallTimeout)
	defer cancel()
	grant, err := l.client.Grant(cctx, int64(math.Ceil(l.cfg.TTL.Seconds())))
	if err != nil {
		return fmt.Errorf("could not start a session within %v: %w", l.cfg.CallTimeout, err)
	}
	id := grant.ID
	if _, err := l.client.Put(cctx, l.pfx+"replicas/"+strconv.FormatUint(l.cfg.ID, 10), l.cfg.Addr, clientv3.WithLease(id)); err != nil {
		return fmt.Errorf("could not register replica %d within %v: %w", l.cfg.ID, l.cfg.CallTimeout, err)
	}
	l.mu.Lock()
	l.lease = id
	l.mu.Unlock()
	if l.cfg.Candidate {
		return l.stand(cctx, id)
	}
	return nil
}

// stand puts this replica's election key, behind those already there.
func (l *Log) stand(ctx context.Context, lease clientv3.LeaseID) error {
	key := fmt.Sprintf("%sleader/%016x", l.pfx, int64(lease))
	val := strconv.FormatUint(l.cfg.ID, 10) + " " + l.cfg.Addr
	resp, err := l.client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, val, clientv3.WithLease(lease))).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return fmt.Errorf("could not stand for leader within %v: %w", l.cfg.CallTimeout, err)
	}
	rev := resp.Header.Revision
	if !resp.Succeeded {
		rev = resp.Responses[0].GetResponseRange().Kvs[0].CreateRevision
	}
	l.mu.Lock()
	l.setKeyLocked(key, rev)
	l.mu.Unlock()
	return nil
}

// setKeyLocked records this replica's election key ("": it does not stand
// now), in a new term.
func (l *Log) setKeyLocked(key string, rev int64) {
	l.myKey, l.myRev = key, rev
	l.term++
}

// keepSession keeps the replica's lease alive, and when it ends (etcd
// unreachable for longer than the TTL: it expired) takes a new one and
// registers again, behind the other candidates. Resign stands again at
// once, behind the others.
func (l *Log) keepSession() {
	defer l.wg.Done()
	for {
		l.mu.Lock()
		lease := l.lease
		l.mu.Unlock()
		if lease != 0 {
			// The keep-alive channel closes when the lease can not be
			// renewed before it expires (etcd unreachable for the TTL).
			kctx, kcancel := context.WithCancel(l.ctx)
			ka, err := l.client.KeepAlive(kctx, lease)
			if err == nil {
				resigned := false
			drain:
				for {
					select {
					case <-l.ctx.Done():
						kcancel()
						return
					case _, ok := <-ka:
						if !ok {
							break drain
						}
					case <-l.resignCh:
						resigned = true
						break drain
					}
				}
				kcancel()
				if resigned {
					l.resign(lease)
					continue
				}
				if l.ctx.Err() == nil && l.leaseOutlived(lease) {
					continue
				}
				l.cfg.Logf("etcdlog: replica %d lost its etcd session (etcd unreachable for %v); it registers again", l.cfg.ID, l.cfg.TTL)
			} else {
				kcancel()
			}
		}
		l.mu.Lock()
		old := l.lease
		l.lease = 0
		l.setKeyLocked("", 0)
		l.mu.Unlock()
		l.signal(l.changed)
		if old != 0 {
			// The lease may still live on the server (etcd answered
			// again just too late): its keys must go now, not after
			// their TTL, or this replica's new candidacy would queue
			// behind its own old one.
			cctx, cancel := context.WithTimeout(l.ctx, l.cfg.CallTimeout)
			_, _ = l.client.Revoke(cctx, old)
			cancel()
		}
		for delay := 50 * time.Millisecond; ; delay = min(2*delay, time.Second) {
			if l.ctx.Err() != nil {
				return
			}
			err := l.join(l.ctx)
			if err == nil {
				break
			}
			l.cfg.Logf("etcdlog: replica %d: %v; retrying", l.cfg.ID, err)
			t := time.NewTimer(delay)
			select {
			case <-l.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

// leaseOutlived, after the client gave up renewing lease (no answer from
// etcd for its TTL), asks etcd whether it still holds it: etcd's new
// leader, after losing the old one, extends every lease, so a replica
// that was cut off only by etcd's own election keeps its keys and its
// place in the election's line, and goes on with the same lease. It
// does not stand meanwhile (Ready reports a step down). It asks for at
// most the TTL; false: the lease is gone, or etcd did not answer.
func (l *Log) leaseOutlived(lease clientv3.LeaseID) bool {
	l.mu.Lock()
	key, rev := l.myKey, l.myRev
	l.setKeyLocked("", 0)
	l.mu.Unlock()
	l.signal(l.changed)
	deadline := time.Now().Add(l.cfg.TTL)
	for delay := 50 * time.Millisecond; time.Now().Before(deadline); delay = min(2*delay, 500*time.Millisecond) {
		cctx, cancel := context.WithDeadline(l.ctx, deadline)
		resp, err := l.client.TimeToLive(cctx, lease)
		cancel()
		if err == nil {
			if resp.TTL <= 0 {
				return false
			}
			l.mu.Lock()
			l.setKeyLocked(key, rev)
			l.mu.Unlock()
			l.signal(l.changed)
			l.cfg.Logf("etcdlog: replica %d kept its etcd session through an etcd outage", l.cfg.ID)
			return true
		}
		t := time.NewTimer(delay)
		select {
		case <-l.ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
	return false
}

// resign puts this replica's candidacy behind the others': the next
// candidate leads at once.
func (l *Log) resign(lease clientv3.LeaseID) {
	l.mu.Lock()
	key := l.myKey
	l.setKeyLocked("", 0)
	l.mu.Unlock()
	l.signal(l.changed)
	if key == "" {
		return
	}
	cctx, cancel := context.WithTimeout(l.ctx, l.cfg.CallTimeout)
	defer cancel()
	if _, err := l.client.Delete(cctx, key); err != nil {
		l.cfg.Logf("etcdlog: replica %d could not resign: %v", l.cfg.ID, err)
		return
	}
	if err := l.stand(cctx, lease); err != nil {
		l.cfg.Logf("etcdlog: replica %d: %v", l.cfg.ID, err)
	}
}

// watch follows the job's keys from revision rev, restarting the watch
// (from the next revision) when it breaks.
func (l *Log) watch(rev int64) {
	defer l.wg.Done()
	for delay := 50 * time.Millisecond; l.ctx.Err() == nil; {
		// RequireLeader: a member cut off from its cluster ends the
		// watch rather than going quiet; the client then resumes
		// through another member.
		wch := l.client.Watch(clientv3.WithRequireLeader(l.ctx), l.pfx, clientv3.WithPrefix(), clientv3.WithRev(rev))
		for resp := range wch {
			if err := resp.Err(); err != nil {
				if resp.CompactRevision != 0 {
					l.fail(fmt.Errorf("etcdlog: the job's log was compacted past revision %d, which replica %d had not read", rev, l.cfg.ID))
					return
				}
				break
			}
			l.mu.Lock()
			var err error
			for _, ev := range resp.Events {
				del := ev.Type == clientv3.EventTypeDelete
				if err = l.takeLocked(string(ev.Kv.Key), ev.Kv.Value, ev.Kv.CreateRevision, del); err != nil {
					break
				}
				rev = ev.Kv.ModRevision + 1
			}
			l.mu.Unlock()
			if err != nil {
				l.fail(err)
				return
			}
			l.signal(l.changed)
			delay = 50 * time.Millisecond
		}
		t := time.NewTimer(delay)
		select {
		case <-l.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(2*delay, time.Second)
	}
}

func (l *Log) fail(err error) {
	l.mu.Lock()
	if l.err == nil {
		l.err = err
	}
	l.mu.Unlock()
	l.signal(l.changed)
}

// takeLocked takes one key of the job as the watch (or the first read)
// gives it.
func (l *Log) takeLocked(key string, val []byte, createRev int64, deleted bool) error {
	rest, ok := strings.CutPrefix(key, l.pfx)
	if !ok {
		return nil
	}
	kind, name, _ := strings.Cut(rest, "/")
	switch kind {
	case "log":
		if deleted {
			return nil
		}
		index, err := strconv.ParseUint(name, 10, 64)
		if err != nil {
			return fmt.Errorf("etcdlog: bad log key %q", key)
		}
		switch {
		case index <= l.received:
			return nil // read first, then seen again by the watch
		case index != l.received+1:
			return fmt.Errorf("etcdlog: the job's log jumps from entry %d to %d", l.received, index)
		}
		l.pending = append(l.pending, entry{index: index, data: bytes.Clone(val)})
		l.received = index
	case "leader":
		if deleted {
			delete(l.candidates, key)
			return nil
		}
		idText, addr, _ := strings.Cut(string(val), " ")
		id, err := strconv.ParseUint(idText, 10, 64)
		if err != nil {
			return fmt.Errorf("etcdlog: bad election value %q under %q", val, key)
		}
		l.candidates[key] = candidate{rev: createRev, id: id, addr: addr}
	case "replicas":
		id, err := strconv.ParseUint(name, 10, 64)
		if err != nil {
			return fmt.Errorf("etcdlog: bad replica key %q", key)
		}
		if deleted {
			delete(l.replicas, id)
		} else {
			l.replicas[id] = string(val)
		}
		l.groupChanged = true
	}
	return nil
}

// leaderLocked is the candidate whose key is the oldest (its election key;
// "": none).
func (l *Log) leaderLocked() (string, candidate) {
	var key string
	var best candidate
	for k, c := range l.candidates {
		if key == "" || c.rev < best.rev {
			key, best = k, c
		}
	}
	return key, best
}

// Leader returns the id of the replica that leads, as this replica knows
// (0: none).
func (l *Log) Leader() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, c := l.leaderLocked()
	return c.id
}

// Replicas returns every registered replica by id, with its address.
func (l *Log) Replicas() map[uint64]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.replicas)
}

// CandidateIDs returns the replicas that stand for leader, sorted.
func (l *Log) CandidateIDs() []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ids []uint64
	for _, c := range l.candidates {
		if !slices.Contains(ids, c.id) {
			ids = append(ids, c.id)
		}
	}
	slices.Sort(ids)
	return ids
}

// ID is this replica's id.
func (l *Log) ID() uint64 { return l.cfg.ID }

// Machine returns the replica's membership, to read (never Step) between
// calls of Ready.
func (l *Log) Machine() *membership.Machine { return l.m }

// Changed fires when Ready may have something.
func (l *Log) Changed() <-chan struct{} { return l.changed }

// Propose queues ev, which happened at time at, for the log; it never
// blocks. Only the leader proposes; a proposal that the leader loses its
// lead with is dropped (it never shows in Ready): the proposer proposes
// again if it still matters, as with raft.
func (l *Log) Propose(at time.Time, ev membership.Event) error {
	b, err := membership.Encode(at, ev)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.leading {
		return ErrNotLeader
	}
	l.queue = append(l.queue, b)
	l.signal(l.appendCh)
	return nil
}

// Ready applies the entries received since the last call to the
// membership, in order, and returns what they did.
func (l *Log) Ready() (Ready, error) {
	l.mu.Lock()
	if l.err != nil {
		err := l.err
		l.mu.Unlock()
		return Ready{}, err
	}
	pend := l.pending
	l.pending = nil
	changed := l.groupChanged
	l.groupChanged = false
	key, _ := l.leaderLocked()
	leading := key != "" && key == l.myKey
	if leading && l.leading && l.leadTerm != l.term {
		// It lost its key for a while (etcd unreachable) and got it
		// back: what it proposed meanwhile was dropped, so it steps down
		// for this Ready (its ranks reconnect, and send again what
		// matters) and leads again in the next.
		leading = false
		l.signal(l.changed)
	}
	if leading && !l.leading {
		// Every entry of the previous leader came before its key went
		// (one watch, in revision order): the log goes on after them.
		l.appendNext = l.received + 1
		l.leadTerm = l.term
	}
	if !leading {
		l.queue = nil
	}
	l.leading = leading
	l.mu.Unlock()
	out := Ready{Leader: leading, GroupChanged: changed}
	for _, e := range pend {
		at, ev, err := membership.Decode(e.data)
		if err != nil {
			return Ready{}, fmt.Errorf("etcdlog: replica %d: entry %d: %w", l.cfg.ID, e.index, err)
		}
		out.Applied = append(out.Applied, Applied{Index: e.index, At: at, Event: ev, Actions: l.m.Step(at, ev)})
	}
	if leading {
		l.signal(l.appendCh)
	}
	return out, nil
}

// appendLoop appends the leader's proposals to the log, one at a time, in
// order.
func (l *Log) appendLoop() {
	defer l.wg.Done()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-l.appendCh:
		}
		for {
			l.mu.Lock()
			if !l.leading || len(l.queue) == 0 || l.myKey == "" || l.term != l.leadTerm {
				l.mu.Unlock()
				break
			}
			b, index, key, rev, term := l.queue[0], l.appendNext, l.myKey, l.myRev, l.term
			l.mu.Unlock()
			res := l.append(index, b, key, rev, term)
			l.mu.Lock()
			if l.term == term && l.appendNext == index {
				switch res {
				case appended:
					l.queue = l.queue[1:]
					l.appendNext++
				case indexTaken:
					l.appendNext++
				case deposed:
					l.queue = nil
				}
			}
			l.mu.Unlock()
		}
	}
}

// appendResult is what became of one append.
type appendResult int

const (
	appended appendResult = iota
	// indexTaken: this replica still holds its key, and an entry of its
	// own is at the index: one it appended in an earlier term with the
	// same key (etcd unreachable for a while, then its key kept), which
	// it had not received back when it led again. The entry goes at the
	// next index.
	indexTaken
	// deposed: its key is gone (or etcd did not answer before it
	// stopped leading): the proposal is dropped.
	deposed
)

// append puts entry index, as long as this replica's election key is the
// one it created, and the index is free. It tries again after an error
// that leaves the outcome unknown (an etcd member lost mid-call): the
// conditions make a second try harmless, and an entry already there with
// the same bytes is this one.
func (l *Log) append(index uint64, b []byte, key string, rev int64, term uint64) appendResult {
	lk := l.logKey(index)
	for delay := 20 * time.Millisecond; ; delay = min(2*delay, 500*time.Millisecond) {
		cctx, cancel := context.WithTimeout(l.ctx, l.cfg.CallTimeout)
		resp, err := l.client.Txn(cctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev), clientv3.Compare(clientv3.CreateRevision(lk), "=", 0)).
			Then(clientv3.OpPut(lk, string(b))).Else(clientv3.OpGet(lk), clientv3.OpGet(key)).Commit()
		cancel()
		if err == nil {
			if resp.Succeeded {
				return appended
			}
			entry := resp.Responses[0].GetResponseRange().Kvs
			if len(entry) == 1 && bytes.Equal(entry[0].Value, b) {
				return appended
			}
			if mine := resp.Responses[1].GetResponseRange().Kvs; len(mine) == 1 && mine[0].CreateRevision == rev {
				return indexTaken
			}
			l.cfg.Logf("etcdlog: replica %d no longer leads: entry %d not appended", l.cfg.ID, index)
			return deposed
		}
		l.mu.Lock()
		still := l.leading && l.term == term
		l.mu.Unlock()
		if !still || l.ctx.Err() != nil {
			return deposed
		}
		t := time.NewTimer(delay)
		select {
		case <-l.ctx.Done():
			t.Stop()
			return deposed
		case <-t.C:
		}
	}
}

// Resign hands the lead on: this replica stands again behind the other
// candidates, so the next one leads at once. It does not block.
func (l *Log) Resign() { l.signal(l.resignCh) }

// Close stops the replica and ends its session: its keys go at once, and
// another candidate leads without waiting for the TTL. Bounded by
// CallTimeout.
func (l *Log) Close() error {
	var err error
	l.stopOnce.Do(func() {
		l.cancel()
		l.wg.Wait()
		l.mu.Lock()
		lease := l.lease
		l.mu.Unlock()
		if lease != 0 {
			cctx, cancel := context.WithTimeout(context.Background(), l.cfg.CallTimeout)
			_, err = l.client.Revoke(cctx, lease)
			cancel()
		}
		l.client.Close()
	})
	return err
}

// Abandon stops the replica without a word to etcd, as a killed process
// does: its session ends when its TTL runs out.
func (l *Log) Abandon() {
	l.stopOnce.Do(func() {
		l.cancel()
		l.wg.Wait()
		l.client.Close()
	})
}
