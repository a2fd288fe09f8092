package p2p

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Hang diagnosis.
//
// When a collective waits past the stall threshold, the rank that waits
// asks the rendezvous for a diagnosis (Node.DiagnoseHang). The rendezvous
// asks every rank for its state on the control stream, which a rank stuck
// in user code or in a system call still answers: the answer is built on
// the control reader's goroutines, which Go schedules (and preempts a busy
// loop for) like any other. A rank's state (RankState) is the call it is in
// and the last calls it finished (the collective layer's flight recorder,
// see SetCallReporter), the peers its blocked transfers wait for (recorded
// by the transport: on a shm link only once a transfer parks, so that its
// fast path pays nothing; on a socket for the transfer's duration, next
// to system calls that cost far more), and the goroutine
// stacks that matter: the one running the collective, or the user's. The
// rendezvous puts them into a HangReport whose Diagnosis names the rank the
// waiting is stuck on and what it does, hands it to its OnHang (the
// launcher prints it and writes the dump) or, without one, writes the dump
// itself (it is the one process that has every rank's state), and sends it
// back to the ranks that asked. Without a launcher, the rank that asked
// first (HangReport.First) prints the diagnosis; the others print where
// it went.
//
// One hang, one gathering: every rank that waits in the stalled call asks,
// at about the same time or seconds apart (each rank's stall threshold
// runs from its own start of the call). Asks for a call (epoch, Seq)
// whose states are being gathered join that gathering; asks for a call
// already diagnosed get the kept report, with no new gathering (which
// would take every rank's goroutine stacks again, and print the diagnosis
// again). A call whose stall had ended when it was gathered is not kept.
//
// The messages (wire.go):
//   - rank -> rendezvous: hangask, Seq the stalled call;
//   - rendezvous -> every rank: stateq, Text the gathering's id: send your
//     state;
//   - rank -> rendezvous: state, with Seq its progress and Text its
//     RankState and the gathering's id as JSON (stateAnswer);
//   - rendezvous -> the ranks that asked: hang, with Rank the rank it goes
//     to and Text the HangReport as JSON.

// EnvHangDir names the directory hang diagnoses are written to (by gorun;
// without it, by the process that hosts the rendezvous, rank 0's, or, if
// that fails, by the rank that asked first); unset:
// the system's temporary directory (os.TempDir), as PyTorch's NCCL flight
// recorder does: a job's working directory is often a shared file system
// that a dump per stall should not litter.
const EnvHangDir = "GORUN_HANG_DIR"

// stateAnswerTimeout bounds how long the rendezvous waits for the ranks'
// states: a rank that does not answer within it is stopped or cut off,
// which the diagnosis says. (A stalled rank waits for the report itself
// longer: collective's hangAskTimeout.)
const stateAnswerTimeout = 5 * time.Second

// keptHangReports is how many diagnosed calls the rendezvous keeps the
// report of, to answer later asks for the same call: a job stalls in one
// call at a time, but ranks stuck in an earlier call than the others ask
// about that one.
const keptHangReports = 8

// Limits that keep a rank's answer small (it travels on the control
// stream, whose frames are at most maxFrame).
const (
	maxStateGoroutines = 8
	maxStateFrames     = 24
)

// CallRecord is one collective call in a flight recorder.
type CallRecord struct {
	Seq   uint64    `json:"seq"`
	Kind  string    `json:"kind"`           // "allreduce", "broadcast", ...
	Name  string    `json:"name,omitempty"` // the call's tensor name, if any
	Call  string    `json:"call"`           // the call as its fingerprint reads
	Start time.Time `json:"start"`
	End   time.Time `json:"end,omitzero"` // zero while the call runs
	Err   string    `json:"error,omitempty"`
}

// String is how a diagnosis names the call: allreduce #17 "layer3.w".
func (c *CallRecord) String() string {
	s := fmt.Sprintf("%s #%d", c.Kind, c.Seq)
	if c.Name != "" {
		s += fmt.Sprintf(" %q", c.Name)
	}
	return s
}

// CallReporter returns the call a rank is in (nil between calls) and the
// calls it finished last, oldest first. It must not block.
type CallReporter func() (current *CallRecord, recent []CallRecord)

// PeerWait is a data transfer that is blocked: a receive from, or a send
// to, Peer, since Since.
type PeerWait struct {
	Peer  int       `json:"peer"`
	Op    string    `json:"op"` // "recv from" or "send to"
	Since time.Time `json:"since"`
}

