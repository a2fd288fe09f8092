package collective

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gorun/gorun/p2p"
	"github.com/gorun/gorun/ring"
)

// Op is a reduction: Sum, Avg, Min, Max or Prod.
type Op = ring.Op

// The reductions. Avg divides the sum by Size() once, on the rank that owns
// each segment, so every rank gets bitwise-identical results (integer
// averages truncate).
const (
	Sum  = ring.Sum
	Avg  = ring.Avg
	Min  = ring.Min
	Max  = ring.Max
	Prod = ring.Prod
)

// checkOp refuses an op that is not one of the reductions, as a bad
// argument: before the call is numbered, so the other ranks never hear of
// it and the Comm stays usable.
func checkOp(what string, op Op) error {
	switch op {
	case Sum, Avg, Min, Max, Prod:
		return nil
	}
	return fmt.Errorf("gorun: %s: invalid op %v: use Sum, Avg, Min, Max or Prod", what, op)
}

// CallOption adjusts one collective call.
type CallOption func(*ring.Call)

// Name labels a call in errors, stall warnings and timelines, e.g. the name
// of the gradient it reduces.
func Name(name string) CallOption { return func(c *ring.Call) { c.Name = name } }

// callTimeoutKey carries a per-call bound in a context (WithCallTimeout).
type callTimeoutKey struct{}

// WithCallTimeout returns a context whose collective calls are bounded by d
// instead of the communicator's collective timeout (WithTimeout,
// GORUN_TIMEOUT). It is for calls that wait on other ranks' storage rather
// than on the network, such as the barrier after which a checkpoint is
// committed: a rank still writing a large shard to S3 is slow, not dead.
// A dead or frozen peer still ends such a call at once (broken links,
// heartbeats), and the caller's own deadline on ctx still applies. Every
// rank should use the same bound; d <= 0 leaves the collective timeout.
func WithCallTimeout(ctx context.Context, d time.Duration) context.Context {
	if d <= 0 {
		return ctx
	}
	return context.WithValue(ctx, callTimeoutKey{}, d)
}

// timeoutCause is the cause of a call's context when the collective
// timeout ends it. It is made for every call, so it is formatted only when
// read: fmt.Errorf per call cost a 4-byte allreduce half a microsecond.
type timeoutCause struct {
	bound time.Duration
	setBy string
}

func (e *timeoutCause) Error() string {
	return fmt.Sprintf("no progress within the %v collective timeout (set by %s)", e.bound, e.setBy)
}

// callTimeout is the bound of a call made with ctx.
func (c *Comm) callTimeout(ctx context.Context) (time.Duration, string) {
	if d, ok := ctx.Value(callTimeoutKey{}).(time.Duration); ok && d > 0 {
		return d, "the caller's WithCallTimeout"
	}
	return c.timeout, "WithTimeout or " + EnvTimeout
}

// Handle is a collective in flight. Wait for it before touching its buffers.
type Handle struct {
	call ring.Call
	ctx  context.Context
	run  runFunc
	done chan struct{} // nil for a call run inline (do): nobody waits on its Handle
	err  error

	comm   *Comm
	queued time.Time // when the call was numbered
	view   *commView // the membership epoch it was numbered in
}

// Done is closed when the collective has finished, successfully or not.
func (h *Handle) Done() <-chan struct{} { return h.done }

// Wait blocks until the collective finishes or ctx is done, and returns its
// error. If ctx ends first the collective itself goes on (its buffers are
// still in use); Wait again to collect it.
func (h *Handle) Wait(ctx context.Context) error {
	select {
	case <-h.done:
		return h.err
	default:
	}
	start := time.Now()
	if h.comm != nil {
		defer func() { h.comm.stats.waitNanos.Add(uint64(time.Since(start))) }()
	}
	select {
	case <-h.done:
		return h.err
	case <-ctx.Done():
		return fmt.Errorf("gorun: waiting for %s #%d: %w", h.call.Kind, h.call.Seq, context.Cause(ctx))
	}
}

