package collective

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/p2p"
)

// A task of a second srun step (step 1 of job 4242, two tasks on node09)
// that joins the elastic job of step 0 on node[07-08]: the allocation is
// node[07-09].
var srunJoinTask = map[string]string{
	"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
	"SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_STEP_NODELIST": "node09", "SLURM_JOB_NODELIST": "node[07-09]",
	"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "1", "SLURMD_NODENAME": "node09",
	EnvJobKey: schedKey, EnvElastic: "1", EnvJoinStep: "0",
}

// joinList is the rendezvous a joiner of step 0 on node09 registers with,
// at port: node09's own entries last.
func joinList(port int, nodes ...string) string {
	p := strconv.Itoa(port)
	var list, own []string
	if nodes[0] == "node09" {
		own = append(own, net.JoinHostPort(nodes[0], p))
	} else {
		list = append(list, net.JoinHostPort(nodes[0], p))
	}
	for _, n := range nodes {
		e := fmt.Sprintf("%d@%s", slurmNodeReplicaID(n), net.JoinHostPort(n, p))
		if n == "node09" {
			own = append(own, e)
		} else {
			list = append(list, e)
		}
	}
	return strings.Join(append(list, own...), ",")
}

func TestSlurmJoinEnv(t *testing.T) {
	derived := slurmRendezvousPort(4242, 0) // 22420
	all := []string{"node07", "node08", "node09"}
	for _, tc := range []struct {
		name string
		vars map[string]string
		want envWant
		err  string
	}{
		{"a joiner of step 0", srunJoinTask, envWant{"slurm", -1, 2, 1, 2, joinList(derived, all...), false}, ""},
		{"a later step", withVars(srunJoinTask, "SLURM_STEP_ID", "7", EnvJoinStep, "3"), envWant{"slurm", -1, 2, 1, 2, joinList(slurmRendezvousPort(4242, 3), all...), false}, ""},
		{"the allocation without a failed node", withVars(srunJoinTask, "SLURM_JOB_NODELIST", "node[07,09]"), envWant{"slurm", -1, 2, 1, 2, joinList(derived, "node07", "node09"), false}, ""},
		{"older Slurm's names", withVars(srunJoinTask, "SLURM_JOB_ID", "", "SLURM_JOBID", "4242", "SLURM_JOB_NODELIST", "", "SLURM_NODELIST", "node[07-09]"),
			envWant{"slurm", -1, 2, 1, 2, joinList(derived, all...), false}, ""},
		{"srun --jobid from outside the allocation", withVars(srunJoinTask, "SLURM_JOB_NODELIST", "node09", "SLURM_NODELIST", "node[07-09]"),
			envWant{"slurm", -1, 2, 1, 2, joinList(derived, all...), false}, ""},
		{"the joiner on the first node", withVars(srunJoinTask, "SLURMD_NODENAME", "node07"),
			envWant{"slurm", -1, 2, 1, 2, fmt.Sprintf("%d@node08:22420,%d@node09:22420,node07:22420,%d@node07:22420",
				slurmNodeReplicaID("node08"), slurmNodeReplicaID("node09"), slurmNodeReplicaID("node07")), false}, ""},
		{"two lists that differ", withVars(srunJoinTask, "SLURM_JOB_NODELIST", "node[08-10]", "SLURM_NODELIST", "node07"),
			envWant{"slurm", -1, 2, 1, 2, joinList(derived, "node07", "node08", "node09", "node10"), false}, ""},
		{"the port override", withVars(srunJoinTask, EnvRendezvousPort, "31000"), envWant{"slurm", -1, 2, 1, 2, joinList(31000, all...), false}, ""},
		{"GORUN_RENDEZVOUS_ADDR's port", withVars(srunJoinTask, EnvRendezvousAddr, "node07:5000", EnvRendezvousPort, "31000"), envWant{"slurm", -1, 2, 1, 2, joinList(5000, all...), false}, ""},
		{"MASTER_PORT", withVars(srunJoinTask, "MASTER_ADDR", "node07", "MASTER_PORT", "29500"), envWant{"slurm", -1, 2, 1, 2, joinList(29500, all...), false}, ""},
		{"this step's reserved ports are not the joined step's", withVars(srunJoinTask, "SLURM_STEP_RESV_PORTS", "12005-12008"), envWant{"slurm", -1, 2, 1, 2, joinList(derived, all...), false}, ""},

		{"not elastic", withVars(srunJoinTask, EnvElastic, ""), envWant{}, "only an elastic job takes joiners: set GORUN_ELASTIC=1"},
		{"not a step id", withVars(srunJoinTask, EnvJoinStep, "first"), envWant{}, `GORUN_JOIN_STEP="first" is not a step id`},
		{"a negative step", withVars(srunJoinTask, EnvJoinStep, "-1"), envWant{}, "is not a step id"},
		{"the batch step", withVars(srunJoinTask, EnvJoinStep, "4294967294"), envWant{}, "batch or extern step"},
		{"this step itself", withVars(srunJoinTask, EnvJoinStep, "1"), envWant{}, "is this step itself"},
		{"no job id", withVars(srunJoinTask, "SLURM_JOB_ID", ""), envWant{}, "is not a job id"},
		{"no node list", withVars(srunJoinTask, "SLURM_JOB_NODELIST", ""), envWant{}, "SLURM_JOB_NODELIST is not set"},
		{"a bad node list", withVars(srunJoinTask, "SLURM_JOB_NODELIST", "node[09-07]"), envWant{}, "SLURM_JOB_NODELIST"},
		{"a bad older node list", withVars(srunJoinTask, "SLURM_NODELIST", "node[09-07]"), envWant{}, "SLURM_NODELIST"},
		{"a bad GORUN_RENDEZVOUS_ADDR", withVars(srunJoinTask, EnvRendezvousAddr, "node07"), envWant{}, "GORUN_RENDEZVOUS_ADDR=\"node07\" is not HOST:PORT"},
		{"a bad MASTER_PORT", withVars(srunJoinTask, "MASTER_ADDR", "node07", "MASTER_PORT", "x"), envWant{}, `MASTER_PORT="x"`},
		{"a bad port override", withVars(srunJoinTask, EnvRendezvousPort, "0"), envWant{}, EnvRendezvousPort},
		{"no key", withVars(srunJoinTask, EnvJobKey, ""), envWant{}, "no job key"},
	} {
		checkEnvCase(t, tc.name, tc.vars, tc.want, tc.err)
	}
	e, err := readEnv(mapEnv(srunJoinTask))
	if err != nil || e.srunJoin == nil || e.replica || e.group || e.srunJoin.port != derived {
		t.Errorf("a joiner: %+v, %v; want one that looks for step 0's group at port %d and hosts no replica", e, err, derived)
	}
}

