package collective

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorun/gorun/p2p"
)

// EnvStallThreshold sets the stall warning threshold (a Go duration or
// seconds; negative disables).
const EnvStallThreshold = "GORUN_STALL_THRESHOLD"

// DefaultStallThreshold is how long a collective may wait before a stall
// warning, unless WithStallThreshold or GORUN_STALL_THRESHOLD says otherwise;
// with a collective timeout of 2 minutes or less, half the timeout is used
// instead, so that the warning comes before the timeout.
const DefaultStallThreshold = 60 * time.Second

// stallWatch is the stall warning of the call running now. Calls run one
// at a time (execMu), so one timer per Comm is re-armed for each, rather
// than a timer, a channel and closures made per call, which cost a small
// collective about half a microsecond.
type stallWatch struct {
	mu    sync.Mutex
	timer *time.Timer
	h     *Handle // the call watched; nil between calls
	start time.Time
	first bool // no warning yet for this call: the next asks for a diagnosis
}

// watchStall arms the stall warning for h, which started running at start;
// unwatchStall disarms it. The warning repeats every threshold while the
// call waits; it never ends the call (the timeout does). The first warning
// of the call is followed by the hang diagnosis, on lines of its own
// (hangDiagnosis): the warning goes out at once, the diagnosis when the
// rendezvous has gathered every rank's state, seconds later. It also
// records the call's start in the flight recorder (traceCall records its
// end).
func (c *Comm) watchStall(h *Handle, start time.Time) {
	if f := c.flight(); f != nil {
		f.begin(h.call, start)
	}
	d := c.stallThreshold
	if d <= 0 {
		return
	}
	w := &c.stall
	w.mu.Lock()
	w.h, w.start, w.first = h, start, true
	if w.timer == nil {
		w.timer = time.AfterFunc(d, c.stallFired)
	} else {
		w.timer.Reset(d)
	}
	w.mu.Unlock()
}

// unwatchStall disarms the warning of the call that watchStall armed.
func (c *Comm) unwatchStall() {
	if c.stallThreshold <= 0 {
		return
	}
	w := &c.stall
	w.mu.Lock()
	w.h = nil
	w.timer.Stop()
	w.mu.Unlock()
}

// stallFired warns of the call being watched. A firing that comes after
// its call ended, or that was due before the next call re-armed the timer,
// finds no call that has waited the threshold and says nothing.
func (c *Comm) stallFired() {
	d := c.stallThreshold
	w := &c.stall
	w.mu.Lock()
	h, start, diagnose := w.h, w.start, w.first
	if h == nil || time.Since(start) < d {
		w.mu.Unlock()
		return
	}
	w.first = false
	w.timer.Reset(d) // the repeats do not wait for the diagnosis
	w.mu.Unlock()
	c.stats.stalls.Add(1)
	c.warnf("%s", c.stallMessage(h, start))
	c.trace().instant(h.rank(), laneCollectives, "stall warning", map[string]any{"seq": h.call.Seq, "call": h.call.String()})
	if diagnose {
		// One diagnosis per stalled call: the repeats only say how long
		// it has waited.
		for _, line := range c.hangDiagnosis(h) {
			c.warnf("%s", line)
		}
	}
}

// stallMessage names the call by its fingerprint, how long it has waited and
// what this rank can tell about the ranks that have not reached it.
func (c *Comm) stallMessage(h *Handle, start time.Time) string {
	waited := time.Since(start).Round(time.Millisecond)
	bound, _ := c.callTimeout(h.ctx)
	msg := fmt.Sprintf("gorun: stall warning: rank %d has waited %v in call #%d %s (after %v in the queue); the collective timeout is %v",
		h.rank(), waited, h.call.Seq, h.call, start.Sub(h.queued).Round(time.Millisecond), bound)
	if c.node == nil {
		return msg
	}
	behind, known := c.ranksBehind(h.call.Seq)
	switch {
	case !known:
		msg += "; the other ranks' progress is unknown"
	case len(behind) == 0:
		msg += "; every rank has entered this call, so the ring is slow or a link is stuck"
	default:
		var parts []string
		for _, b := range behind {
			parts = append(parts, fmt.Sprintf("rank %d (last entered #%d)", b.rank, b.seq))
		}
		msg += fmt.Sprintf("; ranks that have not entered it yet: %s", strings.Join(parts, ", "))
	}
	return msg
}

// hangDiagnosis asks the rendezvous to gather every rank's state (the call
// it is in, its flight recorder, the peer it waits for, its stack) and
// returns the lines to print after the stall warning:
//   - under a launcher, which printed the diagnosis: where it went;
//   - without one, on the rank that asked first: the diagnosis, the named
//     rank's stack and where every rank's state went (the rendezvous, in
//     rank 0's process, wrote it);
//   - on the other ranks: one line saying who printed it and where the
//     states went, so that a big job prints and writes it once.
func (c *Comm) hangDiagnosis(h *Handle) []string {
	if c.node == nil {
		return nil
	}
	rank, seq := h.rank(), h.call.Seq
	ctx, cancel := context.WithTimeout(c.life, hangAskTimeout)
	defer cancel()
	rep, err := c.node.DiagnoseHang(ctx, seq)
	if err != nil {
		return []string{fmt.Sprintf("gorun: rank %d: no hang diagnosis of call #%d: %v", rank, seq, err)}
	}
	return hangReportLines(rank, seq, rep)
}

