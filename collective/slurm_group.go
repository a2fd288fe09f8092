package collective

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gorun/gorun/internal/hostlist"
	"github.com/gorun/gorun/p2p"
)

// Where the rendezvous group of an elastic srun step listens, so that the
// tasks of a later srun step in the same allocation can join it
// (GORUN_JOIN_STEP), even once rank 0 and its node are gone.
//
// As on Kubernetes (env_kubernetes_elastic.go), every replica that a later
// process may need to find listens on one port known in advance, the
// group's port: the port of the step's rendezvous address (derived from
// the job and step ids unless a variable names it, see readRendezvous),
// on its own node. Rank 0
// hosts replica 1 there on the step's first node; on every other node the
// first task that hosts a replica (local rank 0, see schedulerReplica)
// hosts it there, with an ID that follows from the node's name
// (slurmNodeReplicaID). A later step of the job knows the allocation's
// nodes (slurmJobNodes) and the job id, so from the id of the step it
// joins it can list every replica that may be listening: ID@node:port for
// each node, and replica 1 on the first node (slurmJoin.rendezvous). A
// replica that does not lead sends it to the one that does. The ID comes
// from the name, not from the node's place in the list, because the list
// a later step sees may lack a node that failed (Slurm takes a failed node
// out of a job that runs with --no-kill).
//
// Two replicas cannot share a port on one node: when the step has fewer
// nodes than replicas (on two nodes, node 1 hosts two of the group's
// three), the further ones on a node listen on a free port, with the
// usual ReplicaID(rank). The group knows where they are; a later step does
// not, and finds the group through the replicas at the group's port: with
// three nodes or more the group's three replicas are at that port on three
// nodes, with two nodes two of them are.

// EnvJoinStep names the srun step (its id in this allocation) whose
// elastic job the tasks of this step join: GORUN_JOIN_STEP=0 for a job
// started by the allocation's first srun. Its tasks are joiners (rank -1):
// the job admits them at its next commit and gives them their ranks.
const EnvJoinStep = "GORUN_JOIN_STEP"

// slurmProbeTimeout bounds a joiner's dial of the group's port on one
// node: a node that is up answers (or refuses) within a round trip, and a
// failed one must not hold up the others.
const slurmProbeTimeout = 2 * time.Second

// slurmProbeInterval is how long a joiner waits before asking the nodes
// again when no replica answered: the step it joins may still be
// starting, its ranks not listening yet.
const slurmProbeInterval = time.Second

// slurmJoin is where the tasks of a joining step look for the group of the
// step they join.
type slurmJoin struct {
	job, step uint64
	nodeList  string   // the allocation's nodes, as Slurm wrote them (for messages)
	nodes     []string // the allocation's nodes
	self      string   // the joiner's node
	port      int      // the group's port
	portFrom  string   // where port came from (for messages)
}

// readSlurmJoin reads GORUN_JOIN_STEP for a task of an srun step: with it
// set, the task is a joiner of that step's elastic job, which it finds on
// the allocation's nodes at the group's port. The port is the one the
// joined step's tasks use: that of GORUN_RENDEZVOUS_ADDR, else
// MASTER_PORT (with MASTER_ADDR), else GORUN_RENDEZVOUS_PORT, else
// derived from the job and the joined step's id, as slurmRendezvous
// chooses it. Ports that srun reserved for the joined step
// (SLURM_STEP_RESV_PORTS) are not known to another step: such a step's
// joiners need GORUN_RENDEZVOUS_PORT, set for both steps.
func readSlurmJoin(getenv func(string) string, e *launchEnv) error {
	s := strings.TrimSpace(getenv(EnvJoinStep))
	if s == "" {
		return nil
	}
	if v := strings.TrimSpace(getenv(EnvElastic)); v != "1" {
		return fmt.Errorf("%s=%s, but %s=%q: only an elastic job takes joiners: set %s=1 for this step (and for the step it joins)", EnvJoinStep, s, EnvElastic, v, EnvElastic)
	}
	step, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return fmt.Errorf("%s=%q is not a step id: name the srun step to join by its number (srun -v prints StepId=JOB.STEP; the first srun in a batch script or salloc is step 0)", EnvJoinStep, s)
	}
	if step == slurmBatchStep || step == slurmExternStep {
		return fmt.Errorf("%s=%d is Slurm's batch or extern step, which runs no ranks: name the srun step whose job to join (0 for the first)", EnvJoinStep, step)
	}
	jobVar := "SLURM_JOB_ID"
	job := strings.TrimSpace(getenv(jobVar))
	if job == "" {
		jobVar = "SLURM_JOBID"
		job = strings.TrimSpace(getenv(jobVar))
	}
	jobID, err := strconv.ParseUint(job, 10, 64)
	if err != nil {
		return fmt.Errorf("%s=%d, but %s=%q is not a job id: start the joining tasks with srun inside the allocation of the step they join", EnvJoinStep, step, jobVar, job)
	}
	if own := firstSet(getenv("SLURM_STEP_ID"), getenv("SLURM_STEPID")); own == s {
		return fmt.Errorf("%s=%d is this step itself: name another step of job %d, the one whose job these tasks join", EnvJoinStep, step, jobID)
	}
	nodes, list, err := slurmJobNodes(getenv)
	if err != nil {
		return fmt.Errorf("%s=%d: %w", EnvJoinStep, step, err)
	}
	j := &slurmJoin{job: jobID, step: step, nodeList: list, nodes: nodes, self: slurmNodeName(getenv, e)}
	if j.port, j.portFrom, err = slurmJoinPort(getenv, jobID, step); err != nil {
		return fmt.Errorf("%s=%d: %w", EnvJoinStep, step, err)
	}
	e.rank, e.srunJoin = -1, j
	return nil
}

