package collective

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"gorgonia.org/tensor"

	"github.com/gorun/gorun/compress"
	"github.com/gorun/gorun/ring"
)

// The Reducer: gradient averaging for a training loop, as Horovod's
// DistributedOptimizer and PyTorch DDP's reducer do it. This file has its
// options, its registration and a step's flow: gradients handed over
// (GradReady, Backward) are copied or added into fusion buffers, whose
// allreduces start in bucket order (launch), and Step waits for them and
// scales the result back into the gradients. reducer_batch.go splits a
// step's samples into micro-batches, reducer_layout.go lays out the
// buckets and checks that every rank registered the same, and
// reducer_consistency.go keeps the replicas' parameters identical.

// DefaultFusionThreshold is the size of a fusion buffer unless
// ReducerOptions.FusionThreshold or GORUN_FUSION_THRESHOLD says otherwise.
const DefaultFusionThreshold = 64 << 20

// EnvFusionThreshold overrides the fusion buffer size in bytes.
const EnvFusionThreshold = "GORUN_FUSION_THRESHOLD"

// ReducerOptions configure NewReducer. Every rank must use the same values
// (the topology check compares them).
type ReducerOptions struct {
	// BackwardPassesPerStep (k) is the number of micro-batches whose
	// gradients are summed locally before one allreduce; 0 means 1, or the
	// value derived from GlobalBatch.
	BackwardPassesPerStep int
	// GlobalBatch, with LocalBatch, fixes the number of samples per
	// optimizer step across the whole job: k = GlobalBatch / (Size * LocalBatch).
	// A job restarted at another world size keeps its global batch; if it
	// cannot, NewReducer says why, unless UnevenSplit is set.
	GlobalBatch, LocalBatch int
	// UnevenSplit lets a global batch that Size·LocalBatch does not divide
	// be split unevenly, as the ElasticSampler does: rank r takes its
	// Share of the GlobalBatch samples, in ceil(share/LocalBatch)
	// micro-batches of LocalBatch samples (the last one possibly smaller;
	// MicroBatches lists them), and each micro-batch's gradient, the mean
	// over its samples, is weighted by its sample count, so Step leaves the
	// exact mean over the global batch. A rank whose share is empty (a
	// global batch smaller than Size, e.g. a short last batch) has one
	// micro-batch of 0 samples: it still hands its gradients over (the
	// allreduce needs every rank), and they count as zeros whatever they
	// hold, so a NaN from a mean over no samples does not reach the
	// result. It is always on for an elastic
	// Comm, whose size changes under the Reducer: after every membership
	// change the Reducer re-plans its micro-batches for the new rank and
	// size, and lays out and checks its buckets again, by itself, at its
	// first use. When the split is even nothing changes: the result is
	// bitwise that of the even path.
	UnevenSplit bool
	// FusionThreshold is the largest fusion buffer in bytes; small
	// gradients are packed together up to it and reduced with one
	// collective. 0 means GORUN_FUSION_THRESHOLD or 64 MiB; a negative
	// value turns fusion off (one collective per gradient).
	FusionThreshold int
	// Compression picks, per gradient, the codec of package compress its
	// allreduce uses ("fp16", "bf16", "int8"; "" or "none": uncompressed),
	// from the gradient's name and size in bytes; CompressLarge is the usual
	// choice. Gradients with different codecs never share a fusion buffer.
	// Only float32 gradients are compressed, and only in buffers of at least
	// the Comm's compression threshold (WithCompressionThreshold, 64 KiB by
	// default). nil leaves the Comm's default (WithCompression,
	// GORUN_COMPRESSION) to apply to the fusion buffers.
	//
	// Error feedback is kept per fusion buffer, under the buffer's name,
	// which lists its gradients: the layout is the same every step, so each
	// gradient's residuals survive from step to step (ResetResiduals
	// forgets them, e.g. after loading a checkpoint).
	Compression func(name string, bytes int) string
	// Balance sizes each rank's share of GlobalBatch by its measured
	// compute speed (see BalanceOptions); the zero value leaves the
	// shares even. It implies UnevenSplit.
	Balance BalanceOptions
}

// CompressLarge returns a ReducerOptions.Compression policy: codec for
// gradients of at least minBytes, none for the others.
func CompressLarge(codec string, minBytes int) func(name string, bytes int) string {
	return func(_ string, bytes int) string {
		if bytes >= minBytes {
			return codec
		}
		return "none"
	}
}

