package launcher

import (
	"sync"

	"github.com/gorun/gorun/p2p"
)

// hangLog prints the hang diagnoses of a job run by gorun (its rendezvous
// gathers them: p2p/diagnose.go) and writes each one's report, every rank's
// flight recorder and stack, to $GORUN_HANG_DIR or os.TempDir().
type hangLog struct {
	mu       sync.Mutex
	logf     func(format string, args ...any)
	last     string // the last diagnosis printed
	lastDump string // and where its report went
}

// culpritFrames is how much of the named rank's stack gorun prints under
// the diagnosis (the dump has the rest).
const culpritFrames = 8

// report prints rep and writes it to a file; it returns the file's path.
// Every rank that waits in the stalled call asks for a diagnosis: the same
// diagnosis again is not printed nor written twice.
func (h *hangLog) report(rep *p2p.HangReport) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if rep.Diagnosis == h.last {
		return h.lastDump
	}
	h.logf("hang diagnosis: %s", rep.Diagnosis)
	for _, l := range rep.CulpritStack(culpritFrames) {
		h.logf("  %s", l)
	}
	path, err := p2p.WriteHangReport("", rep, "")
	if err != nil {
		h.logf("%v", err)
	} else {
		h.logf("every rank's flight recorder (its current call, its last calls and its stack) is in %s", path)
	}
	h.last, h.lastDump = rep.Diagnosis, path
	return path
}
