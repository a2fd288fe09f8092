package p2p

// A replicated rendezvous whose log and election are kept in etcd
// (membership/etcdlog) rather than by raft among the replicas: the
// replicas then need no links with each other, and the group survives
// the loss of any replica, its leader's included, for as long as the etcd
// cluster keeps its majority.
//
// Every replica registers itself in etcd (no offers, no group changes to
// propose); the candidates stand for leader, and whichever leads holds
// the ranks' control streams and carries out the membership's actions,
// as with raft. A replica that does not stand (Observe: the launcher's)
// only applies the log, and reports if it is asked to; a rank that
// reaches it is redirected to the leader, whose address the election
// gives.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/gorun/gorun/membership"
	"github.com/gorun/gorun/membership/etcdlog"
	"github.com/gorun/gorun/membership/raftgroup"
)

// EtcdGroup keeps a group's log and election in etcd.
type EtcdGroup struct {
	// Endpoints are the etcd cluster's client addresses, "host:port".
	Endpoints []string
	// RendezvousID names the job in etcd (--rdzv-id): its keys are
	// under /gorun/<RendezvousID>/. Every process of the job gives the
	// same.
	RendezvousID string
	// Observe: this replica never stands for leader; it only applies the
	// log (with Reports, the launcher's: it says what happens).
	Observe bool
	// TLS, if set, is how to reach an etcd cluster that serves TLS (its
	// files, which every process of the job reads).
	TLS *etcdlog.TLS
}

// groupLog is the replicated log under a group: raft's
// (raftgroup.Replica) or etcd's (etcdGroupLog).
type groupLog interface {
	Propose(at time.Time, ev membership.Event) error
	Ready() (raftgroup.Ready, error)
	Leader() uint64
	Replicas() map[uint64]string
	Voters() int
	VoterIDs() []uint64
	TransferLeader(to uint64)
	Machine() *membership.Machine
}

// etcdGroupLog is an etcdlog.Log as a groupLog: the voters are the
// replicas that stand for leader, and handing the lead over resigns it
// (the next candidate in etcd's line leads, whichever the caller named).
type etcdGroupLog struct{ *etcdlog.Log }

func (e etcdGroupLog) Ready() (raftgroup.Ready, error) {
	rd, err := e.Log.Ready()
	out := raftgroup.Ready{Leader: rd.Leader, GroupChanged: rd.GroupChanged}
	for _, a := range rd.Applied {
		out.Applied = append(out.Applied, raftgroup.Applied(a))
	}
	return out, err
}

func (e etcdGroupLog) Voters() int           { return len(e.CandidateIDs()) }
func (e etcdGroupLog) VoterIDs() []uint64    { return e.CandidateIDs() }
func (e etcdGroupLog) TransferLeader(uint64) { e.Resign() }

// startEtcdGroup makes r a replica of a group kept in etcd (startGroup's
// part with an EtcdGroup).
func (r *Rendezvous) startEtcdGroup(g *groupState) error {
	ec := g.cfg.Etcd
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.Timeout)
	defer cancel()
	tlsCfg, err := ec.TLS.Config()
	if err != nil {
		return fmt.Errorf("rendezvous in etcd: %w", err)
	}
	r.cfg.Logf = r.asyncLogf(r.cfg.Logf)
	// A replica killed is replaced once its session expires: within the
	// heartbeat bound, as raft's election is, unless etcd's own election
	// needs longer (MinTTL).
	l, err := etcdlog.Start(ctx, etcdlog.Config{Endpoints: ec.Endpoints, TLS: tlsCfg, Job: ec.RendezvousID, ID: g.cfg.ID, Addr: g.cfg.Advertise,
		Candidate: !ec.Observe, TTL: r.hb, CallTimeout: min(r.cfg.Timeout, max(r.hb, 5*time.Second)),
		Membership: r.machineConfig(), Logf: r.cfg.Logf})
	if err != nil {
		close(r.closeCh) // ends asyncLogf's goroutine: this rendezvous never starts
		return fmt.Errorf("rendezvous in etcd: %w", err)
	}
	role := "stands for leader"
	if ec.Observe {
		role = "follows"
	}
	r.cfg.Logf("rendezvous: replica %d %s; the membership is in etcd at %s under /gorun/%s/", g.cfg.ID, role, strings.Join(ec.Endpoints, ","), ec.RendezvousID)
	g.etcd = l
	g.rep = etcdGroupLog{l}
	r.grp = g
	r.m = l.Machine()
	r.wg.Add(1)
	go r.etcdLoop()
	return nil
}

// etcdLoop carries out what the log asks whenever it changed, and after
// this replica proposed (a new leader's first proposals wait for it).
func (r *Rendezvous) etcdLoop() {
	defer r.wg.Done()
	g := r.grp
	for {
		select {
		case <-r.closeCh:
			return
		case <-g.etcd.Changed():
		case <-g.kick:
		}
		if err := r.groupReady(); err != nil {
			r.cfg.Logf("rendezvous: replica %d: %v", g.cfg.ID, err)
			return
		}
	}
}

// abandonGroup ends the replica's part in the group as a killed process'
// ends: with etcd, its session is left to expire.
func (r *Rendezvous) abandonGroup() {
	g := r.grp
	if g.etcd == nil {
		r.closeGroup()
		return
	}
	g.etcd.Abandon()
}

// FindEtcdLeader returns the group id and address of the replica that
// leads the job's rendezvous in etcd (for Config.RendezvousReplica and
// Rendezvous), waiting while none does, until ctx ends.
func FindEtcdLeader(ctx context.Context, g EtcdGroup) (uint64, string, error) {
	tlsCfg, err := g.TLS.Config()
	if err != nil {
		return 0, "", err
	}
	return etcdlog.FindLeader(ctx, g.Endpoints, tlsCfg, g.RendezvousID)
}