// firstSet is the first of a and b that is not empty, trimmed.
func firstSet(a, b string) string {
	if a = strings.TrimSpace(a); a != "" {
		return a
	}
	return strings.TrimSpace(b)
}

// slurmJoinPort is the group's port of the joined step, as the joined
// step's tasks chose it (see readSlurmJoin), and what chose it.
func slurmJoinPort(getenv func(string) string, job, step uint64) (int, string, error) {
	if addr := getenv(EnvRendezvousAddr); addr != "" {
		_, p, err := net.SplitHostPort(addr)
		port, perr := strconv.Atoi(p)
		if err != nil || perr != nil || port < 1 || port > 65535 {
			return 0, "", fmt.Errorf("%s=%q is not HOST:PORT", EnvRendezvousAddr, addr)
		}
		return port, EnvRendezvousAddr, nil
	}
	if getenv("MASTER_ADDR") != "" && getenv("MASTER_PORT") != "" {
		port, err := strconv.Atoi(strings.TrimSpace(getenv("MASTER_PORT")))
		if err != nil || port < 1 || port > 65535 {
			return 0, "", fmt.Errorf("MASTER_PORT=%q is not a TCP port", getenv("MASTER_PORT"))
		}
		return port, "MASTER_PORT", nil
	}
	if port, err := rendezvousPortOverride(getenv); err != nil || port != 0 {
		return port, EnvRendezvousPort, err
	}
	return slurmRendezvousPort(job, step), fmt.Sprintf("derived from job %d, step %d", job, step), nil
}

// slurmJobNodes is the allocation's nodes: those of SLURM_NODELIST and
// of SLURM_JOB_NODELIST, in that order, each once, and the longer of the
// two lists as Slurm wrote it (for messages). Inside salloc or sbatch both
// name the allocation; srun --jobid=JOB run from outside it sets
// SLURM_JOB_NODELIST to the step's own nodes and SLURM_NODELIST to the
// allocation's (Slurm 22.05).
func slurmJobNodes(getenv func(string) string) (nodes []string, list string, err error) {
	for _, name := range []string{"SLURM_NODELIST", "SLURM_JOB_NODELIST"} {
		v := strings.TrimSpace(getenv(name))
		if v == "" {
			continue
		}
		these, err := hostlist.Expand(v)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", name, err)
		}
		if len(these) > len(nodes) {
			list = v
		}
		for _, n := range these {
			if !slices.Contains(nodes, n) {
				nodes = append(nodes, n)
			}
		}
	}
	if len(nodes) == 0 {
		return nil, "", errors.New("SLURM_JOB_NODELIST is not set, so the allocation's nodes, where the group's replicas listen, are unknown: start the tasks with srun inside the allocation")
	}
	return nodes, list, nil
}

// slurmNodeReplicaID is the ID of the replica at the group's port on
// node name: 2^32 plus 40 bits of the name's FNV-1a hash, above the
// ReplicaID(rank) of every other replica (1 is rank 0's), so that the two
// kinds never meet; two nodes of a group of at most five replicas share
// one with a chance of about 10 in 2^40.
func slurmNodeReplicaID(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return 1<<32 + h.Sum64()%(1<<40)
}