// verb is how a diagnosis says what the transfer waits to do.
func (w PeerWait) verb() string {
	if w.Op == "recv from" {
		return "receive from"
	}
	return w.Op
}

// Frame is one frame of a goroutine stack.
type Frame struct {
	Func string `json:"func"`
	File string `json:"file"`
	Line int    `json:"line"`
}

// Goroutine is one goroutine's stack, as far as a diagnosis needs it.
type Goroutine struct {
	ID    int    `json:"id"`
	State string `json:"state"` // "running", "syscall", "chan receive", ...
	// Role: "collective" (it runs or waits for a collective call) or
	// "user" (user code, outside any collective).
	Role   string  `json:"role"`
	Frames []Frame `json:"frames"` // innermost first, at most maxStateFrames
}

// RankState is what one rank told the rendezvous about itself.
type RankState struct {
	Rank     int    `json:"rank"`
	Host     string `json:"host,omitempty"`
	PID      int    `json:"pid,omitempty"`
	Progress uint64 `json:"progress"` // the last call it entered (SetProgress)
	// Current is the call it is in; nil: it is between calls (in user code).
	Current *CallRecord  `json:"current,omitempty"`
	Recent  []CallRecord `json:"recent,omitempty"` // the calls it finished last, oldest first
	Waits   []PeerWait   `json:"waits,omitempty"`  // its blocked transfers, longest first
	// Goroutines: the one that runs the current call, or the user's
	// goroutines when it is in no call; the most telling first.
	Goroutines []Goroutine `json:"goroutines,omitempty"`
	// NoAnswer says why the rendezvous has nothing else for this rank.
	NoAnswer string `json:"no_answer,omitempty"`
}

// HangReport is one hang diagnosis: every rank's state when a rank
// (Requester, the first to ask) waited past the stall threshold in call
// Seq (of membership epoch Epoch, in an elastic job).
type HangReport struct {
	Time      time.Time `json:"time"`
	Requester int       `json:"requester"`
	Epoch     int       `json:"epoch,omitempty"`
	Seq       uint64    `json:"seq"`
	// Diagnosis is one line naming the rank the waiting is stuck on and
	// what it does, e.g. `rank 2 waits in allreduce #17 "layer3.w" for
	// rank 1; rank 1's last call was #16 and it is in user code:
	// main.loadBatch at train/main.go:88 (goroutine 1, running)`.
	Diagnosis string      `json:"diagnosis"`
	Culprit   int         `json:"culprit"` // the rank it names; -1: none
	Ranks     []RankState `json:"ranks"`
	// Dump is where the report, with every rank's state, was written:
	// by the launcher (RendezvousConfig.OnHang) or, without one, by the
	// process that hosts the rendezvous, on host DumpHost. "" if nowhere:
	// DumpErr says why, if it was tried.
	Dump     string `json:"dump,omitempty"`
	DumpHost string `json:"dump_host,omitempty"`
	DumpErr  string `json:"dump_error,omitempty"`
	// DumpPending: printing and writing the report had not finished when
	// the rendezvous answered (hangDumpTimeout); the dump may still
	// appear, and a rank must not write one more into the same place.
	DumpPending bool `json:"dump_pending,omitempty"`
	// Printed: the launcher printed the diagnosis.
	Printed bool `json:"printed,omitempty"`
	// Ended: the rank that asked was no longer in call Seq when the
	// states were gathered (the stall ended): nothing was diagnosed.
	Ended bool `json:"ended,omitempty"`
	// Stripped: Ranks was left out of the answer to the ranks that asked,
	// to fit one control frame (a big job); the dump, if any, has them.
	Stripped bool `json:"stripped,omitempty"`
	// First, set by DiagnoseHang (not sent): this rank is Requester, the
	// first to ask about the call, so it is the one to print the
	// diagnosis when no launcher did.
	First bool `json:"-"`
}

// stateAnswer is a rank's answer to a gathering's stateq: its state and
// the gathering it answers (a late answer to an earlier gathering must
// not count for a later one).
type stateAnswer struct {
	RankState
	Gathering uint64 `json:"gathering"`
}

// hangAnswer is a report as it reached this rank: the rank the
// rendezvous sent it to, to tell whether this rank asked first.
type hangAnswer struct {
	rep *HangReport
	to  int
}

