package collective

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gorun/gorun/ring"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// EnvMetricsAddr, when set ("host:port" or ":port"), makes every rank serve
// its metrics in Prometheus text format at /metrics; a rank listens on the
// port plus its local rank, so ranks sharing a host do not collide.
const EnvMetricsAddr = "GORUN_METRICS_ADDR"

// offsetPort adds off to the port of addr.
func offsetPort(addr string, off int) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return "", fmt.Errorf("port %q is not a number", port)
	}
	if p == 0 {
		return addr, nil
	}
	return net.JoinHostPort(host, strconv.Itoa(p+off)), nil
}

// The metric names. The counters kept the names of the hand-written format
// they replace, so dashboards built on them keep working.
const (
	metricCollectives  = "gorun_collectives_total"
	metricCallDuration = "gorun_collective_duration_seconds"
	metricCallFailures = "gorun_collective_failures_total"
	metricRankLabel    = "rank"
	metricKindLabel    = "kind"
	metricSizeLabel    = "size"
	metricReasonLabel  = "reason"
)

// callDurationBuckets bound the latency histogram: from 10 µs, the order of
// a tiny allreduce on shared memory, doubling up to 84 s, past the default
// 60 s collective timeout, in 24 buckets.
var callDurationBuckets = prometheus.ExponentialBuckets(10e-6, 2, 24)

// sizeClasses split calls by the bytes of their user buffer (as
// gorun_collective_bytes_total counts them): few classes, so that the
// histogram's series stay few (kinds x classes), and each roughly a change
// of regime, from latency-bound to bandwidth-bound.
var sizeClasses = [...]struct {
	max   int64
	label string
}{
	{4 << 10, "<=4KiB"},
	{64 << 10, "<=64KiB"},
	{1 << 20, "<=1MiB"},
	{16 << 20, "<=16MiB"},
	{1<<63 - 1, ">16MiB"},
}

// sizeClass is the index in sizeClasses of a call of n bytes.
func sizeClass(n int64) int {
	for i, sc := range sizeClasses[:len(sizeClasses)-1] {
		if n <= sc.max {
			return i
		}
	}
	return len(sizeClasses) - 1
}

// callBytes is the size of a call's user buffer, the one Stats.Bytes
// counts: Allgather's output (size times its input), every other kind's
// input.
func callBytes(call ring.Call, size int) int64 {
	n := int64(call.Count) * int64(call.DType.Size())
	switch call.Kind {
	case ring.Barrier:
		return 0
	case ring.Allgather:
		return n * int64(size)
	}
	return n
}

// kindSlots indexes the cached series by ring.Kind directly, up to the last
// kind ring has; a kind beyond it (one added to ring later) still counts,
// through the labelled lookup on every call.
const kindSlots = int(ring.Shift) + 1

// Why a call failed, as far as the rank could tell when the call returned.
// Few on purpose: one series per kind and reason.
const (
	failCanceled   = iota // the caller's context ended (its cancel or deadline)
	failTimeout           // the collective timeout (WithTimeout, WithCallTimeout) passed
	failMismatch          // this rank saw a peer call something else
	failMembership        // an elastic job's membership changed under the call
	failAborted           // the job was aborted (by another rank's failure) or closed
	failError             // anything else: mostly a link to a peer that broke
	failReasons
)

var failReasonLabels = [failReasons]string{"canceled", "timeout", "mismatch", "membership", "aborted", "error"}

// metricsServer is a rank's Prometheus metrics, on a registry of its own
// (tests and StartLocal run many ranks in one process, so the global
// registry would mix them), and the HTTP server that serves them.
type metricsServer struct {
	registry *prometheus.Registry
	gatherer prometheus.Gatherer // the registry, with the rank added to every series

	durationVec *prometheus.HistogramVec
	failureVec  *prometheus.CounterVec
	// durations and failures cache the series of each (kind, size) and
	// (kind, reason) once its first call has created it. A series is
	// created only when used, not up front: a histogram series is 27 on
	// the wire (buckets, sum, count), so every kind x size class would be
	// 810 per rank, 810 000 for 1000 ranks, mostly for kinds a job never
	// calls. The cache spares later calls the labelled lookup, which hashes
	// the label values and allocates.
	durations [kindSlots][len(sizeClasses)]atomic.Pointer[observerSlot]
	failures  [kindSlots][failReasons]atomic.Pointer[counterSlot]

	srv *http.Server
	ln  net.Listener
}

