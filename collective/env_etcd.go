package collective

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/gorun/gorun/membership/etcdlog"
	"github.com/gorun/gorun/p2p"
)

// The etcd rendezvous backend (issue 28): the job's membership is kept in
// an etcd cluster, whose keys hold its log and elect the replica that
// leads, so that no process of the job is a single point of failure
// (p2p's EtcdGroup). gorun --rdzv-backend etcd sets the GORUN_RDZV_*
// variables for every rank; without gorun the same variables, or
// torchrun's PET_RDZV_* (which Kubeflow sets from a PyTorchJob's
// rdzvBackend, rdzvHost:rdzvPort and rdzvId), choose it.
const (
	// EnvRdzvBackend is where the job's membership is kept: "gorun" (the
	// default: the rendezvous gorun or rank 0 hosts) or "etcd".
	EnvRdzvBackend = "GORUN_RDZV_BACKEND"
	// EnvRdzvEndpoints are the etcd cluster's client addresses,
	// comma-separated host:port ("h1:2379,h2:2379,h3:2379").
	EnvRdzvEndpoints = "GORUN_RDZV_ENDPOINTS"
	// EnvRdzvID names the job in etcd: every process of the job gives the
	// same, and a new run of a job a new one (the membership's log of a
	// run stays under its id).
	EnvRdzvID = "GORUN_RDZV_ID"
	// EnvRdzvConf is torchrun's --rdzv-conf for an etcd cluster that
	// serves TLS: "cacert=ca.pem,cert=client.pem,key=client-key.pem"
	// (paths every process of the job can read; protocol=https with the
	// system's roots). https:// endpoints also mean TLS.
	EnvRdzvConf = "GORUN_RDZV_CONF"

	// torchrun's PET_RDZV_* names: env_kubernetes_elastic.go.
)

// minEtcdHeartbeat is the shortest heartbeat bound with the etcd backend:
// the ranks look for a new leader for three bounds, and one is there
// about a second after the old one's lease (etcdlog.MinTTL at least)
// expired.
const minEtcdHeartbeat = 2 * time.Second

// readEtcd reads the rendezvous backend: GORUN_RDZV_* first, else
// torchrun's PET_RDZV_*. With etcd the job is elastic (its membership
// outlives any of its processes), the rendezvous address is etcd's
// election's, and the ranks that stand for leader are the ones gorun
// chose (GORUN_RDZV_REPLICA), or, without gorun, rank 0 and two more
// (etcdCandidate).
func readEtcd(getenv func(string) string, e *launchEnv) error {
	backendVar, endpointsVar, idVar, confVar := EnvRdzvBackend, EnvRdzvEndpoints, EnvRdzvID, EnvRdzvConf
	if strings.TrimSpace(getenv(backendVar)) == "" && strings.TrimSpace(getenv(envPETRdzvBackend)) != "" {
		backendVar, endpointsVar, idVar, confVar = envPETRdzvBackend, envPETRdzvEndpoint, envPETRdzvID, envPETRdzvConf
	}
	backend := strings.TrimSpace(getenv(backendVar))
	switch strings.ToLower(backend) {
	case "", "gorun":
		return nil
	case "c10d", "static":
		if backendVar == envPETRdzvBackend {
			// torchrun's own stores: the rendezvous is rank 0's, at
			// PET_MASTER_ADDR, as without PET_RDZV_BACKEND.
			return nil
		}
	case "etcd", "etcd-v2":
		endpoints, https, err := parseEtcdEndpoints(endpointsVar, getenv(endpointsVar))
		if err != nil {
			return err
		}
		tls, err := etcdlog.ParseConf(getenv(confVar))
		if err != nil {
			return fmt.Errorf("%s=%q: %v (write cacert=ca.pem,cert=client.pem,key=client-key.pem)", confVar, getenv(confVar), err)
		}
		if tls == nil && https {
			tls = &etcdlog.TLS{} // the system's roots
		}
		if _, err := tls.Config(); err != nil {
			return fmt.Errorf("%s=%q: %v", confVar, getenv(confVar), err)
		}
		id := strings.TrimSpace(getenv(idVar))
		if etcdlog.CheckJob(id) != nil {
			return fmt.Errorf("%s=%q: the etcd rendezvous needs the job's id, the same for every process and new for each run, without '/' or spaces (e.g. %s=train-42)", idVar, id, idVar)
		}
		if e.heartbeat != 0 && e.heartbeat < minEtcdHeartbeat {
			return fmt.Errorf("%s=%v with %s=etcd: want 2s or more: a lost leader is replaced once its etcd lease (%v at least) expires, and the ranks look for the new one for 3 heartbeat bounds", EnvHeartbeatTimeout, e.heartbeat, backendVar, etcdlog.MinTTL)
		}
		e.etcd = &p2p.EtcdGroup{Endpoints: endpoints, RendezvousID: id, TLS: tls}
		e.elastic = true
		e.rendezvous, e.hostRendezvous = "", false
		return nil
	}
	return fmt.Errorf("%s=%q: want gorun (the rendezvous gorun or rank 0 hosts) or etcd (with %s and %s)", backendVar, backend, endpointsVar, idVar)
}

// parseEtcdEndpoints reads variable name's etcd addresses, and whether
// they are https://.
func parseEtcdEndpoints(name, s string) ([]string, bool, error) {
	if strings.TrimSpace(s) == "" {
		return nil, false, fmt.Errorf("%s is not set: the etcd rendezvous needs the etcd cluster's client addresses (write %s=h1:2379,h2:2379,h3:2379)", name, name)
	}
	out, https, err := etcdlog.ParseEndpoints(s)
	if err != nil {
		return nil, false, fmt.Errorf("%s=%q: %v (write h1:2379,h2:2379,h3:2379)", name, s, err)
	}
	return out, https, nil
}

// etcdCandidate says whether this rank stands for leader of a job kept in
// etcd without gorun: rank 0, and four ranks on other nodes where there
// are (under srun, as schedulerReplica picks them; elsewhere, where a pod
// is a node, ranks 1 to 4), so that losing any one node leaves
// candidates. Four rather than two: a process that replaces a lost one
// joins without standing (joinOrRejoin), so each loss of a candidate
// takes one away for good.
func etcdCandidate(e *launchEnv) bool {
	if e.rank == 0 {
		return true
	}
	if e.source == "slurm" {
		return schedulerReplica(e.nodeID, e.localRank, e.nodeCounts) >= 0
	}
	return e.rank < podReplicas
}

// findEtcdLeader finds the replica that leads the job's membership in
// etcd: its group id and address, the rank's rendezvous. It waits while
// none leads (the candidates start with the ranks), at most Timeout.
func findEtcdLeader(ctx context.Context, cfg config) (uint64, string, error) {
	fctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	id, addr, err := p2p.FindEtcdLeader(fctx, *cfg.etcd)
	if err != nil {
		return 0, "", fmt.Errorf("finding the rendezvous in etcd (%s, %s): %w", EnvRdzvEndpoints, EnvRdzvID, err)
	}
	return id, addr, nil
}