// SetCallReporter makes this rank's answers to a hang diagnosis carry the
// calls f reports (the collective layer's flight recorder).
func (n *Node) SetCallReporter(f CallReporter) { n.callReporter.Store(&f) }

// DiagnoseHang asks the rendezvous to gather every rank's state because
// this rank has waited past the stall threshold in call seq, and returns
// the report, with First set if this rank was the first to ask about the
// call. Bounded by ctx.
func (n *Node) DiagnoseHang(ctx context.Context, seq uint64) (*HangReport, error) {
	n.diagMu.Lock()
	defer n.diagMu.Unlock()
	select { // drop a stale answer to an earlier, abandoned request
	case <-n.diagAnswer:
	default:
	}
	if n.ctl == nil {
		return nil, errors.New("p2p: hang diagnosis: no control path to a rendezvous")
	}
	// Call numbers restart at every epoch of an elastic job: the epoch
	// says which call #seq is.
	epoch := max(n.Epoch(), 0)
	if err := n.sendCtl(&msg{T: tHangAsk, Rank: max(n.rank(), 0), Seq: seq, Epoch: epoch}); err != nil {
		return nil, fmt.Errorf("p2p: hang diagnosis: %w", err)
	}
	for {
		select {
		case a := <-n.diagAnswer:
			if a.rep.Seq != seq || a.rep.Epoch != epoch {
				// A late answer to an earlier request, abandoned at its
				// deadline, or one of another epoch: not this call's.
				continue
			}
			a.rep.First = a.rep.Requester == a.to
			return a.rep, nil
		case <-ctx.Done():
			return nil, fmt.Errorf("p2p: hang diagnosis: no answer from the rendezvous: %w", context.Cause(ctx))
		case <-n.ctlDead:
			return nil, errors.New("p2p: hang diagnosis: the control path to the rendezvous is closed")
		}
	}
}

// hangReportArrived hands the rendezvous' report, sent to rank to, to
// DiagnoseHang. The newest report wins: one left unread in the channel is
// an answer nobody waits for any more.
func (n *Node) hangReportArrived(text string, to int) {
	var rep HangReport
	if err := json.Unmarshal([]byte(text), &rep); err != nil {
		n.logf("bad hang diagnosis from the rendezvous: %v", err)
		return
	}
	a := hangAnswer{rep: &rep, to: to}
	for {
		select {
		case n.diagAnswer <- a:
			return
		default:
		}
		select { // only this goroutine (the control reader) sends
		case <-n.diagAnswer:
		default:
		}
	}
}

// answerHang sends this rank's state to the rendezvous for the gathering
// whose id is gathering (the stateq's Text). It runs on a goroutine of its
// own: the control reader goes on reading meanwhile.
func (n *Node) answerHang(gathering string) {
	defer n.wg.Done()
	id, _ := strconv.ParseUint(gathering, 10, 64)
	b, err := json.Marshal(stateAnswer{RankState: n.State(), Gathering: id})
	if err != nil {
		n.logf("hang diagnosis: encoding this rank's state: %v", err)
		return
	}
	if err := n.sendCtl(&msg{T: tState, Rank: max(n.rank(), 0), Seq: n.progress.Load(), Text: string(b)}); err != nil {
		n.logf("hang diagnosis: sending this rank's state to the rendezvous: %v", err)
	}
}

// State returns this rank's state for a hang diagnosis.
func (n *Node) State() RankState {
	st := RankState{Rank: n.rank(), PID: os.Getpid(), Progress: n.progress.Load()}
	st.Host, _ = os.Hostname()
	if f := n.callReporter.Load(); f != nil {
		st.Current, st.Recent = (*f)()
	}
	st.Waits = n.pendingWaits()
	st.Goroutines = relevantGoroutines(parseStacks(allStacks()), st.Current != nil)
	return st
}

// pendingWaits lists the transfers on this rank's links that are blocked
// now, the longest waiting first.
func (n *Node) pendingWaits() []PeerWait {
	n.mu.Lock()
	tr := n.tr
	n.mu.Unlock()
	if tr == nil {
		return nil
	}
	var w []PeerWait
	for _, dir := range []struct {
		links []*link
		op    string
	}{{tr.from, "recv from"}, {tr.to, "send to"}} {
		for r, l := range dir.links {
			if l == nil {
				continue
			}
			if since := l.waitSince(); since != 0 {
				w = append(w, PeerWait{Peer: r, Op: dir.op, Since: time.Unix(0, since)})
			}
		}
	}
	slices.SortFunc(w, func(a, b PeerWait) int { return a.Since.Compare(b.Since) })
	return w
}