// Seq is the collective's sequence number: the same call has the same number
// on every rank.
func (h *Handle) Seq() uint64 { return h.call.Seq }

func failed(err error) *Handle {
	h := &Handle{done: make(chan struct{}), err: err}
	close(h.done)
	return h
}

// submit gives the call its sequence number and queues it for the worker.
// The lock makes the sequence order and the queue order the same.
func (c *Comm) submit(ctx context.Context, call ring.Call, opts []CallOption, run runFunc) *Handle {
	h, inline := c.prepare(ctx, call, opts, run, false)
	if inline {
		panic("unreachable")
	}
	return h
}

// do runs a synchronous call. When nothing is queued ahead of it, it runs
// on the caller's goroutine: a tiny allreduce is bound by latency, and each
// hand-off to another goroutine can cost a wake-up of an idle CPU.
func (c *Comm) do(ctx context.Context, call ring.Call, opts []CallOption, run runFunc) error {
	h, inline := c.prepare(ctx, call, opts, run, true)
	if !inline {
		return h.Wait(ctx)
	}
	defer c.execMu.Unlock()
	start := time.Now()
	err := c.execute(h)
	c.stats.inlineNanos.Add(uint64(time.Since(start)))
	return err
}

// blockedTime is how long callers have spent blocked in collectives: in
// Handle.Wait, and running synchronous calls on their own goroutine. A
// load-balancing Reducer takes it out of a step's compute time.
func (c *Comm) blockedTime() time.Duration {
	return time.Duration(c.stats.waitNanos.Load() + c.stats.inlineNanos.Load())
}

// prepare validates the Comm's state and numbers the call. With mayInline
// and an idle worker it returns inline=true holding execMu, so no later call
// can run before this one; otherwise the call is queued.
func (c *Comm) prepare(ctx context.Context, call ring.Call, opts []CallOption, run runFunc, mayInline bool) (*Handle, bool) {
	for _, o := range opts {
		o(&call)
	}
	// What the options chose is checked before the call is numbered too: a
	// numbered call that fails on one rank fails the job.
	if call.Kind == ring.Allreduce && call.Codec != "" {
		if _, err := c.compression.codec(call.Codec); err != nil {
			return failed(fmt.Errorf("gorun: Allreduce: %w", err)), false
		}
	}
	h := &Handle{call: call, ctx: ctx, comm: c, queued: time.Now()}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return failed(ErrClosed), false
	}
	if c.life.Err() != nil {
		c.mu.Unlock()
		return failed(c.unusable(context.Cause(c.life))), false
	}
	defer c.mu.Unlock()
	v := c.cur()
	if err := v.endErr(); err != nil {
		// The membership changed: nothing can be numbered in this epoch
		// any more. RunElastic reconfigures on this error.
		return failed(fmt.Errorf("gorun: rank %d: %s: %w", v.rank, call.Kind.Name(), err)), false
	}
	h.view = v
	c.seq++
	h.call.Seq = c.seq
	h.run = run
	if mayInline && c.pending == 0 && !c.reconfiguring {
		// Nobody else waits for execMu holding mu (see Comm.mu), and only
		// a call already inline can hold it now: it needs no mu to end.
		c.execMu.Lock()
		return h, true
	}
	// A full queue means the caller issues async calls far faster than they
	// complete; blocking (under the lock, so the order holds) is the honest
	// back-pressure.
	h.done = make(chan struct{})
	select {
	case c.queue <- h:
		c.pending++
	case <-ctx.Done():
		err := fmt.Errorf("gorun: rank %d: %s #%d could not be queued: %w", v.rank, call.Kind, h.call.Seq, context.Cause(ctx))
		c.failCall(ctx, err)
		return failed(err), false
	}
	return h, false
}

// unusable is the error of a call made after the job failed. Like the call
// that failed, it waits (bounded) for the abort to reach the other ranks if
// this rank hosts the rendezvous: the program is about to exit on it.
// The caller must not hold c.mu.
func (c *Comm) unusable(cause error) error {
	if errors.Is(cause, ErrClosed) {
		return ErrClosed
	}
	c.awaitAbortRelay()
	return fmt.Errorf("gorun: rank %d: communicator unusable after an earlier failure: %w", c.Rank(), cause)
}

