package collective

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorun/gorun/internal/hostlist"
	"github.com/gorun/gorun/p2p"
	"github.com/gorun/gorun/ring"
	"golang.org/x/sys/unix"
)

// TuningEnv are the tuning variables: gorun hands those set in its own
// environment to every rank, remote ones included, because ranks that
// disagree on them fail (an allreduce algorithm is part of every message's
// fingerprint) or lose speed.
var TuningEnv = []string{EnvAllreduceAlgorithms, EnvChunkBytes, EnvCPUBind, EnvDataPlane, EnvPollUS, EnvShm, EnvShmBytes}

// The environment contract. gorun sets the GORUN_* variables for every rank;
// the others are read so that the same binary also runs without gorun,
// under a scheduler. The first source whose rank variable is set wins:
//
//   - gorun: GORUN_RANK, GORUN_SIZE, GORUN_LOCAL_RANK, GORUN_LOCAL_SIZE.
//   - mpirun: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE.
//   - srun: rank SLURM_PROCID of SLURM_NTASKS (or SLURM_NPROCS), local rank
//     SLURM_LOCALID, local size this node's (SLURM_NODEID) entry of
//     SLURM_STEP_TASKS_PER_NODE ("2(x3),1"; else SLURM_TASKS_PER_NODE, else
//     SLURM_NTASKS_PER_NODE). Without another rendezvous (below) rank 0
//     hosts it on the first node of SLURM_STEP_NODELIST (else
//     SLURM_JOB_NODELIST, SLURM_NODELIST), at GORUN_RENDEZVOUS_PORT or at
//     20000 + (SLURM_JOB_ID mod 1000)*10 + (SLURM_STEP_ID mod 10), so job
//     4242's step 1 uses port 22421 (see slurmRendezvousPortBase). Task 0
//     must run on that node (srun's default block distribution).
//   - torchrun's PET_* arguments, which Kubeflow Trainer v2 sets for every
//     pod of a TrainJob and the training operator (v1.7 on) for every pod
//     of a PyTorchJob: pod PET_NODE_RANK of PET_NNODES; rank 0 hosts the
//     rendezvous at PET_MASTER_ADDR:PET_MASTER_PORT (Trainer), or
//     MASTER_ADDR:MASTER_PORT (PyTorchJob: the master pod, rank 0). A Go
//     program runs one process per pod (numProcPerNode: 1; a
//     PET_NPROC_PER_NODE that is not a number, such as PyTorchJob's default
//     "auto", counts as 1). With PET_NPROC_PER_NODE=N>1 the processes must
//     come from torchrun, which sets LOCAL_RANK (rank = PET_NODE_RANK*N +
//     LOCAL_RANK), and GORUN_RENDEZVOUS_PORT must name a port other than
//     torchrun's own; without LOCAL_RANK it is an error.
//   - torchrun, and PyTorchJob before v1.7: RANK, WORLD_SIZE, LOCAL_RANK,
//     LOCAL_WORLD_SIZE; rank 0 hosts the rendezvous at
//     MASTER_ADDR:MASTER_PORT.
//   - An Indexed Job or a JobSet: rank JOB_COMPLETION_INDEX (Kubernetes
//     sets it) of GORUN_SIZE (the manifest sets it to the completions); the
//     manifest sets GORUN_RENDEZVOUS_ADDR to pod 0's stable DNS name and a
//     port, e.g. train-0.train:29400 (a Job "train" with a headless
//     Service "train" as the pods' subdomain) or
//     train-workers-0-0.train:29400 (JobSet "train", replicated Job
//     "workers", replicas: 1).
//
// The rendezvous: GORUN_RENDEZVOUS (hosted by gorun), else
// GORUN_RENDEZVOUS_ADDR (hosted by rank 0), else the source's own, as above
// (MASTER_ADDR:MASTER_PORT for every source but Trainer's). The job key:
// GORUN_JOB_KEY, or the file GORUN_JOB_KEY_FILE, which must be a regular
// file that only its owner can read (chmod 600), as ssh demands of a key.
const (
	EnvRank           = "GORUN_RANK"            // this process's rank, 0..size-1
	EnvSize           = "GORUN_SIZE"            // number of ranks in the job
	EnvLocalRank      = "GORUN_LOCAL_RANK"      // rank among the ranks on this host
	EnvLocalSize      = "GORUN_LOCAL_SIZE"      // number of ranks on this host
	EnvHost           = "GORUN_HOST"            // this rank's host as named in gorun's -H, hostfile or discovery script ("localhost" for a job on one host)
	EnvRendezvous     = "GORUN_RENDEZVOUS"      // host:port of the rendezvous hosted by gorun
	EnvRendezvousAddr = "GORUN_RENDEZVOUS_ADDR" // host:port rank 0 hosts the rendezvous on (without gorun)
	EnvRendezvousPort = "GORUN_RENDEZVOUS_PORT" // port of the rendezvous rank 0 hosts under srun or Trainer, instead of the derived one or PET_MASTER_PORT
	EnvJobKey         = "GORUN_JOB_KEY"         // hex job key proving membership
	EnvJobKeyFile     = "GORUN_JOB_KEY_FILE"    // file holding the hex job key, readable by its owner only (chmod 600)
	EnvTimeout        = "GORUN_TIMEOUT"         // collective timeout, a Go duration ("60s") or seconds
	EnvListenIP       = "GORUN_LISTEN_IP"       // IP this rank listens on and advertises
	EnvDataPlane      = "GORUN_DATA_PLANE"      // auto | tls | plaintext | libp2p
	EnvRestartCount   = "GORUN_RESTART_COUNT"   // how many times gorun restarted the job
	EnvVerbose        = "GORUN_VERBOSE"         // non-empty: print connection diagnostics
	EnvChunkBytes     = "GORUN_CHUNK_BYTES"     // ring pipelining chunk size in bytes (tuning)

	// EnvAllreduceAlgorithms chooses the allreduce algorithm by buffer
	// size (tuning; see ring.ParseAllreducePolicy): comma-separated
	// name:max-bytes entries, the last without a size, e.g.
	// "direct:4K,scatter-gather:2M,ring" (up to 4 KiB direct, up to 2 MiB
	// scatter-gather, above that the ring). Sizes are bytes with an
	// optional K, M or G suffix (binary). A single name forces that
	// algorithm for every size: ring, direct, recursive-doubling,
	// rabenseifner, scatter-gather or hierarchical. Unset, "" or "default":
	// the measured defaults for the job's size and links, which add the
	// hierarchical allreduce from 512 KiB when every host runs the same
	// number (two or more) of ranks; a policy that is given is obeyed as
	// it is. Every rank must
	// use the same value (the algorithm is part of every message's call
	// fingerprint, so ranks that disagree fail with a mismatch error); a
	// value that does not parse fails Init.
	EnvAllreduceAlgorithms = "GORUN_ALLREDUCE_ALGORITHMS"

	// EnvShm "0" (or off, false, no) keeps ranks of one host on unix
	// sockets instead of shared-memory links; a pair uses shared memory
	// only if both ranks allow it (tuning).
	EnvShm = "GORUN_SHM"
	// EnvShmBytes is the size of each shared-memory link's ring buffer in
	// bytes, rounded up to a power of two (default 2 MiB; tuning).
	EnvShmBytes = "GORUN_SHM_BYTES"
	// EnvPollUS is how long, in microseconds, a receive polls before it
	// sleeps (default 50; 0 sleeps at once; tuning).
	EnvPollUS = "GORUN_POLL_US"

	// EnvElastic is "1" in an elastic job (gorun --min-np/--max-np or a
	// host discovery script): a lost member re-forms the job in place
	// instead of stopping it (see RunElastic). A joiner, started to join a
	// running job, gets GORUN_RANK=-1; its GORUN_SIZE is then the job's
	// initial -np and is ignored (the rendezvous assigns rank and size).
	EnvElastic = "GORUN_ELASTIC"
	// EnvHeartbeatTimeout is the heartbeat bound of an elastic job, a Go
	// duration ("3s") or seconds: a member silent for that long counts as
	// lost. Every member and the rendezvous use the same value (gorun sets
	// it); 3s when unset.
	EnvHeartbeatTimeout = "GORUN_HEARTBEAT_TIMEOUT"
)

