package p2p

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
//
// This file holds the report and its diagnosis; the stacks are parsed in
// diagnose_stacks.go, a rank's side is diagnose_rank.go and the
// rendezvous' diagnose_rendezvous.go.

import (
	"fmt"
	"strings"
	"time"
)

// EnvHangDir names the directory hang diagnoses are written to (by gorun;
// without it, by the process that hosts the rendezvous, rank 0's, or, if
// that fails, by the rank that asked first); unset:
// the system's temporary directory (os.TempDir), as PyTorch's NCCL flight
// recorder does: a job's working directory is often a shared file system
// that a dump per stall should not litter.
const EnvHangDir = "GORUN_HANG_DIR"

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