// fail aborts the job: this rank is no longer in step with the others, so
// every rank must learn of it now rather than at its own timeout.
func (c *Comm) fail(err error) {
	if c.node != nil {
		c.node.Abort(err)
	}
	c.cancel(err)
}

// failCall ends this rank's part after a call failed with err. In an
// elastic job a call whose caller's context ended is this rank leaving
// (the program stops, e.g. on a signal): the others go on without it from
// their last commit, never an abort of the job. Anything else aborts the
// job (fail).
func (c *Comm) failCall(ctx context.Context, err error) {
	if c.elastic && c.node != nil && ctx.Err() != nil {
		c.node.Quit(fmt.Sprintf("its context ended: %v", context.Cause(ctx)))
		c.cancel(err)
		return
	}
	c.fail(err)
}

// worker runs the queued collectives one by one, in sequence order.
func (c *Comm) worker() {
	defer close(c.stopped)
	for h := range c.queue {
		c.execMu.Lock()
		h.err = c.execute(h)
		c.execMu.Unlock()
		close(h.done)
		c.mu.Lock()
		c.pending--
		if c.pending == 0 {
			select { // for quiesce
			case c.drained <- struct{}{}:
			default:
			}
		}
		c.mu.Unlock()
	}
}

func (c *Comm) execute(h *Handle) error {
	if c.life.Err() != nil {
		return c.unusable(context.Cause(c.life))
	}
	v := h.view
	if err := c.staleErr(h); err != nil {
		return err
	}
	if err := context.Cause(h.ctx); err != nil {
		err = fmt.Errorf("gorun: rank %d: %s #%d cancelled by the caller before it ran: %w", v.rank, h.call.Kind, h.call.Seq, err)
		c.failCall(h.ctx, err)
		return err
	}
	// The op's context ends on the first of: the caller's context, the
	// collective timeout, an abort of the job, or (elastic) the end of the
	// call's membership epoch.
	bound, setBy := c.callTimeout(h.ctx)
	ctx, cancel := context.WithTimeoutCause(h.ctx, bound, &timeoutCause{bound, setBy})
	defer cancel()
	c.setCallCancel(cancel)
	defer c.setCallCancel(nil)
	if c.life.Err() != nil {
		cancel() // life ended before setCallCancel: cancelCall found none
	}
	if v.end != nil {
		stopEpoch := context.AfterFunc(v.ctx, func() { cancel() })
		defer stopEpoch()
	}

	start := time.Now()
	queued := start.Sub(h.queued)
	c.stats.queueNanos.Add(uint64(queued))
	if c.node != nil {
		c.node.SetProgress(h.call.Seq)
	}
	c.watchStall(h, start)
	err := h.run(ctx, h.call)
	c.unwatchStall()
	end := time.Now()
	c.traceCall(h, start, end, err)
	c.observeCall(h, ctx, end.Sub(start), err)
	if err == nil {
		c.stats.collectives.Add(1)
		c.stats.nanos.Add(uint64(end.Sub(start)))
		return nil
	}
	if c.elastic && h.ctx.Err() == nil && c.life.Err() == nil {
		if nerr := c.newcomerMismatch(v, err); nerr != nil {
			return nerr
		}
		if mc := c.membershipCause(v, err); mc != nil {
			return fmt.Errorf("gorun: rank %d: %s #%d: %w", v.rank, h.call.Kind, h.call.Seq, mc)
		}
	}
	if c.life.Err() == nil && c.node != nil && c.node.Err() != nil && !isMembershipChange(c.node.Err()) {
		// The node failed (an abort, a lost peer, a rank that left) and the
		// call broke on it before c.life heard: the node's cause is the one.
		c.cancel(c.node.Err())
	}
	if c.life.Err() != nil {
		// Another rank aborted first: its cause is the one worth reading.
		c.awaitAbortRelay()
		return fmt.Errorf("gorun: rank %d: %w", v.rank, context.Cause(c.life))
	}
	if ctx.Err() != nil && !errors.Is(err, context.Cause(ctx)) {
		err = fmt.Errorf("%w (%v)", err, context.Cause(ctx))
	}
	if h.call.Name != "" {
		err = fmt.Errorf("%q: %w", h.call.Name, err)
	}
	// The ring's errors already say which collective and which peer; the
	// abort sent to the other ranks carries them as they are.
	c.failCall(h.ctx, err)
	c.awaitAbortRelay()
	return fmt.Errorf("gorun: rank %d: %w", v.rank, err)
}