// DefaultTimeout bounds every collective unless WithTimeout or GORUN_TIMEOUT
// says otherwise.
const DefaultTimeout = 60 * time.Second

// launchEnv is what Init learns from the environment: who we are and how to
// find the rest of the job.
type launchEnv struct {
	source               string // "gorun", "mpirun", "slurm", "torch-elastic", "torchrun", "indexed-job" or "" (none)
	rank, size           int
	localRank, localSize int
	rendezvous           string // host:port
	hostRendezvous       bool   // rank 0 must host the rendezvous itself
	jobKey               []byte
	elastic              bool          // GORUN_ELASTIC=1; rank -1 is a joiner
	heartbeat            time.Duration // GORUN_HEARTBEAT_TIMEOUT, 0 if unset
	localSizeKnown       bool          // the source said how many ranks share this host
}

// Ports of the rendezvous that rank 0 hosts under srun when nothing names
// one: slurmRendezvousPortBase + (job id mod 1000)*10 + (step id mod 10),
// in 20000..29999, below Linux's ephemeral range (32768-60999 by default)
// so that no outgoing connection holds it. Two concurrent steps of a job
// get different ports unless their step ids differ by a multiple of 10,
// two jobs sharing a node unless their ids end in the same three digits;
// and a user can read the port off the job id (job 4242 step 1: 22421).
const (
	slurmRendezvousPortBase = 20000
	slurmRendezvousPorts    = 10000
)

