package podsim

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A pod sees its name as host name and HOSTNAME, the other pod's name
// resolves to the other node, its environment is only what it was given,
// and a container that fails is started again until it succeeds.
func TestPods(t *testing.T) {
	count := filepath.Join(t.TempDir(), "count")
	out := &syncBuffer{}
	c := New(t, out,
		Spec{Name: "job-worker-0", Env: []string{"ROLE=first"}, Args: []string{"sh", "-c", `echo "name $(hostname) $HOSTNAME"; getent hosts job-worker-1; echo "vars $(env | grep -cv '^_=\|^PWD=\|^SHLVL=')"`}},
		Spec{Name: "job-worker-1", Args: []string{"sh", "-c", `n=$(cat ` + count + ` 2>/dev/null || echo 0); echo $((n+1)) > ` + count + `; echo run $n; [ "$n" -ge 2 ]`}},
	)
	c.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Wait(ctx); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	text := out.String()
	for _, want := range []string{
		"[job-worker-0] name job-worker-0 job-worker-0\n",
		"[job-worker-0] " + c.Pods[1].Host.IP + " ",
		"[job-worker-0] vars 3\n", // PATH, HOSTNAME, ROLE
		"[job-worker-1] run 0\n", "[job-worker-1] run 1\n", "[job-worker-1] run 2\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	if state, exits := c.Pods[1].State(); state != "Succeeded" || len(exits) != 3 {
		t.Errorf("pod 1: %s after %q, want Succeeded after 2 failures", state, exits)
	}
}

// Delete: SIGTERM, SIGKILL after the grace period for a container that
// ignores it, and the pod created again.
func TestDelete(t *testing.T) {
	out := &syncBuffer{}
	c := New(t, out, Spec{Name: "p-0", Args: []string{"sh", "-c", `trap "echo term" TERM; echo up; while :; do sleep 0.05; done`}})
	c.Start(t)
	p := c.Pods[0]
	waitFor := func(s string, n int) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); strings.Count(out.String(), s) < n; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %d %q in:\n%s", n, s, out)
			}
		}
	}
	waitFor("[p-0] up", 1)
	first := p.PID()
	if err := p.Delete(500*time.Millisecond, true); err != nil {
		t.Fatal(err)
	}
	waitFor("[p-0] up", 2)
	if pid := p.PID(); pid == 0 || pid == first {
		t.Errorf("pod recreated as pid %d, the deleted one was %d", pid, first)
	}
	if _, exits := p.State(); len(exits) != 1 || !strings.Contains(exits[0], "killed") {
		t.Errorf("the deleted container ended %q, want killed after the grace period", exits)
	}
	if err := p.Delete(500*time.Millisecond, false); err != nil {
		t.Fatal(err)
	}
	if state, _ := p.State(); state != "Deleted" {
		t.Errorf("state %s after a delete without recreation", state)
	}
}
