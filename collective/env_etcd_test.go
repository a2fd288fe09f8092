package collective

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// GORUN_RDZV_* (or torchrun's PET_RDZV_*) choose the etcd backend: the
// job is elastic, needs no rendezvous address, and rank 0 and two more
// stand for leader with the bounds' defaults; under gorun, gorun says who
// stands.
func TestEtcdRdzvEnv(t *testing.T) {
	key := strings.Repeat("ab", 32)
	read := func(env map[string]string) (launchEnv, error) {
		return readEnv(func(k string) string { return env[k] })
	}
	pet := map[string]string{"PET_NODE_RANK": "1", "PET_NNODES": "4", "PET_RDZV_BACKEND": "etcd-v2",
		"PET_RDZV_ENDPOINT": "etcd-0:2379,http://etcd-1:2379", "PET_RDZV_ID": "train-42", EnvJobKey: key}
	e, err := read(pet)
	if err != nil {
		t.Fatal(err)
	}
	if e.etcd == nil || !slices.Equal(e.etcd.Endpoints, []string{"etcd-0:2379", "etcd-1:2379"}) || e.etcd.RendezvousID != "train-42" ||
		!e.elastic || e.hostRendezvous || e.rendezvous != "" || !e.replica || e.minNP != 1 || e.maxNP != 4 || e.elasticWait != 600*time.Second {
		t.Fatalf("pod 1 with PET_RDZV_BACKEND=etcd-v2: %+v (etcd %+v)", e, e.etcd)
	}
	pet["PET_NODE_RANK"], pet["PET_NNODES"] = "5", "6"
	if e, err := read(pet); err != nil || e.replica {
		t.Fatalf("pod 5: %+v, %v; want no candidate (ranks 0 to 4 stand)", e, err)
	}
	pet["PET_NODE_RANK"], pet["PET_NNODES"] = "1", "4"
	// PET_RDZV_BACKEND=c10d is torchrun's own store: rank 0's rendezvous.
	pet["PET_RDZV_BACKEND"], pet["PET_MASTER_ADDR"], pet["PET_MASTER_PORT"] = "c10d", "pod-0", "29400"
	if e, err := read(pet); err != nil || e.etcd != nil || e.rendezvous != "pod-0:29400" {
		t.Fatalf("PET_RDZV_BACKEND=c10d: %+v, %v; want rank 0's rendezvous", e, err)
	}

	// An elastic PyTorchJob with rdzvBackend etcd: no rank, the pod's
	// index from its name (or PET_NODE_RANK), the bounds from PET_NNODES.
	elastic := withVars(elasticPod, "PET_RDZV_BACKEND", "etcd", "PET_RDZV_ENDPOINT", "etcd-client:2379")
	for _, c := range []struct {
		name      string
		vars      map[string]string
		rank, max int
		candidate bool
	}{
		{"pod 2", elastic, 2, 4, true},
		{"pod 4 of 6", withVars(elastic, "HOSTNAME", "pj-worker-4", "PET_NNODES", "2:6"), 4, 6, true},
		{"pod 5 of 6", withVars(elastic, "HOSTNAME", "pj-worker-5", "PET_NNODES", "2:6"), 5, 6, false},
		{"pod 3 by its label", withVars(elastic, "HOSTNAME", "", "PET_NODE_RANK", "3"), 3, 4, true},
	} {
		e, err := read(c.vars)
		if err != nil || e.etcd == nil || e.etcd.Endpoints[0] != "etcd-client:2379" || !e.elastic || e.hostRendezvous || e.pods != nil ||
			e.rank != c.rank || e.replica != c.candidate || e.minNP != 2 || e.maxNP != c.max || e.size != c.max {
			t.Errorf("elastic PyTorchJob with etcd, %s: %+v, %v", c.name, e, err)
		}
	}
	for _, c := range []struct {
		name, want string
		vars       map[string]string
	}{
		{"no index", "set PET_NODE_RANK", withVars(elastic, "HOSTNAME", "trainer")},
		{"beyond the start", "not within the 4 pods", withVars(elastic, "HOSTNAME", "pj-worker-4")},
		{"no id", `PET_RDZV_ID="": the etcd rendezvous needs the job's id`, withVars(elastic, "PET_RDZV_ID", "")},
	} {
		if _, err := read(c.vars); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("elastic PyTorchJob with etcd, %s: %v; want an error with %q", c.name, err, c.want)
		}
	}

	g := map[string]string{EnvRank: "2", EnvSize: "4", EnvRendezvous: "gorun-host:5000", EnvJobKey: key, EnvElastic: "1",
		EnvRdzvBackend: "etcd", EnvRdzvEndpoints: "h1:2379,h2:2379,h3:2379", EnvRdzvID: "gorun-1"}
	if e, err := read(g); err != nil || e.etcd == nil || e.replica || e.rendezvous != "" {
		t.Fatalf("a rank gorun did not choose: %+v, %v; want the etcd backend, no candidate", e, err)
	}
	g[EnvRdzvReplica], g[EnvMinNP], g[EnvMaxNP], g[EnvElasticWait] = "1", "2", "6", "60s"
	if e, err := read(g); err != nil || !e.replica || e.minNP != 2 || e.maxNP != 6 {
		t.Fatalf("a rank gorun chose: %+v, %v; want a candidate with gorun's bounds", e, err)
	}

	for _, c := range []struct {
		set  map[string]string
		want string
	}{
		{map[string]string{EnvRdzvBackend: "zookeeper"}, `GORUN_RDZV_BACKEND="zookeeper": want gorun (the rendezvous gorun or rank 0 hosts) or etcd (with GORUN_RDZV_ENDPOINTS and GORUN_RDZV_ID)`},
		{map[string]string{EnvRdzvEndpoints: ""}, "GORUN_RDZV_ENDPOINTS is not set: the etcd rendezvous needs the etcd cluster's client addresses"},
		{map[string]string{EnvRdzvEndpoints: "h1"}, `GORUN_RDZV_ENDPOINTS="h1": "h1" is not host:port (write h1:2379,h2:2379,h3:2379)`},
		{map[string]string{EnvRdzvID: ""}, `GORUN_RDZV_ID="": the etcd rendezvous needs the job's id`},
		{map[string]string{EnvRdzvID: "a/b"}, `GORUN_RDZV_ID="a/b"`},
		{map[string]string{EnvHeartbeatTimeout: "1s"}, "GORUN_HEARTBEAT_TIMEOUT=1s with GORUN_RDZV_BACKEND=etcd: want 2s or more"},
	} {
		env := map[string]string{EnvRank: "0", EnvSize: "2", EnvJobKey: key,
			EnvRdzvBackend: "etcd", EnvRdzvEndpoints: "h1:2379", EnvRdzvID: "job"}
		for k, v := range c.set {
			env[k] = v
		}
		if _, err := read(env); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v; want an error with %q", c.set, err, c.want)
		}
	}
}
