package collective

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/ring"
)

type event struct {
	Name string         `json:"name"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"`
	Dur  float64        `json:"dur"`
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	Args map[string]any `json:"args"`
}

func parseTrace(t *testing.T, data []byte) []event {
	t.Helper()
	var evs []event
	if err := json.Unmarshal(data, &evs); err != nil {
		t.Fatalf("trace is not valid JSON: %v\n%s", err, data)
	}
	return evs
}

// trainSteps runs a small training loop with a reducer on every rank:
// broadcast, 2 steps of k=2 micro-batches over 3 small gradients (one
// fusion bucket of 2 and one of 1), and a checkpoint mark.
func trainSteps(t *testing.T, comms []*Comm) {
	ctx := context.Background()
	mustAll(t, onEach(comms, func(c *Comm) error {
		r, err := NewReducer(c, ReducerOptions{BackwardPassesPerStep: 2, FusionThreshold: 800})
		if err != nil {
			return err
		}
		for i, n := range []int{100, 100, 150} {
			if err := r.Register(fmt.Sprint("layer", i), make([]float32, n), make([]float32, n)); err != nil {
				return err
			}
		}
		if err := r.BroadcastParameters(ctx, 0); err != nil {
			return err
		}
		for range 2 {
			for range 2 {
				for _, name := range []string{"layer0", "layer1", "layer2"} {
					if err := r.GradReady(ctx, name); err != nil {
						return err
					}
				}
			}
			if err := r.Step(ctx); err != nil {
				return err
			}
		}
		c.Mark("checkpoint", map[string]any{"step": 2})
		return nil
	}))
}

// Four ranks in one process share one trace: it parses as JSON after Close,
// has a track per rank, and shows each rank's collectives, queue waits,
// fusion copies, micro-batches, steps and marks.
func TestTimelineSharedByRanks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.json")
	tl, err := OpenTimeline(path)
	if err != nil {
		t.Fatal(err)
	}
	comms := newJob(t, 4, WithTimeline(tl))
	trainSteps(t, comms)

	// Before Close the file is a trace cut short: every line but the
	// first is one event followed by ",\n".
	partial, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(partial), "[\n") || !strings.HasSuffix(string(partial), "},\n") {
		t.Fatalf("partial trace does not end with an event and a comma: %q", partial[max(0, len(partial)-40):])
	}
	parseTrace(t, append(partial[:len(partial)-2], ']'))

	if err := tl.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	evs := parseTrace(t, data)
	for rank := range 4 {
		count := map[string]int{}
		for _, e := range evs {
			if e.Pid != rank {
				continue
			}
			name := e.Name
			switch {
			case strings.HasPrefix(name, "Allreduce bucket"):
				name = "Allreduce bucket"
			case strings.HasPrefix(name, "micro-batch"):
				name = "micro-batch"
			case strings.HasPrefix(name, "step "):
				name = "step wait"
			case strings.HasPrefix(name, "queued: "):
				name = "queued " + e.Ph
			}
			count[name]++
		}
		want := map[string]int{
			"process_name":                      1,
			"Broadcast layer0":                  1,
			"Allgather reducer topology digest": 1,
			"Allreduce bucket":                  2, // layer0+layer1, 2 steps
			"Allreduce layer2":                  2,
			"fusion copy in":                    12, // 3 gradients × 2 micro-batches × 2 steps
			"fusion copy out":                   4,
			"micro-batch":                       4,
			"step wait":                         2,
			"checkpoint":                        1,
		}
		for name, n := range want {
			if count[name] != n {
				t.Errorf("rank %d: %d %q events, want %d (all: %v)", rank, count[name], name, n, count)
			}
		}
		// The ring's phases of each collective: 4 allreduces, each a ring,
		// scatter-gather or Rabenseifner (reduce-scatter, allgather) or, being
		// small, a direct gather or a recursive doubling.
		if count["wait for peers"] == 0 || count["gather"]+count["reduce-scatter"]+count["recursive-doubling"] < 4 {
			t.Errorf("rank %d: collective phases missing: %v", rank, count)
		}
		if count["queued b"] == 0 || count["queued b"] != count["queued e"] {
			t.Errorf("rank %d: queue wait events begin %d, end %d", rank, count["queued b"], count["queued e"])
		}
	}
	for _, e := range evs {
		if e.Ph == "X" && strings.HasPrefix(e.Name, "Allreduce") && e.Args["call"] == nil {
			t.Fatalf("collective event without its fingerprint: %+v", e)
		}
	}
}

// GORUN_TIMELINE=path: rank N of a multi-rank job writes path.rankN;
// MergeTimelines joins the files into one trace.
func TestTimelineFilePerRank(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tl.json")
	t.Setenv(EnvTimeline, path)
	comms := newJob(t, 2)
	trainSteps(t, comms)
	// Close every rank at once: a clean Close waits for its peers to close.
	mustAll(t, onEach(comms, func(c *Comm) error { return c.Close() }))
	var files []string
	for rank := range 2 {
		f := fmt.Sprintf("%s.rank%d", path, rank)
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range parseTrace(t, data) {
			if e.Ph != "i" && e.Pid != rank {
				t.Fatalf("%s holds an event of rank %d: %+v", f, e.Pid, e)
			}
		}
		files = append(files, f)
	}
	merged := filepath.Join(dir, "merged.json")
	if err := MergeTimelines(merged, files...); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(merged)
	if err != nil {
		t.Fatal(err)
	}
	pids := map[int]bool{}
	for _, e := range parseTrace(t, data) {
		pids[e.Pid] = true
	}
	if !pids[0] || !pids[1] {
		t.Fatalf("merged trace lacks a rank: %v", pids)
	}
}

// The async (queue) events of calls of different membership epochs never
// share an id, though sequence numbers restart and ranks are renumbered at
// every epoch; a call is drawn on the track of the rank it was numbered
// with (the Comm's rank may have changed since).
func TestTimelineIDsAcrossEpochs(t *testing.T) {
	var buf strings.Builder
	tl := NewTimeline(&buf)
	c := &Comm{tl: tl}
	c.view.Store(&commView{rank: 0, size: 2, epoch: 2, ctx: context.Background()})
	now := time.Now()
	for _, v := range []*commView{{rank: 1, size: 3, epoch: 0}, {rank: 1, size: 2, epoch: 2}} {
		h := &Handle{call: ring.Call{Kind: ring.Barrier, Seq: 3}, view: v, comm: c, queued: now.Add(-time.Millisecond)}
		c.traceCall(h, now, now.Add(time.Millisecond), nil)
	}
	if err := tl.Close(); err != nil {
		t.Fatal(err)
	}
	var evs []struct {
		Ph  string `json:"ph"`
		ID  string `json:"id"`
		Pid int    `json:"pid"`
	}
	if err := json.Unmarshal([]byte(buf.String()), &evs); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range evs {
		if e.Ph == "b" {
			ids = append(ids, e.ID)
			if e.Pid != 1 {
				t.Errorf("event %s on rank %d's track, want rank 1's (the call's)", e.ID, e.Pid)
			}
		}
	}
	if fmt.Sprint(ids) != "[r1-3 e2-r1-3]" {
		t.Errorf("queue ids %v, want [r1-3 e2-r1-3]", ids)
	}
}
