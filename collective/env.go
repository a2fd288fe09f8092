package collective

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/gorun/gorun/p2p"
	"github.com/gorun/gorun/ring"
)

// What Init learns from its environment: the contract (the variables gorun
// sets, and those of the launchers a binary also runs under), and readEnv,
// which finds the launcher that started this rank and reads it. gorun,
// mpirun and torchrun name rank, size, local rank and local size in four
// variables each (readRankVars); Slurm (env_slurm.go) and the Kubernetes
// contracts (env_kubernetes.go) have readers of their own. The rendezvous
// and the job key come after the source (readRendezvous, env_jobkey.go).

// TuningEnv are the tuning variables: gorun hands those set in its own
// environment to every rank, remote ones included, because ranks that
// disagree on them fail (an allreduce algorithm is part of every message's
// fingerprint) or lose speed.
var TuningEnv = []string{EnvAllreduceAlgorithms, EnvChunkBytes, EnvCPUBind, EnvDataPlane, EnvPollUS, EnvShm, EnvShmBytes, EnvHandshakeTimeout, EnvAutotune}

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
//     must run on that node (srun's default block distribution). With
//     GORUN_ELASTIC=1 and GORUN_JOIN_STEP=S, the tasks of this step are
//     joiners of the elastic job of step S of the same allocation, found
//     through its replicas on the allocation's nodes (slurm_group.go).
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
//   - An elastic PyTorchJob (elasticPolicy): PET_RDZV_ENDPOINT names pod 0
//     and the port, PET_NNODES=MIN:MAX the bounds; the pod's index is
//     PET_NODE_RANK or read off HOSTNAME (env_kubernetes_elastic.go).
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
	// EnvAutotune "1" (or on, true, yes) has a job across hosts time the
	// allreduce schedules its links' model ranks close on the first calls
	// of every size and keep the fastest (links_refine.go), as Horovod's
	// HOROVOD_AUTOTUNE does. Off by default: choices from timings can
	// differ from run to run, and with them the float rounding, so a
	// resumed job would no longer end bitwise where an uninterrupted one
	// does. Every rank must use the same value.
	EnvAutotune = "GORUN_AUTOTUNE"

	// EnvShm "0" (or off, false, no) keeps ranks of one host on unix
	// sockets instead of shared-memory links; a pair uses shared memory
	// only if both ranks allow it (tuning).
	EnvShm = "GORUN_SHM"
	// EnvShmBytes is the size of each shared-memory link's ring buffer in
	// bytes, rounded up to a power of two (default 2 MiB, less on a host
	// of more than 23 ranks; tuning).
	EnvShmBytes = "GORUN_SHM_BYTES"
	// EnvHandshakeTimeout is how long a rank that expects no more links
	// waits for the hello of a connection to its data ports (a Go
	// duration, default 5s; tuning).
	EnvHandshakeTimeout = "GORUN_HANDSHAKE_TIMEOUT"
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
	// replica: this rank hosts a replica of the rendezvous group, whose
	// membership has the job's elastic bounds (env_replica.go).
	replica      bool
	replicaSpare bool // the replica is a spare (GORUN_RDZV_REPLICA=spare)
	minNP, maxNP int
	elasticWait  time.Duration
	// group: rank 0 hosts replica 1 of a rendezvous group (an elastic job
	// under srun or on Kubernetes); nodeID, nodeCounts: this task's node
	// in the step and the tasks of each (Slurm); pods: where the pods'
	// replicas listen (Kubernetes, env_kubernetes_elastic.go).
	group      bool
	nodeID     int
	nodeCounts []int
	pods       *podGroup
	// replicaID, replicaPort: the ID of this task's replica and the port
	// it listens on, under srun (slurm_group.go); 0: ReplicaID(rank), and
	// a free port.
	replicaID   uint64
	replicaPort int
	// srunJoin: this task of an srun step joins the elastic job of an
	// earlier step (GORUN_JOIN_STEP, slurm_group.go).
	srunJoin *slurmJoin
	// etcd: the membership is kept in etcd (env_etcd.go); nil: in the
	// rendezvous gorun or rank 0 hosts.
	etcd *p2p.EtcdGroup
}

// readEnv reads the launch environment through getenv (os.Getenv in
// production, a map in tests). The first source whose rank variable is set
// wins, in this order: GORUN_RANK (gorun), OMPI_COMM_WORLD_RANK (mpirun),
// SLURM_PROCID (srun), PET_RDZV_ENDPOINT (an elastic PyTorchJob),
// PET_NODE_RANK (Kubeflow Trainer / torch elastic),
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
	case elasticPyTorchJob(getenv):
		err = readElasticPyTorchJob(getenv, &e)
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
	if err := readEtcd(getenv, &e); err != nil {
		return e, err
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

	if e.etcd == nil {
		if err := readRendezvous(getenv, &e); err != nil {
			return e, err
		}
	}
	if err := readReplica(getenv, &e); err != nil {
		return e, err
	}
	if (e.size > 1 || e.elastic) && e.rendezvous == "" && e.etcd == nil {
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

// readRendezvous sets the rendezvous: GORUN_RENDEZVOUS (gorun's), else
// GORUN_RENDEZVOUS_ADDR (hosted by rank 0), else the source's own:
// PET_MASTER_ADDR:PET_MASTER_PORT for the PET_* source
// (readTorchElasticRendezvous), MASTER_ADDR:MASTER_PORT for the others, and
// under srun without MASTER_* the step's first node at a port derived from
// the job (slurmRendezvous).
func readRendezvous(getenv func(string) string, e *launchEnv) error {
	switch {
	case e.srunJoin != nil:
		// The replicas of the joined step's group (slurm_group.go).
		e.rendezvous = e.srunJoin.rendezvous()
		return nil
	case getenv(EnvRendezvous) != "":
		e.rendezvous = getenv(EnvRendezvous)
		return nil
	case getenv(EnvRendezvousAddr) != "":
		e.rendezvous, e.hostRendezvous = getenv(EnvRendezvousAddr), true
		return nil
	case e.source == "torch-elastic":
		return readTorchElasticRendezvous(getenv, e)
	case e.source == "pytorchjob-elastic":
		return nil // PET_RDZV_ENDPOINT (readElasticPyTorchJob)
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
// readAutotune reads EnvAutotune: off unless "1", "on", "true" or "yes".
func readAutotune(getenv func(string) string) (bool, error) {
	switch v := getenv(EnvAutotune); strings.ToLower(v) {
	case "1", "on", "true", "yes":
		return true, nil
	case "", "0", "off", "false", "no":
		return false, nil
	default:
		return false, fmt.Errorf("%s=%q: want 1 (time the links' allreduce choices on the first calls) or 0 (the default)", EnvAutotune, v)
	}
}

func readAllreducePolicy(getenv func(string) string) (ring.AllreducePolicy, error) {
	p, err := ring.ParseAllreducePolicy(getenv(EnvAllreduceAlgorithms))
	if err != nil {
		return p, fmt.Errorf("%s: %w", EnvAllreduceAlgorithms, err)
	}
	return p, nil
}
