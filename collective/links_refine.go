package collective

import (
	"cmp"
	"context"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gorun/gorun/ring"
)

// Refining the links' allreduce policy from the job's own calls, as
// Horovod's autotune does with its parameters.
//
// The policy from the links (links.go, ring.CrossHostPolicy) is a model's
// guess from a few probes at start: it knows neither what the cores'
// sharing costs each schedule at a given size nor how the links behave
// under the job's real traffic. So the first calls of every size class
// (the policy's grid: sizes in (n/2, n], n a power of two) also time the
// schedules the model ranks close to its choice:
//
//   - refineWarmCalls calls run the policy's choice untimed (the first
//     calls of a size fault in its buffers and start its goroutines);
//   - then refineSamples(n) calls of every candidate, interleaved (one of
//     each in turn, so that a change of the machine's load in between
//     touches all alike), each call timed on this rank;
//   - after the last one, the ranks agree on every candidate's time: the
//     slowest rank's median (an allreduce of the medians with Max, an
//     extra collective every rank runs after the same call: the calls of
//     a job, and their sizes, are the same on every rank);
//   - the fastest candidate takes the class if it beats the policy's
//     choice by the margin (refineMarginNum/Den); otherwise the choice
//     stays.
//
// Every rank decides from the same agreed numbers, so all pick alike
// whatever their own clocks said. Candidates are the schedules the model
// prices within refineSpread of its choice (at most refineMaxCandidates,
// its choice included): far slower ones are not worth a slow call, and a
// class whose choice has no close rival is not timed at all. A class is
// timed once in a ring's life; an elastic job's next membership epoch (a
// new ring, a new layout) times its classes again. A Comm whose policy
// was set (GORUN_ALLREDUCE_ALGORITHMS), or a job on one host (its defaults
// were timed on the machine already), refines nothing.
//
// It runs only with GORUN_AUTOTUNE=1, as Horovod's autotune runs only
// when asked: a choice made from timings may differ from one run to the
// next, and the timed calls themselves run other schedules than the
// policy's, so the float rounding of a job would change from run to run,
// and a job resumed from a checkpoint would not end bitwise where the
// uninterrupted one does. The model's choices depend on the links alone,
// which are stable from start to start.

const (
	refineWarmCalls     = 2
	refineSpread        = 2 // the model's time of a candidate ≤ refineSpread × its choice's
	refineMaxCandidates = 3
	// refineMarginNum/Den: a candidate takes a class only when its agreed
	// time × Num/Den is still below the policy's choice's: calls timed a
	// few times on shared cores differ by some per cent run to run.
	refineMarginNum, refineMarginDen = 11, 10
	// refineLargeBytes: from this size a call takes long enough that two
	// samples of each candidate make a stable minimum, and more would
	// cost the job seconds.
	refineLargeBytes = 16 << 20
	// refineSmallBytes: up to this size a call takes tens of µs, its
	// time varies most with the cores' other work, and more samples cost
	// the job next to nothing.
	refineSmallBytes = 64 << 10
	// refineMaxBytes: classes above it are not timed (a call of several
	// hundred MB over a slow link takes seconds).
	refineMaxBytes = 256 << 20
)

// refineSamples is the number of timed calls of each candidate of the
// class of n bytes.
func refineSamples(n int) int {
	switch {
	case n >= refineLargeBytes:
		return 2
	case n <= refineSmallBytes:
		return 16
	}
	return 4
}

// timedClass is the refinement's state for one class of sizes.
type timedClass struct {
	upper int              // the class is (upper/2, upper] bytes
	cands []ring.Algorithm // cands[0]: the policy's choice when the class was first called
	calls int              // calls of the class so far
	took  [][]time.Duration
	done  bool
}

// policyRefiner holds a ring's refinement: what every call of an
// uncompressed allreduce runs, and what the ranks decided. It does no I/O:
// the Comm runs the calls and the agreement (refinedAllreduce).
type policyRefiner struct {
	rules   []ring.AllreduceRule // the policy now: the links', with the decided classes
	model   func(a ring.Algorithm, bytes int64) (time.Duration, bool)
	runs    []ring.Algorithm // the schedules the ring runs (ring.ModelCandidates)
	classes map[int]*timedClass
	changed atomic.Int32 // classes whose choice the timings changed (read by AllreducePolicy)
	// measured is what a timed call took; time.Since but in tests.
	measured func(a ring.Algorithm, start time.Time) time.Duration
}

func newPolicyRefiner(rules []ring.AllreduceRule, runs []ring.Algorithm, model func(ring.Algorithm, int64) (time.Duration, bool)) *policyRefiner {
	return &policyRefiner{rules: slices.Clone(rules), runs: runs, model: model, classes: map[int]*timedClass{},
		measured: func(_ ring.Algorithm, start time.Time) time.Duration { return time.Since(start) }}
}

