package collective

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/p2p"
	"go.yaml.in/yaml/v3"
	"golang.org/x/sys/unix"
)

// schedKey is a valid job key for the scheduler tests (64 hex digits).
var schedKey = strings.Repeat("5a", 32)

func mapEnv(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// withVars returns base with extra set on top (a copy).
func withVars(base map[string]string, extra ...string) map[string]string {
	out := make(map[string]string, len(base)+len(extra)/2)
	for k, v := range base {
		out[k] = v
	}
	for i := 0; i+1 < len(extra); i += 2 {
		if extra[i+1] == "" {
			delete(out, extra[i])
		} else {
			out[extra[i]] = extra[i+1]
		}
	}
	return out
}

type envWant struct {
	source               string
	rank, size           int
	localRank, localSize int
	rendezvous           string
	host                 bool
}

func checkEnvCase(t *testing.T, name string, vars map[string]string, want envWant, wantErr string) {
	t.Helper()
	got, err := readEnv(mapEnv(vars))
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%s: err = %v, want one containing %q", name, err, wantErr)
		}
		return
	}
	if err != nil {
		t.Errorf("%s: %v", name, err)
		return
	}
	g := envWant{got.source, got.rank, got.size, got.localRank, got.localSize, got.rendezvous, got.hostRendezvous}
	if g != want {
		t.Errorf("%s:\n got %+v\nwant %+v", name, g, want)
	}
	if got.size > 1 && len(got.jobKey) == 0 {
		t.Errorf("%s: no job key", name)
	}
}

// An srun task, as srun -N 2 -n 4 sets it for task 2 (job 4242, step 1).
var srunTask = map[string]string{
	"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_NPROCS": "4", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
	"SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_TASKS_PER_NODE": "2(x2)",
	"SLURM_STEP_NODELIST": "node[07-08]", "SLURM_JOB_NODELIST": "node[07-08]", "SLURM_NODELIST": "node[07-08]",
	"SLURM_JOB_ID": "4242", "SLURM_JOBID": "4242", "SLURM_STEP_ID": "1", "SLURM_STEPID": "1",
	EnvJobKey: schedKey,
}

