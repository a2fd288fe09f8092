package collective

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// The local SGD tests' model: a float32 and a float64 parameter, and a
// local step that moves each member its own way (member: its identity,
// which stays when ranks are renumbered).
const lsDim32, lsDim64 = 5, 3

func lsInit() ([]float32, []float64) {
	p, q := make([]float32, lsDim32), make([]float64, lsDim64)
	for j := range p {
		p[j] = 0.5 + 0.1*float32(j)
	}
	for j := range q {
		q[j] = -1 + 0.25*float64(j)
	}
	return p, q
}

// lsGrad is member's gradient of element j at step s (from 1).
func lsGrad(member, s, j int) float64 {
	return 0.3*float64(member+1) - 0.02*float64(j*s) + 0.01*float64((member*7+s)%5)
}

func lsLocalStep(p []float32, q []float64, member, s int) {
	for j := range p {
		p[j] -= float32(0.05 * lsGrad(member, s, j))
	}
	for j := range q {
		q[j] -= 0.05 * lsGrad(member, s, j+lsDim32)
	}
}

// lsReference is the model, in float64, after steps steps of the members
// (by step, from 1: who took part), averaged every `every` steps as
// LocalSGD does with lr and mu: the anchor and every member's parameters.
type lsReference struct {
	anchor, mom []float64
	local       map[int][]float64
}

func newLSReference() *lsReference {
	p, q := lsInit()
	var a []float64
	for _, v := range p {
		a = append(a, float64(v))
	}
	a = append(a, q...)
	return &lsReference{anchor: a, mom: make([]float64, len(a)), local: map[int][]float64{}}
}

// step is a local step of each member, from its parameters (the anchor
// when it has none, as after an average).
func (r *lsReference) step(members []int, s int) {
	for _, m := range members {
		x, ok := r.local[m]
		if !ok {
			x = slices.Clone(r.anchor)
		}
		for j := range x {
			x[j] -= 0.05 * lsGrad(m, s, j)
		}
		r.local[m] = x
	}
}

// average is the outer step over the members that took part.
func (r *lsReference) average(lr, mu float64) {
	delta := make([]float64, len(r.anchor))
	for _, x := range r.local {
		for j := range delta {
			delta[j] += (r.anchor[j] - x[j]) / float64(len(r.local))
		}
	}
	for j := range r.anchor {
		if mu == 0 {
			r.anchor[j] -= lr * delta[j]
			continue
		}
		r.mom[j] = mu*r.mom[j] + delta[j]
		r.anchor[j] -= lr * (delta[j] + mu*r.mom[j])
	}
	r.local = map[int][]float64{}
}

func lsFlat(p []float32, q []float64) []float64 {
	var out []float64
	for _, v := range p {
		out = append(out, float64(v))
	}
	return append(out, q...)
}

// LocalSGD's averages, plain and with DiLoCo's outer Nesterov step, against
// the one-process reference: after every average each rank holds the
// reference's anchor, bit for bit the same on every rank, and between
// averages its own local parameters.
func TestLocalSGDAveragesParameters(t *testing.T) {
	const n, every, steps = 4, 3, 7
	for _, outer := range []struct{ lr, mu float64 }{{1, 0}, {0.7, 0.9}} {
		t.Run(fmt.Sprintf("lr=%g,momentum=%g", outer.lr, outer.mu), func(t *testing.T) {
			comms := memJob(t, n)
			got := make([][][]float64, n) // by rank, by step: the parameters after it
			errs := onEach(comms, func(c *Comm) error {
				ls, err := NewLocalSGD(c, LocalSGDOptions{Every: every, OuterLR: outer.lr, OuterMomentum: outer.mu})
				if err != nil {
					return err
				}
				p, q := lsInit()
				if err := ls.Register("p", p); err != nil {
					return err
				}
				if err := ls.Register("q", q); err != nil {
					return err
				}
				for s := 1; s <= steps; s++ {
					lsLocalStep(p, q, c.Rank(), s)
					averaged, err := ls.Step(context.Background())
					if err != nil {
						return err
					}
					if averaged != (s%every == 0) {
						return fmt.Errorf("step %d: averaged %v", s, averaged)
					}
					got[c.Rank()] = append(got[c.Rank()], lsFlat(p, q))
				}
				if ls.Averages() != steps/every {
					return fmt.Errorf("%d averages, want %d", ls.Averages(), steps/every)
				}
				return nil
			})
			mustAll(t, errs)
			ref := newLSReference()
			all := []int{0, 1, 2, 3}
			for s := 1; s <= steps; s++ {
				ref.step(all, s)
				if s%every == 0 {
					ref.average(outer.lr, outer.mu)
				}
				for r := range n {
					want := ref.anchor
					if s%every != 0 {
						want = ref.local[r]
					}
					if !closeTo(got[r][s-1], want, 1e-5) {
						t.Fatalf("step %d, rank %d: %v, want %v", s, r, got[r][s-1], want)
					}
					if s%every == 0 && !slices.Equal(got[r][s-1], got[0][s-1]) {
						t.Fatalf("step %d: rank %d holds %v after the average, rank 0 %v", s, r, got[r][s-1], got[0][s-1])
					}
				}
			}
		})
	}
}

