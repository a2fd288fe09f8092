package launcher

// The replicated rendezvous of an elastic job across hosts (p2p's
// GroupConfig): gorun's rendezvous is replica 1 of a group of three, and
// ranks of the start on other hosts host the others (--rdzv-replicas 3 or
// 5). Once the group
// is complete gorun's replica hands the lead to a rank's, so the ranks'
// control streams stay among their hosts; gorun's replica still votes and
// says what happens. Losing the leader's process or host then costs the
// job at most the ranks that were there: another replica leads within
// the heartbeat bound and the ranks reconnect to it.

import (
	"strconv"
	"strings"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/membership/etcdlog"
	"github.com/gorun/gorun/p2p"
)

// replicaRanks picks the ranks that host a replica, for a group of n
// (gorun's among them): the first rank of each host, remote hosts first
// (gorun's own host has its replica), then more ranks of hosts already
// chosen if there are not enough hosts; none for n <= 1. As many more
// host a spare replica, picked the same way among the rest: when a
// replica's rank is lost, the group takes a spare in its place (p2p's
// changeGroupLocked), so it survives more losses than n's majority.
func replicaRanks(lay *layout, n int) (group, spares map[int]bool) {
	if n <= 1 {
		return nil, nil
	}
	group = pickReplicaRanks(lay, n-1, nil)
	return group, pickReplicaRanks(lay, n-1, group)
}

// pickReplicaRanks picks up to want ranks not in taken: the first rank of
// each host without one, remote hosts first, then more ranks of hosts.
func pickReplicaRanks(lay *layout, want int, taken map[int]bool) map[int]bool {
	out := map[int]bool{}
	seen := map[int]bool{}
	for r := range taken {
		seen[lay.pl.host[r]] = true
	}
	for pass := range 3 {
		for r, h := range lay.pl.host {
			if len(out) == want {
				return out
			}
			if taken[r] {
				continue
			}
			remote := !IsLocalHost(lay.hosts[h].Name)
			if out[r] || pass < 2 && seen[h] || pass == 0 && !remote {
				continue
			}
			seen[h], out[r] = true, true
		}
	}
	return out
}

// With --rdzv-backend etcd the membership is kept in etcd instead: the
// ranks that host a replica stand for leader (at least two, so that the
// loss of one leaves another), and gorun's replica only observes and
// reports. gorun's loss or pause then costs the job nothing at all, once
// the ranks registered.

// groupReplicas is how many replicas replicaRanks picks ranks for
// (gorun's counted).
func (el Elastic) groupReplicas() int {
	if el.Etcd != nil {
		return max(el.Replicas, 3)
	}
	return el.Replicas
}

// groupConfig is gorun's replica's part (nil: a lone rendezvous).
func (e *elasticRun) groupConfig() *p2p.GroupConfig {
	if ec := e.el.Etcd; ec != nil {
		observer := *ec
		observer.Observe = true
		return &p2p.GroupConfig{ID: 1, Reports: true, Etcd: &observer}
	}
	if len(e.replicas) == 0 {
		return nil
	}
	return &p2p.GroupConfig{ID: 1, Size: e.el.Replicas, Reports: true, HandOff: true}
}

// maxSize is the rendezvous' (and every replica's) largest membership.
func (e *elasticRun) maxSize() int {
	if e.el.MaxNP == 0 {
		return max(maxRendezvousSize, e.job.NP)
	}
	return e.el.MaxNP
}

// etcdEnv is how a rank finds the job's membership in etcd (nil: it is
// in gorun's rendezvous).
func (e *elasticRun) etcdEnv() []string {
	ec := e.el.Etcd
	if ec == nil {
		return nil
	}
	env := []string{collective.EnvRdzvBackend + "=etcd", collective.EnvRdzvEndpoints + "=" + strings.Join(ec.Endpoints, ","),
		collective.EnvRdzvID + "=" + ec.RendezvousID}
	if t := ec.TLS; t != nil {
		// The ranks read the same files, at the same paths, on their hosts.
		env = append(env, collective.EnvRdzvConf+"="+etcdConf(t))
	}
	return env
}

// etcdConf writes t as --rdzv-conf (GORUN_RDZV_CONF) reads it.
func etcdConf(t *etcdlog.TLS) string {
	conf := []string{"protocol=https"}
	for _, kv := range [][2]string{{"cacert", t.CACert}, {"cert", t.Cert}, {"key", t.Key}} {
		if kv[1] != "" {
			conf = append(conf, kv[0]+"="+kv[1])
		}
	}
	return strings.Join(conf, ",")
}

// replicaEnv is what every rank is told of the job's bounds, which the
// replicas' memberships share.
func (e *elasticRun) replicaEnv() []string {
	// Every rank, joiners included, finds the leader in etcd.
	env := e.etcdEnv()
	if len(e.replicas) == 0 {
		return env
	}
	return append(env,
		collective.EnvMinNP+"="+strconv.Itoa(e.el.MinNP),
		collective.EnvMaxNP+"="+strconv.Itoa(e.maxSize()),
		collective.EnvElasticWait+"="+e.el.Timeout.String(),
	)
}