func TestSlurmEnv(t *testing.T) {
	rdv := "node07:22421" // 20000 + 242*10 + 1
	for _, tc := range []struct {
		name string
		vars map[string]string
		want envWant
		err  string
	}{
		{"task 2 on the second node", srunTask, envWant{"slurm", 2, 4, 0, 2, rdv, true}, ""},
		{"task 0 on the first node", withVars(srunTask, "SLURM_PROCID", "0", "SLURM_NODEID", "0"), envWant{"slurm", 0, 4, 0, 2, rdv, true}, ""},
		{"uneven tasks per node", withVars(srunTask, "SLURM_PROCID", "3", "SLURM_NODEID", "1", "SLURM_STEP_TASKS_PER_NODE", "3,1"), envWant{"slurm", 3, 4, 0, 1, rdv, true}, ""},
		{"compressed counts, third node", withVars(srunTask, "SLURM_NTASKS", "7", "SLURM_PROCID", "6", "SLURM_NODEID", "2", "SLURM_LOCALID", "0", "SLURM_STEP_TASKS_PER_NODE", "3(x2),1", "SLURM_STEP_NODELIST", "a[1-2],b7"),
			envWant{"slurm", 6, 7, 0, 1, "a1:22421", true}, ""},
		{"job-level fallbacks", withVars(srunTask, "SLURM_STEP_TASKS_PER_NODE", "", "SLURM_STEP_NODELIST", "", "SLURM_JOB_NODELIST", "gpu[001-002]", "SLURM_TASKS_PER_NODE", "2(x2)"),
			envWant{"slurm", 2, 4, 0, 2, "gpu001:22421", true}, ""},
		{"oldest names only", map[string]string{"SLURM_PROCID": "1", "SLURM_NPROCS": "2", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2", "SLURM_NODELIST": "n1", "SLURM_JOBID": "7", "SLURM_STEPID": "0", EnvJobKey: schedKey},
			envWant{"slurm", 1, 2, 1, 2, "n1:20070", true}, ""},
		{"port override", withVars(srunTask, EnvRendezvousPort, "31000"), envWant{"slurm", 2, 4, 0, 2, "node07:31000", true}, ""},
		{"ports Slurm reserved for the step", withVars(srunTask, "SLURM_STEP_RESV_PORTS", "12005-12008"), envWant{"slurm", 2, 4, 0, 2, "node07:12005", true}, ""},
		{"the override beats reserved ports", withVars(srunTask, "SLURM_STEP_RESV_PORTS", "12005", EnvRendezvousPort, "31000"), envWant{"slurm", 2, 4, 0, 2, "node07:31000", true}, ""},
		{"bad reserved ports", withVars(srunTask, "SLURM_STEP_RESV_PORTS", "x-y"), envWant{}, "SLURM_STEP_RESV_PORTS"},
		{"MASTER_ADDR from the batch script wins", withVars(srunTask, "MASTER_ADDR", "node08", "MASTER_PORT", "29500"), envWant{"slurm", 2, 4, 0, 2, "node08:29500", true}, ""},
		{"GORUN_RENDEZVOUS_ADDR wins", withVars(srunTask, EnvRendezvousAddr, "10.0.0.1:5000"), envWant{"slurm", 2, 4, 0, 2, "10.0.0.1:5000", true}, ""},
		{"one task needs no rendezvous", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, envWant{"slurm", 0, 1, 0, 1, "", false}, ""},
		{"gorun under srun is gorun", withVars(srunTask, EnvRank, "1", EnvSize, "4", EnvRendezvous, "10.0.0.9:4000"), envWant{"gorun", 1, 4, 0, 1, "10.0.0.9:4000", false}, ""},

		{"rank 0 off the first node", withVars(srunTask, "SLURM_PROCID", "0", "SLURM_NODEID", "1"), envWant{}, "set " + EnvRendezvousAddr},
		{"rank 0 off the first node, with its address given", withVars(srunTask, "SLURM_PROCID", "0", "SLURM_NODEID", "1", EnvRendezvousAddr, "node08:5000"), envWant{"slurm", 0, 4, 0, 2, "node08:5000", true}, ""},
		{"reversed range in the node list", withVars(srunTask, "SLURM_STEP_NODELIST", "node[08-07]"), envWant{}, "SLURM_STEP_NODELIST"},
		{"no step id (the batch script itself)", withVars(srunTask, "SLURM_STEP_ID", "", "SLURM_STEPID", ""), envWant{}, "start it with srun"},
		{"the batch step", withVars(srunTask, "SLURM_STEP_ID", "4294967294", "SLURM_STEPID", "4294967294"), envWant{}, "batch or extern step"},
		{"no node list", withVars(srunTask, "SLURM_STEP_NODELIST", "", "SLURM_JOB_NODELIST", "", "SLURM_NODELIST", ""), envWant{}, "SLURM_STEP_NODELIST"},
		{"node id beyond the counts", withVars(srunTask, "SLURM_NODEID", "2"), envWant{}, "SLURM_NODEID=2"},
		{"several nodes, no node id", withVars(srunTask, "SLURM_NODEID", ""), envWant{}, "SLURM_NODEID is not set"},
		{"local id beyond the node's tasks", withVars(srunTask, "SLURM_LOCALID", "2"), envWant{}, "SLURM_LOCALID=2"},
		{"bad counts", withVars(srunTask, "SLURM_STEP_TASKS_PER_NODE", "2(3)"), envWant{}, "SLURM_STEP_TASKS_PER_NODE"},
		{"bad port override", withVars(srunTask, EnvRendezvousPort, "70000"), envWant{}, EnvRendezvousPort},
		{"no size", map[string]string{"SLURM_PROCID": "0"}, envWant{}, "SLURM_NTASKS is not"},
		{"no key", withVars(srunTask, EnvJobKey, ""), envWant{}, "no job key"},
	} {
		checkEnvCase(t, tc.name, tc.vars, tc.want, tc.err)
	}
}

// The derived port stays in 20000..29999, below Linux's ephemeral range,
// and differs between the steps of a job and between jobs whose ids differ
// in their last three digits.
func TestSlurmRendezvousPort(t *testing.T) {
	if got := slurmRendezvousPort(4242, 1); got != 22421 {
		t.Fatalf("job 4242 step 1: port %d, want 22421", got)
	}
	seen := map[int]string{}
	for job := uint64(1_000_000); job < 1_001_000; job++ {
		for step := uint64(0); step < 10; step++ {
			p := slurmRendezvousPort(job, step)
			if p < 20000 || p >= 30000 || p >= 32768 {
				t.Fatalf("job %d step %d: port %d outside 20000..29999", job, step, p)
			}
			if prev, ok := seen[p]; ok {
				t.Fatalf("job %d step %d: port %d already used by %s", job, step, p, prev)
			}
			seen[p] = fmt.Sprintf("job %d step %d", job, step)
		}
	}
	for _, step := range []uint64{slurmBatchStep, slurmExternStep, 1 << 40} {
		if p := slurmRendezvousPort(99999999, step); p < 20000 || p >= 30000 {
			t.Fatalf("step %d: port %d outside 20000..29999", step, p)
		}
	}
}

// Kubernetes contracts, pod by pod, and the order in which sources win.
func TestKubeEnv(t *testing.T) {
	// Kubeflow Trainer v2, TrainJob "train", numNodes 4, numProcPerNode 1: pod 2.
	trainer := map[string]string{
		"PET_NNODES": "4", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "2",
		"PET_MASTER_ADDR": "train-node-0-0.train", "PET_MASTER_PORT": "29500",
		"JOB_COMPLETION_INDEX": "2", EnvJobKey: schedKey,
	}
	// PyTorchJob "pj" (training operator v1.7+), 1 master + 3 workers: worker 0.
	pytorchJob := map[string]string{
		"MASTER_ADDR": "pj-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "4", "RANK": "1",
		"PET_NPROC_PER_NODE": "auto", "PET_NODE_RANK": "1", "PET_NNODES": "4", "PYTHONUNBUFFERED": "0",
		EnvJobKey: schedKey,
	}
	indexed := map[string]string{
		"JOB_COMPLETION_INDEX": "3", EnvSize: "4", EnvRendezvousAddr: "train-0.train:29500", EnvJobKey: schedKey,
	}
	for _, tc := range []struct {
		name string
		vars map[string]string
		want envWant
		err  string
	}{
		{"trainer pod 2", trainer, envWant{"torch-elastic", 2, 4, 0, 1, "train-node-0-0.train:29500", true}, ""},
		{"trainer pod 0", withVars(trainer, "PET_NODE_RANK", "0", "JOB_COMPLETION_INDEX", "0"), envWant{"torch-elastic", 0, 4, 0, 1, "train-node-0-0.train:29500", true}, ""},
		{"trainer, port override", withVars(trainer, EnvRendezvousPort, "29600"), envWant{"torch-elastic", 2, 4, 0, 1, "train-node-0-0.train:29600", true}, ""},
		{"trainer, 2 per pod under torchrun", withVars(trainer, "PET_NPROC_PER_NODE", "2", "LOCAL_RANK", "1", "RANK", "5", "WORLD_SIZE", "8", "MASTER_ADDR", "train-node-0-0.train", "MASTER_PORT", "29500", EnvRendezvousPort, "29600"),
			envWant{"torch-elastic", 5, 8, 1, 2, "train-node-0-0.train:29600", true}, ""},
		{"trainer, auto under torchrun", withVars(trainer, "PET_NPROC_PER_NODE", "auto", "LOCAL_RANK", "0", "LOCAL_WORLD_SIZE", "4", EnvRendezvousPort, "29600"),
			envWant{"torch-elastic", 8, 16, 0, 4, "train-node-0-0.train:29600", true}, ""},
		{"trainer, 2 per pod without torchrun", withVars(trainer, "PET_NPROC_PER_NODE", "2"), envWant{}, "numProcPerNode: 1"},
		{"trainer, torchrun holds the port", withVars(trainer, "PET_NPROC_PER_NODE", "2", "LOCAL_RANK", "1"), envWant{}, EnvRendezvousPort},
		{"trainer, no master address", withVars(trainer, "PET_MASTER_ADDR", ""), envWant{}, "PET_MASTER_ADDR"},
		{"trainer, node rank out of range", withVars(trainer, "PET_NODE_RANK", "4"), envWant{}, "PET_NODE_RANK=4"},
		{"trainer, no node count", withVars(trainer, "PET_NNODES", ""), envWant{}, "PET_NNODES is not"},
		{"pytorchjob worker 0", pytorchJob, envWant{"torch-elastic", 1, 4, 0, 1, "pj-master-0:23456", true}, ""},
		{"pytorchjob master", withVars(pytorchJob, "RANK", "0", "PET_NODE_RANK", "0"), envWant{"torch-elastic", 0, 4, 0, 1, "pj-master-0:23456", true}, ""},
		{"pytorchjob before v1.7 (no PET_*)", withVars(pytorchJob, "PET_NPROC_PER_NODE", "", "PET_NODE_RANK", "", "PET_NNODES", ""), envWant{"torchrun", 1, 4, 0, 1, "pj-master-0:23456", true}, ""},
		{"pytorchjob, nprocPerNode 4 without torchrun", withVars(pytorchJob, "PET_NPROC_PER_NODE", "4", "WORLD_SIZE", "16"), envWant{}, "no LOCAL_RANK"},
		{"PET_NNODES range without an endpoint", withVars(pytorchJob, "PET_NNODES", "1:4"), envWant{}, "PET_RDZV_ENDPOINT"},
		{"indexed job pod 3", indexed, envWant{"indexed-job", 3, 4, 0, 1, "train-0.train:29500", true}, ""},
		{"indexed job without GORUN_SIZE", withVars(indexed, EnvSize, ""), envWant{}, "set " + EnvSize},
		{"indexed job without rendezvous", withVars(indexed, EnvRendezvousAddr, ""), envWant{}, "no rendezvous address"},
		{"indexed job index beyond size", withVars(indexed, "JOB_COMPLETION_INDEX", "4"), envWant{}, "rank 4 is not within a job of size 4"},

		// Source order: GORUN_*, OMPI, SLURM, PET_*, RANK, JOB_COMPLETION_INDEX.
		{"gorun beats all", withVars(trainer, EnvRank, "1", EnvSize, "2", EnvRendezvous, "h:1", "OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "2", "SLURM_PROCID", "0", "SLURM_NTASKS", "2"),
			envWant{"gorun", 1, 2, 0, 1, "h:1", false}, ""},
		{"mpirun beats slurm", withVars(srunTask, "OMPI_COMM_WORLD_RANK", "1", "OMPI_COMM_WORLD_SIZE", "2", "MASTER_ADDR", "m", "MASTER_PORT", "1"),
			envWant{"mpirun", 1, 2, 0, 1, "m:1", true}, ""},
		{"slurm beats PET", withVars(srunTask, "PET_NODE_RANK", "0", "PET_NNODES", "9"), envWant{"slurm", 2, 4, 0, 2, "node07:22421", true}, ""},
		{"PET beats RANK", withVars(trainer, "RANK", "0", "WORLD_SIZE", "9"), envWant{"torch-elastic", 2, 4, 0, 1, "train-node-0-0.train:29500", true}, ""},
		{"RANK beats JOB_COMPLETION_INDEX", withVars(indexed, "RANK", "1", "WORLD_SIZE", "2"), envWant{"torchrun", 1, 2, 0, 1, "train-0.train:29500", true}, ""},
	} {
		checkEnvCase(t, tc.name, tc.vars, tc.want, tc.err)
	}
}

// GORUN_JOB_KEY_FILE must be a regular file only its owner can read, for
// every source.
func TestJobKeyFilePermissions(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(schedKey+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // WriteFile's mode is masked by the umask
			t.Fatal(err)
		}
		return p
	}
	private, ownerRO := write("private", 0o600), write("readonly", 0o400)
	groupRead, worldRead := write("group", 0o640), write("world", 0o644)
	link := filepath.Join(dir, "link") // a Kubernetes Secret volume's files are links
	if err := os.Symlink(ownerRO, link); err != nil {
		t.Fatal(err)
	}
	// A FIFO that nobody writes: opening it for reading the usual way
	// would block Init for ever.
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	sources := map[string]map[string]string{
		"gorun":         {EnvRank: "0", EnvSize: "2", EnvRendezvous: "h:1"},
		"mpirun":        {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", EnvRendezvousAddr: "h:1"},
		"slurm":         withVars(srunTask, EnvJobKey, ""),
		"torch-elastic": {"PET_NODE_RANK": "0", "PET_NNODES": "2", "PET_MASTER_ADDR": "h", "PET_MASTER_PORT": "1"},
		"torchrun":      {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
		"indexed-job":   {"JOB_COMPLETION_INDEX": "0", EnvSize: "2", EnvRendezvousAddr: "h:1"},
	}
	for source, vars := range sources {
		for _, tc := range []struct{ file, err string }{
			{private, ""}, {ownerRO, ""}, {link, ""},
			{groupRead, "chmod 600 " + groupRead},
			{worldRead, "chmod 600 " + worldRead},
			{dir, "not a regular file"},
			{fifo, "not a regular file"},
			{filepath.Join(dir, "missing"), "no such file"},
		} {
			got, err := readEnv(mapEnv(withVars(vars, EnvJobKeyFile, tc.file)))
			name := source + " " + filepath.Base(tc.file)
			switch {
			case tc.err == "" && err != nil:
				t.Errorf("%s: %v", name, err)
			case tc.err == "" && (got.source != source || fmt.Sprintf("%x", got.jobKey) != schedKey):
				t.Errorf("%s: source %q key %x", name, got.source, got.jobKey)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), EnvJobKeyFile)):
				t.Errorf("%s: err = %v, want one naming %s and containing %q", name, err, EnvJobKeyFile, tc.err)
			}
		}
	}
}