// With int8 on the wire, the deltas of many averages lose almost nothing:
// error feedback carries each encoding's loss into the next average, so
// the model stays close to the uncompressed one, far closer than one
// encoding's error; the wire carries about a quarter of the bytes.
func TestLocalSGDInt8ErrorFeedback(t *testing.T) {
	const n, dim, averages = 4, 1 << 15, 40 // 128 KiB: above the compression threshold
	comms := memJob(t, n)
	final := make([][]float32, n)
	var stats CompressionStats
	errs := onEach(comms, func(c *Comm) error {
		ls, err := NewLocalSGD(c, LocalSGDOptions{Every: 1, Compression: "int8"})
		if err != nil {
			return err
		}
		p := make([]float32, dim)
		if err := ls.Register("p", p); err != nil {
			return err
		}
		for s := range averages {
			rng := rand.New(rand.NewPCG(uint64(c.Rank()), uint64(s)))
			for j := range p {
				p[j] -= float32(0.01 * rng.NormFloat64())
			}
			if _, err := ls.Step(context.Background()); err != nil {
				return err
			}
		}
		final[c.Rank()] = p
		if c.Rank() == 0 {
			_, per := c.CompressionStats()
			stats = per["local SGD deltas float32"]
		}
		return nil
	})
	mustAll(t, errs)
	// The exact model: the sum over the averages of the ranks' mean step.
	want := make([]float64, dim)
	var oneStep float64 // the size of one average's mean step, RMS
	for s := range averages {
		mean := make([]float64, dim)
		for r := range n {
			rng := rand.New(rand.NewPCG(uint64(r), uint64(s)))
			for j := range mean {
				mean[j] += float64(float32(0.01*rng.NormFloat64())) / n
			}
		}
		for j := range want {
			want[j] -= mean[j]
			if s == 0 {
				oneStep += mean[j] * mean[j] / dim
			}
		}
	}
	oneStep = math.Sqrt(oneStep)
	var errSq float64
	for j, v := range final[0] {
		errSq += (float64(v) - want[j]) * (float64(v) - want[j]) / dim
	}
	// One int8 encoding errs by about 0.7 % of what it encodes; without
	// feedback those errors would add up over the 40 averages.
	if e := math.Sqrt(errSq); e > 0.01*oneStep {
		t.Errorf("RMS error %.3g after %d averages, more than 1 %% of one average's step (%.3g)", e, averages, oneStep)
	}
	for r := range n {
		if !slices.Equal(final[r], final[0]) {
			t.Fatalf("rank %d's parameters differ from rank 0's", r)
		}
	}
	if stats.Calls != averages || stats.WireBytes*3 > stats.RawBytes {
		t.Errorf("compression stats %+v: want %d calls, under a third of the bytes", stats, averages)
	}
}