// newMetrics builds the rank's registry: the Stats counters, read when
// scraped, and the per-call latency histogram and failure counter.
func (c *Comm) newMetrics() *metricsServer {
	m := &metricsServer{registry: prometheus.NewRegistry()}
	m.registry.MustRegister(statsCollector{c})
	m.durationVec = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    metricCallDuration,
		Help:    "Time collectives that completed spent running (from leaving the queue to the end), by kind and size of the user buffer.",
		Buckets: callDurationBuckets,
	}, []string{metricKindLabel, metricSizeLabel})
	m.failureVec = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricCallFailures,
		Help: "Collectives that failed once running, by kind and by why, as far as this rank could tell when the call returned.",
	}, []string{metricKindLabel, metricReasonLabel})
	m.registry.MustRegister(m.durationVec, m.failureVec)
	m.gatherer = rankGatherer{c: c, registry: m.registry}
	return m
}

// observerSlot and counterSlot box a series so that an atomic.Pointer can
// hold it (the series are interfaces).
type (
	observerSlot struct{ prometheus.Observer }
	counterSlot  struct{ prometheus.Counter }
)

// durationSeries is the histogram series of calls of kind k in size class
// s, created by its first call. No lock of our own: the vector creates at
// most one series per label values under its own lock, so goroutines racing
// on a first call all get the same series and may all store it.
func (m *metricsServer) durationSeries(k ring.Kind, s int) prometheus.Observer {
	if int(k) >= kindSlots {
		return m.durationVec.WithLabelValues(k.String(), sizeClasses[s].label)
	}
	slot := &m.durations[k][s]
	if cached := slot.Load(); cached != nil {
		return cached.Observer
	}
	series := m.durationVec.WithLabelValues(k.String(), sizeClasses[s].label)
	slot.Store(&observerSlot{series})
	return series
}

// failureSeries is the failure counter of kind k and reason r, created by
// the first such failure; like durationSeries.
func (m *metricsServer) failureSeries(k ring.Kind, r int) prometheus.Counter {
	if int(k) >= kindSlots {
		return m.failureVec.WithLabelValues(k.String(), failReasonLabels[r])
	}
	slot := &m.failures[k][r]
	if cached := slot.Load(); cached != nil {
		return cached.Counter
	}
	series := m.failureVec.WithLabelValues(k.String(), failReasonLabels[r])
	slot.Store(&counterSlot{series})
	return series
}

// observeCall records a call that ran: its latency if it completed, its
// failure otherwise. ctx is the call's own context (bounded by the
// collective timeout). For the kinds ring has, it allocates nothing once
// the call's series exists.
func (c *Comm) observeCall(h *Handle, ctx context.Context, took time.Duration, err error) {
	m := c.metrics
	if m == nil {
		return // metrics are off: the call pays nothing
	}
	if err == nil {
		m.durationSeries(h.call.Kind, sizeClass(callBytes(h.call, h.view.size))).Observe(took.Seconds())
		return
	}
	m.failureSeries(h.call.Kind, c.failReason(h, ctx, err)).Inc()
}

// failReason classifies a failed call from what the rank knows when the call
// returns; an abort that another rank sent may arrive only later, so a call
// broken by a peer's failure can count as failError.
func (c *Comm) failReason(h *Handle, ctx context.Context, err error) int {
	var mismatch *ring.MismatchError
	switch {
	case h.ctx.Err() != nil:
		return failCanceled
	case errors.As(err, &mismatch):
		return failMismatch
	case isMembershipChange(err), h.view.end != nil && h.view.ctx.Err() != nil,
		c.node != nil && isMembershipChange(c.node.Err()):
		return failMembership
	case c.life.Err() != nil, c.node != nil && c.node.Err() != nil:
		return failAborted
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return failTimeout
	}
	return failError
}

// statsCollector serves Comm.Stats as counters, read at scrape time, under
// the names of the hand-written format that came before.
type statsCollector struct{ c *Comm }

var statsDescs = [...]*prometheus.Desc{
	prometheus.NewDesc(metricCollectives, "Collectives completed.", nil, nil),
	prometheus.NewDesc("gorun_collective_bytes_total", "Bytes of user buffers passed to collectives.", nil, nil),
	prometheus.NewDesc("gorun_wire_payload_bytes_sent_total", "Payload bytes this rank sent on the wire.", nil, nil),
	prometheus.NewDesc("gorun_wire_header_bytes_sent_total", "Framing bytes this rank sent on the wire.", nil, nil),
	prometheus.NewDesc("gorun_wire_payload_bytes_received_total", "Payload bytes this rank received.", nil, nil),
	prometheus.NewDesc("gorun_wire_messages_sent_total", "Messages this rank sent on the wire.", nil, nil),
	prometheus.NewDesc("gorun_communication_seconds_total", "Time spent inside collectives.", nil, nil),
	prometheus.NewDesc("gorun_queue_seconds_total", "Time calls spent queued behind earlier calls.", nil, nil),
	prometheus.NewDesc("gorun_wait_seconds_total", "Time callers spent blocked waiting for collectives.", nil, nil),
	prometheus.NewDesc("gorun_stall_warnings_total", "Stall warnings logged.", nil, nil),
}