// setCallCancel records the cancel func of the collective running now (nil:
// none). Collectives run one at a time (execMu).
func (c *Comm) setCallCancel(f context.CancelFunc) {
	c.callMu.Lock()
	c.callCancel = f
	c.callMu.Unlock()
}

// cancelCall ends the running collective's context; it runs once life
// ends (an abort, Close).
func (c *Comm) cancelCall() {
	c.callMu.Lock()
	f := c.callCancel
	c.callMu.Unlock()
	if f != nil {
		f()
	}
}

// awaitAbortRelay holds the error of a rank that hosts the rendezvous until
// the abort has reached the other ranks (bounded): programs exit on errors,
// and the rendezvous dies with them.
func (c *Comm) awaitAbortRelay() {
	if c.rdv == nil {
		return
	}
	var left *p2p.PeerLeftError
	if errors.As(context.Cause(c.life), &left) {
		return // nothing is relayed: every rank was told of the departure already
	}
	t := time.NewTimer(2 * time.Second)
	defer t.Stop()
	select {
	case <-c.rdv.AbortDelivered():
	case <-t.C:
	}
}

// runFunc runs one numbered call on the ring.
type runFunc func(ctx context.Context, call ring.Call) error

// start and finish a call, synchronously or not, once its arguments have
// been checked; a bad argument fails before the call is numbered, so it
// changes nothing.
func (c *Comm) async(ctx context.Context, call ring.Call, run runFunc, err error, opts []CallOption) *Handle {
	if err != nil {
		return failed(err)
	}
	return c.submit(ctx, call, opts, run)
}

func (c *Comm) sync(ctx context.Context, call ring.Call, run runFunc, err error, opts []CallOption) error {
	if err != nil {
		return err
	}
	return c.do(ctx, call, opts, run)
}

// Allreduce reduces buf across all ranks with op, in place: afterwards every
// rank holds the same result, bit for bit. buf is a []float32, []float64,
// []int32, []int64 or a contiguous *tensor.Dense of those dtypes.
func (c *Comm) Allreduce(ctx context.Context, buf any, op Op, opts ...CallOption) error {
	call, run, err := c.allreduce(buf, op)
	return c.sync(ctx, call, run, err, opts)
}

// AllreduceAsync starts an Allreduce and returns at once. buf must not be
// touched until the handle is done.
func (c *Comm) AllreduceAsync(ctx context.Context, buf any, op Op, opts ...CallOption) *Handle {
	call, run, err := c.allreduce(buf, op)
	return c.async(ctx, call, run, err, opts)
}

func (c *Comm) allreduce(buf any, op Op) (ring.Call, runFunc, error) {
	v, err := viewOf(buf)
	if err != nil {
		return ring.Call{}, nil, fmt.Errorf("gorun: Allreduce: %w", err)
	}
	if v.dtype == ring.Uint8 {
		return ring.Call{}, nil, fmt.Errorf("gorun: Allreduce: []byte cannot be reduced: use a numeric slice")
	}
	if err := checkOp("Allreduce", op); err != nil {
		return ring.Call{}, nil, err
	}
	call := ring.Call{Kind: ring.Allreduce, Op: op, DType: v.dtype, Count: v.count, Codec: c.compression.defaultName()}
	return call, func(ctx context.Context, call ring.Call) error {
		c.stats.bytes.Add(uint64(len(v.bytes)))
		if call = c.compression.gate(call); call.Codec != "" {
			return c.allreduceCompressed(ctx, call, v)
		}
		cv := c.cur()
		if cv.refine != nil {
			return c.refinedAllreduce(ctx, cv, call, v.bytes)
		}
		return cv.ring.Allreduce(ctx, call, v.bytes)
	}, nil
}