// allStacks returns every goroutine's stack (runtime.Stack's text).
func allStacks() []byte {
	buf := make([]byte, 256<<10)
	for {
		k := runtime.Stack(buf, true)
		if k < len(buf) || len(buf) >= 64<<20 {
			return buf[:k]
		}
		buf = make([]byte, 2*len(buf))
	}
}

// parseStacks parses runtime.Stack's text: blocks of "goroutine N [state]:"
// followed by pairs of lines "func(args)" and "\tfile:line +0x..".
func parseStacks(b []byte) []Goroutine {
	var gs []Goroutine
	var g *Goroutine
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "goroutine "):
			gs = append(gs, Goroutine{})
			g = &gs[len(gs)-1]
			rest := strings.TrimPrefix(line, "goroutine ")
			id, after, _ := strings.Cut(rest, " ")
			g.ID, _ = strconv.Atoi(id)
			if i, j := strings.Index(after, "["), strings.LastIndex(after, "]"); i >= 0 && j > i {
				g.State = after[i+1 : j]
			}
		case g == nil || line == "":
		case strings.HasPrefix(line, "\t"):
			if len(g.Frames) == 0 {
				continue
			}
			f := &g.Frames[len(g.Frames)-1]
			loc := strings.TrimSpace(line)
			if i := strings.LastIndex(loc, " +0x"); i >= 0 {
				loc = loc[:i]
			}
			if i := strings.LastIndex(loc, ":"); i >= 0 {
				f.File = loc[:i]
				f.Line, _ = strconv.Atoi(loc[i+1:])
			}
		case strings.HasPrefix(line, "created by "), strings.HasPrefix(line, "..."):
			// The creator's frame and elided frames say nothing about
			// where the goroutine is; skip the creator's location line.
			if strings.HasPrefix(line, "created by ") {
				sc.Scan()
			}
		default:
			fn := line
			if i := strings.LastIndex(fn, "("); i > 0 {
				fn = fn[:i]
			}
			g.Frames = append(g.Frames, Frame{Func: fn})
		}
	}
	return gs
}

// mainModule is the module of the program's main package ("" if unknown).
var mainModule = sync.OnceValue(func() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.Main.Path
	}
	return ""
})

const gorunModule = "github.com/gorun/gorun"

// userFrame reports whether f is the user's code: package main, a test,
// or the main module when that is not gorun itself.
func userFrame(f Frame) bool {
	if strings.HasPrefix(f.Func, "main.") || strings.HasSuffix(f.File, "_test.go") {
		return true
	}
	m := mainModule()
	return m != "" && m != gorunModule && (strings.HasPrefix(f.Func, m+".") || strings.HasPrefix(f.Func, m+"/"))
}

// runsCollective reports whether g runs, or waits for, a collective call.
func runsCollective(g Goroutine) bool {
	for _, f := range g.Frames {
		if strings.HasPrefix(f.Func, gorunModule+"/collective.(*Comm).execute") ||
			strings.HasPrefix(f.Func, gorunModule+"/collective.(*Handle).Wait") {
			return true
		}
	}
	return false
}

// busy reports whether a goroutine in state s is doing something (on a CPU
// or in a system call) rather than waiting for other goroutines.
func busy(s string) bool {
	s, _, _ = strings.Cut(s, ",")
	return s == "running" || s == "runnable" || s == "syscall"
}

// relevantGoroutines picks the goroutines a diagnosis shows: with inCall,
// those that run or wait for a collective call first; then the user's
// goroutines outside collectives, busy ones and the main goroutine first.
func relevantGoroutines(all []Goroutine, inCall bool) []Goroutine {
	var coll, user []Goroutine
	for _, g := range all {
		switch {
		case runsCollective(g):
			g.Role = "collective"
			coll = append(coll, g)
		case slices.ContainsFunc(g.Frames, userFrame):
			g.Role = "user"
			user = append(user, g)
		}
	}
	slices.SortStableFunc(user, func(a, b Goroutine) int {
		if ba, bb := busy(a.State), busy(b.State); ba != bb {
			if ba {
				return -1
			}
			return 1
		}
		if (a.ID == 1) != (b.ID == 1) {
			if a.ID == 1 {
				return -1
			}
			return 1
		}
		return a.ID - b.ID
	})
	out := user
	if inCall {
		out = append(coll, user...)
	}
	if len(out) == 0 {
		// Nothing of the user's: show the main goroutine, wherever it is.
		for _, g := range all {
			if g.ID == 1 {
				g.Role = "user"
				out = append(out, g)
			}
		}
	}
	out = out[:min(len(out), maxStateGoroutines)]
	for i := range out {
		out[i].Frames = out[i].Frames[:min(len(out[i].Frames), maxStateFrames)]
	}
	return out
}