// Under srun the first replica of every node but rank 0's listens at the
// group's port with its node's ID; the others take a free port and
// ReplicaID(rank).
func TestSlurmReplicaPlace(t *testing.T) {
	// A step of 6 tasks on node[1-3], two per node, in an allocation of
	// four nodes.
	step := map[string]string{
		"SLURM_NTASKS": "6", "SLURM_STEP_TASKS_PER_NODE": "2(x3)", "SLURM_STEP_NODELIST": "node[1-3]", "SLURM_JOB_NODELIST": "node[1-4]",
		"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", EnvElastic: "1", EnvJobKey: schedKey,
	}
	port := slurmRendezvousPort(4242, 0)
	for _, tc := range []struct {
		rank      int
		node      string // SLURMD_NODENAME; "" unset
		replica   bool
		wantID    uint64
		wantPort  int
		wantSpare bool
	}{
		{rank: 0, node: "node1"}, // replica 1, the rendezvous itself
		{rank: 1, node: "node1"}, // rank 0's node is picked last: none left
		{rank: 2, node: "node2", replica: true, wantID: slurmNodeReplicaID("node2"), wantPort: port},
		{rank: 3, node: "node2", replica: true, wantID: p2p.ReplicaID(3), wantSpare: true},
		{rank: 4, node: "node3", replica: true, wantID: slurmNodeReplicaID("node3"), wantPort: port},
		{rank: 5, node: "node3", replica: true, wantID: p2p.ReplicaID(5), wantSpare: true},
		{rank: 4, node: "", replica: true, wantID: slurmNodeReplicaID("node3"), wantPort: port}, // from the step's list
	} {
		vars := withVars(step, "SLURM_PROCID", strconv.Itoa(tc.rank), "SLURM_NODEID", strconv.Itoa(tc.rank/2), "SLURM_LOCALID", strconv.Itoa(tc.rank%2), "SLURMD_NODENAME", tc.node)
		e, err := readEnv(mapEnv(vars))
		if err != nil {
			t.Fatalf("rank %d: %v", tc.rank, err)
		}
		if e.replica != tc.replica || e.replicaID != tc.wantID || e.replicaPort != tc.wantPort || e.replicaSpare != tc.wantSpare {
			t.Errorf("rank %d on %q: replica %v id %d port %d spare %v; want %v, %d, %d, %v", tc.rank, tc.node,
				e.replica, e.replicaID, e.replicaPort, e.replicaSpare, tc.replica, tc.wantID, tc.wantPort, tc.wantSpare)
		}
	}
	// GORUN_RENDEZVOUS_PORT moves the group's port with the rendezvous.
	vars := withVars(step, "SLURM_PROCID", "2", "SLURM_NODEID", "1", "SLURM_LOCALID", "0", "SLURMD_NODENAME", "node2", EnvRendezvousPort, "31000")
	if e, err := readEnv(mapEnv(vars)); err != nil || e.replicaPort != 31000 {
		t.Errorf("with %s=31000: port %d, %v; want 31000", EnvRendezvousPort, e.replicaPort, err)
	}
}

// Node IDs are above every rank's ReplicaID and differ between nodes.
func TestSlurmNodeReplicaID(t *testing.T) {
	seen := map[uint64]string{}
	for i := range 1000 {
		name := fmt.Sprintf("node%04d", i)
		id := slurmNodeReplicaID(name)
		if id < 1<<32 || id >= 1<<32+1<<40 {
			t.Errorf("%s: id %d outside [2^32, 2^32+2^40)", name, id)
		}
		if other, dup := seen[id]; dup {
			t.Errorf("%s and %s: the same id %d", name, other, id)
		}
		seen[id] = name
	}
	if slurmNodeReplicaID("gpu7") != slurmNodeReplicaID("gpu7") {
		t.Error("a node's id changes between calls")
	}
}

// A joiner finds the group when its port answers on a node, and otherwise
// fails within its context saying where it looked and what to check.
func TestSlurmJoinWaitGroup(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	j := &slurmJoin{job: 4242, step: 0, nodeList: "localhost", nodes: []string{"localhost"}, port: port, portFrom: "test"}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := j.waitGroup(ctx); err != nil {
		t.Fatalf("a listening port: %v", err)
	}
	ln.Close()
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err = j.waitGroup(ctx)
	for _, want := range []string{"no replica of step 0's rendezvous group answered on localhost at port " + strconv.Itoa(port), "is step 0 of job 4242 running, with GORUN_ELASTIC=1?"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("nothing listening: %v; want an error containing %q", err, want)
		}
	}
}
