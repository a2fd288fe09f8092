// Printing and saving the rendezvous' hang diagnoses.

package launcher

import (
	"sync"

	"github.com/gorun/gorun/p2p"
)

// hangLog prints the hang diagnoses of a job run by gorun (its rendezvous
// gathers them: p2p/diagnose.go) and writes each one's report, every rank's
// flight recorder and stack, to $GORUN_HANG_DIR or os.TempDir().
type hangLog struct {
	mu      sync.Mutex
	logf    func(format string, args ...any)
	printed map[hangCall]string // the calls diagnosed, and where each report went
}

// hangCall is a diagnosed call and the rank its diagnosis names.
type hangCall struct {
	epoch   int
	seq     uint64
	culprit int
}

// culpritFrames is how much of the named rank's stack gorun prints under
// the diagnosis (the dump has the rest).
const culpritFrames = 8

// report prints rep and writes it to a file; it returns the file's path.
// The rendezvous gathers one report per stalled call however many ranks
// ask; should it gather a call again (its kept reports are few), a
// diagnosis naming the same rank for the same call is not printed nor
// written twice. The text is no key: it holds durations, which differ.
func (h *hangLog) report(rep *p2p.HangReport) string {
	key := hangCall{rep.Epoch, rep.Seq, rep.Culprit}
	h.mu.Lock()
	if path, ok := h.printed[key]; ok {
		h.mu.Unlock()
		return path
	}
	if h.printed == nil {
		h.printed = map[hangCall]string{}
	}
	h.printed[key] = "" // printed; its dump is being written
	h.logf("hang diagnosis: %s", rep.Diagnosis)
	for _, l := range rep.CulpritStack(culpritFrames) {
		h.logf("  %s", l)
	}
	h.mu.Unlock()
	// Written without the lock: a dump directory on a stuck file system
	// must not hold up the diagnosis of another call.
	path, err := p2p.WriteHangReport("", rep, "")
	if err != nil {
		h.logf("%v", err)
	} else {
		h.logf("every rank's flight recorder (its current call, its last calls and its stack) is in %s", path)
	}
	h.mu.Lock()
	h.printed[key] = path
	h.mu.Unlock()
	return path
}