func TestHostingListenAddr(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for in, want := range map[string]string{
		"10.1.2.3:29500":      "10.1.2.3:29500", // an address is kept
		"[fd00::1]:29500":     "[fd00::1]:29500",
		":29500":              ":29500",
		"localhost:29500":     ":29500", // a name: every interface
		"node07.invalid:2000": ":2000",  // even one that does not resolve (yet)
	} {
		if got, err := hostingListenAddr(ctx, in); err != nil || got != want {
			t.Errorf("hostingListenAddr(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := hostingListenAddr(ctx, "no-port"); err == nil {
		t.Error("hostingListenAddr accepted an address without a port")
	}
}

func TestDefaultListenIP(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got, err := defaultListenIP(ctx, "127.0.0.1:29500", false); err != nil || got != "127.0.0.1" {
		t.Errorf("toward 127.0.0.1: %q, %v; want 127.0.0.1", got, err)
	}
	// A name that resolves to loopback (Debian's 127.0.1.1 line for the
	// host's own name) in a job that spans hosts: the others could not
	// reach this rank there, so it takes the default route's address, or
	// fails without one. A loopback IP written as such is taken at its
	// word.
	got, err := defaultListenIP(ctx, "localhost:29500", true)
	if route := defaultRouteSource(); route != nil {
		if err != nil || got != route.String() {
			t.Errorf("toward a name for loopback in a multi-host job: %q, %v; want the default route's %v", got, err, route)
		}
	} else if err == nil || !strings.Contains(err.Error(), EnvListenIP) {
		t.Errorf("toward a name for loopback in a multi-host job, no default route: err = %v, want one naming %s", err, EnvListenIP)
	}
	if got, err := defaultListenIP(ctx, "127.0.0.1:29500", true); err != nil || got != "127.0.0.1" {
		t.Errorf("toward 127.0.0.1 written as an IP: %q, %v; want 127.0.0.1", got, err)
	}
	// Toward an address of one of this host's interfaces, the route's
	// source is that address: the one the other hosts reach this host at.
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.IsLoopback() || ipn.IP.To4() == nil {
			continue
		}
		got, err := defaultListenIP(ctx, net.JoinHostPort(ipn.IP.String(), "29500"), true)
		if err != nil || got != ipn.IP.String() {
			t.Errorf("toward %v: %q, %v; want %v", ipn.IP, got, err, ipn.IP)
		}
	}
	// A list of a rendezvous group's replicas: the first that resolves (a
	// lost pod's name is gone).
	if got, err := defaultListenIP(ctx, "pod-0.gone.invalid:29500,3@127.0.0.1:29500", false); err != nil || got != "127.0.0.1" {
		t.Errorf("toward a list whose first name is gone: %q, %v; want 127.0.0.1", got, err)
	}
	// A name that does not resolve is asked again until the deadline (a
	// pod's DNS record may come later), then named in the error.
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	if _, err := defaultListenIP(short, "node07.invalid:29500", false); err == nil || !strings.Contains(err.Error(), EnvListenIP) || !strings.Contains(err.Error(), "still failing after") {
		t.Errorf("toward a name that does not resolve: err = %v, want one naming %s, after retrying", err, EnvListenIP)
	}
}

// Two srun tasks on one node (named localhost) find each other through the
// rendezvous readEnv derives, hosted by rank 0 at the port derived from the
// job and step ids, and compute an allreduce.
func TestSlurmRendezvousJob(t *testing.T) {
	// A job id whose derived port is free now.
	var jobID int
	for id := 0; id < 1000; id++ {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(slurmRendezvousPort(uint64(id), 0))))
		if err == nil {
			ln.Close()
			jobID = id
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const size = 2
	var wg sync.WaitGroup
	results := make([][]float32, size)
	errs := make([]error, size)
	for rank := range size {
		wg.Add(1)
		go func() {
			defer wg.Done()
			vars := map[string]string{
				"SLURM_PROCID": strconv.Itoa(rank), "SLURM_NTASKS": strconv.Itoa(size), "SLURM_LOCALID": strconv.Itoa(rank), "SLURM_NODEID": "0",
				"SLURM_STEP_TASKS_PER_NODE": strconv.Itoa(size), "SLURM_STEP_NODELIST": "localhost",
				"SLURM_JOB_ID": strconv.Itoa(jobID), "SLURM_STEP_ID": "0", EnvJobKey: schedKey,
			}
			env, err := readEnv(mapEnv(vars))
			if err != nil {
				errs[rank] = err
				return
			}
			if want := fmt.Sprintf("localhost:%d", slurmRendezvousPort(uint64(jobID), 0)); env.rendezvous != want || !env.hostRendezvous {
				errs[rank] = fmt.Errorf("rendezvous %q (host %v), want %q hosted by rank 0", env.rendezvous, env.hostRendezvous, want)
				return
			}
			c, err := Init(ctx, WithRank(env.rank, env.size), WithLocalRank(env.localRank, env.localSize),
				WithRendezvous(env.rendezvous, env.hostRendezvous), WithJobKey(env.jobKey), WithTimeout(30*time.Second))
			if err != nil {
				errs[rank] = err
				return
			}
			defer c.Close()
			buf := []float32{float32(rank + 1), 10}
			if err := c.Allreduce(ctx, buf, Sum); err != nil {
				errs[rank] = err
				return
			}
			results[rank] = buf
		}()
	}
	wg.Wait()
	for rank, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", rank, err)
		}
	}
	for rank, got := range results {
		if want := []float32{3, 20}; !slices.Equal(got, want) {
			t.Errorf("rank %d: allreduce = %v, want %v", rank, got, want)
		}
	}
}