// Reducer averages a training loop's gradients across ranks and
// micro-batches. Register every parameter and its gradient once, in the same
// order on every rank; then, per micro-batch, compute the gradients into the
// registered gradient buffers (overwriting them) and hand each one over with
// GradReady as soon as it is final, or all at once with Backward. After k
// micro-batches, Step waits and leaves in every gradient buffer the average
// over all ranks and all k micro-batches.
//
// Gradients are packed into fusion buffers (buckets) in registration order;
// a bucket's allreduce starts in the background as soon as all its gradients
// of the k-th micro-batch are in and every earlier bucket has started, so
// register parameters in the order backward produces their gradients (last
// layer first) to overlap communication with the rest of backward.
//
// The fusion buffers also hold the local sum over micro-batches, so a
// gradient is copied (or added) once per micro-batch and copied back once per
// step. A gradient alone in its bucket, with k = 1, is reduced in place.
//
// A Reducer is used by one goroutine: it is not safe for concurrent use.
type Reducer struct {
	comm      *Comm
	k         int
	threshold int
	opts      ReducerOptions

	entries []*gradEntry
	byName  map[string]int
	buckets []*bucket
	sealed  bool
	sealErr error

	// GlobalBatch plans (planFor): this rank's micro-batch sizes, whether
	// they are weighted (an uneven split), and the epoch they are for.
	plan      []int
	weighted  bool
	planEpoch int
	bal       *balancer // nil: no load balancing

	micro  int    // micro-batches completed in this step
	handed int    // gradients handed over in the current micro-batch
	round  uint64 // counts micro-batches since creation, from 1
	next   int    // first bucket not yet started in this step
	steps  int
}

type gradEntry struct {
	name         string
	param, grad  any
	pv, gv       view
	codec        string // "" when ReducerOptions.Compression is nil
	shape        []int
	bucket, off  int // bucket index and byte offset of the gradient in it
	seen         uint64
	readyInFinal bool
}

type bucket struct {
	dtype   ring.DType
	codec   string
	name    string // call name: also the key of its error-feedback residuals
	entries []int
	bytes   int
	buf     []byte // fusion buffer (nil when direct)
	arg     any    // what is passed to Allreduce
	direct  bool   // one gradient, k = 1: reduce the gradient buffer in place
	ready   int
	h       *Handle
}

// NewReducer returns a Reducer for comm. It computes k from the options and
// fails if they are inconsistent.
func NewReducer(comm *Comm, o ReducerOptions) (*Reducer, error) {
	k := o.BackwardPassesPerStep
	if k < 0 {
		return nil, fmt.Errorf("gorun: Reducer: BackwardPassesPerStep %d is negative", k)
	}
	bal, err := newBalancer(o.Balance)
	if err != nil {
		return nil, err
	}
	switch {
	case bal != nil && (o.GlobalBatch <= 0 || o.LocalBatch <= 0):
		return nil, fmt.Errorf("gorun: Reducer: Balance needs GlobalBatch and LocalBatch: it splits the global batch")
	case bal != nil && k != 0:
		return nil, fmt.Errorf("gorun: Reducer: BackwardPassesPerStep %d can not be combined with Balance, which changes each rank's number of micro-batches: leave it 0", k)
	}
	r := &Reducer{comm: comm, opts: o, byName: map[string]int{}, bal: bal}
	uneven := r.unevenAllowed()
	if o.GlobalBatch > 0 || o.LocalBatch > 0 {
		kk, err := PassesPerStep(o.GlobalBatch, comm.Size(), o.LocalBatch)
		if err != nil && uneven && o.GlobalBatch > 0 && o.LocalBatch > 0 {
			if k != 0 {
				return nil, fmt.Errorf("gorun: Reducer: BackwardPassesPerStep %d can not be combined with an uneven split of global batch %d: leave it 0", k, o.GlobalBatch)
			}
			r.replan()
			kk, err = r.k, nil
		}
		if err != nil {
			return nil, fmt.Errorf("gorun: Reducer: %w", err)
		}
		if k != 0 && k != kk {
			return nil, fmt.Errorf("gorun: Reducer: BackwardPassesPerStep %d contradicts global batch %d = %d ranks × local batch %d × %d passes: set one of them",
				k, o.GlobalBatch, comm.Size(), o.LocalBatch, kk)
		}
		k = kk
	}
	if k == 0 {
		k = 1
	}
	th := o.FusionThreshold
	if th == 0 {
		th = DefaultFusionThreshold
		if s := os.Getenv(EnvFusionThreshold); s != "" {
			v, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil {
				return nil, fmt.Errorf("gorun: %s=%q is not a byte count", EnvFusionThreshold, s)
			}
			th = v
		}
	}
	r.k, r.threshold = k, th
	if o.GlobalBatch > 0 && !r.weighted {
		r.plan = slices.Repeat([]int{o.LocalBatch}, k)
	}
	r.planEpoch = comm.Epoch()
	return r, nil
}

// FusionThreshold is the fusion buffer size in bytes (negative: no fusion).
func (r *Reducer) FusionThreshold() int { return r.threshold }

// Buckets is the number of collectives per step (known after Seal).
func (r *Reducer) Buckets() int { return len(r.buckets) }