// slurmBatchStep and slurmExternStep are the step ids Slurm gives the batch
// script and the extern step (SLURM_BATCH_SCRIPT, SLURM_EXTERN_CONT).
const (
	slurmBatchStep  = 4294967294
	slurmExternStep = 4294967295
)

// readEnv reads the launch environment through getenv (os.Getenv in
// production, a map in tests). The first source whose rank variable is set
// wins, in this order: GORUN_RANK (gorun), OMPI_COMM_WORLD_RANK (mpirun),
// SLURM_PROCID (srun), PET_NODE_RANK (Kubeflow Trainer / torch elastic),
// RANK (torchrun, Kubeflow PyTorchJob), JOB_COMPLETION_INDEX (an indexed
// Kubernetes Job or JobSet). An error names the variable and the fix.
func readEnv(getenv func(string) string) (launchEnv, error) {
	var e launchEnv
	e.localRank, e.localSize = -1, -1
	var err error
	switch {
	case getenv(EnvRank) != "":
		err = readRankVars(getenv, &e, "gorun", EnvRank, EnvSize, EnvLocalRank, EnvLocalSize)
	case getenv("OMPI_COMM_WORLD_RANK") != "":
		err = readRankVars(getenv, &e, "mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")
	case getenv("SLURM_PROCID") != "":
		err = readSlurm(getenv, &e)
	case getenv(envPETNodeRank) != "":
		err = readTorchElastic(getenv, &e)
	case getenv("RANK") != "":
		err = readRankVars(getenv, &e, "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
	case getenv(envJobCompletionIndex) != "":
		err = readIndexedJob(getenv, &e)
	default:
		return e, nil
	}
	if err != nil {
		return e, err
	}
	switch v := strings.TrimSpace(getenv(EnvElastic)); v {
	case "", "0":
	case "1":
		e.elastic = true
	default:
		return e, fmt.Errorf("%s=%q: want 1 (elastic) or 0", EnvElastic, v)
	}
	if s := getenv(EnvHeartbeatTimeout); s != "" {
		d, err := parseDuration(EnvHeartbeatTimeout, s)
		if err != nil || d <= 0 {
			return e, fmt.Errorf("%s=%q is not a positive duration (write 3s)", EnvHeartbeatTimeout, s)
		}
		e.heartbeat = d
	}
	joiner := e.elastic && e.rank == -1
	if joiner {
		// A joiner's rank and size come from the rendezvous.
		e.size = max(e.size, 1)
	}
	if e.rank == -1 && !e.elastic {
		return e, fmt.Errorf("rank -1 (a joiner) from %s environment, but the job is not elastic (%s is not 1)", e.source, EnvElastic)
	}
	if !joiner && (e.size < 1 || e.rank < 0 || e.rank >= e.size) {
		return e, fmt.Errorf("rank %d is not within a job of size %d (from %s environment)", e.rank, e.size, e.source)
	}
	if e.localRank < 0 {
		e.localRank = 0
	}
	e.localSizeKnown = e.localSize >= 1
	if e.localSize < 1 {
		e.localSize = 1
	}

	if err := readRendezvous(getenv, &e); err != nil {
		return e, err
	}
	if (e.size > 1 || e.elastic) && e.rendezvous == "" {
		return e, fmt.Errorf("rank %d of %d (from %s environment): no rendezvous address: launch with gorun, or set %s or MASTER_ADDR and MASTER_PORT",
			e.rank, e.size, e.source, EnvRendezvousAddr)
	}

	key, err := readJobKey(getenv)
	if err != nil {
		return e, err
	}
	if (e.size > 1 || e.elastic) && key == nil {
		return e, fmt.Errorf("rank %d of %d: no job key: set %s (hex) or %s; every rank of the job must use the same key (gorun sets it for you)",
			e.rank, e.size, EnvJobKey, EnvJobKeyFile)
	}
	e.jobKey = key
	return e, nil
}

// Variables of the Kubernetes contracts.
const (
	envPETNodeRank        = "PET_NODE_RANK"        // Trainer v2: the pod's index (its Job completion index)
	envPETNNodes          = "PET_NNODES"           // Trainer v2: number of pods
	envPETNProcPerNode    = "PET_NPROC_PER_NODE"   // Trainer v2: processes per pod (numProcPerNode)
	envPETMasterAddr      = "PET_MASTER_ADDR"      // Trainer v2: DNS name of pod 0
	envPETMasterPort      = "PET_MASTER_PORT"      // Trainer v2: port on pod 0
	envJobCompletionIndex = "JOB_COMPLETION_INDEX" // the index of a pod of an Indexed Job (Kubernetes sets it)
)

// intVar reads an integer variable; ok is false when it is unset.
func intVar(getenv func(string) string, name string) (v int, ok bool, err error) {
	s := strings.TrimSpace(getenv(name))
	if s == "" {
		return 0, false, nil
	}
	v, err = strconv.Atoi(s)
	if err != nil {
		return 0, true, fmt.Errorf("%s=%q is not an integer", name, getenv(name))
	}
	return v, true, nil
}

// readRankVars reads a source whose rank, size, local rank and local size
// are four variables (the last two optional).
func readRankVars(getenv func(string) string, e *launchEnv, source, rankVar, sizeVar, localRankVar, localSizeVar string) error {
	e.source = source
	var ok bool
	var err error
	if e.rank, _, err = intVar(getenv, rankVar); err != nil {
		return err
	}
	if e.size, ok, err = intVar(getenv, sizeVar); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("%s is set but %s is not: set both", rankVar, sizeVar)
	}
	if v, ok, err := intVar(getenv, localRankVar); err != nil {
		return err
	} else if ok {
		e.localRank = v
	}
	if v, ok, err := intVar(getenv, localSizeVar); err != nil {
		return err
	} else if ok {
		e.localSize = v
	}
	return nil
}

