package etcdlog

import (
	"bytes"
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gorun/gorun/membership"
)

// The leader's side of the log: proposals, appended in order.

// Propose queues ev, which happened at time at, for the log; it never
// blocks. Only the leader proposes; a proposal that the leader loses its
// lead with is dropped (it never shows in Ready): the proposer proposes
// again if it still matters, as with raft. (A pause of the lead while the
// replica is unsure of its etcd session, which ends with its key kept,
// loses nothing: see leaseOutlived.)
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
			if !l.leading || l.unsure || len(l.queue) == 0 || l.myKey == "" || l.term != l.leadTerm {
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
		// It tries again while its key is the one it appends with (its
		// term unchanged), also while unsure of its lease: the
		// conditions make an append of a replica that no longer leads
		// fail.
		l.mu.Lock()
		still := l.term == term
		l.mu.Unlock()
		if !still || l.ctx.Err() != nil {
			return deposed
		}
		if !sleep(l.ctx, delay) {
			return deposed
		}
	}
}
