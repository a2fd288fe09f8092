package collective

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/gorun/gorun/p2p"
)

// A replicated rendezvous (p2p's GroupConfig): in an elastic job the
// membership is kept by a group of replicas, one in gorun and one in each
// of a few ranks on other hosts, so that losing the leader's process or
// host does not end the job. gorun tells the ranks that host one
// (GORUN_RDZV_REPLICA), and every rank the job's elastic bounds, which
// each replica's membership must share.
const (
	// EnvRdzvReplica "1": this rank hosts a replica of the job's
	// rendezvous group (gorun sets it for two ranks on other hosts than
	// its own; ignored for a joiner); "spare": a replica that takes the
	// place of a lost one (gorun sets it for as many more ranks).
	EnvRdzvReplica = "GORUN_RDZV_REPLICA"
	// EnvMinNP, EnvMaxNP: the elastic job's --min-np and --max-np;
	// EnvElasticWait: how long it may stay below --min-np (--elastic-timeout).
	EnvMinNP       = "GORUN_MIN_NP"
	EnvMaxNP       = "GORUN_MAX_NP"
	EnvElasticWait = "GORUN_ELASTIC_WAIT"
)

// readReplica reads whether this rank hosts a replica, and the bounds its
// membership needs. Under gorun, gorun says (GORUN_RDZV_REPLICA) and gives
// the bounds. An elastic job under srun has no gorun to keep its
// membership: rank 0 hosts replica 1 where the ranks meet, and the tasks
// that schedulerReplica picks on other nodes host the others; the bounds
// are GORUN_MIN_NP (default 1), GORUN_MAX_NP (default the step's tasks)
// and GORUN_ELASTIC_WAIT (default 600s), the same for every task. An
// elastic job on Kubernetes is placed the same way on its pods
// (env_kubernetes_elastic.go): pod 0 hosts replica 1, pods 1 and 2 the
// others, pods 3 and 4 spares, with PET_NNODES's bounds for an elastic
// PyTorchJob.
func readReplica(getenv func(string) string, e *launchEnv) error {
	switch v := strings.TrimSpace(getenv(EnvRdzvReplica)); v {
	case "", "0":
	case "1":
		e.replica = true
	case "spare":
		e.replica, e.replicaSpare = true, true
	default:
		return fmt.Errorf("%s=%q: want 1 (host a replica of the rendezvous), spare (host a spare one) or 0", EnvRdzvReplica, v)
	}
	if !e.elastic || e.rank < 0 {
		e.replica, e.replicaSpare = false, false // only the members of an elastic job's start host one
		return nil
	}
	switch {
	case e.hostRendezvous && e.source == "slurm":
		e.group = true
		pick := -1
		if e.rank != 0 {
			pick = schedulerReplica(e.nodeID, e.localRank, e.nodeCounts)
		}
		e.replica, e.replicaSpare = pick >= 0, pick >= 2
		if e.replica {
			// Where a later step finds it (slurm_group.go).
			e.replicaID, e.replicaPort = slurmReplicaPlace(getenv, e)
		}
	case e.hostRendezvous && (e.source == "pytorchjob-elastic" || e.source == "indexed-job"):
		pods, err := podGroupOf(e.rendezvous)
		if err != nil {
			return fmt.Errorf("an elastic job's pods host its rendezvous: %w", err)
		}
		e.group, e.pods = true, &pods
		e.replica, e.replicaSpare = podHostsReplica(e.rank, e.size)
	}
	// Without gorun to choose them, the ranks that stand for leader of a
	// membership kept in etcd, with the bounds' defaults of a group under
	// srun.
	etcdAlone := e.etcd != nil && e.source != "gorun"
	if etcdAlone {
		e.replica = etcdCandidate(e)
	}
	if !e.replica && !e.group {
		return nil
	}
	defaults := e.group || etcdAlone
	var err error
	// An elastic PyTorchJob's bounds are PET_NNODES's (readElasticPyTorchJob).
	if e.minNP, err = boundVar(getenv, EnvMinNP, max(e.minNP, 1), defaults); err != nil {
		return err
	}
	if e.maxNP, err = boundVar(getenv, EnvMaxNP, cmp.Or(e.maxNP, e.size), defaults); err != nil {
		return err
	}
	if e.minNP > e.size || e.size > e.maxNP {
		return fmt.Errorf("%s=%d, %s=%d: the job's %d ranks are not within them", EnvMinNP, e.minNP, EnvMaxNP, e.maxNP, e.size)
	}
	s := getenv(EnvElasticWait)
	if s == "" && defaults {
		s = "600s"
	}
	if s == "" {
		return fmt.Errorf("%s is not set: a replica of the rendezvous needs the job's wait below %s", EnvElasticWait, EnvMinNP)
	}
	if e.elasticWait, err = parseDuration(EnvElasticWait, s); err != nil || e.elasticWait <= 0 {
		return fmt.Errorf("%s=%q is not a positive duration (write 600s)", EnvElasticWait, s)
	}
	return nil
}