// readSlurm reads a task of an srun step: rank SLURM_PROCID of
// SLURM_NTASKS (or SLURM_NPROCS), local rank SLURM_LOCALID, and as local
// size the entry of SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE,
// else SLURM_NTASKS_PER_NODE) for this node, SLURM_NODEID.
func readSlurm(getenv func(string) string, e *launchEnv) error {
	sizeVar := "SLURM_NTASKS"
	if getenv(sizeVar) == "" && getenv("SLURM_NPROCS") != "" {
		sizeVar = "SLURM_NPROCS"
	}
	if err := readRankVars(getenv, e, "slurm", "SLURM_PROCID", sizeVar, "SLURM_LOCALID", ""); err != nil {
		return err
	}
	nodeID, haveNode, err := intVar(getenv, "SLURM_NODEID")
	if err != nil {
		return err
	}
	for _, name := range []string{"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"} {
		s := getenv(name)
		if s == "" {
			continue
		}
		counts, err := hostlist.ExpandCounts(s)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		switch {
		case len(counts) == 1:
			e.localSize = counts[0]
		case !haveNode:
			return fmt.Errorf("%s=%q lists several nodes but SLURM_NODEID is not set, so this task's node is unknown: run the program with srun", name, s)
		case nodeID < 0 || nodeID >= len(counts):
			return fmt.Errorf("SLURM_NODEID=%d is not a node of %s=%q (%d nodes)", nodeID, name, s, len(counts))
		default:
			e.localSize = counts[nodeID]
		}
		if e.localRank >= e.localSize {
			return fmt.Errorf("SLURM_LOCALID=%d is not below this node's task count %d (from %s=%q)", e.localRank, e.localSize, name, s)
		}
		break
	}
	return nil
}

