package collective

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/gorun/gorun/internal/hostlist"
)

// A rank started by srun: its rank, size and local size from Slurm's
// variables, and, when nothing else names one, the rendezvous that rank 0
// hosts on the step's first node at a port derived from the job (see
// slurmRendezvousPortBase).

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
		e.nodeID, e.nodeCounts = nodeID, counts
		if e.localRank >= e.localSize {
			return fmt.Errorf("SLURM_LOCALID=%d is not below this node's task count %d (from %s=%q)", e.localRank, e.localSize, name, s)
		}
		break
	}
	return readSlurmJoin(getenv, e)
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
