package collective

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// An elastic job on Kubernetes, without gorun: an elastic PyTorchJob
// (elasticPolicy), whose pods get torchrun's rendezvous arguments
// (readElasticPyTorchJob), or an Indexed Job (or JobSet) with
// GORUN_ELASTIC=1. As under srun (env_replica.go), the membership is a
// raft group: pod 0 hosts replica 1 where the pods meet, and pods 1 and 2
// host replicas ReplicaID(1) and ReplicaID(2), so that losing pod 0 leaves
// a majority; pods 3 and 4 host spares. Every pod has an address of its own and a stable DNS name,
// so every replica is reached at the same port on its pod's name
// (podGroup), which is how a replaced pod finds the running group when
// pod 0 is gone (elastic_pod.go).

// The elastic PyTorchJob's variables (training operator v1,
// ElasticEnvVarGenerator): the operator sets them for every pod of a job
// with an elasticPolicy, and no rank: its pods are Workers only.
const (
	envPETRdzvBackend  = "PET_RDZV_BACKEND"  // c10d (default), static, etcd, etcd-v2
	envPETRdzvEndpoint = "PET_RDZV_ENDPOINT" // <job>-worker-0:<port> (or elasticPolicy.rdzvHost/rdzvPort)
	envPETRdzvID       = "PET_RDZV_ID"       // elasticPolicy.rdzvId, the job's run id for torchrun
	envPETMaxRestarts  = "PET_MAX_RESTARTS"  // elasticPolicy.maxRestarts
	envPETRdzvConf     = "PET_RDZV_CONF"     // torchrun's --rdzv-conf: for etcd, protocol, cacert, cert, key
	// torchRdzvPort is torchrun's port when --rdzv-endpoint names none.
	torchRdzvPort = 29400
)

// podGroup names the pods of a Kubernetes job that host the replicas of
// its rendezvous group: pod i is <prefix>-<i><domain>, every replica at
// port. The names follow from pod 0's, the rendezvous host: an elastic
// PyTorchJob's <job>-worker-0 (the operator's Service per pod), an Indexed
// Job's <job>-0.<subdomain>, a JobSet's <jobset>-<rjob>-0-0.<subdomain>.
type podGroup struct {
	prefix, domain string
	port           int
}

