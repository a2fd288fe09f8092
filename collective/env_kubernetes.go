package collective

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// A rank started on Kubernetes: torchrun's PET_* arguments, which Kubeflow
// Trainer v2 and the training operator's PyTorchJob set for every pod
// (readTorchElastic, and the rendezvous on pod 0), and an Indexed Job's or
// JobSet's JOB_COMPLETION_INDEX (readIndexedJob).

// Variables of the Kubernetes contracts.
const (
	envPETNodeRank        = "PET_NODE_RANK"        // Trainer v2: the pod's index (its Job completion index)
	envPETNNodes          = "PET_NNODES"           // Trainer v2: number of pods
	envPETNProcPerNode    = "PET_NPROC_PER_NODE"   // Trainer v2: processes per pod (numProcPerNode)
	envPETMasterAddr      = "PET_MASTER_ADDR"      // Trainer v2: DNS name of pod 0
	envPETMasterPort      = "PET_MASTER_PORT"      // Trainer v2: port on pod 0
	envJobCompletionIndex = "JOB_COMPLETION_INDEX" // the index of a pod of an Indexed Job (Kubernetes sets it)
)

// readTorchElastic reads torchrun's PET_* arguments, which Kubeflow Trainer
// v2 sets for every pod of a TrainJob and the training operator for every
// pod of a PyTorchJob: pod PET_NODE_RANK of PET_NNODES, PET_NPROC_PER_NODE
// processes per pod. A Go program runs one process per pod: rank
// PET_NODE_RANK, size PET_NNODES; a PET_NPROC_PER_NODE that is not a
// number ("auto", the PyTorchJob default) means one process per pod too, as
// it does for the operator's WORLD_SIZE. With more processes per pod
// something must start and number them: torchrun does, and sets LOCAL_RANK
// (and LOCAL_WORLD_SIZE); then rank = PET_NODE_RANK*PET_NPROC_PER_NODE +
// LOCAL_RANK. Without LOCAL_RANK it is an error, since every process of the
// pod would claim the same rank.
func readTorchElastic(getenv func(string) string, e *launchEnv) error {
	e.source = "torch-elastic"
	node, _, err := intVar(getenv, envPETNodeRank)
	if err != nil {
		return err
	}
	if s := getenv(envPETNNodes); strings.Contains(s, ":") {
		return fmt.Errorf("%s=%q is a range of sizes, but %s, which an elastic PyTorchJob's pods get, is not set: set it to pod 0's name and port, or give the job a fixed size", envPETNNodes, s, envPETRdzvEndpoint)
	}
	nodes, ok, err := intVar(getenv, envPETNNodes)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%s is set but %s is not: set both (Kubeflow Trainer sets them for every pod)", envPETNodeRank, envPETNNodes)
	}
	if node < 0 || node >= nodes {
		return fmt.Errorf("%s=%d is not within %s=%d", envPETNodeRank, node, envPETNNodes, nodes)
	}
	local, underTorchrun, err := intVar(getenv, "LOCAL_RANK")
	if err != nil {
		return err
	}
	perNode := 1
	s := strings.TrimSpace(getenv(envPETNProcPerNode))
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 {
			return fmt.Errorf("%s=%q: want a positive number of processes per pod (1 for a Go program)", envPETNProcPerNode, s)
		}
		perNode = n
	} else if underTorchrun {
		// torchrun chose the number ("auto", "gpu"): it says how many.
		n, ok, err := intVar(getenv, "LOCAL_WORLD_SIZE")
		if err != nil || !ok || n < 1 {
			return fmt.Errorf("%s=%q and LOCAL_RANK is set, but LOCAL_WORLD_SIZE=%q does not say how many processes torchrun started: set numProcPerNode to a number", envPETNProcPerNode, s, getenv("LOCAL_WORLD_SIZE"))
		}
		perNode = n
	}
	e.rank, e.size = node, nodes
	if perNode == 1 && !underTorchrun {
		return nil
	}
	if !underTorchrun {
		return fmt.Errorf("%s=%d asks for %d processes per pod, but this process has no LOCAL_RANK to tell them apart: set numProcPerNode: 1 (one Go process per pod), or start the processes with torchrun and set %s",
			envPETNProcPerNode, perNode, perNode, EnvRendezvousPort)
	}
	if local < 0 || local >= perNode {
		return fmt.Errorf("LOCAL_RANK=%d is not within %s=%d", local, envPETNProcPerNode, perNode)
	}
	e.rank, e.size = node*perNode+local, nodes*perNode
	e.localRank, e.localSize = local, perNode
	return nil
}

// readIndexedJob reads a pod of an Indexed Job (or of a JobSet's only
// replicated Job): rank JOB_COMPLETION_INDEX, which Kubernetes sets, of
// GORUN_SIZE, which the manifest must set to the Job's completions.
func readIndexedJob(getenv func(string) string, e *launchEnv) error {
	e.source = "indexed-job"
	var ok bool
	var err error
	if e.rank, _, err = intVar(getenv, envJobCompletionIndex); err != nil {
		return err
	}
	if e.size, ok, err = intVar(getenv, EnvSize); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%s=%d (an indexed Job's pod) but %s is not set: set %s to the Job's completions in the pod template's env",
			envJobCompletionIndex, e.rank, EnvSize, EnvSize)
	}
	return nil
}

// readTorchElasticRendezvous: rank 0 hosts the rendezvous on pod 0,
// PET_MASTER_ADDR (Trainer) or MASTER_ADDR (PyTorchJob), at
// GORUN_RENDEZVOUS_PORT, else at PET_MASTER_PORT or MASTER_PORT. Under
// torchrun (LOCAL_RANK set) those ports are torchrun's own (its agent's
// store listens there on pod 0), so GORUN_RENDEZVOUS_PORT is required.
func readTorchElasticRendezvous(getenv func(string) string, e *launchEnv) error {
	hostVar, portVar := envPETMasterAddr, envPETMasterPort
	if getenv(hostVar) == "" {
		hostVar, portVar = "MASTER_ADDR", "MASTER_PORT"
	}
	host := getenv(hostVar)
	if host == "" {
		if e.size > 1 {
			return fmt.Errorf("rank %d of %d (from %s): neither %s nor MASTER_ADDR is set: set %s to pod 0's DNS name, or set %s", e.rank, e.size, envPETNodeRank, envPETMasterAddr, envPETMasterAddr, EnvRendezvousAddr)
		}
		return nil
	}
	port, err := rendezvousPortOverride(getenv)
	if err != nil {
		return err
	}
	if port == 0 {
		if getenv("LOCAL_RANK") != "" {
			return fmt.Errorf("rank %d of %d: under torchrun (LOCAL_RANK is set), %s=%s is torchrun's own port on pod 0: set %s to another port open between the pods", e.rank, e.size, portVar, getenv(portVar), EnvRendezvousPort)
		}
		var ok bool
		if port, ok, err = intVar(getenv, portVar); err != nil {
			return err
		}
		if !ok || port < 1 || port > 65535 {
			return fmt.Errorf("%s=%q is not a TCP port: set it, or %s", portVar, getenv(portVar), EnvRendezvousPort)
		}
	}
	e.rendezvous, e.hostRendezvous = net.JoinHostPort(host, strconv.Itoa(port)), true
	return nil
}