// runtimeFrame reports whether f is the Go runtime's own machinery (parking,
// scheduling), which says nothing about what the goroutine waits for.
func runtimeFrame(f Frame) bool {
	return strings.HasPrefix(f.Func, "runtime.") || strings.HasPrefix(f.Func, "internal/")
}

// Top describes the top of g's stack: its innermost frames up to the
// first one of the user's code, e.g. "syscall.read <- syscall.Read <-
// main.blockInSyscall at hangprog/main.go:61 (goroutine 1, syscall)".
func (g Goroutine) Top() string {
	fs := g.Frames
	first := slices.IndexFunc(fs, func(f Frame) bool { return !runtimeFrame(f) })
	if first < 0 {
		first = 0
	}
	last := slices.IndexFunc(fs, userFrame)
	if last < first {
		last = min(first+2, len(fs)-1)
	}
	if len(fs) == 0 {
		return fmt.Sprintf("(goroutine %d, %s, no frames)", g.ID, g.State)
	}
	var names []string
	for i := first; i <= last; i++ {
		if last-first > 4 && i > first+1 && i < last-1 {
			if i == first+2 {
				names = append(names, "…")
			}
			continue
		}
		names = append(names, fs[i].Func)
	}
	at := fs[last]
	return fmt.Sprintf("%s at %s:%d (goroutine %d, %s)", strings.Join(names, " <- "), shortFile(at.File), at.Line, g.ID, g.State)
}

// shortFile keeps the last directory and the file name.
func shortFile(p string) string {
	return filepath.Join(filepath.Base(filepath.Dir(p)), filepath.Base(p))
}

// diagnose finds the rank the stall is stuck on and says what it does. It
// follows, from the rank that asked, the peer each rank's oldest blocked
// transfer waits for, to the first rank that is not in the stalled call.
// It reports false if the rank that asked is no longer in that call (the
// stall ended, or the job is being stopped): nothing to tell a launcher.
func (r *HangReport) diagnose() bool {
	r.Culprit = -1
	byRank := map[int]*RankState{}
	for i := range r.Ranks {
		byRank[r.Ranks[i].Rank] = &r.Ranks[i]
	}
	asker := byRank[r.Requester]
	if asker == nil || asker.Current == nil || asker.Current.Seq != r.Seq {
		r.Diagnosis = fmt.Sprintf("rank %d is no longer in call #%d: the stall ended before the diagnosis", r.Requester, r.Seq)
		return false
	}
	call := asker.Current
	waiter, cur := -1, r.Requester
	seen := map[int]bool{}
	for !seen[cur] {
		seen[cur] = true
		s := byRank[cur]
		if s == nil || s.NoAnswer != "" || s.Current == nil || s.Current.Seq != r.Seq {
			r.Culprit = cur
			break
		}
		if len(s.Waits) == 0 {
			break
		}
		waiter, cur = cur, s.Waits[0].Peer
	}
	if r.Culprit < 0 {
		// No chain of waits leads out of the call: blame the first rank
		// that has not entered it, if any.
		for _, s := range r.Ranks {
			if s.NoAnswer != "" || s.Current == nil || s.Current.Seq != r.Seq {
				r.Culprit, waiter = s.Rank, -1
				break
			}
		}
	}
	if r.Culprit < 0 {
		var ws []string
		for _, s := range r.Ranks {
			if len(s.Waits) > 0 {
				w := s.Waits[0]
				ws = append(ws, fmt.Sprintf("rank %d waits to %s rank %d (for %v)", s.Rank, w.verb(), w.Peer, r.Time.Sub(w.Since).Round(time.Millisecond)))
			}
		}
		r.Diagnosis = fmt.Sprintf("every rank is in %s, so the ring is slow or a link is stuck", call)
		if len(ws) > 0 {
			r.Diagnosis += ": " + strings.Join(ws, ", ")
		}
		return true
	}
	var head string
	if waiter >= 0 {
		head = fmt.Sprintf("rank %d waits in %s for rank %d", waiter, byRank[waiter].Current, r.Culprit)
	} else {
		head = fmt.Sprintf("rank %d waits in %s, which rank %d has not entered", r.Requester, call, r.Culprit)
	}
	r.Diagnosis = head + "; " + describe(byRank[r.Culprit], r.Culprit, r.Time)
	return true
}

