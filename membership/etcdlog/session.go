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

// Resign hands the lead on: this replica stands again behind the other
// candidates, so the next one leads at once. It does not block.
func (l *Log) Resign() { l.signal(l.resignCh) }