// Broadcast copies buf from rank root to every other rank, in place.
func (c *Comm) Broadcast(ctx context.Context, buf any, root int, opts ...CallOption) error {
	call, run, err := c.broadcast(buf, root)
	return c.sync(ctx, call, run, err, opts)
}

// BroadcastAsync starts a Broadcast and returns at once.
func (c *Comm) BroadcastAsync(ctx context.Context, buf any, root int, opts ...CallOption) *Handle {
	call, run, err := c.broadcast(buf, root)
	return c.async(ctx, call, run, err, opts)
}

func (c *Comm) broadcast(buf any, root int) (ring.Call, runFunc, error) {
	v, err := viewOf(buf)
	if err != nil {
		return ring.Call{}, nil, fmt.Errorf("gorun: Broadcast: %w", err)
	}
	if size := c.Size(); root < 0 || root >= size {
		return ring.Call{}, nil, fmt.Errorf("gorun: Broadcast: root %d is not a rank of this job (size %d)", root, size)
	}
	call := ring.Call{Kind: ring.Broadcast, DType: v.dtype, Count: v.count, Root: root}
	return call, func(ctx context.Context, call ring.Call) error {
		c.stats.bytes.Add(uint64(len(v.bytes)))
		return c.cur().ring.Broadcast(ctx, call, v.bytes)
	}, nil
}

// Allgather concatenates every rank's in, in rank order, into out on every
// rank. len(out) must be Size()*len(in), with the same element type.
func (c *Comm) Allgather(ctx context.Context, in, out any, opts ...CallOption) error {
	call, run, err := c.allgather(in, out)
	return c.sync(ctx, call, run, err, opts)
}

// AllgatherAsync starts an Allgather and returns at once.
func (c *Comm) AllgatherAsync(ctx context.Context, in, out any, opts ...CallOption) *Handle {
	call, run, err := c.allgather(in, out)
	return c.async(ctx, call, run, err, opts)
}

func (c *Comm) allgather(in, out any) (ring.Call, runFunc, error) {
	vi, vo, err := c.pair(in, out, "Allgather", "out", "in")
	if err != nil {
		return ring.Call{}, nil, err
	}
	call := ring.Call{Kind: ring.Allgather, DType: vi.dtype, Count: vi.count}
	return call, func(ctx context.Context, call ring.Call) error {
		c.stats.bytes.Add(uint64(len(vo.bytes)))
		return c.cur().ring.Allgather(ctx, call, vi.bytes, vo.bytes)
	}, nil
}

// ReduceScatter reduces in across ranks with op and leaves block Rank() of
// the result in out. len(in) must be Size()*len(out).
func (c *Comm) ReduceScatter(ctx context.Context, in, out any, op Op, opts ...CallOption) error {
	call, run, err := c.reduceScatter(in, out, op)
	return c.sync(ctx, call, run, err, opts)
}

// ReduceScatterAsync starts a ReduceScatter and returns at once.
func (c *Comm) ReduceScatterAsync(ctx context.Context, in, out any, op Op, opts ...CallOption) *Handle {
	call, run, err := c.reduceScatter(in, out, op)
	return c.async(ctx, call, run, err, opts)
}