// In an elastic job, a member lost between two averages, with commits
// after every step: the survivors resume from the last commit every one of
// them holds, and whichever that is, they resume with the parameters of
// the last average on every rank (the local steps since are dropped), and
// their next average is that of the survivors alone, as the reference
// computes it.
func TestLocalSGDElasticLoss(t *testing.T) {
	const n, every, steps, lost, lostAt = 4, 4, 8, 3, 6
	tj := startToyJob(t, n, 1, 1, 1)
	type member struct {
		resumed    []float64 // the parameters when the loop ran again after the reset
		resumeStep int
		final      []float64
		steps      []int // the steps it ran, in order, re-runs included
		err        error
	}
	members := make([]*member, n)
	var wg sync.WaitGroup
	errCrashed := errors.New("crashed by the test")
	for i, c := range tj.j.Comms {
		m := &member{}
		members[i] = m
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.err = func() error {
				ls, err := NewLocalSGD(c, LocalSGDOptions{Every: every, OuterLR: 0.8, OuterMomentum: 0.5})
				if err != nil {
					return err
				}
				p, q := lsInit()
				step := 0 // steps done, committed with the model
				st := NewElasticState(c)
				if err := ls.Register("p", p); err != nil {
					return err
				}
				if err := ls.Register("q", q); err != nil {
					return err
				}
				if err := st.Register("p", p, "q", q, "step", &step); err != nil {
					return err
				}
				if err := ls.RegisterElastic(st); err != nil {
					return err
				}
				entered := false
				return RunElastic(tj.ctx, c, st, func(ctx context.Context) error {
					if entered && m.resumed == nil {
						m.resumed, m.resumeStep = lsFlat(p, q), step
					}
					entered = true
					for step < steps {
						lsLocalStep(p, q, i, step+1)
						m.steps = append(m.steps, step+1)
						if i == lost && step+1 == lostAt {
							tj.j.Crash(c)
							return errCrashed
						}
						if _, err := ls.Step(ctx); err != nil {
							return err
						}
						step++
						if err := st.Commit(ctx); err != nil {
							return err
						}
					}
					m.final = lsFlat(p, q)
					return nil
				})
			}()
		}()
	}
	wg.Wait()
	if !errors.Is(members[lost].err, errCrashed) {
		t.Fatalf("the lost member ended with %v", members[lost].err)
	}
	// The survivors' commit of step 6 fails: they resume from that of
	// step 5, or of step 4 when the crash cut another member's commit 5
	// short (its last message from member 3 never arrived).
	resume := members[0].resumeStep
	if resume != 4 && resume != 5 {
		t.Fatalf("the survivors resumed after step %d, want 4 or 5", resume)
	}
	// The reference: steps 1-4 by all four and their average, then steps
	// resume+1..8 by the three survivors from that average.
	ref := newLSReference()
	for s := 1; s <= every; s++ {
		ref.step([]int{0, 1, 2, 3}, s)
	}
	ref.average(0.8, 0.5)
	afterFirst := slices.Clone(ref.anchor)
	for s := resume + 1; s <= steps; s++ {
		ref.step([]int{0, 1, 2}, s)
	}
	ref.average(0.8, 0.5)
	// Each survivor ran steps 1 to k before the reset: 6, or 5 if the
	// crash found it still in commit 5; then resume+1 to 8.
	var after []int
	for s := resume + 1; s <= steps; s++ {
		after = append(after, s)
	}
	ranSteps := func(got []int) bool {
		for k := 5; k <= 6; k++ {
			want := make([]int, 0, k+len(after))
			for s := 1; s <= k; s++ {
				want = append(want, s)
			}
			if slices.Equal(got, append(want, after...)) {
				return true
			}
		}
		return false
	}
	for i, m := range members[:lost] {
		if m.err != nil {
			t.Fatalf("member %d: %v", i, m.err)
		}
		if m.resumeStep != resume {
			t.Errorf("member %d resumed after step %d, member 0 after %d", i, m.resumeStep, resume)
		}
		if !closeTo(m.resumed, afterFirst, 1e-6) || !slices.Equal(m.resumed, members[0].resumed) {
			t.Errorf("member %d resumed from %v, want the average of step 4, %v, on every member", i, m.resumed, afterFirst)
		}
		if !ranSteps(m.steps) {
			t.Errorf("member %d ran steps %v, want 1 to 5 or 6, then %v", i, m.steps, after)
		}
		if !closeTo(m.final, ref.anchor, 1e-5) || !slices.Equal(m.final, members[0].final) {
			t.Errorf("member %d ends with %v, want %v on every member", i, m.final, ref.anchor)
		}
	}
}