// schedulerReplica says whether the task with local rank local on node
// node of a step (counts: tasks per node) hosts one of the four replicas
// beside rank 0's (two for the group of three, two spares that take the
// place of lost ones): the first task of nodes 1, 2, ..., then the second,
// rank 0's node last; with two nodes, the first two of node 1 and the
// second of node 0; on one node, local ranks 1 to 4. The group's leader
// picks its voters among them so that losing rank 0's node leaves a
// majority where it can.
//
// It returns the task's place in that order (0 and 1: the group's, 2 and
// 3: the spares), -1 if it hosts none.
func schedulerReplica(node, local int, counts []int) int {
	const replicas = 4
	if len(counts) == 0 {
		counts = []int{max(local+1, 1)}
	}
	picked := 0
	for l := 0; picked < replicas; l++ {
		more := false
		for n := 1; n <= len(counts) && picked < replicas; n++ {
			i := n % len(counts) // nodes 1, 2, ... and rank 0's last
			if i == 0 && l == 0 || l >= counts[i] {
				continue
			}
			more = true
			if i == node && l == local {
				return picked
			}
			picked++
		}
		if !more && l > 0 {
			return -1
		}
	}
	return -1
}

// boundVar reads a positive bound, def when unset and defaults allowed.
func boundVar(getenv func(string) string, name string, def int, defaults bool) (int, error) {
	if strings.TrimSpace(getenv(name)) == "" && defaults {
		return def, nil
	}
	return positiveInt(getenv, name)
}

func positiveInt(getenv func(string) string, name string) (int, error) {
	s := strings.TrimSpace(getenv(name))
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%s=%q is not a positive number (a replica of the rendezvous needs it)", name, s)
	}
	return n, nil
}

// startReplica starts this rank's replica of the rendezvous group, on the
// address the rank listens on; the group's leader adds it once the rank's
// hello offers it.
//
// Under srun a replica may have an ID and a port of its own
// (slurm_group.go): at the group's port it listens on every interface of
// its node, where a later step dials the node's name, and advertises the
// rank's address. If another process holds that port on the node, it
// takes a free one: the job runs as well, and a later step finds the group
// through the replicas on the other nodes.
func startReplica(ctx context.Context, cfg config, heartbeat time.Duration) (*p2p.Rendezvous, error) {
	ip := cmp.Or(cfg.listenIP, "127.0.0.1")
	id := cmp.Or(cfg.replicaID, p2p.ReplicaID(cfg.rank))
	rc := p2p.RendezvousConfig{
		ListenAddr: net.JoinHostPort(ip, "0"), Size: cfg.size, JobKey: cfg.jobKey, Timeout: cfg.timeout, Logf: cfg.logf,
		Elastic: &p2p.ElasticConfig{MinSize: cfg.minSize, MaxSize: cfg.maxSize, WaitTimeout: cfg.elasticWait, HeartbeatTimeout: heartbeat},
		Group:   &p2p.GroupConfig{ID: id, Spare: cfg.replicaSpare, Etcd: cfg.etcd},
	}
	var rz *p2p.Rendezvous
	var err error
	if cfg.replicaPort != 0 {
		port := strconv.Itoa(cfg.replicaPort)
		at := rc
		at.ListenAddr = net.JoinHostPort("", port)
		if parsed := net.ParseIP(ip); parsed != nil && parsed.To4() == nil {
			at.ListenAddr = net.JoinHostPort("::", port)
		}
		group := *rc.Group
		group.Advertise = net.JoinHostPort(ip, port)
		at.Group = &group
		if rz, err = p2p.StartRendezvous(ctx, at); addrInUse(err) {
			cfg.warnf("gorun: rank %d: port %d of the rendezvous group is taken on this node, so replica %d listens on another, where a later srun step (%s) cannot find it: %v", cfg.rank, cfg.replicaPort, id, EnvJoinStep, err)
			rz, err = p2p.StartRendezvous(ctx, rc)
		}
	} else {
		rz, err = p2p.StartRendezvous(ctx, rc)
	}
	if err != nil {
		return nil, fmt.Errorf("hosting a replica of the rendezvous (%s=1): %w", EnvRdzvReplica, err)
	}
	return rz, nil
}