// slurmRendezvous is the rendezvous of an srun step when nothing else names
// one: the step's first node, at GORUN_RENDEZVOUS_PORT or the port derived
// from the job and step ids (see slurmRendezvousPortBase).
func slurmRendezvous(getenv func(string) string) (string, error) {
	var list, listVar string
	for _, name := range []string{"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"} {
		if list = getenv(name); list != "" {
			listVar = name
			break
		}
	}
	if nodeID, ok, _ := intVar(getenv, "SLURM_NODEID"); ok && nodeID != 0 && getenv("SLURM_PROCID") == "0" {
		// Rank 0 hosts the rendezvous on the first node of the step: with a
		// distribution that puts task 0 elsewhere, the other ranks would
		// look for it on the wrong node.
		return "", fmt.Errorf("SLURM_PROCID=0 runs on node %d of the step (SLURM_NODEID), not on its first node, where the ranks look for the rendezvous: use srun's default block distribution, or set %s=HOST:PORT to rank 0's node for every task", nodeID, EnvRendezvousAddr)
	}
	if list == "" {
		return "", fmt.Errorf("no rendezvous address: SLURM_STEP_NODELIST (and SLURM_JOB_NODELIST) are not set, so the first node of the step is unknown: run the program with srun, or set %s=HOST:PORT", EnvRendezvousAddr)
	}
	nodes, err := hostlist.Expand(list)
	if err != nil {
		return "", fmt.Errorf("%s: %w", listVar, err)
	}
	port, err := rendezvousPortOverride(getenv)
	if err != nil {
		return "", err
	}
	if port == 0 && getenv("SLURM_STEP_RESV_PORTS") != "" {
		// Ports Slurm reserved for this step alone (MpiParams=ports=...,
		// srun --resv-ports), as OpenMPI uses them: no other job or step
		// on the node holds them, which a derived port cannot promise.
		v := getenv("SLURM_STEP_RESV_PORTS")
		first, _, _ := strings.Cut(v, ",")
		first, _, _ = strings.Cut(first, "-")
		if port, err = strconv.Atoi(strings.TrimSpace(first)); err != nil || port <= 0 || port > 65535 {
			return "", fmt.Errorf("SLURM_STEP_RESV_PORTS=%q does not start with a port: set %s", v, EnvRendezvousPort)
		}
	}
	if port == 0 {
		job, step := getenv("SLURM_JOB_ID"), getenv("SLURM_STEP_ID")
		if job == "" {
			job = getenv("SLURM_JOBID")
		}
		if step == "" {
			step = getenv("SLURM_STEPID")
		}
		if job == "" || step == "" {
			return "", fmt.Errorf("SLURM_JOB_ID or SLURM_STEP_ID is not set, so this process is not a task of an srun step (is it running in the batch script itself?): start it with srun, or with gorun, or set %s", EnvRendezvousPort)
		}
		jobID, err1 := strconv.ParseUint(strings.TrimSpace(job), 10, 64)
		stepID, err2 := strconv.ParseUint(strings.TrimSpace(step), 10, 64)
		if err1 != nil || err2 != nil {
			return "", fmt.Errorf("SLURM_JOB_ID=%q and SLURM_STEP_ID=%q must be integers to derive the rendezvous port: set %s", job, step, EnvRendezvousPort)
		}
		if stepID == slurmBatchStep || stepID == slurmExternStep {
			return "", fmt.Errorf("SLURM_STEP_ID=%d is Slurm's batch or extern step, not an srun step: start the ranks with srun (or gorun) inside the batch script", stepID)
		}
		port = slurmRendezvousPort(jobID, stepID)
	}
	return net.JoinHostPort(nodes[0], strconv.Itoa(port)), nil
}

// slurmRendezvousPort derives the rendezvous port of a step from its job
// and step ids (see slurmRendezvousPortBase).
func slurmRendezvousPort(jobID, stepID uint64) int {
	return slurmRendezvousPortBase + int(jobID%1000)*10 + int(stepID%10)
}

// rendezvousPortOverride reads GORUN_RENDEZVOUS_PORT; 0 when unset.
func rendezvousPortOverride(getenv func(string) string) (int, error) {
	s := strings.TrimSpace(getenv(EnvRendezvousPort))
	if s == "" {
		return 0, nil
	}
	port, err := strconv.Atoi(s)
	if err != nil || port < 1 || port > 65535 {
		return 0, fmt.Errorf("%s=%q is not a TCP port (1-65535)", EnvRendezvousPort, s)
	}
	return port, nil
}

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
		return fmt.Errorf("%s=%q is a range of sizes (an elastic PyTorchJob): a gorun job without gorun has a fixed size: remove elasticPolicy, or launch with gorun --min-np/--max-np", envPETNNodes, s)
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

