package collective

import (
	"bufio"
	"encoding/json"
	"fmt"
	"github.com/gorun/gorun/ring"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// EnvTimeline names the Chrome trace file each rank writes (see Timeline).
const EnvTimeline = "GORUN_TIMELINE"

// Tracks (Chrome "threads") within one rank's process track.
const (
	laneCollectives = 1 // the collectives, in execution order
	laneQueue       = 2 // async events: each call's wait in the queue
	laneReducer     = 3 // fusion copies, micro-batches and steps
	laneMarks       = 4 // user marks (checkpoints, epochs)
	lanePhases      = 5 // phases inside each collective, from the ring
)

var laneNames = map[int]string{
	laneCollectives: "collectives",
	laneQueue:       "queue wait",
	laneReducer:     "reducer (fusion, aggregation)",
	laneMarks:       "marks",
	lanePhases:      "collective phases",
}

// Timeline writes a Chrome trace (the JSON array format that chrome://tracing
// and Perfetto open) with one process track per rank. Each event is written
// to the file as it happens, one per line followed by ",\n", so a trace cut
// short by a crash loads as it is (both viewers accept the missing "]");
// Close appends a final event and the "]" so that the file is strict JSON.
//
// Several Comms may share one Timeline (ranks in one process, as in tests);
// each writes under pid = its rank. With GORUN_TIMELINE=path, a one-rank job
// writes path and rank N of a larger job writes path.rankN (ranks are
// usually separate processes); MergeTimelines joins such files into one.
type Timeline struct {
	mu     sync.Mutex
	w      io.Writer
	f      *os.File
	named  map[int]bool
	closed bool
	err    error
}

// OpenTimeline creates (truncates) path and starts a trace in it.
func OpenTimeline(path string) (*Timeline, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("gorun: timeline: %w", err)
	}
	t := NewTimeline(f)
	t.f = f
	return t, t.err
}

// NewTimeline starts a trace on w; Close does not close w.
func NewTimeline(w io.Writer) *Timeline {
	t := &Timeline{w: w, named: map[int]bool{}}
	_, t.err = io.WriteString(w, "[\n")
	return t
}

// timelinePath is the file rank writes for GORUN_TIMELINE=path.
func timelinePath(path string, rank, size int) string {
	if size == 1 {
		return path
	}
	return fmt.Sprintf("%s.rank%d", path, rank)
}

type traceEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"`
	Dur  *float64       `json:"dur,omitempty"`
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	ID   string         `json:"id,omitempty"`
	S    string         `json:"s,omitempty"`
	Args map[string]any `json:"args,omitempty"`
}

// us is the trace timestamp of at: microseconds since the Unix epoch, so
// that the files of ranks in different processes (or hosts, up to clock
// skew) line up when merged.
func (t *Timeline) us(at time.Time) float64 {
	return float64(at.UnixNano()) / 1e3
}

// emit writes one event; t may be nil (no timeline).
func (t *Timeline) emit(ev traceEvent) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.err != nil {
		return
	}
	var b strings.Builder
	if !t.named[ev.Pid] {
		t.named[ev.Pid] = true
		meta := func(name string, tid int, args map[string]any) {
			line, _ := json.Marshal(traceEvent{Name: name, Ph: "M", Pid: ev.Pid, Tid: tid, Args: args})
			b.Write(line)
			b.WriteString(",\n")
		}
		meta("process_name", 0, map[string]any{"name": fmt.Sprintf("rank %d", ev.Pid)})
		meta("process_sort_index", 0, map[string]any{"sort_index": ev.Pid})
		for lane := laneCollectives; lane <= laneMarks; lane++ {
			meta("thread_name", lane, map[string]any{"name": laneNames[lane]})
			meta("thread_sort_index", lane, map[string]any{"sort_index": lane})
		}
	}
	line, err := json.Marshal(ev)
	if err != nil {
		return
	}
	b.Write(line)
	b.WriteString(",\n")
	_, t.err = io.WriteString(t.w, b.String())
}

func (t *Timeline) span(pid, tid int, name string, start, end time.Time, args map[string]any) {
	if t == nil {
		return
	}
	d := float64(end.Sub(start).Nanoseconds()) / 1e3
	t.emit(traceEvent{Name: name, Ph: "X", Ts: t.us(start), Dur: &d, Pid: pid, Tid: tid, Args: args})
}

func (t *Timeline) instant(pid, tid int, name string, args map[string]any) {
	if t == nil {
		return
	}
	t.emit(traceEvent{Name: name, Ph: "i", S: "t", Ts: t.us(time.Now()), Pid: pid, Tid: tid, Args: args})
}

// async writes a begin/end pair: such events may overlap on one track.
func (t *Timeline) async(pid, tid int, cat, name, id string, start, end time.Time, args map[string]any) {
	if t == nil {
		return
	}
	t.emit(traceEvent{Name: name, Cat: cat, Ph: "b", Ts: t.us(start), Pid: pid, Tid: tid, ID: id, Args: args})
	t.emit(traceEvent{Name: name, Cat: cat, Ph: "e", Ts: t.us(end), Pid: pid, Tid: tid, ID: id})
}

// Close ends the trace with "]" (making the file strict JSON) and closes the
// file it opened. Events after Close are dropped.
func (t *Timeline) Close() error {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return t.err
	}
	t.closed = true
	if t.err == nil {
		// The last event has no trailing comma.
		line, _ := json.Marshal(traceEvent{Name: "trace end", Ph: "i", S: "g", Ts: t.us(time.Now())})
		_, t.err = fmt.Fprintf(t.w, "%s\n]\n", line)
	}
	if t.f != nil {
		if err := t.f.Close(); t.err == nil {
			t.err = err
		}
	}
	return t.err
}

// Mark records an instant event on this rank's "marks" track, for example a
// checkpoint or an epoch boundary.
func (c *Comm) Mark(name string, args map[string]any) {
	c.trace().instant(c.Rank(), laneMarks, name, args)
}

// trace returns the Comm's timeline or nil.
func (c *Comm) trace() *Timeline { return c.tl }

// tracePhase puts one phase of a collective, as the ring reports it, on the
// rank's "collective phases" track.
func (c *Comm) tracePhase(call ring.Call, phase string, start, end time.Time) {
	if tl := c.trace(); tl != nil {
		tl.span(c.Rank(), lanePhases, phase, start, end, map[string]any{"seq": call.Seq, "call": call.String()})
	}
}

// MergeTimelines writes to dst one trace holding the events of the srcs
// (for example the path.rankN files of a job), each of which may be complete
// or cut short.
func MergeTimelines(dst string, srcs ...string) error {
	out, err := os.Create(dst)
	if err != nil {
		return fmt.Errorf("gorun: timeline: %w", err)
	}
	w := bufio.NewWriter(out)
	w.WriteString("[\n")
	first := true
	for _, src := range srcs {
		data, err := os.ReadFile(src)
		if err != nil {
			out.Close()
			return fmt.Errorf("gorun: timeline: %w", err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			line = strings.TrimSuffix(strings.TrimSpace(line), ",")
			if line == "" || line == "[" || line == "]" || !json.Valid([]byte(line)) {
				continue
			}
			if !first {
				w.WriteString(",\n")
			}
			first = false
			w.WriteString(line)
		}
	}
	w.WriteString("\n]\n")
	if err := w.Flush(); err != nil {
		out.Close()
		return fmt.Errorf("gorun: timeline: %w", err)
	}
	return out.Close()
}
