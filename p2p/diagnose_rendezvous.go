package p2p

// The rendezvous' side of a hang diagnosis: gathering every rank's state
// for a stalled call (once per call, however many ranks ask), diagnosing,
// writing the report (WriteHangReport, unless the launcher's OnHang does)
// and answering the ranks that asked.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"
)

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
