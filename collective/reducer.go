package collective

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"gorgonia.org/tensor"

	"github.com/gorun/gorun/compress"
	"github.com/gorun/gorun/ring"
)

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
	uneven := o.UnevenSplit || comm.Elastic()
	r := &Reducer{comm: comm, opts: o, byName: map[string]int{}}
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

// replan computes this rank's micro-batches for the global batch at the
// Comm's current rank and size: its Share of GlobalBatch samples in
// micro-batches of at most LocalBatch (at least one, possibly empty).
func (r *Reducer) replan() {
	g, l := r.opts.GlobalBatch, r.opts.LocalBatch
	size := r.comm.Size()
	r.planEpoch = r.comm.Epoch()
	if g%(size*l) == 0 {
		r.k, r.weighted = g/(size*l), false
		r.plan = slices.Repeat([]int{l}, r.k)
		return
	}
	lo, hi := Share(g, r.comm.Rank(), size)
	n := hi - lo
	r.plan = r.plan[:0]
	for n > l {
		r.plan = append(r.plan, l)
		n -= l
	}
	r.plan = append(r.plan, n)
	r.k, r.weighted = len(r.plan), true
}

// follow re-plans the Reducer after a membership change of an elastic
// Comm: new micro-batches, a new bucket layout and a new topology check, by
// every rank of the new epoch at its first use of the Reducer (a joiner's
// is its first use too). A step under way is dropped: RunElastic runs it
// again.
func (r *Reducer) follow() {
	if !r.comm.Elastic() || r.planEpoch == r.comm.Epoch() {
		return
	}
	r.relayout()
}

// relayout re-plans the micro-batches and drops the bucket layout, which
// the next Seal makes and checks again on every rank.
func (r *Reducer) relayout() {
	if r.opts.GlobalBatch > 0 && r.opts.LocalBatch > 0 {
		r.replan()
	}
	r.planEpoch = r.comm.Epoch()
	r.sealed, r.sealErr, r.buckets = false, nil, nil
	r.micro, r.handed, r.next = 0, 0, 0
}

// SetGlobalBatch changes the number of samples of the following steps,
// e.g. for the shorter last batch of an epoch (ElasticSampler.BatchLen),
// and re-plans the micro-batches (MicroBatches) with the uneven split. It
// needs GlobalBatch and LocalBatch set and an uneven split allowed
// (UnevenSplit, or an elastic Comm) unless the new batch splits evenly.
// Every rank must call it between the same two steps: the next step lays
// out and checks the buckets again.
func (r *Reducer) SetGlobalBatch(n int) error {
	switch {
	case r.opts.GlobalBatch <= 0 || r.opts.LocalBatch <= 0:
		return fmt.Errorf("gorun: Reducer: SetGlobalBatch(%d) needs ReducerOptions.GlobalBatch and LocalBatch", n)
	case n <= 0:
		return fmt.Errorf("gorun: Reducer: SetGlobalBatch(%d): the batch must hold at least one sample", n)
	case r.micro > 0 || r.handed > 0:
		return fmt.Errorf("gorun: Reducer: SetGlobalBatch(%d) in the middle of a step (after %d micro-batches): call it between steps", n, r.micro)
	}
	if _, err := PassesPerStep(n, r.comm.Size(), r.opts.LocalBatch); err != nil && !r.opts.UnevenSplit && !r.comm.Elastic() {
		return fmt.Errorf("gorun: Reducer: SetGlobalBatch: %w (or set ReducerOptions.UnevenSplit)", err)
	}
	if n == r.opts.GlobalBatch {
		return nil
	}
	r.opts.GlobalBatch = n
	r.relayout()
	return nil
}

// MicroBatches lists this rank's micro-batch sizes for one step when
// GlobalBatch and LocalBatch are set: feed micro-batch j exactly that many
// samples (e.g. consecutive slices of the rank's Share of the step's global
// batch, as ElasticSampler.Next returns it). Empty without GlobalBatch. In
// an elastic job it changes with the membership; read it every step.
func (r *Reducer) MicroBatches() []int {
	r.follow()
	return slices.Clone(r.plan)
}