// describe says what rank (state s) does, for a diagnosis.
func describe(s *RankState, rank int, now time.Time) string {
	switch {
	case s == nil:
		return fmt.Sprintf("rank %d did not answer", rank)
	case s.NoAnswer != "":
		return fmt.Sprintf("rank %d did not answer: %s", rank, s.NoAnswer)
	case s.Current != nil:
		d := fmt.Sprintf("rank %d is in %s (for %v)", rank, s.Current, now.Sub(s.Current.Start).Round(time.Millisecond))
		if len(s.Waits) > 0 {
			d += fmt.Sprintf(", waiting to %s rank %d", s.Waits[0].verb(), s.Waits[0].Peer)
		}
		return d
	}
	d := fmt.Sprintf("rank %d has made no collective call yet and it is in user code", rank)
	if n := len(s.Recent); n > 0 {
		d = fmt.Sprintf("rank %d's last call was #%d and it is in user code", rank, s.Recent[n-1].Seq)
	} else if s.Progress > 0 {
		d = fmt.Sprintf("rank %d's last call was #%d and it is in user code", rank, s.Progress)
	}
	if len(s.Goroutines) > 0 {
		d += ": " + s.Goroutines[0].Top()
	}
	return d
}

// CulpritStack returns the named rank's most telling goroutine stack, one
// frame a line ("func at file:line"), at most max lines; nil if none.
func (r *HangReport) CulpritStack(max int) []string {
	for _, s := range r.Ranks {
		if s.Rank != r.Culprit || len(s.Goroutines) == 0 {
			continue
		}
		g := s.Goroutines[0]
		lines := []string{fmt.Sprintf("rank %d, goroutine %d [%s]:", s.Rank, g.ID, g.State)}
		for _, f := range g.Frames[:min(len(g.Frames), max)] {
			lines = append(lines, fmt.Sprintf("  %s at %s:%d", f.Func, f.File, f.Line))
		}
		return lines
	}
	return nil
}

// WriteHangReport writes rep as JSON to dir (""=$GORUN_HANG_DIR, or
// os.TempDir()) in a file named gorun-hang-<time><suffix>.json, readable
// by its owner only, and returns its absolute path.
func WriteHangReport(dir string, rep *HangReport, suffix string) (string, error) {
	if dir == "" {
		dir = os.Getenv(EnvHangDir)
	}
	if dir == "" {
		dir = os.TempDir()
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return "", err
	}
	base := "gorun-hang-" + rep.Time.UTC().Format("20060102T150405.000Z") + suffix
	for i := 1; ; i++ {
		name := base + ".json"
		if i > 1 {
			name = fmt.Sprintf("%s-%d.json", base, i)
		}
		path := filepath.Join(dir, name)
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600) // host names, PIDs, tensor names: the user's only
		if errors.Is(err, os.ErrExist) && i < 100 {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("writing the hang diagnosis (set %s to a writable directory): %w", EnvHangDir, err)
		}
		_, err = f.Write(append(b, '\n'))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return "", fmt.Errorf("writing the hang diagnosis to %s: %w", path, err)
		}
		if abs, err := filepath.Abs(path); err == nil {
			path = abs
		}
		return path, nil
	}
}

// hangKey names a call in a job: its epoch (0 unless elastic) and
// sequence number, which restarts at every epoch.
type hangKey struct {
	epoch int
	seq   uint64
}

// keptHang is the answer the rendezvous sent for a diagnosed call, kept
// for the ranks that ask about it later.
type keptHang struct {
	key  hangKey
	text string // the HangReport as sent, JSON
}

// hangGather is a diagnosis the rendezvous is gathering. Requests for the
// same call that come while it runs (every rank that waits in the stalled
// call asks at about the same time) get its report too.
type hangGather struct {
	id         uint64 // in stateq and the states, to match the answers
	key        hangKey
	requester  int
	askers     []*rzConn
	want       map[*rzConn]bool
	answers    map[*rzConn]*RankState
	allAnswers chan struct{} // closed when every rank answered
}