// classUpper is the upper bound of the size class of n bytes: the
// smallest power of two ≥ n, at least 4 (the policy grid's first size).
func classUpper(n int) int {
	if n <= 4 {
		return 4
	}
	return 1 << bits.Len(uint(n-1))
}

func (p *policyRefiner) choice(n int) ring.Algorithm {
	a, _ := ring.AllreducePolicy{Rules: p.rules}.Pick(n)
	return a
}

// next returns the schedule the call of n bytes runs, and its class when
// the call is timed (nil: it is not).
func (p *policyRefiner) next(n int) (ring.Algorithm, *timedClass, int) {
	up := classUpper(n)
	c := p.classes[up]
	if c == nil {
		c = p.newClass(up)
		p.classes[up] = c
	}
	i := c.calls - refineWarmCalls
	c.calls++
	if c.done || i < 0 {
		return p.choice(n), nil, 0
	}
	k := i % len(c.cands)
	return c.cands[k], c, k
}

// newClass picks the candidates of a class: the policy's choice at its
// upper bound, and the schedules the model prices within refineSpread of
// it, cheapest first.
func (p *policyRefiner) newClass(up int) *timedClass {
	c := &timedClass{upper: up}
	cur := p.choice(up)
	c.cands = []ring.Algorithm{cur}
	tc, ok := p.model(cur, int64(up))
	if up > refineMaxBytes || !ok {
		c.done = true
		return c
	}
	type priced struct {
		a ring.Algorithm
		t time.Duration
	}
	var rivals []priced
	for _, a := range p.runs {
		if t, ok := p.model(a, int64(up)); ok && a != cur && t <= refineSpread*tc {
			rivals = append(rivals, priced{a, t})
		}
	}
	slices.SortStableFunc(rivals, func(x, y priced) int { return cmp.Compare(x.t, y.t) })
	for _, r := range rivals[:min(len(rivals), refineMaxCandidates-1)] {
		c.cands = append(c.cands, r.a)
	}
	if len(c.cands) == 1 {
		c.done = true
		return c
	}
	c.took = make([][]time.Duration, len(c.cands))
	return c
}

// record adds a timed call of candidate k; it returns the class's medians
// once every candidate has its samples (nil before): the ranks then agree
// on them (decide).
func (c *timedClass) record(k int, d time.Duration) []int64 {
	c.took[k] = append(c.took[k], d)
	want := refineSamples(c.upper)
	for _, t := range c.took {
		if len(t) < want {
			return nil
		}
	}
	med := make([]int64, len(c.took))
	for i, t := range c.took {
		ns := make([]int64, len(t))
		for j, d := range t {
			ns[j] = d.Nanoseconds()
		}
		med[i] = median(ns)
	}
	return med
}

// decide takes the agreed times of c's candidates (the slowest rank's
// medians, in c.cands' order) and returns the class's schedule, and
// whether the policy changed. Every rank passing the same times decides
// alike.
func (p *policyRefiner) decide(c *timedClass, agreed []int64) (ring.Algorithm, bool) {
	c.done, c.took = true, nil
	best := 0
	for i, t := range agreed {
		if t < agreed[best] {
			best = i
		}
	}
	if best == 0 || agreed[best]*refineMarginNum/refineMarginDen >= agreed[0] {
		return c.cands[0], false
	}
	p.rules = setClass(p.rules, c.upper, c.cands[best])
	p.changed.Add(1)
	return c.cands[best], true
}

// setClass returns rules with the sizes (upper/2, upper] given to algo,
// neighbours of one algorithm merged into one rule.
func setClass(rules []ring.AllreduceRule, upper int, algo ring.Algorithm) []ring.AllreduceRule {
	lower := upper / 2
	if upper == 4 {
		lower = 0
	}
	var out []ring.AllreduceRule
	add := func(max int, a ring.Algorithm) {
		if k := len(out); k > 0 && out[k-1].Algo == a {
			out[k-1].MaxBytes = max
			return
		}
		out = append(out, ring.AllreduceRule{MaxBytes: max, Algo: a})
	}
	prev := 0 // sizes up to prev are placed
	for _, r := range rules {
		if r.MaxBytes <= prev {
			continue
		}
		if prev < lower {
			add(min(r.MaxBytes, lower), r.Algo)
			prev = min(r.MaxBytes, lower)
		}
		if prev < upper && r.MaxBytes > prev {
			add(upper, algo)
			prev = upper
		}
		if r.MaxBytes > prev {
			add(r.MaxBytes, r.Algo)
			prev = r.MaxBytes
		}
	}
	return out
}