// A pod of a job as the test models it: the environment its container gets
// (the manifest's plus what the operator injects), the name other pods
// reach it by, and the ports its container declares.
type modelPod struct {
	dns   string
	env   map[string]string
	ports []int
}

// yamlAt walks a decoded YAML document: string keys index maps, ints index
// lists. It returns nil when a step is missing.
func yamlAt(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func yamlString(v any, path ...any) string {
	switch x := yamlAt(v, path...).(type) {
	case string:
		return x
	case int:
		return strconv.Itoa(x)
	}
	return ""
}

func yamlInt(v any, path ...any) (int, error) {
	x, ok := yamlAt(v, path...).(int)
	if !ok {
		return 0, fmt.Errorf("%v is %v, not an integer", path, yamlAt(v, path...))
	}
	return x, nil
}

// containerEnv is the environment the manifest gives a pod's first
// container. A key from a Secret becomes schedKey: as GORUN_JOB_KEY from
// secretKeyRef, or as GORUN_JOB_KEY_FILE in a Secret volume, written to a
// file in dir with the mode the volume gives it (defaultMode, or an item's
// mode), so that readEnv's permission check sees what the pod would.
func containerEnv(podSpec any, dir string) (map[string]string, []int, error) {
	c := yamlAt(podSpec, "containers", 0)
	if c == nil {
		return nil, nil, fmt.Errorf("no container")
	}
	env := map[string]string{}
	list, _ := yamlAt(c, "env").([]any)
	for _, item := range list {
		name := yamlString(item, "name")
		switch {
		case yamlAt(item, "value") != nil:
			env[name] = yamlString(item, "value")
		case yamlAt(item, "valueFrom", "secretKeyRef") != nil:
			if yamlString(item, "valueFrom", "secretKeyRef", "name") != "gorun-job-key" || yamlString(item, "valueFrom", "secretKeyRef", "key") != "key" {
				return nil, nil, fmt.Errorf("%s from secret %v, want gorun-job-key's key", name, yamlAt(item, "valueFrom", "secretKeyRef"))
			}
			env[name] = schedKey
		default:
			return nil, nil, fmt.Errorf("env %s: neither a value nor a secretKeyRef", name)
		}
	}
	if p := env[EnvJobKeyFile]; p != "" {
		file, err := secretFile(podSpec, c, p, dir)
		if err != nil {
			return nil, nil, err
		}
		env[EnvJobKeyFile] = file
	}
	var ports []int
	pl, _ := yamlAt(c, "ports").([]any)
	for _, p := range pl {
		if n, err := yamlInt(p, "containerPort"); err == nil {
			ports = append(ports, n)
		}
	}
	return env, ports, nil
}

// secretFile finds the Secret volume item mounted at path in container c
// and writes schedKey to a file in dir with the item's mode.
func secretFile(podSpec, c any, path, dir string) (string, error) {
	mounts, _ := yamlAt(c, "volumeMounts").([]any)
	for _, m := range mounts {
		mountPath := strings.TrimSuffix(yamlString(m, "mountPath"), "/")
		rel, ok := strings.CutPrefix(path, mountPath+"/")
		if !ok {
			continue
		}
		vols, _ := yamlAt(podSpec, "volumes").([]any)
		for _, v := range vols {
			if yamlString(v, "name") != yamlString(m, "name") || yamlAt(v, "secret") == nil {
				continue
			}
			if yamlString(v, "secret", "secretName") != "gorun-job-key" {
				return "", fmt.Errorf("volume %s: secret %q, want gorun-job-key", yamlString(v, "name"), yamlString(v, "secret", "secretName"))
			}
			mode := 0o644 // Kubernetes' default for a Secret volume
			if yamlAt(v, "secret", "defaultMode") != nil {
				var err error
				if mode, err = yamlInt(v, "secret", "defaultMode"); err != nil {
					return "", err
				}
			}
			file := "" // the item projected at rel
			items, _ := yamlAt(v, "secret", "items").([]any)
			for _, it := range items {
				if yamlString(it, "path") == rel && yamlString(it, "key") == "key" {
					file = rel
					if yamlAt(it, "mode") != nil {
						mode, _ = yamlInt(it, "mode")
					}
				}
			}
			if len(items) == 0 && rel == "key" {
				file = rel
			}
			if file == "" {
				return "", fmt.Errorf("%s: no item of secret gorun-job-key is projected at %s", path, rel)
			}
			f, err := os.CreateTemp(dir, "job-key-")
			if err != nil {
				return "", err
			}
			_, err = f.WriteString(schedKey)
			if err = errors.Join(err, f.Close()); err != nil {
				return "", err
			}
			return f.Name(), os.Chmod(f.Name(), os.FileMode(mode))
		}
	}
	return "", fmt.Errorf("%s=%s is on no Secret volume mounted in the container", EnvJobKeyFile, path)
}

// The pods of each kind of job, with what its operator injects. The
// contracts, from the operators' sources and documentation:
//
//   - PyTorchJob, Kubeflow training operator v1 (pkg/controller.v1/pytorch,
//     setPodEnv and MasterEnvVarGenerator): every pod of replica type T,
//     index i, gets MASTER_ADDR=<job>-master-0 (the master's Service),
//     MASTER_PORT=the master container "pytorch"'s port "pytorchjob-port",
//     WORLD_SIZE=total replicas*nprocPerNode (1 unless a number),
//     RANK=i for the master, i+1 for a worker, and since v1.7
//     PET_NPROC_PER_NODE=nprocPerNode ("auto" by default),
//     PET_NODE_RANK=RANK, PET_NNODES=total replicas (without elasticPolicy).
//     Pod <job>-<type>-<i> is reached by the Service of the same name.
//   - TrainJob, Kubeflow Trainer v2 torch plugin (pkg/runtime/framework/
//     plugins/torch): PET_NNODES=numNodes, PET_NPROC_PER_NODE=numProcPerNode,
//     PET_NODE_RANK=the Job completion index,
//     PET_MASTER_ADDR=<job>-node-0-0.<job>, PET_MASTER_PORT=29500 (the
//     runtime's trainer port); the pods are a JobSet's replicated Job
//     "node", pod i reached as <job>-node-0-<i>.<job>.
//   - Indexed Job (kubernetes.io/docs/concepts/workloads/controllers/job,
//     "Completion mode"): pod i gets JOB_COMPLETION_INDEX=i and hostname
//     <job>-<i>; with subdomain S (a headless Service) it is reached as
//     <job>-<i>.S.
//   - JobSet (jobset.sigs.k8s.io, "Exclusive placement"/"DNS hostnames"):
//     pod i of Job j of replicated Job r is an indexed Job's pod,
//     JOB_COMPLETION_INDEX=i, reached as <jobset>-<r>-<j>-<i>.<subdomain>,
//     the subdomain being spec.network.subdomain or the JobSet's name.
func podsOf(doc map[string]any, legacy bool, dir string) ([]modelPod, error) {
	name := yamlString(doc, "metadata", "name")
	var pods []modelPod
	switch kind := yamlString(doc, "kind"); kind {
	case "PyTorchJob":
		if yamlAt(doc, "spec", "elasticPolicy") != nil {
			return elasticPods(doc, dir)
		}
		specs := yamlAt(doc, "spec", "pytorchReplicaSpecs")
		total := 0
		for _, t := range []string{"Master", "Worker"} {
			if yamlAt(specs, t) != nil {
				n, err := yamlInt(specs, t, "replicas")
				if err != nil {
					return nil, err
				}
				total += n
			}
		}
		nproc := yamlString(doc, "spec", "nprocPerNode")
		if nproc == "" {
			nproc = "auto"
		}
		perNode, err := strconv.Atoi(nproc)
		if err != nil {
			perNode = 1
		}
		if yamlAt(specs, "Master") == nil {
			return nil, fmt.Errorf("no Master replica: the operator sets MASTER_ADDR and RANK only with one")
		}
		masterPort := -1
		ports, _ := yamlAt(specs, "Master", "template", "spec", "containers", 0, "ports").([]any)
		if yamlString(specs, "Master", "template", "spec", "containers", 0, "name") == "pytorch" {
			for _, p := range ports {
				if yamlString(p, "name") == "pytorchjob-port" {
					masterPort, _ = yamlInt(p, "containerPort")
				}
			}
		}
		if masterPort < 0 {
			return nil, fmt.Errorf(`the Master's container "pytorch" declares no port "pytorchjob-port"`)
		}
		for _, t := range []string{"Master", "Worker"} {
			if yamlAt(specs, t) == nil {
				continue
			}
			n, _ := yamlInt(specs, t, "replicas")
			for i := range n {
				env, ports, err := containerEnv(yamlAt(specs, t, "template", "spec"), dir)
				if err != nil {
					return nil, fmt.Errorf("%s %d: %w", t, i, err)
				}
				rank := i
				if t == "Worker" {
					rank++
				}
				env["MASTER_ADDR"], env["MASTER_PORT"] = name+"-master-0", strconv.Itoa(masterPort)
				env["WORLD_SIZE"], env["RANK"] = strconv.Itoa(total*perNode), strconv.Itoa(rank)
				if !legacy {
					env["PET_NPROC_PER_NODE"], env["PET_NODE_RANK"], env["PET_NNODES"] = nproc, strconv.Itoa(rank), strconv.Itoa(total)
				}
				pods = append(pods, modelPod{fmt.Sprintf("%s-%s-%d", name, strings.ToLower(t), i), env, ports})
			}
		}
	case "TrainJob":
		trainer := yamlAt(doc, "spec", "trainer")
		n, err := yamlInt(trainer, "numNodes")
		if err != nil {
			return nil, err
		}
		spec := map[string]any{"containers": []any{map[string]any{"env": yamlAt(trainer, "env")}}}
		for i := range n {
			env, _, err := containerEnv(spec, dir)
			if err != nil {
				return nil, fmt.Errorf("pod %d: %w", i, err)
			}
			env["PET_NNODES"], env["PET_NPROC_PER_NODE"], env["PET_NODE_RANK"] = strconv.Itoa(n), yamlString(trainer, "numProcPerNode"), strconv.Itoa(i)
			env["PET_MASTER_ADDR"], env["PET_MASTER_PORT"] = fmt.Sprintf("%s-node-0-0.%s", name, name), "29500"
			env["JOB_COMPLETION_INDEX"] = strconv.Itoa(i)
			pods = append(pods, modelPod{fmt.Sprintf("%s-node-0-%d.%s", name, i, name), env, []int{29500}})
		}
	case "Job":
		return indexedPods(yamlAt(doc, "spec"), func(_, i int) string {
			return fmt.Sprintf("%s-%d.%s", name, i, yamlString(doc, "spec", "template", "spec", "subdomain"))
		}, 1, dir)
	case "JobSet":
		subdomain := yamlString(doc, "spec", "network", "subdomain")
		if subdomain == "" {
			subdomain = name
		}
		rjobs, _ := yamlAt(doc, "spec", "replicatedJobs").([]any)
		for _, rj := range rjobs {
			replicas, err := yamlInt(rj, "replicas")
			if err != nil {
				return nil, err
			}
			p, err := indexedPods(yamlAt(rj, "template", "spec"), func(j, i int) string {
				return fmt.Sprintf("%s-%s-%d-%d.%s", name, yamlString(rj, "name"), j, i, subdomain)
			}, replicas, dir)
			if err != nil {
				return nil, err
			}
			pods = append(pods, p...)
		}
	default:
		return nil, fmt.Errorf("kind %q: no contract", kind)
	}
	return pods, nil
}

// elasticPods are the Workers of an elastic PyTorchJob, with what the
// training operator gives them (ElasticEnvVarGenerator): no rank, but
// PET_RDZV_ENDPOINT=<job>-worker-0:<the Workers' pytorchjob-port> (or
// the policy's rdzvHost:rdzvPort),
// PET_RDZV_BACKEND (c10d by default), PET_NNODES=min:max,
// PET_MAX_RESTARTS and PET_RDZV_ID when the policy sets them; and the
// pod's name as HOSTNAME, which the container runtime sets.
func elasticPods(doc map[string]any, dir string) ([]modelPod, error) {
	name := yamlString(doc, "metadata", "name")
	policy := yamlAt(doc, "spec", "elasticPolicy")
	worker := yamlAt(doc, "spec", "pytorchReplicaSpecs", "Worker")
	if worker == nil || yamlAt(doc, "spec", "pytorchReplicaSpecs", "Master") != nil {
		return nil, fmt.Errorf("an elastic PyTorchJob has Workers only")
	}
	n, err := yamlInt(worker, "replicas")
	if err != nil {
		return nil, err
	}
	if p := yamlString(worker, "restartPolicy"); p != "OnFailure" {
		return nil, fmt.Errorf("restartPolicy %q: a failed pod must be restarted to rejoin (OnFailure)", p)
	}
	lo, err1 := yamlInt(policy, "minReplicas")
	hi, err2 := yamlInt(policy, "maxReplicas")
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("elasticPolicy: minReplicas and maxReplicas: %v, %v", err1, err2)
	}
	port := -1
	if yamlString(worker, "template", "spec", "containers", 0, "name") == "pytorch" {
		ports, _ := yamlAt(worker, "template", "spec", "containers", 0, "ports").([]any)
		for _, p := range ports {
			if yamlString(p, "name") == "pytorchjob-port" {
				port, _ = yamlInt(p, "containerPort")
			}
		}
	}
	if port < 0 {
		return nil, fmt.Errorf(`the Worker's container "pytorch" declares no port "pytorchjob-port"`)
	}
	backend := yamlString(policy, "rdzvBackend")
	if backend == "" {
		backend = "c10d"
	}
	var pods []modelPod
	for i := range n {
		env, ports, err := containerEnv(yamlAt(worker, "template", "spec"), dir)
		if err != nil {
			return nil, fmt.Errorf("worker %d: %w", i, err)
		}
		env["PYTHONUNBUFFERED"] = "0"
		env["PET_RDZV_ENDPOINT"] = fmt.Sprintf("%s-worker-0:%d", name, port)
		if host := yamlString(policy, "rdzvHost"); host != "" {
			p, _ := yamlInt(policy, "rdzvPort")
			env["PET_RDZV_ENDPOINT"] = fmt.Sprintf("%s:%d", host, p)
		}
		env["PET_RDZV_BACKEND"], env["PET_NNODES"] = backend, fmt.Sprintf("%d:%d", lo, hi)
		if r := yamlString(policy, "maxRestarts"); r != "" {
			env["PET_MAX_RESTARTS"] = r
		}
		if id := yamlString(policy, "rdzvId"); id != "" {
			env["PET_RDZV_ID"] = id
		}
		env["HOSTNAME"] = fmt.Sprintf("%s-worker-%d", name, i)
		pods = append(pods, modelPod{env["HOSTNAME"], env, ports})
	}
	return pods, nil
}