// hangKeyLocked names call seq of the current epoch. r.mu is held.
func (r *Rendezvous) hangKeyLocked(seq uint64) hangKey {
	if r.cfg.Elastic != nil {
		return hangKey{epoch: r.m.Epoch(), seq: seq}
	}
	return hangKey{seq: seq}
}

// staleHangAskLocked says whether a rank asked about a call of an epoch
// that has ended: its call fails with the epoch, and the ranks' states now
// describe another call with the same number.
func (r *Rendezvous) staleHangAskLocked(epoch int) bool {
	return r.cfg.Elastic != nil && epoch != r.m.Epoch()
}

// hangAsked handles c's request for a hang diagnosis of call seq: it joins
// the gathering for that call, is answered with its kept report, or
// starts a gathering.
func (r *Rendezvous) hangAsked(c *rzConn, seq uint64, epoch int) {
	r.mu.Lock()
	if r.closed || !r.m.Started() || r.staleHangAskLocked(epoch) {
		r.mu.Unlock()
		return
	}
	key := r.hangKeyLocked(seq)
	if g := r.hangs[key]; g != nil {
		g.askers = append(g.askers, c)
		r.mu.Unlock()
		return
	}
	for _, k := range r.hangKept {
		if k.key == key {
			r.wg.Add(1) // under mu and !closed: never races with Close's Wait
			r.mu.Unlock()
			go func() {
				defer r.wg.Done()
				r.sendHang(c, k.text)
			}()
			return
		}
	}
	r.hangIDs++
	g := &hangGather{id: r.hangIDs, key: key, requester: r.m.Rank(c.mid), askers: []*rzConn{c}, want: map[*rzConn]bool{},
		answers: map[*rzConn]*RankState{}, allAnswers: make(chan struct{})}
	var conns []*rzConn
	for _, o := range r.connsLocked() {
		if !r.m.InJob(o.mid) {
			continue
		}
		conns = append(conns, o)
		g.want[o] = true
	}
	if r.hangs == nil {
		r.hangs = map[hangKey]*hangGather{}
	}
	r.hangs[key] = g
	r.wg.Add(1) // under mu and !closed: never races with Close's Wait
	r.mu.Unlock()
	r.cfg.Logf("rendezvous: rank %d waits past the stall threshold in call #%d; asking every rank for its state", g.requester, seq)
	go r.gatherHang(g, conns)
}