// readRendezvous sets the rendezvous: GORUN_RENDEZVOUS (gorun's), else
// GORUN_RENDEZVOUS_ADDR (hosted by rank 0), else the source's own:
// PET_MASTER_ADDR:PET_MASTER_PORT for the PET_* source
// (readTorchElasticRendezvous), MASTER_ADDR:MASTER_PORT for the others, and
// under srun without MASTER_* the step's first node at a port derived from
// the job (slurmRendezvous).
func readRendezvous(getenv func(string) string, e *launchEnv) error {
	switch {
	case getenv(EnvRendezvous) != "":
		e.rendezvous = getenv(EnvRendezvous)
		return nil
	case getenv(EnvRendezvousAddr) != "":
		e.rendezvous, e.hostRendezvous = getenv(EnvRendezvousAddr), true
		return nil
	case e.source == "torch-elastic":
		return readTorchElasticRendezvous(getenv, e)
	case getenv("MASTER_ADDR") != "" && getenv("MASTER_PORT") != "":
		e.rendezvous, e.hostRendezvous = net.JoinHostPort(getenv("MASTER_ADDR"), getenv("MASTER_PORT")), true
		return nil
	case e.source == "slurm" && (e.size > 1 || e.elastic):
		addr, err := slurmRendezvous(getenv)
		if err != nil {
			return fmt.Errorf("rank %d of %d (from slurm environment): %w", e.rank, e.size, err)
		}
		e.rendezvous, e.hostRendezvous = addr, true
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

// readJobKey reads the job key from GORUN_JOB_KEY, or from the file named
// by GORUN_JOB_KEY_FILE. Like ssh with a private key, it refuses a file
// that is not a regular file or that its group or others may read: the key
// is what proves membership in the job.
func readJobKey(getenv func(string) string) ([]byte, error) {
	text, from := getenv(EnvJobKey), EnvJobKey
	if text == "" && getenv(EnvJobKeyFile) != "" {
		name := getenv(EnvJobKeyFile)
		from = EnvJobKeyFile + "=" + name
		b, err := readPrivateFile(name)
		if err != nil {
			return nil, fmt.Errorf("job key from %s: %w", EnvJobKeyFile, err)
		}
		text = string(b)
	}
	text = strings.TrimSpace(text)
	if text == "" {
		return nil, nil
	}
	key, err := hex.DecodeString(text)
	if err != nil || len(key) < 16 {
		return nil, fmt.Errorf("job key from %s must be at least 32 hex digits (16 bytes)", from)
	}
	return key, nil
}

// readPrivateFile reads a regular file that only its owner may read or
// write (mode & 0o077 == 0). The mode is that of the file opened, so a
// symbolic link (a Kubernetes Secret volume's files are links) is judged
// by its target. It opens without blocking, so a FIFO named by mistake is
// refused rather than waited on forever.
func readPrivateFile(name string) ([]byte, error) {
	fd, err := unix.Open(name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%v): put the key in a file and run chmod 600 on it", name, st.Mode().Type())
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%s has mode %04o, so others than its owner can read it: run chmod 600 %s (on Kubernetes: defaultMode: 0400 on the Secret volume, and no fsGroup)", name, perm, name)
	}
	return io.ReadAll(io.LimitReader(f, 1<<16))
}

// hostingListenAddr is the address a rank that hosts the rendezvous at addr
// listens on. An IP address is kept. A host name becomes every interface,
// at the same port: the name may resolve, on the hosting node itself, to
// a loopback address (Debian's "127.0.1.1 hostname" line in /etc/hosts) or
// not at all yet (a pod's own headless-Service name before it is published),
// while the other ranks reach the node by that name.
func hostingListenAddr(ctx context.Context, addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("rendezvous address %q: %w (write HOST:PORT)", addr, err)
	}
	if host == "" || net.ParseIP(host) != nil {
		return addr, nil
	}
	if ips, err := net.DefaultResolver.LookupIP(ctx, "ip", host); err == nil && len(ips) > 0 && !slices.ContainsFunc(ips, func(ip net.IP) bool { return ip.To4() != nil }) {
		return net.JoinHostPort("::", port), nil // an IPv6-only name
	}
	return net.JoinHostPort("", port), nil // 0.0.0.0
}