// indexedPods are the pods of `jobs` Indexed Jobs with spec jobSpec.
func indexedPods(jobSpec any, dns func(job, index int) string, jobs int, dir string) ([]modelPod, error) {
	if yamlString(jobSpec, "completionMode") != "Indexed" {
		return nil, fmt.Errorf("completionMode %q: JOB_COMPLETION_INDEX needs Indexed", yamlString(jobSpec, "completionMode"))
	}
	n, err := yamlInt(jobSpec, "completions")
	if err != nil {
		return nil, err
	}
	if p, err := yamlInt(jobSpec, "parallelism"); err != nil || p != n {
		return nil, fmt.Errorf("parallelism %v, completions %d: every rank must run at once", yamlAt(jobSpec, "parallelism"), n)
	}
	var pods []modelPod
	for j := range jobs {
		for i := range n {
			env, ports, err := containerEnv(yamlAt(jobSpec, "template", "spec"), dir)
			if err != nil {
				return nil, fmt.Errorf("pod %d: %w", i, err)
			}
			env["JOB_COMPLETION_INDEX"] = strconv.Itoa(i)
			pods = append(pods, modelPod{dns(j, i), env, ports})
		}
	}
	return pods, nil
}

// checkJob runs readEnv for every pod and checks that they form one job:
// every rank once, one size, one rendezvous hosted by rank 0 on the pod
// the others reach by that name, at a port its container declares, and one
// job key.
func checkJob(pods []modelPod, wantSource string) error {
	if len(pods) < 2 {
		return fmt.Errorf("%d pods: want a job of several ranks", len(pods))
	}
	seen := make([]bool, len(pods))
	var rendezvous string
	var key []byte
	var etcd p2p.EtcdGroup
	for i, p := range pods {
		e, err := readEnv(mapEnv(p.env))
		if err != nil {
			return fmt.Errorf("pod %s: %w", p.dns, err)
		}
		if e.source != wantSource {
			return fmt.Errorf("pod %s: source %q, want %q", p.dns, e.source, wantSource)
		}
		if e.size != len(pods) {
			return fmt.Errorf("pod %s: size %d, but the job has %d pods", p.dns, e.size, len(pods))
		}
		if seen[e.rank] {
			return fmt.Errorf("pod %s: rank %d, which another pod has too", p.dns, e.rank)
		}
		seen[e.rank] = true
		if e.etcd != nil {
			// The membership is in etcd: no pod hosts a rendezvous; every
			// pod names the same etcd and job.
			if i > 0 && (!slices.Equal(e.etcd.Endpoints, etcd.Endpoints) || e.etcd.RendezvousID != etcd.RendezvousID) {
				return fmt.Errorf("pod %s: etcd %+v; pod %s: %+v", p.dns, *e.etcd, pods[0].dns, etcd)
			}
			etcd = *e.etcd
			continue
		}
		if !e.hostRendezvous {
			return fmt.Errorf("pod %s: nobody hosts the rendezvous %q", p.dns, e.rendezvous)
		}
		if i == 0 {
			rendezvous, key = e.rendezvous, e.jobKey
		} else if e.rendezvous != rendezvous || string(e.jobKey) != string(key) {
			return fmt.Errorf("pod %s: rendezvous %q, key %x; pod %s: %q, %x", p.dns, e.rendezvous, e.jobKey, pods[0].dns, rendezvous, key)
		}
		if e.rank == 0 {
			host, port, err := net.SplitHostPort(e.rendezvous)
			if err != nil {
				return fmt.Errorf("pod %s: rendezvous %q: %w", p.dns, e.rendezvous, err)
			}
			if host != p.dns {
				return fmt.Errorf("rendezvous %q: rank 0 hosts it on pod %s, which the others do not reach as %s", e.rendezvous, p.dns, host)
			}
			if n, _ := strconv.Atoi(port); !slices.Contains(p.ports, n) {
				return fmt.Errorf("rendezvous %q: rank 0's container (pod %s) declares ports %v, not %s", e.rendezvous, p.dns, p.ports, port)
			}
		}
	}
	return nil
}