// PassesPerStep returns the number of micro-batches per optimizer step that
// keeps globalBatch samples per step with size ranks of localBatch samples
// each, or an error saying why no whole number does.
func PassesPerStep(globalBatch, size, localBatch int) (int, error) {
	switch {
	case globalBatch <= 0:
		return 0, fmt.Errorf("global batch %d must be positive when a local batch is set", globalBatch)
	case localBatch <= 0:
		return 0, fmt.Errorf("local batch %d must be positive when a global batch is set", localBatch)
	case globalBatch%(size*localBatch) != 0:
		return 0, fmt.Errorf("global batch %d is not divisible by %d ranks × local batch %d (= %d samples per micro-batch step); choose a local batch that divides %d/%d, or another number of ranks",
			globalBatch, size, localBatch, size*localBatch, globalBatch, size)
	}
	return globalBatch / (size * localBatch), nil
}

// BackwardPassesPerStep is k: the number of micro-batches per Step.
// With an uneven split it is this rank's number, which may differ by one
// between ranks.
func (r *Reducer) BackwardPassesPerStep() int {
	r.follow()
	return r.k
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

// describe is this rank's registration, one line per tensor, preceded by
// the options that decide the bucket layout.
func (r *Reducer) describe() []string {
	opts := fmt.Sprintf("options: k=%d fusion=%d", r.k, r.threshold)
	if r.weighted {
		// k differs between ranks; the split rule they share is what counts.
		opts = fmt.Sprintf("options: global=%d local=%d uneven fusion=%d", r.opts.GlobalBatch, r.opts.LocalBatch, r.threshold)
	}
	lines := []string{opts}
	for _, e := range r.entries {
		p := "-"
		if e.param != nil {
			p = e.pv.dtype.String()
		}
		line := fmt.Sprintf("%q grad %s%v param %s", e.name, e.gv.dtype, e.shape, p)
		if e.codec != "" {
			line += " codec " + e.codec
		}
		lines = append(lines, line)
	}
	return lines
}

// Seal ends registration: it lays out the fusion buffers and checks, with
// two small collectives, that every rank registered the same names, shapes
// and dtypes in the same order and uses the same options. Every rank must
// call it (GradReady, Backward, Step, BroadcastParameters and
// CheckConsistency call it the first time).
func (r *Reducer) Seal(ctx context.Context) error {
	r.follow()
	if r.sealed {
		return r.sealErr
	}
	r.sealed = true
	r.layout()
	r.sealErr = r.checkTopology(ctx)
	return r.sealErr
}

func (r *Reducer) layout() {
	var cur *bucket
	for i, e := range r.entries {
		n := len(e.gv.bytes)
		if cur == nil || cur.dtype != e.gv.dtype || cur.codec != e.codec || r.threshold < 0 || cur.bytes+n > r.threshold {
			cur = &bucket{dtype: e.gv.dtype, codec: e.codec}
			r.buckets = append(r.buckets, cur)
		}
		e.bucket, e.off = len(r.buckets)-1, cur.bytes
		cur.entries = append(cur.entries, i)
		cur.bytes += n
	}
	for i, b := range r.buckets {
		b.name = r.entries[b.entries[0]].name
		if len(b.entries) > 1 {
			b.name = fmt.Sprintf("bucket %d (%d tensors, %s..%s)", i, len(b.entries), b.name, r.entries[b.entries[len(b.entries)-1]].name)
		}
		if len(b.entries) == 1 && r.k == 1 && !r.weighted {
			b.direct = true
			b.arg = r.entries[b.entries[0]].grad
			continue
		}
		switch b.dtype {
		case ring.Float32:
			s := make([]float32, b.bytes/4)
			b.buf, b.arg = bytesOf(s), s
		case ring.Float64:
			s := make([]float64, b.bytes/8)
			b.buf, b.arg = bytesOf(s), s
		}
	}
}

func (r *Reducer) checkTopology(ctx context.Context) error {
	c := r.comm
	desc := r.describe()
	sum := sha256.Sum256([]byte(strings.Join(desc, "\n")))
	all := make([]byte, len(sum)*c.Size())
	if err := c.Allgather(ctx, sum[:], all, Name("reducer topology digest")); err != nil {
		return err
	}
	same := true
	for i := 1; i < c.Size(); i++ {
		if string(all[i*len(sum):(i+1)*len(sum)]) != string(all[:len(sum)]) {
			same = false
		}
	}
	if same {
		return nil
	}
	// Exchange the descriptions to say what differs.
	text := []byte(strings.Join(desc, "\n"))
	lens := make([]int64, c.Size())
	if err := c.Allgather(ctx, []int64{int64(len(text))}, lens, Name("reducer topology length")); err != nil {
		return err
	}
	m := int(slices.Max(lens))
	pad := make([]byte, m)
	copy(pad, text)
	texts := make([]byte, m*c.Size())
	if err := c.Allgather(ctx, pad, texts, Name("reducer topology")); err != nil {
		return err
	}
	descs := make([][]string, c.Size())
	for i := range descs {
		descs[i] = strings.Split(string(texts[i*m:i*m+int(lens[i])]), "\n")
	}
	return topologyError(descs)
}

// topologyError lists, for every rank whose registration differs from rank
// 0's, the first few differences.
func topologyError(descs [][]string) error {
	var b strings.Builder
	b.WriteString("gorun: Reducer: ranks registered different tensors (each line compares a rank with rank 0):")
	for r := 1; r < len(descs); r++ {
		a, o := descs[0], descs[r]
		if slices.Equal(a, o) {
			continue
		}
		shown := 0
		for i := 0; i < max(len(a), len(o)) && shown < 5; i++ {
			var x, y string
			if i < len(a) {
				x = a[i]
			}
			if i < len(o) {
				y = o[i]
			}
			if x == y {
				continue
			}
			shown++
			switch {
			case i == 0:
				fmt.Fprintf(&b, "\n  rank %d: %s, rank 0: %s", r, y, x)
			case y == "":
				fmt.Fprintf(&b, "\n  rank %d: has no tensor #%d; rank 0 registered %s", r, i-1, x)
			case x == "":
				fmt.Fprintf(&b, "\n  rank %d: tensor #%d is %s; rank 0 registered only %d", r, i-1, y, len(a)-1)
			default:
				fmt.Fprintf(&b, "\n  rank %d: tensor #%d is %s; rank 0 has %s", r, i-1, y, x)
			}
		}
		if len(a) != len(o) {
			fmt.Fprintf(&b, "\n  rank %d registered %d tensors, rank 0 registered %d", r, len(o)-1, len(a)-1)
		}
	}
	return errors.New(b.String())
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
	if final {
		return r.launch(ctx)
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

// BroadcastParameters copies every registered parameter from rank root to
// all ranks, so that every replica starts identical.
func (r *Reducer) BroadcastParameters(ctx context.Context, root int) error {
	if err := r.Seal(ctx); err != nil {
		return err
	}
	var hs []*Handle
	for _, e := range r.entries {
		if e.param != nil {
			hs = append(hs, r.comm.BroadcastAsync(ctx, e.param, root, Name(e.name)))
		}
	}
	var errs []error
	for _, h := range hs {
		errs = append(errs, h.Wait(ctx))
	}
	return errors.Join(errs...)
}

// CheckConsistency hashes every registered parameter and compares the
// hashes across ranks. If replicas have diverged it returns, on every rank,
// an error naming the first tensor that differs and the ranks that differ.
func (r *Reducer) CheckConsistency(ctx context.Context) error {
	if err := r.Seal(ctx); err != nil {
		return err
	}
	var idx []int
	for i, e := range r.entries {
		if e.param != nil {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return nil
	}
	mine := make([]int64, len(idx))
	for j, i := range idx {
		h := fnv.New64a()
		h.Write(r.entries[i].pv.bytes)
		mine[j] = int64(h.Sum64())
	}
	n := r.comm.Size()
	all := make([]int64, len(mine)*n)
	if err := r.comm.Allgather(ctx, mine, all, Name("parameter hashes")); err != nil {
		return err
	}
	p := len(idx)
	odd := map[int][]string{} // rank -> tensors where it is outside the majority
	first := ""
	for j, i := range idx {
		groups := map[int64][]int{}
		for rk := range n {
			h := all[rk*p+j]
			groups[h] = append(groups[h], rk)
		}
		if len(groups) == 1 {
			continue
		}
		var keys []int64
		for h := range groups {
			keys = append(keys, h)
		}
		// Majority first; ties go to the group holding the lowest rank.
		slices.SortFunc(keys, func(a, b int64) int {
			if d := len(groups[b]) - len(groups[a]); d != 0 {
				return d
			}
			return groups[a][0] - groups[b][0]
		})
		name := r.entries[i].name
		if first == "" {
			var parts []string
			for _, h := range keys {
				parts = append(parts, fmt.Sprintf("%s hash %016x", ranksString(groups[h]), uint64(h)))
			}
			first = fmt.Sprintf("first differing tensor %q (#%d): %s", name, i, strings.Join(parts, "; "))
		}
		for _, h := range keys[1:] {
			for _, rk := range groups[h] {
				odd[rk] = append(odd[rk], name)
			}
		}
	}
	if first == "" {
		return nil
	}
	var ranks []int
	for rk := range odd {
		ranks = append(ranks, rk)
	}
	slices.Sort(ranks)
	var parts []string
	for _, rk := range ranks {
		parts = append(parts, fmt.Sprintf("rank %d (%d tensors, first %q)", rk, len(odd[rk]), odd[rk][0]))
	}
	return fmt.Errorf("gorun: parameters have diverged across ranks: %s; ranks outside the majority: %s", first, strings.Join(parts, ", "))
}

func ranksString(rs []int) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = strconv.Itoa(r)
	}
	if len(rs) == 1 {
		return "rank " + s[0]
	}
	return "ranks " + strings.Join(s, ",")
}

func f32s(b []byte) []float32 {
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

func f64s(b []byte) []float64 {
	return unsafe.Slice((*float64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
}

// addBytes adds src into dst, elementwise.
func addBytes(dt ring.DType, dst, src []byte) {
	if len(dst) == 0 {
		return
	}
	if dt == ring.Float32 {
		d, s := f32s(dst), f32s(src)
		for i := range d {
			d[i] += s[i]
		}
		return
	}
	d, s := f64s(dst), f64s(src)
	for i := range d {
		d[i] += s[i]
	}
}

// axpyBytes computes dst = a*src (first) or dst += a*src.
func axpyBytes(dt ring.DType, dst, src []byte, a float64, first bool) {
	if len(dst) == 0 {
		return
	}
	if dt == ring.Float32 {
		d, s, f := f32s(dst), f32s(src), float32(a)
		for i := range d {
			if first {
				d[i] = s[i] * f
			} else {
				d[i] += s[i] * f
			}
		}
		return
	}
	d, s := f64s(dst), f64s(src)
	for i := range d {
		if first {
			d[i] = s[i] * a
		} else {
			d[i] += s[i] * a
		}
	}
}

// scaleInto writes src*scale into dst.
func scaleInto(dt ring.DType, dst, src []byte, scale float64) {
	if len(dst) == 0 {
		return
	}
	if dt == ring.Float32 {
		d, s, f := f32s(dst), f32s(src), float32(scale)
		for i := range d {
			d[i] = s[i] * f
		}
		return
	}
	d, s := f64s(dst), f64s(src)
	for i := range d {
		d[i] = s[i] * scale
	}
}