// hangReportLines are hangDiagnosis' lines for report rep on call seq,
// asked by rank.
func hangReportLines(rank int, seq uint64, rep *p2p.HangReport) []string {
	if rep.Ended {
		return []string{fmt.Sprintf("gorun: rank %d: no hang diagnosis of call #%d: %s", rank, seq, rep.Diagnosis)}
	}
	where := ""
	if rep.Dump != "" {
		where = fmt.Sprintf("%s on host %s", rep.Dump, rep.DumpHost)
	}
	if rep.Printed {
		msg := fmt.Sprintf("gorun: rank %d: the launcher printed a hang diagnosis of call #%d", rank, seq)
		if where != "" {
			msg += " and wrote every rank's flight recorder to " + where
		}
		return []string{msg}
	}
	if !rep.First {
		msg := fmt.Sprintf("gorun: rank %d: hang diagnosis of call #%d: rank %d printed it", rank, seq, rep.Requester)
		if where != "" {
			msg += "; every rank's flight recorder is in " + where
		}
		return []string{msg}
	}
	lines := []string{"gorun: hang diagnosis: " + rep.Diagnosis}
	for _, l := range rep.CulpritStack(hangStackFrames) {
		lines = append(lines, "gorun:   "+l)
	}
	switch {
	case where != "":
		lines = append(lines, "gorun: every rank's flight recorder (its current call, its last calls and its stack) is in "+where)
	case rep.DumpPending:
		// The rendezvous is still writing them, maybe to a stuck file
		// system: one more writer there would only stall this rank too.
		lines = append(lines, "gorun: every rank's flight recorder is not written yet: "+rep.DumpErr)
	case rep.Stripped:
		// The states did not fit in the answer: this rank has only the
		// diagnosis, nothing to write.
		lines = append(lines, fmt.Sprintf("gorun: the ranks' flight recorders were not written: the rendezvous could not (%s), and they are too big to send to rank %d", rep.DumpErr, rank))
	default:
		// The rendezvous could not write them; this rank has them all.
		path, err := p2p.WriteHangReport("", rep, fmt.Sprintf("-rank%d", rank))
		if err != nil {
			lines = append(lines, fmt.Sprintf("gorun: the ranks' flight recorders were not written: by the rendezvous: %s; by rank %d: %v", rep.DumpErr, rank, err))
		} else {
			lines = append(lines, fmt.Sprintf("gorun: every rank's flight recorder (its current call, its last calls and its stack) is in %s (written by rank %d: the rendezvous could not: %s)", path, rank, rep.DumpErr))
		}
	}
	return lines
}

// hangAskTimeout bounds how long a stalled rank waits for the hang report:
// the rendezvous waits up to a few seconds for the ranks' states
// (p2p's stateAnswerTimeout), then writes the dump and answers.
const hangAskTimeout = 15 * time.Second

// hangStackFrames is how much of the named rank's stack the diagnosis
// shows (the dump has the rest).
const hangStackFrames = 8

type rankProgress struct {
	rank int
	seq  uint64
}

// parseDuration accepts a Go duration ("90s") or seconds ("90"); negative
// values are allowed (they disable the feature).
func parseDuration(env, s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if secs, err := strconv.ParseFloat(s, 64); err == nil {
		return time.Duration(secs * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%s=%q is not a duration (write 60s or 60)", env, s)
	}
	return d, nil
}

// ranksBehind asks the rendezvous which ranks have not yet entered call seq.
func (c *Comm) ranksBehind(seq uint64) ([]rankProgress, bool) {
	ctx, cancel := context.WithTimeout(c.life, 5*time.Second)
	defer cancel()
	p, err := c.node.QueryProgress(ctx)
	if err != nil {
		c.logf("rank %d: stall inspector: %v", c.Rank(), err)
		return nil, false
	}
	var behind []rankProgress
	for r, s := range p {
		if s < seq {
			behind = append(behind, rankProgress{r, s})
		}
	}
	return behind, true
}

// traceCall writes a finished call to the timeline: its wait in the queue
// (an async event, since queued calls overlap) and its run on the ring.
// It also records the call's end in the flight recorder.
func (c *Comm) traceCall(h *Handle, start, end time.Time, err error) {
	if f := c.flight(); f != nil {
		f.end(end, err)
	}
	tl := c.trace()
	if tl == nil {
		return
	}
	// Async ids are global: qualify the sequence number by the rank the
	// call was numbered with, and, in an elastic job, by its membership
	// epoch (numbers restart and ranks are renumbered at every epoch).
	rank := h.rank()
	id := fmt.Sprintf("r%d-%d", rank, h.call.Seq)
	if h.view != nil && h.view.epoch > 0 {
		id = fmt.Sprintf("e%d-r%d-%d", h.view.epoch, rank, h.call.Seq)
	}
	name := h.call.Kind.Name()
	if h.call.Name != "" {
		name += " " + h.call.Name
	}
	if start.Sub(h.queued) > 0 {
		tl.async(rank, laneQueue, "queue", "queued: "+name, id, h.queued, start, nil)
	}
	args := map[string]any{"seq": h.call.Seq, "call": h.call.String(), "queued_us": start.Sub(h.queued).Microseconds()}
	if err != nil {
		args["error"] = err.Error()
	}
	tl.span(rank, laneCollectives, name, start, end, args)
}

// rank is the rank the call was numbered with (that of its epoch).
func (h *Handle) rank() int {
	if h.view != nil {
		return h.view.rank
	}
	return h.comm.Rank()
}