// Register adds a parameter and its gradient under a unique name. param may
// be nil (nothing to broadcast or check); otherwise it must have the same
// element count. Both are []float32, []float64 or a contiguous float32 or
// float64 *tensor.Dense, and must stay at the same memory while registered.
func (r *Reducer) Register(name string, param, grad any) error {
	if r.sealed {
		return fmt.Errorf("gorun: Reducer: Register(%q) after the first collective of the reducer: register everything first", name)
	}
	if _, dup := r.byName[name]; dup {
		return fmt.Errorf("gorun: Reducer: %q is registered twice", name)
	}
	gv, err := viewOf(grad)
	if err != nil {
		return fmt.Errorf("gorun: Reducer: gradient %q: %w", name, err)
	}
	if gv.dtype != ring.Float32 && gv.dtype != ring.Float64 {
		return fmt.Errorf("gorun: Reducer: gradient %q is %s: use float32 or float64", name, gv.dtype)
	}
	e := &gradEntry{name: name, param: param, grad: grad, gv: gv, shape: shapeOf(grad)}
	if r.opts.Compression != nil {
		e.codec = r.opts.Compression(name, len(gv.bytes))
		if e.codec == "" {
			e.codec = "none"
		}
		if _, err := compress.ByName(e.codec); err != nil {
			return fmt.Errorf("gorun: Reducer: gradient %q: %w", name, err)
		}
	}
	if param != nil {
		if e.pv, err = viewOf(param); err != nil {
			return fmt.Errorf("gorun: Reducer: parameter %q: %w", name, err)
		}
		if e.pv.count != gv.count {
			return fmt.Errorf("gorun: Reducer: parameter %q has %d elements but its gradient has %d", name, e.pv.count, gv.count)
		}
	}
	r.byName[name] = len(r.entries)
	r.entries = append(r.entries, e)
	return nil
}

func shapeOf(buf any) []int {
	if t, ok := buf.(*tensor.Dense); ok {
		return append([]int(nil), t.Shape()...)
	}
	v, _ := viewOf(buf)
	return []int{v.count}
}

// GradReady hands over the gradient registered as name for the current
// micro-batch: its buffer holds the final gradient of this micro-batch and
// the caller will not write it again until Step returns (k = 1) or until the
// next micro-batch (the value is copied). On the k-th micro-batch, every
// bucket whose gradients are all in starts its allreduce in the background.
func (r *Reducer) GradReady(ctx context.Context, name string) error {
	if err := r.Seal(ctx); err != nil {
		return err
	}
	i, ok := r.byName[name]
	if !ok {
		return fmt.Errorf("gorun: Reducer: GradReady(%q): no gradient of that name is registered", name)
	}
	return r.ready(ctx, i)
}

func (r *Reducer) ready(ctx context.Context, i int) error {
	if r.micro >= r.k {
		return fmt.Errorf("gorun: Reducer: gradient %q handed over after all %d micro-batches of the step: call Step first", r.entries[i].name, r.k)
	}
	if r.handed == 0 {
		r.round++
	}
	e := r.entries[i]
	if e.seen == r.round {
		return fmt.Errorf("gorun: Reducer: gradient %q handed over twice in micro-batch %d", e.name, r.micro+1)
	}
	e.seen = r.round
	b := r.buckets[e.bucket]
	if !b.direct {
		start := time.Now()
		dst := b.buf[e.off : e.off+len(e.gv.bytes)]
		switch {
		case r.weighted && r.plan[r.micro] == 0:
			// An empty share (a global batch smaller than Size): the
			// "mean over 0 samples" the caller computed may be NaN, and
			// NaN*0 is NaN, which the Sum would spread to every rank.
			// The rank contributes zeros; the caller's buffer is untouched.
			if r.micro == 0 {
				clear(dst)
			}
		case r.weighted:
			// An uneven split: the micro-batch's mean gradient counts as
			// many times as it has samples.
			axpyBytes(b.dtype, dst, e.gv.bytes, float64(r.plan[r.micro]), r.micro == 0)
		case r.micro == 0:
			copy(dst, e.gv.bytes)
		default:
			addBytes(b.dtype, dst, e.gv.bytes)
		}
		if tl := r.comm.trace(); tl != nil {
			tl.span(r.comm.Rank(), laneReducer, "fusion copy in", start, time.Now(), map[string]any{"tensor": e.name, "bytes": len(dst), "accumulate": r.micro > 0})
		}
	}
	r.handed++
	final := r.micro == r.k-1
	if final {
		b.ready++
	}
	if r.handed == len(r.entries) {
		r.handed = 0
		r.micro++
		if tl := r.comm.trace(); tl != nil {
			tl.instant(r.comm.Rank(), laneReducer, fmt.Sprintf("micro-batch %d/%d", r.micro, r.k), map[string]any{"step": r.steps + 1})
		}
	}
	if !final {
		return nil
	}
	if err := r.launch(ctx); err != nil {
		return err
	}
	if r.bal != nil && r.micro == r.k {
		samples := 0
		for _, n := range r.plan {
			samples += n
		}
		r.bal.handedOver(ctx, r.comm, samples)
	}
	return nil
}

