package collective

import (
	"context"
	"errors"
	"fmt"

	"github.com/gorun/gorun/compress"
	"github.com/gorun/gorun/ring"
)

// Local SGD: ranks step on their own gradients and average their models
// every few steps, instead of averaging gradients every step (KungFu's
// synchronous model averaging; DiLoCo with an outer optimizer). Across a
// slow link, where every step's allreduce is bound by bandwidth, averaging
// every K steps cuts the traffic K-fold.
//
// Each rank keeps the anchor, the parameters of the last average, the
// same on every rank. An average allreduces the ranks' deltas, anchor −
// parameters (what each rank's local steps moved), and applies their mean
// to the anchor as an outer optimizer's gradient: with OuterLR 1 and no
// momentum that is the mean of the ranks' parameters; with momentum it is
// DiLoCo's outer Nesterov step. The deltas are small and alike in scale,
// which suits 8-bit compression better than the parameters themselves;
// the Comm's error feedback, kept under the average's call name, carries
// what one average's encoding lost into the next.

// LocalSGDOptions configure NewLocalSGD; every rank must use the same.
type LocalSGDOptions struct {
	// Every is the number of local steps between averages (Step counts
	// them); 1 averages after every step.
	Every int
	// OuterLR scales the mean delta applied to the anchor; 0 means 1,
	// plain model averaging.
	OuterLR float64
	// OuterMomentum, when above 0, makes the outer step Nesterov's, as
	// DiLoCo does: m ← μ·m + Δ, anchor ← anchor − lr·(Δ + μ·m).
	OuterMomentum float64
	// Compression is the codec of the deltas' allreduce ("none", "fp16",
	// "bf16", "int8"); "" leaves the Comm's default (WithCompression,
	// GORUN_COMPRESSION). Only float32 parameters are compressed, and only
	// when they are at least the Comm's compression threshold together.
	Compression string
}

// LocalSGD averages a model across ranks every Every local steps. Register
// the parameters (in the same order on every rank), then call Step after
// each local optimizer update. It is used by one goroutine.
//
// In an elastic job, RegisterElastic commits the anchor, the outer
// momentum and the step count with the job's state, and makes every reset
// re-sync the parameters from the last average: the local steps since are
// dropped. Commit right after the averages (when Step returns true) so
// that the samples of the dropped steps are handed out again.
type LocalSGD struct {
	comm  *Comm
	opts  LocalSGDOptions
	codec string

	f32    lsGroup[float32]
	f64    lsGroup[float64]
	names  map[string]bool
	sealed bool

	steps    int64 // Step calls since the start (replicated)
	averages int
}

// lsGroup is the registered parameters of one dtype, laid out end to end
// in the flat buffers: the anchor, the outer momentum, and the deltas that
// the average allreduces.
type lsGroup[T float32 | float64] struct {
	params              [][]T
	anchor, mom, deltas []T
}

// NewLocalSGD returns a LocalSGD on comm.
func NewLocalSGD(comm *Comm, o LocalSGDOptions) (*LocalSGD, error) {
	switch {
	case o.Every < 1:
		return nil, fmt.Errorf("gorun: LocalSGD: Every %d: average after at least one local step", o.Every)
	case o.OuterLR < 0:
		return nil, fmt.Errorf("gorun: LocalSGD: OuterLR %g is negative", o.OuterLR)
	case o.OuterMomentum < 0 || o.OuterMomentum >= 1:
		return nil, fmt.Errorf("gorun: LocalSGD: OuterMomentum %g is not in [0, 1)", o.OuterMomentum)
	}
	if o.OuterLR == 0 {
		o.OuterLR = 1
	}
	if o.Compression != "" {
		if _, err := compress.ByName(o.Compression); err != nil {
			return nil, fmt.Errorf("gorun: LocalSGD: %w", err)
		}
	}
	return &LocalSGD{comm: comm, opts: o, codec: o.Compression, names: map[string]bool{}}, nil
}

// Register adds a parameter: a []float32, []float64 or contiguous float32
// or float64 *tensor.Dense, which must stay at the same memory. Its
// current value is where the first interval starts from, the anchor, so
// register once the parameters hold their starting values on every rank
// (after a checkpoint's restore), or call BroadcastParameters after.
func (l *LocalSGD) Register(name string, param any) error {
	if l.sealed {
		return fmt.Errorf("gorun: LocalSGD: Register(%q) after the first average or RegisterElastic: register every parameter first", name)
	}
	if l.names[name] {
		return fmt.Errorf("gorun: LocalSGD: %q is registered twice", name)
	}
	v, err := viewOf(param)
	if err != nil {
		return fmt.Errorf("gorun: LocalSGD: parameter %q: %w", name, err)
	}
	switch v.dtype {
	case ring.Float32:
		l.f32.add(f32s(v.bytes))
	case ring.Float64:
		l.f64.add(f64s(v.bytes))
	default:
		return fmt.Errorf("gorun: LocalSGD: parameter %q is %s: use float32 or float64", name, v.dtype)
	}
	l.names[name] = true
	return nil
}

func (g *lsGroup[T]) add(p []T) {
	g.params = append(g.params, p)
	g.anchor = append(g.anchor, p...)
}

// seal ends registration: the momentum and delta buffers get their size.
func (l *LocalSGD) seal() {
	if l.sealed {
		return
	}
	l.sealed = true
	l.f32.seal()
	l.f64.seal()
}