// hangAnswered records c's state for the gathering it answers.
func (r *Rendezvous) hangAnswered(c *rzConn, text string) {
	var ans stateAnswer
	if err := json.Unmarshal([]byte(text), &ans); err != nil {
		r.cfg.Logf("rendezvous: rank %d sent a bad state for the hang diagnosis: %v", r.rankOf(c), err)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var g *hangGather
	for _, o := range r.hangs {
		if o.id == ans.Gathering {
			g = o
		}
	}
	if g == nil || !g.want[c] || g.answers[c] != nil {
		return // late: the diagnosis went out without it
	}
	st := ans.RankState
	st.Rank = r.m.Rank(c.mid) // the rank this stream registered as, whatever it says
	g.answers[c] = &st
	if len(g.answers) == len(g.want) {
		close(g.allAnswers)
	}
}

// gatherHang asks conns for their state, waits (bounded) for the answers,
// diagnoses, has the report printed and written (by OnHang, or here),
// keeps it for later asks and answers everyone who asked.
func (r *Rendezvous) gatherHang(g *hangGather, conns []*rzConn) {
	defer r.wg.Done()
	ask := &msg{T: tStateAsk, Seq: g.key.seq, Text: strconv.FormatUint(g.id, 10)}
	var sends sync.WaitGroup
	defer sends.Wait()
	for _, c := range conns {
		sends.Add(1)
		go func() { // concurrently: one frozen rank must not hold up the others
			defer sends.Done()
			if err := c.send(ask, r.cfg.Timeout); err != nil {
				r.cfg.Logf("rendezvous: asking rank %d for its state: %v", r.rankOf(c), err)
			}
		}()
	}
	// Below the heartbeat bound, so that a stopped rank is named as not
	// answering before the heartbeat aborts the job for it.
	bound := min(stateAnswerTimeout, r.hb/2)
	t := time.NewTimer(bound)
	select {
	case <-g.allAnswers:
	case <-t.C:
	case <-r.closeCh:
	}
	t.Stop()
	rep := &HangReport{Time: time.Now(), Requester: g.requester, Epoch: g.key.epoch, Seq: g.key.seq}
	r.mu.Lock()
	aborted := r.m.Aborted() || r.closed
	for _, c := range conns {
		if st := g.answers[c]; st != nil {
			rep.Ranks = append(rep.Ranks, *st)
		} else {
			rep.Ranks = append(rep.Ranks, RankState{Rank: r.m.Rank(c.mid),
				NoAnswer: fmt.Sprintf("no answer within %v (the process is stopped, or its control path is stuck)", bound)})
		}
	}
	r.mu.Unlock()
	slices.SortFunc(rep.Ranks, func(a, b RankState) int { return a.Rank - b.Rank })
	rep.Ended = !rep.diagnose()
	if aborted {
		// The abort's cause is the news; every rank has it.
		rep.Ended = true
		rep.Diagnosis = fmt.Sprintf("the job was aborted while the ranks' states were gathered (rank %d had waited in call #%d)", g.requester, g.key.seq)
	}
	r.cfg.Logf("rendezvous: hang diagnosis: %s", rep.Diagnosis)
	if !rep.Ended {
		r.dumpHang(rep)
	}
	b, err := json.Marshal(rep)
	if err == nil && len(b) > maxFrame/2 {
		// Too big for one control frame: the diagnosis without the states
		// (the dump, if any, has them).
		small := *rep
		small.Ranks, small.Stripped = nil, true
		b, err = json.Marshal(&small)
	}
	if err != nil {
		r.cfg.Logf("rendezvous: encoding the hang diagnosis: %v", err)
		b = nil
	}
	r.mu.Lock()
	delete(r.hangs, g.key)
	if b != nil && !rep.Ended {
		// Later asks for this call get this report: a stall that had ended
		// is not kept, the call may stall again.
		r.hangKept = append(r.hangKept, keptHang{key: g.key, text: string(b)})
		if len(r.hangKept) > keptHangReports {
			r.hangKept = slices.Delete(r.hangKept, 0, len(r.hangKept)-keptHangReports)
		}
	}
	askers := g.askers
	r.mu.Unlock()
	if b == nil {
		return
	}
	for _, c := range askers {
		r.sendHang(c, string(b))
	}
}

// hangDumpTimeout bounds how long the rendezvous waits for a hang report
// to be printed and written before it answers the ranks that asked: a
// dump directory on a stuck network file system must not keep them (or
// Close) waiting.
var hangDumpTimeout = 5 * time.Second

// dumpHang has rep printed and written (by OnHang, or WriteHangReport) on
// a goroutine of its own, waits for that at most hangDumpTimeout, and
// records the dump's path, or why there is none, in rep.
func (r *Rendezvous) dumpHang(rep *HangReport) {
	type written struct {
		path    string
		err     error
		printed bool
	}
	done := make(chan written, 1)
	view := *rep // the writer's own copy: rep is marshalled below while it may still run
	go func() {
		if r.cfg.OnHang != nil {
			done <- written{path: r.cfg.OnHang(&view), printed: true}
			return
		}
		path, err := WriteHangReport("", &view, "")
		done <- written{path: path, err: err}
	}()
	t := time.NewTimer(hangDumpTimeout)
	defer t.Stop()
	select {
	case w := <-done:
		rep.Dump, rep.Printed = w.path, w.printed
		if w.err != nil {
			// This process has every rank's state: the ranks that asked
			// may only get the diagnosis (Stripped in gatherHang).
			rep.DumpErr = w.err.Error()
		}
		if rep.Dump != "" {
			rep.DumpHost, _ = os.Hostname()
		}
	case <-t.C:
		rep.DumpPending = true
		rep.DumpErr = fmt.Sprintf("writing the hang report had not finished after %v (is $%s, or the temp directory, on a slow or stuck file system?); it may still appear there", hangDumpTimeout, EnvHangDir)
		r.cfg.Logf("rendezvous: %s", rep.DumpErr)
	}
}

// sendHang sends the report text to c, which asked for it.
func (r *Rendezvous) sendHang(c *rzConn, text string) {
	if err := c.send(&msg{T: tHang, Rank: max(r.rankOf(c), 0), Text: text}, r.cfg.Timeout); err != nil {
		r.cfg.Logf("rendezvous: sending the hang diagnosis to rank %d: %v", r.rankOf(c), err)
	}
}