// launch starts, in bucket order, every bucket whose gradients are all in.
// The order is the same on every rank, whatever order gradients arrive in.
func (r *Reducer) launch(ctx context.Context) error {
	for r.next < len(r.buckets) && r.buckets[r.next].ready == len(r.buckets[r.next].entries) {
		b := r.buckets[r.next]
		op := Sum
		if b.direct {
			op = Avg
		}
		opts := []CallOption{Name(b.name)}
		if b.codec != "" {
			opts = append(opts, Compression(b.codec))
		}
		b.h = r.comm.AllreduceAsync(ctx, b.arg, op, opts...)
		r.next++
		select {
		case <-b.h.Done():
			if b.h.err != nil {
				return b.h.err
			}
		default:
		}
	}
	return nil
}

// Backward hands over every gradient not yet handed over in the current
// micro-batch, ending it.
func (r *Reducer) Backward(ctx context.Context) error {
	if err := r.Seal(ctx); err != nil {
		return err
	}
	if len(r.entries) == 0 {
		return fmt.Errorf("gorun: Reducer: Backward with no gradient registered")
	}
	if r.micro >= r.k {
		return fmt.Errorf("gorun: Reducer: Backward after all %d micro-batches of the step: call Step first", r.k)
	}
	round := r.round
	if r.handed == 0 {
		round++
	}
	for i, e := range r.entries {
		if e.seen != round {
			if err := r.ready(ctx, i); err != nil {
				return err
			}
		}
	}
	return nil
}

// Step waits for the step's collectives and leaves in every registered
// gradient buffer its average over all ranks and all k micro-batches. It is
// an error to call it before all k micro-batches were handed over.
func (r *Reducer) Step(ctx context.Context) error {
	if err := r.Seal(ctx); err != nil {
		return err
	}
	if r.micro < r.k {
		var missing []string
		if r.handed > 0 {
			for _, e := range r.entries {
				if e.seen != r.round {
					missing = append(missing, strconv.Quote(e.name))
				}
			}
		}
		msg := fmt.Sprintf("gorun: Reducer: Step after %d of %d micro-batches", r.micro, r.k)
		if len(missing) > 0 {
			msg += fmt.Sprintf("; micro-batch %d still lacks %s", r.micro+1, strings.Join(missing, ", "))
		}
		return errors.New(msg)
	}
	start := time.Now()
	scale := 1 / float64(r.comm.Size()*r.k)
	if r.weighted {
		scale = 1 / float64(r.opts.GlobalBatch)
	}
	var errs []error
	for _, b := range r.buckets {
		if b.h == nil {
			errs = append(errs, fmt.Errorf("gorun: Reducer: internal error: a bucket was not started"))
			continue
		}
		if err := b.h.Wait(ctx); err != nil {
			errs = append(errs, err)
			continue
		}
		if b.direct {
			continue
		}
		t := time.Now()
		for _, i := range b.entries {
			e := r.entries[i]
			scaleInto(b.dtype, e.gv.bytes, b.buf[e.off:e.off+len(e.gv.bytes)], scale)
		}
		if tl := r.comm.trace(); tl != nil {
			tl.span(r.comm.Rank(), laneReducer, "fusion copy out", t, time.Now(), map[string]any{"tensors": len(b.entries), "bytes": b.bytes})
		}
	}
	for _, b := range r.buckets {
		b.ready, b.h = 0, nil
	}
	r.micro, r.next = 0, 0
	r.steps++
	if tl := r.comm.trace(); tl != nil {
		tl.span(r.comm.Rank(), laneReducer, fmt.Sprintf("step %d wait", r.steps), start, time.Now(), nil)
	}
	if len(errs) == 0 && r.bal != nil {
		return r.balanceStepDone(ctx)
	}
	return errors.Join(errs...)
}

// ResetResiduals forgets the compression error-feedback residuals of every
// gradient (e.g. after loading a checkpoint).
func (r *Reducer) ResetResiduals() {
	for _, b := range r.buckets {
		r.comm.ResetResiduals(b.name)
	}
}

// BucketNames are the names of the step's collectives, in order: a
// gradient's own name when it travels alone, else "bucket i (n tensors,
// first..last)". Compression statistics and residuals are kept under them.
func (r *Reducer) BucketNames() []string {
	names := make([]string, len(r.buckets))
	for i, b := range r.buckets {
		names[i] = b.name
	}
	return names
}
