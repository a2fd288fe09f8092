package collective

import (
	"bufio"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The pods of an elastic PyTorchJob "pj" (training operator v1,
// ElasticEnvVarGenerator; elasticPolicy minReplicas 2, maxReplicas 4,
// maxRestarts 3, port 29400), as the operator gives them: no rank, the pod
// named by its HOSTNAME.
var elasticPod = map[string]string{
	"PET_RDZV_ENDPOINT": "pj-worker-0:29400", "PET_RDZV_BACKEND": "c10d", "PET_NNODES": "2:4",
	"PET_MAX_RESTARTS": "3", "PET_RDZV_ID": "pj", "PET_NPROC_PER_NODE": "1", "PYTHONUNBUFFERED": "0",
	"HOSTNAME": "pj-worker-2", EnvJobKey: schedKey,
}

func TestKubeElasticEnv(t *testing.T) {
	// An Indexed Job "train" (subdomain "train") made elastic by its manifest.
	indexed := map[string]string{
		"JOB_COMPLETION_INDEX": "1", EnvSize: "4", EnvRendezvousAddr: "train-0.train:29500", EnvJobKey: schedKey,
		EnvElastic: "1", EnvMinNP: "2",
	}
	type want struct {
		rank, size, min, max int
		rendezvous           string
		group, replica       bool
	}
	for _, tc := range []struct {
		name string
		vars map[string]string
		want want
		err  string
	}{
		{"pytorchjob pod 2", elasticPod, want{2, 4, 2, 4, "pj-worker-0:29400", true, true}, ""},
		{"pytorchjob pod 0", withVars(elasticPod, "HOSTNAME", "pj-worker-0"), want{0, 4, 2, 4, "pj-worker-0:29400", true, false}, ""},
		{"pytorchjob pod 3 (a spare)", withVars(elasticPod, "HOSTNAME", "pj-worker-3"), want{3, 4, 2, 4, "pj-worker-0:29400", true, true}, ""},
		{"pytorchjob pod 5", withVars(elasticPod, "HOSTNAME", "pj-worker-5", "PET_NNODES", "2:6"), want{5, 6, 2, 6, "pj-worker-0:29400", true, false}, ""},
		{"pytorchjob, index from the label", withVars(elasticPod, "HOSTNAME", "", "PET_NODE_RANK", "1"), want{1, 4, 2, 4, "pj-worker-0:29400", true, true}, ""},
		{"pytorchjob, one size", withVars(elasticPod, "PET_NNODES", "3"), want{2, 3, 3, 3, "pj-worker-0:29400", true, true}, ""},
		{"pytorchjob, GORUN_SIZE", withVars(elasticPod, EnvSize, "3"), want{2, 3, 2, 4, "pj-worker-0:29400", true, true}, ""},
		{"pytorchjob, no backend", withVars(elasticPod, "PET_RDZV_BACKEND", ""), want{2, 4, 2, 4, "pj-worker-0:29400", true, true}, ""},
		{"pytorchjob, endpoint without port", withVars(elasticPod, "PET_RDZV_ENDPOINT", "pj-worker-0"), want{2, 4, 2, 4, "pj-worker-0:29400", true, true}, ""},
		{"pytorchjob, port override", withVars(elasticPod, EnvRendezvousPort, "29600"), want{2, 4, 2, 4, "pj-worker-0:29600", true, true}, ""},
		{"pytorchjob, bounds overridden", withVars(elasticPod, EnvMinNP, "3"), want{2, 4, 3, 4, "pj-worker-0:29400", true, true}, ""},
		{"pytorchjob, master replica too", withVars(elasticPod, "MASTER_ADDR", "pj-master-0", "MASTER_PORT", "23456", "RANK", "3", "WORLD_SIZE", "5"), want{2, 4, 2, 4, "pj-worker-0:29400", true, true}, ""},

		{"pytorchjob, unknown backend", withVars(elasticPod, "PET_RDZV_BACKEND", "zk"), want{}, "want c10d"},
		{"pytorchjob, bad range", withVars(elasticPod, "PET_NNODES", "4:2"), want{}, "MIN:MAX"},
		{"pytorchjob, no range", withVars(elasticPod, "PET_NNODES", ""), want{}, "MIN:MAX"},
		{"pytorchjob, bad restarts", withVars(elasticPod, "PET_MAX_RESTARTS", "-1"), want{}, "PET_MAX_RESTARTS"},
		{"pytorchjob, 2 processes per pod", withVars(elasticPod, "PET_NPROC_PER_NODE", "2"), want{}, "nprocPerNode: 1"},
		{"pytorchjob, another pod's name", withVars(elasticPod, "HOSTNAME", "other-worker-1"), want{}, "training.kubeflow.org/replica-index"},
		{"pytorchjob, pod beyond the start", withVars(elasticPod, "HOSTNAME", "pj-worker-4"), want{}, "not within the 4 pods"},
		{"pytorchjob, size beyond the range", withVars(elasticPod, EnvSize, "5"), want{}, "allows 2 to 4"},
		{"pytorchjob, endpoint not pod 0", withVars(elasticPod, "PET_RDZV_ENDPOINT", "rdzv.example:29400"), want{}, "not pod 0's DNS name"},
		{"pytorchjob, no job key", withVars(elasticPod, EnvJobKey, ""), want{}, "no job key"},

		{"indexed job pod 1", indexed, want{1, 4, 2, 4, "train-0.train:29500", true, true}, ""},
		{"indexed job pod 0", withVars(indexed, "JOB_COMPLETION_INDEX", "0"), want{0, 4, 2, 4, "train-0.train:29500", true, false}, ""},
		{"indexed job pod 3 (a spare)", withVars(indexed, "JOB_COMPLETION_INDEX", "3"), want{3, 4, 2, 4, "train-0.train:29500", true, true}, ""},
		{"jobset pod 2", withVars(indexed, "JOB_COMPLETION_INDEX", "2", EnvRendezvousAddr, "t-w-0-0.t:29500"), want{2, 4, 2, 4, "t-w-0-0.t:29500", true, true}, ""},
		{"indexed job, fixed size", withVars(indexed, EnvElastic, ""), want{1, 4, 0, 0, "train-0.train:29500", false, false}, ""},
		{"indexed job, rendezvous by IP", withVars(indexed, EnvRendezvousAddr, "10.0.0.1:29500"), want{}, "not pod 0's DNS name"},
		{"indexed job, bad bound", withVars(indexed, EnvMaxNP, "x"), want{}, EnvMaxNP},
	} {
		e, err := readEnv(mapEnv(tc.vars))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: err = %v, want one containing %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		got := want{e.rank, e.size, e.minNP, e.maxNP, e.rendezvous, e.group, e.replica}
		if got != tc.want || !e.hostRendezvous || !e.elastic && tc.want.group {
			t.Errorf("%s:\n got %+v (host %v, elastic %v)\nwant %+v", tc.name, got, e.hostRendezvous, e.elastic, tc.want)
		}
		if e.group && (e.pods == nil || e.elasticWait != 600*time.Second) {
			t.Errorf("%s: group without pods (%v) or wait %v", tc.name, e.pods, e.elasticWait)
		}
		if e.replicaSpare != (e.replica && e.rank >= 3) {
			t.Errorf("%s: pod %d hosts a spare: %v", tc.name, e.rank, e.replicaSpare)
		}
	}
}

// The replicas' addresses and the replaced pods' rendezvous, for each
// kind of pod name.
func TestPodGroup(t *testing.T) {
	for _, tc := range []struct {
		endpoint, pod2, name3 string
		size, self            int
		rendezvous            string
	}{
		{"pj-worker-0:29400", "pj-worker-2:29400", "pj-worker-3", 4, 0, "3@pj-worker-1:29400,4@pj-worker-2:29400,5@pj-worker-3:29400"},
		{"pj-worker-0:29400", "pj-worker-2:29400", "pj-worker-3", 4, 1, "pj-worker-0:29400,4@pj-worker-2:29400,5@pj-worker-3:29400"},
		{"pj-worker-0:29400", "pj-worker-2:29400", "pj-worker-3", 8, 5, "pj-worker-0:29400,3@pj-worker-1:29400,4@pj-worker-2:29400,5@pj-worker-3:29400,6@pj-worker-4:29400"},
		{"train-0.train:29500", "train-2.train:29500", "train-3.train", 2, 1, "train-0.train:29500"},
		{"js-w-0-0.js.ns.svc:1", "js-w-0-2.js.ns.svc:1", "js-w-0-3", 3, 0, "3@js-w-0-1.js.ns.svc:1,4@js-w-0-2.js.ns.svc:1"},
	} {
		g, err := podGroupOf(tc.endpoint)
		if err != nil {
			t.Errorf("%s: %v", tc.endpoint, err)
			continue
		}
		if a := g.addr(2); a != tc.pod2 {
			t.Errorf("%s: pod 2 at %s, want %s", tc.endpoint, a, tc.pod2)
		}
		if i := g.index(tc.name3); i != 3 {
			t.Errorf("%s: %s is pod %d, want 3", tc.endpoint, tc.name3, i)
		}
		if r := podRendezvous(&g, tc.size, tc.self); r != tc.rendezvous {
			t.Errorf("%s, size %d, pod %d: rendezvous %q, want %q", tc.endpoint, tc.size, tc.self, r, tc.rendezvous)
		}
	}
	g, _ := podGroupOf("pj-worker-0:1")
	for _, name := range []string{"pj-worker-", "pj-worker-01", "pj-worker--1", "pj-master-0", "pj-worker-x"} {
		if i := g.index(name); i != -1 {
			t.Errorf("%s is pod %d, want none", name, i)
		}
	}
}

// The relay carries a connection both ways to its target, and Close ends
// the connections it relays.
func TestReplicaRelay(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				c.Write([]byte("echo " + line))
				// Holds the connection until the relay ends it.
				c.Read(make([]byte, 1))
			}()
		}
	}()
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := probe.Addr().(*net.TCPAddr).Port
	probe.Close()
	r, err := startReplicaRelay(port, l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write([]byte("hi\n"))
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "echo hi\n" {
		t.Fatalf("relayed %q, %v", line, err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Errorf("the relayed connection outlived Close")
	}
}