func (g *lsGroup[T]) seal() {
	g.mom = make([]T, len(g.anchor))
	g.deltas = make([]T, len(g.anchor))
}

// Every is the number of local steps between averages.
func (l *LocalSGD) Every() int { return l.opts.Every }

// Averages is how many averages this LocalSGD has made.
func (l *LocalSGD) Averages() int { return l.averages }

// Step counts a local step and averages the model every Every steps (the
// Every-th, 2·Every-th, ... call since the start): it reports whether it
// did. Every rank must call it once per local step.
func (l *LocalSGD) Step(ctx context.Context) (averaged bool, err error) {
	l.steps++
	if l.steps%int64(l.opts.Every) != 0 {
		return false, nil
	}
	return true, l.Sync(ctx)
}

// Sync averages the model now, whatever the step count (e.g. at the end of
// an epoch, before an evaluation or a checkpoint); the next averages keep
// their schedule. Afterwards every rank holds the same parameters.
func (l *LocalSGD) Sync(ctx context.Context) error {
	l.seal()
	var hs []*Handle
	opts := func(dtype string) []CallOption {
		o := []CallOption{Name("local SGD deltas " + dtype)}
		if l.codec != "" {
			o = append(o, Compression(l.codec))
		}
		return o
	}
	if len(l.f32.anchor) > 0 {
		l.f32.computeDeltas()
		hs = append(hs, l.comm.AllreduceAsync(ctx, l.f32.deltas, Avg, opts("float32")...))
	}
	if len(l.f64.anchor) > 0 {
		l.f64.computeDeltas()
		hs = append(hs, l.comm.AllreduceAsync(ctx, l.f64.deltas, Avg, opts("float64")...))
	}
	var errs []error
	for _, h := range hs {
		if err := h.Wait(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	for _, err := range errs {
		if isMembershipChange(err) {
			return err // one membership change, reported once
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	l.f32.outerStep(float32(l.opts.OuterLR), float32(l.opts.OuterMomentum))
	l.f64.outerStep(l.opts.OuterLR, l.opts.OuterMomentum)
	l.averages++
	return nil
}

// computeDeltas writes anchor − parameters into deltas.
func (g *lsGroup[T]) computeDeltas() {
	off := 0
	for _, p := range g.params {
		a, d := g.anchor[off:off+len(p)], g.deltas[off:off+len(p)]
		for i := range p {
			d[i] = a[i] - p[i]
		}
		off += len(p)
	}
}

// outerStep applies the mean delta (in deltas) to the anchor and copies
// the new anchor into the parameters.
func (g *lsGroup[T]) outerStep(lr, mu T) {
	a, m, d := g.anchor, g.mom, g.deltas
	switch {
	case mu == 0 && lr == 1:
		for i := range a {
			a[i] -= d[i]
		}
	case mu == 0:
		for i := range a {
			a[i] -= lr * d[i]
		}
	default:
		for i := range a {
			m[i] = mu*m[i] + d[i]
			a[i] -= lr * (d[i] + mu*m[i])
		}
	}
	g.resync()
}

// resync copies the anchor into the parameters.
func (g *lsGroup[T]) resync() {
	off := 0
	for _, p := range g.params {
		copy(p, g.anchor[off:off+len(p)])
		off += len(p)
	}
}

// BroadcastParameters copies the registered parameters from rank root to
// every rank and starts the next interval from them (the anchor), so that
// every replica starts identical.
func (l *LocalSGD) BroadcastParameters(ctx context.Context, root int) error {
	l.seal()
	var hs []*Handle
	for _, p := range l.f32.params {
		hs = append(hs, l.comm.BroadcastAsync(ctx, p, root, Name("local SGD parameters")))
	}
	for _, p := range l.f64.params {
		hs = append(hs, l.comm.BroadcastAsync(ctx, p, root, Name("local SGD parameters")))
	}
	var errs []error
	for _, h := range hs {
		errs = append(errs, h.Wait(ctx))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	l.f32.reanchor()
	l.f64.reanchor()
	return nil
}

// reanchor makes the parameters the anchor.
func (g *lsGroup[T]) reanchor() {
	off := 0
	for _, p := range g.params {
		copy(g.anchor[off:off+len(p)], p)
		off += len(p)
	}
}

// RegisterElastic registers, in an elastic job's state, what the averages
// need to go on after a reset: the anchor and the outer momentum (the same
// on every rank) and the step count; and makes every reset re-sync the
// parameters from the anchor, the last average, on every rank (a joiner
// too), whatever commit the job resumes from. Register every parameter
// first, and the parameters themselves in st as well: the start of the
// job (RunElastic's first reset, which runs no OnReset) then gives every
// rank rank 0's parameters with its anchor.
func (l *LocalSGD) RegisterElastic(st *ElasticState) error {
	l.seal()
	var nv []any
	if len(l.f32.anchor) > 0 {
		nv = append(nv, "local SGD anchor float32", l.f32.anchor, "local SGD momentum float32", l.f32.mom)
	}
	if len(l.f64.anchor) > 0 {
		nv = append(nv, "local SGD anchor float64", l.f64.anchor, "local SGD momentum float64", l.f64.mom)
	}
	nv = append(nv, "local SGD steps", &l.steps)
	if err := st.Register(nv...); err != nil {
		return err
	}
	st.OnReset(func(context.Context, ElasticEvent) error {
		l.f32.resync()
		l.f64.resync()
		return nil
	})
	return nil
}