// podGroupOf reads the pod names from pod 0's address host:port.
func podGroupOf(addr string) (podGroup, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return podGroup{}, fmt.Errorf("rendezvous address %q: %w (write HOST:PORT)", addr, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 {
		return podGroup{}, fmt.Errorf("rendezvous address %q: port %q is not a TCP port", addr, p)
	}
	label, domain, _ := strings.Cut(host, ".")
	prefix, ok := strings.CutSuffix(label, "-0")
	if !ok || prefix == "" || net.ParseIP(host) != nil {
		return podGroup{}, fmt.Errorf("rendezvous host %q is not pod 0's DNS name (<job>-worker-0, <job>-0.<service>): the pods hosting the other replicas are named after it", host)
	}
	if domain != "" {
		domain = "." + domain
	}
	return podGroup{prefix: prefix, domain: domain, port: port}, nil
}

// addr is where pod i's replica listens: its DNS name and the group's port.
func (g podGroup) addr(i int) string {
	return net.JoinHostPort(g.prefix+"-"+strconv.Itoa(i)+g.domain, strconv.Itoa(g.port))
}

// index is the pod index in a pod name (a HOSTNAME), or -1 if the name is
// not one of the group's.
func (g podGroup) index(name string) int {
	label, _, _ := strings.Cut(name, ".")
	s, ok := strings.CutPrefix(label, g.prefix+"-")
	if !ok {
		return -1
	}
	i, err := strconv.Atoi(s)
	if err != nil || i < 0 || strconv.Itoa(i) != s {
		return -1
	}
	return i
}

// podReplicas is how many pods host a replica: pods 0, 1 and 2 the
// group's three, pods 3 and 4 spares, which take the place of a replica
// lost with its pod (the group's leader adds one when it removes the lost
// one), so that the group survives successive losses.
const podReplicas = 5

// podHostsReplica says whether pod i hosts a replica beside pod 0's, and
// whether it is a spare.
func podHostsReplica(i, size int) (hosts, spare bool) {
	hosts = i >= 1 && i < podReplicas && i < size
	return hosts, hosts && i >= 3
}

// elasticPyTorchJob says whether the environment is an elastic
// PyTorchJob's pod: torchrun's rendezvous endpoint without Trainer's
// PET_MASTER_ADDR (which says a rank 0 hosts the rendezvous), and not
// torchrun's arguments for a fixed-size job kept in etcd (a rank and one
// size, read by readTorchElastic).
func elasticPyTorchJob(getenv func(string) string) bool {
	if getenv(envPETRdzvEndpoint) == "" || getenv(envPETMasterAddr) != "" {
		return false
	}
	fixedEtcd := etcdBackend(getenv(envPETRdzvBackend)) && getenv(envPETNodeRank) != "" && !strings.Contains(getenv(envPETNNodes), ":")
	return !fixedEtcd
}

// readElasticPyTorchJob reads a pod of an elastic PyTorchJob: the
// operator gives it PET_RDZV_ENDPOINT (pod 0's name and port),
// PET_NNODES=MIN:MAX, PET_RDZV_BACKEND, and perhaps PET_RDZV_ID and
// PET_MAX_RESTARTS, but no rank. The pod's index is PET_NODE_RANK when the
// manifest sets it (from the label training.kubeflow.org/replica-index),
// else it is read off the pod's name, HOSTNAME (<job>-worker-<i>, as the
// endpoint's <job>-worker-0). The job starts with GORUN_SIZE pods, by
// default MAX (the manifest's Worker replicas), and keeps between MIN and
// MAX members. PET_RDZV_BACKEND c10d (or static) is gorun's own replicated
// rendezvous; etcd is env_etcd.go's. PET_MAX_RESTARTS bounds torchrun's
// restarts of the whole worker group; gorun restarts nothing (a lost pod
// costs the others at most the step it interrupted, and its replacement
// joins), so it is checked and has nothing to bound.
func readElasticPyTorchJob(getenv func(string) string, e *launchEnv) error {
	e.source = "pytorchjob-elastic"
	b := strings.TrimSpace(getenv(envPETRdzvBackend))
	switch {
	case b == "" || b == "c10d" || b == "static" || etcdBackend(b):
	default:
		return fmt.Errorf("%s=%q: want c10d (gorun's replicated rendezvous) or etcd", envPETRdzvBackend, b)
	}
	if s := strings.TrimSpace(getenv(envPETMaxRestarts)); s != "" {
		if n, err := strconv.Atoi(s); err != nil || n < 0 {
			return fmt.Errorf("%s=%q is not a number of restarts", envPETMaxRestarts, s)
		}
	}
	if s := strings.TrimSpace(getenv(envPETNProcPerNode)); s != "" && s != "1" && s != "auto" {
		return fmt.Errorf("%s=%q: an elastic job runs one Go process per pod: set nprocPerNode: 1", envPETNProcPerNode, s)
	}
	var err error
	if e.minNP, e.maxNP, err = nodeRange(getenv(envPETNNodes)); err != nil {
		return err
	}
	if etcdBackend(b) {
		// PET_RDZV_ENDPOINT is etcd's (readEtcd), not pod 0's: the pod
		// names follow from the pod's own.
		return readEtcdPod(getenv, e)
	}
	endpoint := strings.TrimSpace(getenv(envPETRdzvEndpoint))
	if _, _, err := net.SplitHostPort(endpoint); err != nil {
		endpoint = net.JoinHostPort(endpoint, strconv.Itoa(torchRdzvPort)) // torchrun's default port
	}
	if port, err := rendezvousPortOverride(getenv); err != nil {
		return err
	} else if port != 0 {
		host, _, _ := net.SplitHostPort(endpoint)
		endpoint = net.JoinHostPort(host, strconv.Itoa(port))
	}
	pods, err := podGroupOf(endpoint)
	if err != nil {
		return fmt.Errorf("%s=%q: %w", envPETRdzvEndpoint, getenv(envPETRdzvEndpoint), err)
	}
	e.rendezvous, e.hostRendezvous = endpoint, true
	return readPodPlace(getenv, e, func(name string) (int, string) {
		return pods.index(name), fmt.Sprintf("is not a pod of %s=%s (want %s<i>)", envPETRdzvEndpoint, endpoint, pods.prefix+"-")
	})
}

// readPodPlace reads an elastic PyTorchJob's size to start with (GORUN_SIZE,
// else PET_NNODES's maximum) and the pod's index: PET_NODE_RANK, else
// index of its name (HOSTNAME), which says why a name is none (-1).
func readPodPlace(getenv func(string) string, e *launchEnv, index func(name string) (int, string)) error {
	e.size = e.maxNP
	if n, ok, err := intVar(getenv, EnvSize); err != nil {
		return err
	} else if ok {
		e.size = n
	}
	if e.size < e.minNP || e.size > e.maxNP {
		return fmt.Errorf("%s=%d pods to start with, but %s=%q allows %d to %d", EnvSize, e.size, envPETNNodes, getenv(envPETNNodes), e.minNP, e.maxNP)
	}
	if i, ok, err := intVar(getenv, envPETNodeRank); err != nil {
		return err
	} else if ok {
		e.rank = i
	} else {
		var why string
		if e.rank, why = index(getenv("HOSTNAME")); e.rank < 0 {
			return fmt.Errorf("HOSTNAME=%q %s: set %s from the label training.kubeflow.org/replica-index", getenv("HOSTNAME"), why, envPETNodeRank)
		}
	}
	if e.rank < 0 || e.rank >= e.size {
		return fmt.Errorf("pod %d is not within the %d pods the job starts with (%s, else the maximum of %s)", e.rank, e.size, EnvSize, envPETNNodes)
	}
	e.elastic = true
	return nil
}

// readEtcdPod reads a pod of an elastic PyTorchJob whose membership is
// kept in etcd (rdzvBackend: etcd): its index is PET_NODE_RANK, else the
// number that ends its name (<job>-worker-<i>); the job starts with
// GORUN_SIZE pods, by default PET_NNODES's maximum. Pods 0 to 4 stand for
// leader (etcdCandidate), and a replaced pod joins the running job
// (joinOrRejoin).
func readEtcdPod(getenv func(string) string, e *launchEnv) error {
	return readPodPlace(getenv, e, func(name string) (int, string) {
		return podIndexOfName(name), "does not end in the pod's index (<job>-worker-<i>)"
	})
}

// podIndexOfName is the index that ends a pod's name (its first label),
// <job>-worker-<i>, or -1.
func podIndexOfName(name string) int {
	label, _, _ := strings.Cut(name, ".")
	i := strings.LastIndexByte(label, '-')
	if i < 0 {
		return -1
	}
	n, err := strconv.Atoi(label[i+1:])
	if err != nil || n < 0 || strconv.Itoa(n) != label[i+1:] {
		return -1
	}
	return n
}

// nodeRange reads PET_NNODES: MIN:MAX, or N (MIN = MAX = N).
func nodeRange(s string) (lo, hi int, err error) {
	s = strings.TrimSpace(s)
	a, b, isRange := strings.Cut(s, ":")
	if !isRange {
		b = a
	}
	lo, err1 := strconv.Atoi(a)
	hi, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil || lo < 1 || hi < lo {
		return 0, 0, fmt.Errorf("%s=%q: want MIN:MAX (1 <= MIN <= MAX) or a number of pods", envPETNNodes, s)
	}
	return lo, hi, nil
}

// etcdBackend says whether PET_RDZV_BACKEND names etcd (torchrun's etcd and
// etcd-v2): the membership is then in etcd, not on the pods.
func etcdBackend(b string) bool {
	b = strings.TrimSpace(b)
	return b == "etcd" || b == "etcd-v2"
}