func (c *Comm) reduceScatter(in, out any, op Op) (ring.Call, runFunc, error) {
	vo, vi, err := c.pair(out, in, "ReduceScatter", "in", "out")
	if err != nil {
		return ring.Call{}, nil, err
	}
	if vi.dtype == ring.Uint8 {
		return ring.Call{}, nil, fmt.Errorf("gorun: ReduceScatter: []byte cannot be reduced: use a numeric slice")
	}
	if err := checkOp("ReduceScatter", op); err != nil {
		return ring.Call{}, nil, err
	}
	call := ring.Call{Kind: ring.ReduceScatter, Op: op, DType: vi.dtype, Count: vi.count}
	return call, func(ctx context.Context, call ring.Call) error {
		c.stats.bytes.Add(uint64(len(vi.bytes)))
		return c.cur().ring.ReduceScatter(ctx, call, vi.bytes, vo.bytes)
	}, nil
}

// pair checks that big holds Size() times as many elements as small, of the
// same dtype.
func (c *Comm) pair(small, big any, what, bigName, smallName string) (view, view, error) {
	vs, err := viewOf(small)
	if err != nil {
		return view{}, view{}, fmt.Errorf("gorun: %s: %s: %w", what, smallName, err)
	}
	vb, err := viewOf(big)
	if err != nil {
		return view{}, view{}, fmt.Errorf("gorun: %s: %s: %w", what, bigName, err)
	}
	if vs.dtype != vb.dtype {
		return view{}, view{}, fmt.Errorf("gorun: %s: %s is %s but %s is %s: use one dtype", what, smallName, vs, bigName, vb)
	}
	if size := c.Size(); vb.count != vs.count*size {
		return view{}, view{}, fmt.Errorf("gorun: %s: %s has %d elements, want Size()*len(%s) = %d*%d = %d",
			what, bigName, vb.count, smallName, size, vs.count, vs.count*size)
	}
	return vs, vb, nil
}

// Barrier returns once every rank has called it.
func (c *Comm) Barrier(ctx context.Context, opts ...CallOption) error {
	call, run := c.barrier()
	return c.sync(ctx, call, run, nil, opts)
}

// BarrierAsync starts a Barrier and returns at once.
func (c *Comm) BarrierAsync(ctx context.Context, opts ...CallOption) *Handle {
	call, run := c.barrier()
	return c.async(ctx, call, run, nil, opts)
}

func (c *Comm) barrier() (ring.Call, runFunc) {
	return ring.Call{Kind: ring.Barrier, DType: ring.Int32}, func(ctx context.Context, call ring.Call) error {
		return c.cur().ring.Barrier(ctx, call)
	}
}

// Stats are this rank's cumulative counters.
type Stats struct {
	Collectives uint64        // collectives completed
	Bytes       uint64        // bytes of user buffers passed to collectives
	CommTime    time.Duration // time spent inside collectives
	QueueTime   time.Duration // time calls spent queued behind earlier calls
	WaitTime    time.Duration // time callers spent blocked in Handle.Wait (and sync calls behind a queue)
	Stalls      uint64        // stall warnings logged
	ring.Stats                // bytes and messages this rank put on the wire
}

// Stats returns this rank's counters so far. In an elastic job they count
// over every membership epoch: the wire counters of the rings of earlier
// epochs are kept when the ring is rebuilt.
func (c *Comm) Stats() Stats {
	v := c.cur()
	return Stats{
		Collectives: c.stats.collectives.Load(),
		Bytes:       c.stats.bytes.Load(),
		CommTime:    time.Duration(c.stats.nanos.Load()),
		QueueTime:   time.Duration(c.stats.queueNanos.Load()),
		WaitTime:    time.Duration(c.stats.waitNanos.Load()),
		Stalls:      c.stats.stalls.Load(),
		Stats:       v.wireStats(),
	}
}

// wireStats is the view's ring's traffic plus that of the rings of the
// earlier epochs (none yet while the epoch's ring was not formed).
func (v *commView) wireStats() ring.Stats {
	s := v.base
	if v.ring != nil {
		r := v.ring.Stats()
		s.PayloadBytesSent += r.PayloadBytesSent
		s.HeaderBytesSent += r.HeaderBytesSent
		s.MessagesSent += r.MessagesSent
		s.PayloadBytesRecv += r.PayloadBytesRecv
	}
	return s
}
