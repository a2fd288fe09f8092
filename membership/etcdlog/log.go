package etcdlog

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"slices"
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
	// TLS, if set, is how to reach a cluster that serves TLS.
	TLS *tls.Config
	// CallTimeout bounds each etcd call; 0 = 5 s.
	CallTimeout time.Duration
	Membership  membership.Config
	// Logf, if set, says what happens to the replica's session; it must
	// not block (it is called with no lock held, but on the paths that
	// keep the session alive).
	Logf func(string, ...any)
}

// MinTTL is the shortest session a replica keeps: etcd's own leader
// election (one to two election timeouts, 1-2 s by default) must fit in
// it with room to spare, or the loss of an etcd member would end every
// replica's session (see renewEvery).
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
	term uint64
	// unsure: etcd did not answer the lease's renewals for the TTL, and
	// the replica waits to learn whether its lease (and key) outlived
	// that; it does not lead meanwhile, but keeps its proposals.
	unsure     bool
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
	client, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: cfg.CallTimeout, TLS: cfg.TLS,
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
		if why := tlsProblem(cfg.Endpoints, cfg.TLS); why != nil {
			err = why
		}
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
	leading := key != "" && key == l.myKey && !l.unsure
	if leading && l.leading && l.leadTerm != l.term {
		// Its key changed since it last led (it resigned, or lost its
		// session, and stood again) and it leads again, between two
		// Readys: what it proposed meanwhile was dropped, so it steps down
		// for this Ready (its ranks reconnect, and send again what
		// matters) and leads again in the next.
		leading = false
		l.signal(l.changed)
	}
	if leading && !l.leading && l.leadTerm != l.term {
		// Every entry of the previous leader came before its key went
		// (one watch, in revision order): the log goes on after them.
		// (The same term: it only paused, unsure of its lease, and its
		// appends go on where they were.)
		l.appendNext = l.received + 1
		l.leadTerm = l.term
	}
	if !leading && !l.unsure {
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

// sleep waits d, or until ctx ends; it reports whether ctx is still live,
// for the retry loops that back off between etcd calls.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