// timingReport describes an agreed timing of a class for --verbose.
func timingReport(c *timedClass, agreed []int64, chose ring.Algorithm, changed bool) string {
	var parts []string
	for i, a := range c.cands {
		parts = append(parts, fmt.Sprintf("%s %v", a, time.Duration(agreed[i]).Round(time.Microsecond/10)))
	}
	verb := "keeps"
	if changed {
		verb = "now runs"
	}
	return fmt.Sprintf("allreduce of %s to %s timed (slowest rank's median of %d calls each): %s; %s %s",
		formatSize(c.upper/2+1), formatSize(c.upper), refineSamples(c.upper), strings.Join(parts, ", "), verb, chose)
}

func formatSize(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// refinerFor returns the refinement of rg's policy, or nil where there is
// none: GORUN_AUTOTUNE unset, a policy that was set, or defaults not from
// the links.
func (c *Comm) refinerFor(rg *ring.Ring, links AgreedLinks, size int, hosts []int) *policyRefiner {
	p, fromLinks := rg.DefaultAllreducePolicy()
	if !c.autotune || !fromLinks || !rg.AllreducePolicy().IsDefault() {
		return nil
	}
	chunk := c.chunkBytes
	return newPolicyRefiner(p.Rules, ring.ModelCandidates(size, hosts), func(a ring.Algorithm, n int64) (time.Duration, bool) {
		return ring.AllreduceCost(a, n, size, hosts, links.Links, chunk)
	})
}

// agreeAutotune checks that every rank of a job across hosts has the same
// GORUN_AUTOTUNE: ranks of which only some time their calls would run
// other schedules than the rest on those calls, and fail on the
// fingerprint check with a message about algorithms rather than about the
// variable.
func agreeAutotune(ctx context.Context, mesh ring.Mesh, rank, size int, on bool) error {
	mine := []byte{0}
	if on {
		mine[0] = 1
	}
	got, err := agreeOnRank0(ctx, mesh, rank, size, mine, 1, func(all [][]byte) []byte {
		for _, b := range all {
			if b[0] != all[0][0] {
				return []byte{2}
			}
		}
		return all[0]
	})
	if err != nil {
		return fmt.Errorf("agreeing on %s: %w", EnvAutotune, err)
	}
	if got[0] == 2 {
		state := "unset or 0"
		if on {
			state = "1"
		}
		return fmt.Errorf("%s differs between the ranks (%s on this one): give every rank the same value (gorun hands it to every rank from its own environment)", EnvAutotune, state)
	}
	return nil
}

// refineSeqBit marks the agreement's calls: they run between two of the
// Comm's numbered calls, under the number of the one before with this bit
// set, which no numbered call has.
const refineSeqBit = 1 << 63

// refinedAllreduce runs an uncompressed allreduce call on the view's ring
// with the refiner choosing its schedule, times it if it is a trial, and
// after a class's last trial agrees on its times with the other ranks and
// applies the decision to the ring. Calls run one at a time (execMu), so
// the refiner needs no lock.
func (c *Comm) refinedAllreduce(ctx context.Context, v *commView, call ring.Call, buf []byte) error {
	p := v.refine
	algo, class, k := p.next(len(buf))
	if class == nil {
		// Untimed: the ring's policy (which SetDefaultAllreduce keeps
		// equal to the refiner's rules) picks algo.
		return v.ring.Allreduce(ctx, call, buf)
	}
	start := time.Now()
	if err := v.ring.AllreduceWith(ctx, call, buf, algo); err != nil {
		return err
	}
	medians := class.record(k, p.measured(algo, start))
	if medians == nil {
		return nil
	}
	agreed := encodeInts(medians)
	ac := ring.Call{Kind: ring.Allreduce, Seq: call.Seq | refineSeqBit, Op: ring.Max, DType: ring.Int64, Count: len(medians)}
	if err := v.ring.Allreduce(ctx, ac, agreed); err != nil {
		return fmt.Errorf("agreeing on the timed allreduce schedules: %w", err)
	}
	times := decodeInts(agreed)
	chose, changed := p.decide(class, times)
	if changed && !v.ring.SetDefaultAllreduce(ring.AllreducePolicy{Rules: p.rules}) {
		return fmt.Errorf("refining the allreduce policy: the ring refused %v", ring.AllreducePolicy{Rules: p.rules})
	}
	if v.rank == 0 {
		c.logf("gorun: rank 0: %s", timingReport(class, times, chose, changed))
	}
	return nil
}

// AllreduceTuned reports whether allreduces of bytes bytes run the
// policy's settled choice: false while the calls of their size class are
// still timing the schedules against each other (GORUN_AUTOTUNE=1, see
// links_refine.go), true where nothing is timed (or no call of the size
// came yet). It is the same on every rank after the same calls, so a
// benchmark can warm up until it holds.
func (c *Comm) AllreduceTuned(bytes int) bool {
	c.execMu.Lock()
	defer c.execMu.Unlock()
	v := c.cur()
	if v.refine == nil {
		return true
	}
	// A class no uncompressed call reached is not being timed.
	cl := v.refine.classes[classUpper(bytes)]
	return cl == nil || cl.done
}