// defaultListenIP is the IP a rank listens on and advertises to its peers
// when GORUN_LISTEN_IP does not say: the address this host reaches the
// rendezvous from (the source address of the route to it; a connected UDP
// socket sends nothing), as gorun chooses for its remote ranks. A host name
// that leads to loopback when the job spans hosts (multiHost: the source
// said fewer ranks share this host than the job has) is this host's own
// name in /etc/hosts: the default route's address is taken instead, or,
// without one, it is an error, since ranks on other hosts could not reach
// a loopback address.
func defaultListenIP(ctx context.Context, rendezvous string, multiHost bool) (string, error) {
	host, port, err := net.SplitHostPort(rendezvous)
	if err != nil {
		return "", fmt.Errorf("rendezvous address %q: %w (write HOST:PORT)", rendezvous, err)
	}
	if _, err := strconv.Atoi(port); err != nil {
		return "", fmt.Errorf("rendezvous address %q: port %q is not a number", rendezvous, port)
	}
	ips, err := p2p.LookupIP(ctx, host) // retried until ctx ends: pod 0's name may come later
	if err != nil {
		return "", fmt.Errorf("resolving the rendezvous host %q to choose this rank's address: %w (set %s to this host's address)", host, err, EnvListenIP)
	}
	var errs []error
	for _, ip := range ips {
		src, err := p2p.RouteSource(ip.String())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		local := net.ParseIP(src)
		// A name that resolves to loopback (Debian's "127.0.1.1 node1" in
		// /etc/hosts) on a job that spans hosts; a loopback IP written as
		// such says the job runs on this host alone.
		// This host's own name then, for which Debian's /etc/hosts says
		// 127.0.1.1 while the other hosts' DNS knows its real address:
		// take the address of the default route, as a host would to reach
		// the others.
		if local.IsLoopback() && multiHost && net.ParseIP(host) == nil {
			if out := defaultRouteSource(); out != nil {
				return out.String(), nil
			}
			return "", fmt.Errorf("the rendezvous host %q is %v, a loopback address on this host, and this host has no default route, so ranks on other hosts could not reach this one: set %s to this host's address on the job's network (or fix %q in /etc/hosts)", host, ip, EnvListenIP, host)
		}
		return local.String(), nil
	}
	return "", fmt.Errorf("no route to the rendezvous host %q (%v): %w; set %s to this host's address", host, ips, errors.Join(errs...), EnvListenIP)
}

// defaultRouteSource is the address this host sends from toward a host
// that no more specific route covers (a connected UDP socket sends
// nothing), or nil without a default route.
func defaultRouteSource() net.IP {
	src, err := p2p.RouteSource("198.51.100.1") // TEST-NET-2
	if ip := net.ParseIP(src); err == nil && !ip.IsLoopback() {
		return ip
	}
	return nil
}

// parseTimeout accepts a Go duration ("90s", "2m") or plain seconds ("90").
func parseTimeout(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if secs, err := strconv.ParseFloat(s, 64); err == nil {
		if secs <= 0 {
			return 0, fmt.Errorf("%s=%q must be positive", EnvTimeout, s)
		}
		return time.Duration(secs * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s=%q is not a positive duration (write 60s or 60)", EnvTimeout, s)
	}
	return d, nil
}

// readAllreducePolicy reads GORUN_ALLREDUCE_ALGORITHMS through getenv; unset
// is the zero policy (the ring's measured defaults).
func readAllreducePolicy(getenv func(string) string) (ring.AllreducePolicy, error) {
	p, err := ring.ParseAllreducePolicy(getenv(EnvAllreduceAlgorithms))
	if err != nil {
		return p, fmt.Errorf("%s: %w", EnvAllreduceAlgorithms, err)
	}
	return p, nil
}

// hostIndices returns, for every rank of peers (in rank order), the index
// of its host: ranks with equal HostIDs get equal indices, numbered in the
// order of their first rank (ring.Config.Hosts). It returns nil for fewer
// than two ranks, or when a HostID is unknown.
func hostIndices(peers []p2p.Peer) []int {
	if len(peers) < 2 {
		return nil
	}
	out := make([]int, len(peers))
	ids := make(map[string]int, len(peers))
	for i, p := range peers {
		if p.Rank != i || p.HostID == "" {
			return nil
		}
		idx, ok := ids[p.HostID]
		if !ok {
			idx = len(ids)
			ids[p.HostID] = idx
		}
		out[i] = idx
	}
	return out
}