func loadManifest(t *testing.T, file string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "deploy", "kubernetes", file))
	if err != nil {
		t.Fatal(err)
	}
	var docs []map[string]any
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	for {
		var d map[string]any
		if err := dec.Decode(&d); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("%s: %v", file, err)
		}
		if d != nil {
			docs = append(docs, d)
		}
	}
	return docs
}

// checkServices checks the headless Service an Indexed Job's pods need to
// be reached by name.
func checkServices(docs []map[string]any) error {
	for _, job := range docs {
		if yamlString(job, "kind") != "Job" {
			continue
		}
		sub := yamlString(job, "spec", "template", "spec", "subdomain")
		if sub == "" {
			return fmt.Errorf("job %s: no subdomain, so its pods have no DNS names", yamlString(job, "metadata", "name"))
		}
		found := false
		for _, svc := range docs {
			if yamlString(svc, "kind") == "Service" && yamlString(svc, "metadata", "name") == sub {
				if yamlString(svc, "spec", "clusterIP") != "None" {
					return fmt.Errorf("service %s is not headless (clusterIP: None)", sub)
				}
				if sel := yamlString(svc, "spec", "selector", "job-name"); sel != yamlString(job, "metadata", "name") {
					return fmt.Errorf("service %s selects job-name %q, not the job's pods", sub, sel)
				}
				found = true
			}
		}
		if !found {
			return fmt.Errorf("job %s: subdomain %s, but no Service of that name", yamlString(job, "metadata", "name"), sub)
		}
	}
	return nil
}

