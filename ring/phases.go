package ring

import "time"

// Phase timing: what Config.Phase is told about a collective that ran on
// the pipelined engine (engine.go). The Mesh schedules (exchange.go and
// the files of each algorithm) report their own phases.

// startPhases begins phase timing for a call of steps steps.
func (r *Ring) startPhases(steps int) {
	if r.phase == nil {
		return
	}
	r.callStart, r.firstRecv = time.Now(), time.Time{}
	if cap(r.stepDone) < steps {
		r.stepDone = make([]time.Time, steps)
	}
	r.stepDone = r.stepDone[:steps]
	clear(r.stepDone)
}

// reportPhases tells Config.Phase how the call just run spent its time.
func (r *Ring) reportPhases() {
	if r.phase == nil {
		return
	}
	c, end := r.p.call, time.Now()
	start := r.callStart
	if !r.firstRecv.IsZero() {
		r.phase(c, "wait for peers", start, r.firstRecv)
		start = r.firstRecv
	}
	switch {
	case c.Kind == Allreduce && !r.p.gather && len(r.stepDone) == 2*(r.size-1) && !r.stepDone[r.size-2].IsZero():
		mid := r.stepDone[r.size-2]
		r.phase(c, "reduce-scatter", start, mid)
		r.phase(c, "allgather", mid, end)
	case c.Kind == Allreduce && r.p.gather:
		r.phase(c, "gather", start, end)
	default:
		r.phase(c, c.Kind.String(), start, end)
	}
}
