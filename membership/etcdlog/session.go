package etcdlog

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A replica's session: its lease, its registration and its candidacy.

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

// renewEvery is how often a replica renews its lease. The replica gives
// its lease up when etcd has not answered for the TTL since the last
// renewal it answered; renewing often keeps that renewal recent when etcd's
// leader dies, so nearly the whole TTL is left to ride out etcd's election
// (randomised between one and two election timeouts, 1-2 s by default).
// clientv3's KeepAlive renews only every TTL/3 and counts from the answer:
// at MinTTL that left as little as 1.5 s, and the log's leader paused its
// lead (see leaseOutlived) at most losses of etcd's leader.
const renewEvery = 250 * time.Millisecond

// sessionEnd is why renewLease stopped renewing.
type sessionEnd int

const (
	sessionStopped  sessionEnd = iota // the Log stops
	sessionResigned                   // Resign asked
	// sessionUnanswered: etcd answered no renewal for the TTL; the lease
	// may live on (see leaseOutlived).
	sessionUnanswered
	sessionExpired // etcd says the lease is gone
)

// renewLease renews lease every renewEvery until it ends. Each renewal is
// bounded by CallTimeout, and by the time left until the TTL runs out
// since the send of the last renewal etcd answered (the lease lives at
// least that long on etcd's side).
func (l *Log) renewLease(lease clientv3.LeaseID) sessionEnd {
	// The lease was granted, renewed or found alive just before: it lives
	// about a TTL from now.
	answered := time.Now()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return sessionStopped
		case <-l.resignCh:
			return sessionResigned
		case <-t.C:
		}
		sent := time.Now()
		left := answered.Add(l.cfg.TTL).Sub(sent)
		if left <= 0 {
			return sessionUnanswered
		}
		// RequireLeader: a member without a leader refuses at once, and
		// KeepAliveOnce tries again, through the next member.
		cctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(l.ctx), min(left, l.cfg.CallTimeout))
		resp, err := l.client.KeepAliveOnce(cctx, lease)
		cancel()
		switch {
		case resp != nil && resp.TTL <= 0:
			return sessionExpired
		case err == nil:
			answered = sent
		}
		t.Reset(renewEvery)
	}
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
			switch l.renewLease(lease) {
			case sessionStopped:
				return
			case sessionResigned:
				l.resign(lease)
				continue
			case sessionUnanswered:
				if l.leaseOutlived(lease) {
					continue
				}
				if l.ctx.Err() != nil {
					return
				}
			}
			l.cfg.Logf("etcdlog: replica %d lost its etcd session (etcd unreachable for %v); it registers again", l.cfg.ID, l.cfg.TTL)
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
			if !sleep(l.ctx, delay) {
				return
			}
		}
	}
}

// leaseOutlived, after the client gave up renewing lease (no answer from
// etcd for its TTL), asks etcd whether it still holds it: etcd's new
// leader, after losing the old one, extends every lease, so a replica
// that was cut off only by etcd's own election (which can take longer
// than the TTL on a loaded machine) keeps its keys and its place in the
// election's line, and goes on with the same lease. Meanwhile it is
// unsure: it does not lead (Ready reports a step down: another replica
// would lead if the lease expired), but it keeps its proposals, and
// appends them once it knows its key never went (no other replica led in
// between). It asks for at most the TTL; false: the lease is gone, or
// etcd did not answer.
func (l *Log) leaseOutlived(lease clientv3.LeaseID) bool {
	l.mu.Lock()
	l.unsure = true
	l.mu.Unlock()
	l.signal(l.changed)
	outlived := l.askLease(lease)
	l.mu.Lock()
	l.unsure = false
	if !outlived {
		// Not a moment's lead on a key that may be gone: it stands no
		// more (keepSession registers it again).
		l.setKeyLocked("", 0)
	}
	l.mu.Unlock()
	l.signal(l.changed)
	l.signal(l.appendCh)
	if outlived {
		l.cfg.Logf("etcdlog: replica %d kept its etcd session through an etcd outage", l.cfg.ID)
	}
	return outlived
}

// askLease asks etcd, for at most the TTL, whether lease still lives.
func (l *Log) askLease(lease clientv3.LeaseID) bool {
	deadline := time.Now().Add(l.cfg.TTL)
	for delay := 50 * time.Millisecond; time.Now().Before(deadline); delay = min(2*delay, 500*time.Millisecond) {
		cctx, cancel := context.WithDeadline(l.ctx, deadline)
		resp, err := l.client.TimeToLive(cctx, lease)
		cancel()
		if err == nil {
			return resp.TTL > 0
		}
		if !sleep(l.ctx, delay) {
			return false
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

// Resign hands the lead on: this replica stands again behind the other
// candidates, so the next one leads at once. It does not block.
func (l *Log) Resign() { l.signal(l.resignCh) }