// TestKubeManifests reads deploy/kubernetes/*.yaml, gives every pod of each
// job the environment its manifest and its operator give it, and checks
// that readEnv makes one job of them. Edited copies of the manifests show
// that the check fails when a manifest is wrong.
func TestKubeManifests(t *testing.T) {
	set := func(path []any, v any) func(map[string]any) {
		return func(doc map[string]any) {
			parent := yamlAt(doc, path[:len(path)-1]...)
			switch k := path[len(path)-1].(type) {
			case string:
				parent.(map[string]any)[k] = v
			case int:
				parent.([]any)[k] = v
			}
		}
	}
	envOf := func(path ...any) []any { return append(path, "containers", 0, "env") }
	idxEnv := envOf("spec", "template", "spec")
	jsEnv := envOf("spec", "replicatedJobs", 0, "template", "spec", "template", "spec")
	for _, tc := range []struct {
		name, file, source string
		legacy             bool
		edit               func(map[string]any) // applied to the document of the job
		err                string
	}{
		{"pytorchjob", "pytorchjob.yaml", "torch-elastic", false, nil, ""},
		{"elastic pytorchjob", "elastic-pytorchjob.yaml", "pytorchjob-elastic", false, nil, ""},
		{"elastic indexed job", "elastic-indexed-job.yaml", "indexed-job", false, nil, ""},
		{"pytorchjob, operator before v1.7", "pytorchjob.yaml", "torchrun", true, nil, ""},
		{"trainjob", "trainjob.yaml", "torch-elastic", false, nil, ""},
		{"indexed job", "indexed-job.yaml", "indexed-job", false, nil, ""},
		{"jobset", "jobset.yaml", "indexed-job", false, nil, ""},

		{"elastic pytorchjob, more pods than its maximum", "elastic-pytorchjob.yaml", "pytorchjob-elastic", false,
			set([]any{"spec", "pytorchReplicaSpecs", "Worker", "replicas"}, 5), "size 4, but the job has 5 pods"},
		{"elastic pytorchjob, etcd", "elastic-pytorchjob.yaml", "pytorchjob-elastic", false, func(doc map[string]any) {
			policy := yamlAt(doc, "spec", "elasticPolicy").(map[string]any)
			policy["rdzvBackend"], policy["rdzvHost"], policy["rdzvPort"], policy["rdzvId"] = "etcd", "etcd-client", 2379, "gorun-elastic-1"
		}, ""},
		{"elastic pytorchjob, etcd without an id", "elastic-pytorchjob.yaml", "pytorchjob-elastic", false, func(doc map[string]any) {
			policy := yamlAt(doc, "spec", "elasticPolicy").(map[string]any)
			policy["rdzvBackend"], policy["rdzvHost"], policy["rdzvPort"] = "etcd", "etcd-client", 2379
		}, `PET_RDZV_ID="": the etcd rendezvous needs the job's id`},
		{"elastic pytorchjob, pods not restarted", "elastic-pytorchjob.yaml", "pytorchjob-elastic", false,
			set([]any{"spec", "pytorchReplicaSpecs", "Worker", "restartPolicy"}, "Never"), "OnFailure"},
		{"pytorchjob, key readable by all", "pytorchjob.yaml", "torch-elastic", false,
			set([]any{"spec", "pytorchReplicaSpecs", "Worker", "template", "spec", "volumes", 0, "secret", "defaultMode"}, 0o444), "chmod 600"},
		{"pytorchjob, no port", "pytorchjob.yaml", "torch-elastic", false,
			set([]any{"spec", "pytorchReplicaSpecs", "Master", "template", "spec", "containers", 0, "ports"}, []any{}), "pytorchjob-port"},
		{"trainjob, 2 processes per pod", "trainjob.yaml", "torch-elastic", false,
			set([]any{"spec", "trainer", "numProcPerNode"}, 2), "numProcPerNode: 1"},
		{"indexed job, wrong size", "indexed-job.yaml", "indexed-job", false,
			set(append(idxEnv, 0), map[string]any{"name": "GORUN_SIZE", "value": "3"}), "size 3, but the job has 4 pods"},
		{"indexed job, rendezvous on pod 1", "indexed-job.yaml", "indexed-job", false,
			set(append(idxEnv, 1), map[string]any{"name": "GORUN_RENDEZVOUS_ADDR", "value": "gorun-train-1.gorun-train:29500"}), "which the others do not reach"},
		{"indexed job, undeclared port", "indexed-job.yaml", "indexed-job", false,
			set(append(idxEnv, 1), map[string]any{"name": "GORUN_RENDEZVOUS_ADDR", "value": "gorun-train-0.gorun-train:29400"}), "declares ports"},
		{"indexed job, no subdomain", "indexed-job.yaml", "indexed-job", false,
			set([]any{"spec", "template", "spec", "subdomain"}, ""), "no subdomain"},
		{"jobset, two replicas", "jobset.yaml", "indexed-job", false,
			set([]any{"spec", "replicatedJobs", 0, "replicas"}, 2), "size 4, but the job has 8 pods"},
		{"jobset, wrong name", "jobset.yaml", "indexed-job", false,
			set(append(jsEnv, 1), map[string]any{"name": "GORUN_RENDEZVOUS_ADDR", "value": "gorun-train-0.gorun-train:29500"}), "which the others do not reach"},
	} {
		docs := loadManifest(t, tc.file)
		var job map[string]any
		for _, d := range docs {
			if yamlString(d, "kind") != "Service" {
				job = d
			}
		}
		if job == nil {
			t.Fatalf("%s: no job in %s", tc.name, tc.file)
		}
		if tc.edit != nil {
			tc.edit(job)
		}
		err := checkServices(docs)
		if err == nil {
			var pods []modelPod
			if pods, err = podsOf(job, tc.legacy, t.TempDir()); err == nil {
				err = checkJob(pods, tc.source)
			}
		}
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s (%s): %v", tc.name, tc.file, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s (%s): err = %v, want one containing %q", tc.name, tc.file, err, tc.err)
		}
	}
}