// slurmReplicaPlace says where the task picked to host a replica hosts
// it: on a node other than the step's first (rank 0's) and as its node's
// first replica (local rank 0, see schedulerReplica), at the group's port
// (that of its rendezvous address) with its node's ID; otherwise on a
// free port (port 0) with ReplicaID(rank), as under gorun. Without its
// node's name a task takes the latter: the group works, and a later step
// finds it through the other nodes' replicas.
func slurmReplicaPlace(getenv func(string) string, e *launchEnv) (id uint64, port int) {
	name := slurmNodeName(getenv, e)
	if name == "" || e.nodeID == 0 || e.localRank != 0 {
		return p2p.ReplicaID(e.rank), 0
	}
	_, p, err := net.SplitHostPort(e.rendezvous)
	if port, err = strconv.Atoi(p); err != nil || port <= 0 {
		return p2p.ReplicaID(e.rank), 0
	}
	return slurmNodeReplicaID(name), port
}

// slurmNodeName is this task's node: SLURMD_NODENAME (slurmd sets it),
// else its entry (SLURM_NODEID) in the step's node list.
func slurmNodeName(getenv func(string) string, e *launchEnv) string {
	if n := strings.TrimSpace(getenv("SLURMD_NODENAME")); n != "" {
		return n
	}
	for _, name := range []string{"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"} {
		if list := getenv(name); list != "" {
			nodes, err := hostlist.Expand(list)
			if err != nil || e.nodeID < 0 || e.nodeID >= len(nodes) {
				return ""
			}
			return nodes[e.nodeID]
		}
	}
	return ""
}

// rendezvous is the list a joiner registers with (p2p.Config.Rendezvous):
// replica 1 on the allocation's first node, where rank 0 runs unless the
// joined step was placed on other nodes (srun -w), then every node's
// replica at the group's port; the entries of the joiner's own node come
// last, since Init takes the address it reaches the first entry from as
// the joiner's own (defaultListenIP), and toward its own name a node may
// answer with a loopback address (Debian's 127.0.1.1). A listed replica
// that is not there (a node without one, or rank 0's node, where replica 1
// holds the port) fails its identity check at once, and the joiner tries
// the next.
func (j *slurmJoin) rendezvous() string {
	port := strconv.Itoa(j.port)
	var list, own []string
	add := func(node, entry string) {
		if node == j.self {
			own = append(own, entry)
		} else {
			list = append(list, entry)
		}
	}
	add(j.nodes[0], net.JoinHostPort(j.nodes[0], port))
	for _, n := range j.nodes {
		add(n, strconv.FormatUint(slurmNodeReplicaID(n), 10)+"@"+net.JoinHostPort(n, port))
	}
	return strings.Join(append(list, own...), ",")
}

// waitGroup waits until something listens at the group's port on one of
// the allocation's nodes, asking again every slurmProbeInterval, or fails
// when ctx ends, saying where it looked: a joiner would otherwise wait for
// a group that is not there as long as its context allows.
func (j *slurmJoin) waitGroup(ctx context.Context) error {
	start := time.Now()
	for {
		if j.groupAnswers(ctx) {
			return nil
		}
		if err := waitRetry(ctx, slurmProbeInterval); err != nil {
			return fmt.Errorf("no replica of step %d's rendezvous group answered on %s at port %d (%s) within %v: is step %d of job %d running, with %s=1? (a step whose ranks took ports srun reserved, --resv-ports, needs %s set to the same port for both steps): %w",
				j.step, j.nodeList, j.port, j.portFrom, time.Since(start).Round(time.Millisecond), j.step, j.job, EnvElastic, EnvRendezvousPort, err)
		}
	}
}

// groupAnswers dials the group's port on every node at once and says
// whether one accepted.
func (j *slurmJoin) groupAnswers(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, slurmProbeTimeout)
	defer cancel()
	answered := make(chan bool, len(j.nodes))
	for _, n := range j.nodes {
		go func() {
			var d net.Dialer
			conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(n, strconv.Itoa(j.port)))
			if err == nil {
				conn.Close()
			}
			answered <- err == nil
		}()
	}
	up := false
	for range j.nodes {
		up = <-answered || up
	}
	return up
}

// addrInUse says whether err is a listen on a port that another process
// holds.
func addrInUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || err != nil && strings.Contains(err.Error(), "address already in use")
}
