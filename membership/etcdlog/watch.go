package etcdlog

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Following the job's keys: the log, the election and the registrations,
// in etcd's revision order.

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
		if !sleep(l.ctx, delay) {
			return
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