// Rank 0 of a job whose derived rendezvous port another process holds (two
// Slurm jobs whose ids end alike, on one node) is told which variables
// choose another port.
func TestRendezvousPortTaken(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	t.Setenv(EnvRank, "0")
	t.Setenv(EnvSize, "2")
	t.Setenv(EnvRendezvousAddr, l.Addr().String())
	t.Setenv(EnvJobKey, schedKey)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := Init(ctx, WithTimeout(10*time.Second))
	if err == nil {
		c.Close()
		t.Fatal("Init hosted a rendezvous on a port another process holds")
	}
	for _, want := range []string{"rank 0", l.Addr().String(), EnvRendezvousPort, EnvRendezvousAddr} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

// Under srun, an elastic job's rendezvous is a group: rank 0 hosts replica
// 1 and four tasks, on other nodes first, the others and the spares.
func TestSchedulerReplica(t *testing.T) {
	for _, tc := range []struct {
		counts []int
		want   [][2]int // node, local rank
	}{
		{[]int{2, 2, 2}, [][2]int{{1, 0}, {1, 1}, {2, 0}, {2, 1}}},
		{[]int{3, 3, 3}, [][2]int{{1, 0}, {1, 1}, {2, 0}, {2, 1}}},
		{[]int{2, 2}, [][2]int{{0, 1}, {1, 0}, {1, 1}}},
		{[]int{1, 1}, [][2]int{{1, 0}}},
		{[]int{6}, [][2]int{{0, 1}, {0, 2}, {0, 3}, {0, 4}}},
		{[]int{1, 1, 1, 1, 1, 1}, [][2]int{{1, 0}, {2, 0}, {3, 0}, {4, 0}}},
	} {
		var got [][2]int
		for node, n := range tc.counts {
			for l := range n {
				if schedulerReplica(node, l, tc.counts) >= 0 {
					got = append(got, [2]int{node, l})
				}
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("tasks per node %v: replicas on %v, want %v", tc.counts, got, tc.want)
		}
	}
	// The group's two come first, as placed before there were spares:
	// with two nodes, both on node 1.
	if a, b, c := schedulerReplica(1, 0, []int{2, 2}), schedulerReplica(1, 1, []int{2, 2}), schedulerReplica(0, 1, []int{2, 2}); a != 0 || b != 1 || c != 2 {
		t.Errorf("two nodes of 2: places %d, %d, %d, want 0, 1 (the group's) and 2 (a spare)", a, b, c)
	}
	env := map[string]string{"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
		"SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "1",
		EnvElastic: "1", EnvJobKey: strings.Repeat("ab", 32)}
	e, err := readEnv(func(k string) string { return env[k] })
	if err != nil || !e.group || !e.replica || e.minNP != 1 || e.maxNP != 4 || e.elasticWait != 600*time.Second {
		t.Fatalf("task 2 of an elastic srun step: %+v, %v; want a replica of a group with bounds 1..4, 600s", e, err)
	}
	env["SLURM_PROCID"], env["SLURM_NODEID"] = "0", "0"
	if e, err := readEnv(func(k string) string { return env[k] }); err != nil || !e.group || e.replica || !e.hostRendezvous {
		t.Fatalf("task 0: %+v, %v; want the group's first replica (the rendezvous), no other", e, err)
	}
}