func (sc statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range statsDescs {
		ch <- d
	}
}

func (sc statsCollector) Collect(ch chan<- prometheus.Metric) {
	// One snapshot, so the counters of a scrape agree with each other.
	s := sc.c.Stats()
	values := [len(statsDescs)]float64{
		float64(s.Collectives), float64(s.Bytes),
		float64(s.PayloadBytesSent), float64(s.HeaderBytesSent), float64(s.PayloadBytesRecv), float64(s.MessagesSent),
		s.CommTime.Seconds(), s.QueueTime.Seconds(), s.WaitTime.Seconds(),
		float64(s.Stalls),
	}
	for i, d := range statsDescs {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, values[i])
	}
}

// rankGatherer adds the rank to every series when gathered rather than as a
// constant label: in an elastic job a rank's number changes at a
// reconfiguration, and the series must say the current one.
type rankGatherer struct {
	c        *Comm
	registry *prometheus.Registry
}

func (g rankGatherer) Gather() ([]*dto.MetricFamily, error) {
	families, err := g.registry.Gather()
	name, rank := metricRankLabel, strconv.Itoa(g.c.Rank())
	pair := &dto.LabelPair{Name: &name, Value: &rank}
	for _, f := range families {
		for _, m := range f.Metric {
			// A new slice: a histogram's Write shares its label slice with
			// the histogram, and concurrent scrapes must not write into it.
			labels := make([]*dto.LabelPair, 0, len(m.Label)+1)
			labels = append(append(labels, m.Label...), pair)
			slices.SortFunc(labels, func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) })
			m.Label = labels
		}
	}
	return families, err
}

// metricsGatherer is the rank's metrics; with metrics off (no
// WithMetricsAddr or GORUN_METRICS_ADDR) the Stats counters alone, since no
// call was observed. A histogram or failure series appears once a call of
// its labels has been observed.
func (c *Comm) metricsGatherer() prometheus.Gatherer {
	if c.metrics != nil {
		return c.metrics.gatherer
	}
	registry := prometheus.NewRegistry()
	registry.MustRegister(statsCollector{c})
	return rankGatherer{c: c, registry: registry}
}

// WriteMetrics writes the Comm's metrics in Prometheus text format, each
// series labelled with the rank: the Stats counters and, when metrics are
// served (WithMetricsAddr, GORUN_METRICS_ADDR), the latency histogram
// gorun_collective_duration_seconds{kind,size} and the failure counter
// gorun_collective_failures_total{kind,reason}, a series for each labels
// some call has had.
func (c *Comm) WriteMetrics(w io.Writer) error {
	families, err := c.metricsGatherer().Gather()
	if err != nil {
		return fmt.Errorf("gorun: rank %d: gathering metrics: %w", c.Rank(), err)
	}
	enc := expfmt.NewEncoder(w, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range families {
		if err := enc.Encode(f); err != nil {
			return fmt.Errorf("gorun: rank %d: writing metrics: %w", c.Rank(), err)
		}
	}
	return nil
}

func (m *metricsServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	m.srv.Shutdown(ctx)
}

// MetricsAddr is the address the metrics server listens on, or "".
func (c *Comm) MetricsAddr() string {
	if c.metrics == nil {
		return ""
	}
	return c.metrics.ln.Addr().String()
}

// metricsErrorLog hands promhttp's errors (a collector that failed) to the
// Comm's warnings.
type metricsErrorLog struct{ c *Comm }

func (l metricsErrorLog) Println(v ...any) {
	l.c.warnf("gorun: rank %d: serving metrics: %s", l.c.Rank(), strings.TrimSuffix(fmt.Sprintln(v...), "\n"))
}

// serveMetrics turns metrics on for this rank and serves them at
// http://addr/metrics.
func (c *Comm) serveMetrics(addr string) (*metricsServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	m := c.newMetrics()
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.gatherer, promhttp.HandlerOpts{
		ErrorLog:      metricsErrorLog{c},
		ErrorHandling: promhttp.ContinueOnError, // serve what could be gathered
	}))
	m.ln = ln
	m.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 15 * time.Second}
	go m.srv.Serve(ln)
	return m, nil
}
