package collective

import (
	"bytes"
	"context"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/ring"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// seriesKey names a series by its labels, e.g. "kind=allreduce,rank=0,size=<=4KiB".
func seriesKey(m *dto.Metric) string {
	var parts []string
	for _, l := range m.GetLabel() {
		parts = append(parts, l.GetName()+"="+l.GetValue())
	}
	return strings.Join(parts, ",")
}

// family finds a metric family by name, or fails the test.
func family(t *testing.T, families []*dto.MetricFamily, name string) *dto.MetricFamily {
	t.Helper()
	for _, f := range families {
		if f.GetName() == name {
			return f
		}
	}
	t.Fatalf("no metric family %s", name)
	return nil
}

// counterValue is the value of a family holding a single counter series.
func counterValue(t *testing.T, f *dto.MetricFamily) float64 {
	t.Helper()
	if f.GetType() != dto.MetricType_COUNTER || len(f.Metric) != 1 {
		t.Fatalf("%s: type %v with %d series, want one counter", f.GetName(), f.GetType(), len(f.Metric))
	}
	return f.Metric[0].GetCounter().GetValue()
}

// absent fails the test if the families hold one named name: a vector with
// no series yet must not be gathered at all.
func absent(t *testing.T, families []*dto.MetricFamily, name, why string) {
	t.Helper()
	for _, f := range families {
		if f.GetName() == name {
			var keys []string
			for _, m := range f.Metric {
				keys = append(keys, seriesKey(m))
			}
			t.Errorf("%s has series {%s} %s", name, strings.Join(keys, "} {"), why)
		}
	}
}

// Every call that completes lands in the histogram series of its kind and
// size class, exactly once; only the (kind, size) pairs that were called
// have a series; the counters agree with Stats.
func TestMetricsHistogramCountsCallsByKindAndSize(t *testing.T) {
	comms := newJob(t, 2, WithMetricsAddr("127.0.0.1:0"))
	ctx := context.Background()
	mustAll(t, onEach(comms, func(c *Comm) error {
		for range 3 { // 40 B
			if err := c.Allreduce(ctx, make([]float32, 10), Sum); err != nil {
				return err
			}
		}
		for range 2 { // 80 000 B
			if err := c.Allreduce(ctx, make([]float64, 10000), Max); err != nil {
				return err
			}
		}
		if err := c.AllreduceAsync(ctx, make([]float32, 20000), Sum).Wait(ctx); err != nil { // 80 000 B
			return err
		}
		for range 2 { // 8 KiB
			if err := c.Broadcast(ctx, make([]int32, 2048), 1); err != nil {
				return err
			}
		}
		// Allgather counts its output, 2 ranks x 2400 B = 4800 B: above
		// 4 KiB although each rank's input is below.
		if err := c.Allgather(ctx, make([]int64, 300), make([]int64, 600)); err != nil {
			return err
		}
		// ReduceScatter counts its input, 4800 B; its output is 2400 B.
		if err := c.ReduceScatter(ctx, make([]float32, 1200), make([]float32, 600), Sum); err != nil {
			return err
		}
		for range 2 {
			if err := c.Barrier(ctx); err != nil {
				return err
			}
		}
		return nil
	}))
	for _, c := range comms {
		rank := strconv.Itoa(c.Rank())
		want := map[string]uint64{
			"kind=allreduce,rank=" + rank + ",size=<=4KiB":      3,
			"kind=allreduce,rank=" + rank + ",size=<=1MiB":      3,
			"kind=broadcast,rank=" + rank + ",size=<=64KiB":     2,
			"kind=allgather,rank=" + rank + ",size=<=64KiB":     1,
			"kind=reducescatter,rank=" + rank + ",size=<=64KiB": 1,
			"kind=barrier,rank=" + rank + ",size=<=4KiB":        2,
		}
		families, err := c.metricsGatherer().Gather()
		if err != nil {
			t.Fatalf("rank %s: gather: %v", rank, err)
		}
		durations := family(t, families, metricCallDuration)
		if durations.GetType() != dto.MetricType_HISTOGRAM {
			t.Fatalf("%s is a %v", metricCallDuration, durations.GetType())
		}
		// A series exists only for a (kind, size) that was called: shift,
		// the size classes no call fell in, and every failure series are
		// absent, not zero.
		seen := map[string]bool{}
		var total uint64
		var seconds float64
		for _, m := range durations.Metric {
			h := m.GetHistogram()
			key := seriesKey(m)
			wantCalls, used := want[key]
			if !used {
				t.Errorf("rank %s: series %s exists with %d calls, but no call had its kind and size", rank, key, h.GetSampleCount())
			} else if h.GetSampleCount() != wantCalls {
				t.Errorf("rank %s: %s has %d calls, want %d", rank, key, h.GetSampleCount(), wantCalls)
			}
			seen[key] = true
			if n := len(h.GetBucket()); n != len(callDurationBuckets) {
				t.Errorf("rank %s: %s has %d buckets, want %d", rank, key, n, len(callDurationBuckets))
			}
			total += h.GetSampleCount()
			seconds += h.GetSampleSum()
		}
		s := c.Stats()
		if total != s.Collectives || s.Collectives != 12 {
			t.Errorf("rank %s: histogram holds %d calls, Stats().Collectives = %d, want 12", rank, total, s.Collectives)
		}
		// The histogram observes the same spans CommTime sums.
		if d := math.Abs(seconds - s.CommTime.Seconds()); d > 1e-6 {
			t.Errorf("rank %s: histogram sum %vs, CommTime %v", rank, seconds, s.CommTime)
		}
		for name, v := range map[string]float64{
			metricCollectives:                         float64(s.Collectives),
			"gorun_collective_bytes_total":            float64(s.Bytes),
			"gorun_wire_payload_bytes_sent_total":     float64(s.PayloadBytesSent),
			"gorun_wire_header_bytes_sent_total":      float64(s.HeaderBytesSent),
			"gorun_wire_payload_bytes_received_total": float64(s.PayloadBytesRecv),
			"gorun_wire_messages_sent_total":          float64(s.MessagesSent),
			"gorun_communication_seconds_total":       s.CommTime.Seconds(),
			"gorun_queue_seconds_total":               s.QueueTime.Seconds(),
			"gorun_wait_seconds_total":                s.WaitTime.Seconds(),
			"gorun_stall_warnings_total":              float64(s.Stalls),
		} {
			f := family(t, families, name)
			if got := counterValue(t, f); got != v {
				t.Errorf("rank %s: %s = %v, Stats says %v", rank, name, got, v)
			}
			if key := seriesKey(f.Metric[0]); key != "rank="+rank {
				t.Errorf("rank %s: %s is labelled %q", rank, name, key)
			}
		}
		// 3x40 + 2x80000 + 80000 + 2x8192 + 4800 + 4800 bytes of user buffers.
		if s.Bytes != 3*40+2*80000+80000+2*8192+4800+4800 {
			t.Errorf("rank %s: Stats().Bytes = %d", rank, s.Bytes)
		}
		for key := range want {
			if !seen[key] {
				t.Errorf("rank %s: no histogram series %s", rank, key)
			}
		}
		absent(t, families, metricCallFailures, "with no failed call")
	}
}

// The endpoint serves text that parses as Prometheus' format, with the
// histogram and the counters; WriteMetrics writes the same series.
func TestMetricsEndpointServesParseableText(t *testing.T) {
	comms := newJob(t, 2, WithMetricsAddr("127.0.0.1:0"))
	ctx := context.Background()
	mustAll(t, onEach(comms, func(c *Comm) error {
		return c.Allreduce(ctx, make([]float32, 100), Sum)
	}))
	parse := func(what string, r io.Reader) map[string]*dto.MetricFamily {
		t.Helper()
		p := expfmt.NewTextParser(model.UTF8Validation)
		families, err := p.TextToMetricFamilies(r)
		if err != nil {
			t.Fatalf("%s does not parse: %v", what, err)
		}
		return families
	}
	for _, c := range comms {
		client := &http.Client{Timeout: 10 * time.Second}
		resp, err := client.Get("http://" + c.MetricsAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
			t.Fatalf("rank %d: %s, Content-Type %q:\n%s", c.Rank(), resp.Status, resp.Header.Get("Content-Type"), body)
		}
		served := parse("the served metrics", bytes.NewReader(body))
		var written bytes.Buffer
		if err := c.WriteMetrics(&written); err != nil {
			t.Fatal(err)
		}
		wrote := parse("WriteMetrics' output", &written)
		for name, families := range map[string]map[string]*dto.MetricFamily{"served": served, "WriteMetrics": wrote} {
			f := families[metricCallDuration]
			if f == nil || f.GetType() != dto.MetricType_HISTOGRAM {
				t.Fatalf("rank %d: %s: no histogram %s", c.Rank(), name, metricCallDuration)
			}
			wantKey := "kind=allreduce,rank=" + strconv.Itoa(c.Rank()) + ",size=<=4KiB"
			found := false
			for _, m := range f.Metric {
				if seriesKey(m) == wantKey {
					found = true
					if n := m.GetHistogram().GetSampleCount(); n != 1 {
						t.Errorf("rank %d: %s: %s counts %d calls, want 1", c.Rank(), name, wantKey, n)
					}
				}
			}
			if !found {
				t.Errorf("rank %d: %s: no series %s", c.Rank(), name, wantKey)
			}
			if f := families[metricCollectives]; f == nil || counterValue(t, f) != 1 {
				t.Errorf("rank %d: %s: %s is not 1: %v", c.Rank(), name, metricCollectives, f)
			}
		}
	}
	// With metrics off, WriteMetrics still writes the counters (there is
	// no histogram: no call was observed).
	plain := newJob(t, 1)
	if err := plain[0].Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := plain[0].WriteMetrics(&out); err != nil {
		t.Fatal(err)
	}
	families := parse("WriteMetrics' output with metrics off", &out)
	if f := families[metricCollectives]; f == nil || counterValue(t, f) != 1 {
		t.Errorf("metrics off: %s is not 1:\n%s", metricCollectives, out.String())
	}
	if families[metricCallDuration] != nil {
		t.Errorf("metrics off: a histogram was written:\n%s", out.String())
	}
}

// A call that fails counts as a failure of its kind and reason, not as a
// completed call.
func TestMetricsFailedCallCountedByKindAndReason(t *testing.T) {
	// The stall threshold is past the timeout: the test is about the
	// failure, not about the stall warning and its diagnosis.
	comms := newJob(t, 2, WithTimeout(300*time.Millisecond), WithStallThreshold(time.Minute), WithMetricsAddr("127.0.0.1:0"))
	ctx := context.Background()
	// Rank 1 never calls: rank 0's allreduce ends at the collective timeout.
	if err := comms[0].Allreduce(ctx, make([]float32, 10), Sum); err == nil {
		t.Fatal("rank 0: the allreduce without rank 1 succeeded")
	}
	families, err := comms[0].metricsGatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	// The one failure has the one failure series; no other kind or reason
	// has one.
	failures := family(t, families, metricCallFailures)
	if len(failures.Metric) != 1 {
		t.Errorf("%d failure series after one failed call, want 1", len(failures.Metric))
	}
	for _, m := range failures.Metric {
		if key, v := seriesKey(m), m.GetCounter().GetValue(); key != "kind=allreduce,rank=0,reason=timeout" || v != 1 {
			t.Errorf("%s{%s} = %v, want only {kind=allreduce,rank=0,reason=timeout} = 1", metricCallFailures, key, v)
		}
	}
	absent(t, families, metricCallDuration, "though no call completed")
	if v := counterValue(t, family(t, families, metricCollectives)); v != 0 {
		t.Errorf("%s = %v after a failed call", metricCollectives, v)
	}
}

// allKinds are the kinds ring has.
var allKinds = [...]ring.Kind{ring.Allreduce, ring.Broadcast, ring.Allgather, ring.ReduceScatter, ring.Barrier, ring.Shift}

// Observing a call is on every collective's path: once the first call of a
// (kind, size) has created its series, later ones must not allocate.
func TestMetricsObserveCallAllocatesNothing(t *testing.T) {
	c := newJob(t, 1, WithMetricsAddr("127.0.0.1:0"))[0]
	ctx := context.Background()
	// A call of every kind in every size class it can have (a barrier has
	// no buffer, so only <=4KiB): counts of float32 at each class's bound,
	// and one past the last bound.
	var handles []*Handle
	keys := map[string]bool{}
	for _, k := range allKinds {
		for s := range sizeClasses {
			count := int(min(sizeClasses[s].max, 16<<20+4) / 4)
			h := &Handle{call: ring.Call{Kind: k, DType: ring.Float32, Count: count}, view: c.cur()}
			key := "kind=" + k.String() + ",rank=0,size=" + sizeClasses[sizeClass(callBytes(h.call, h.view.size))].label
			if !keys[key] {
				keys[key] = true
				handles = append(handles, h)
			}
		}
	}
	if want := (len(allKinds)-1)*len(sizeClasses) + 1; len(handles) != want {
		t.Fatalf("%d (kind, size) pairs, want %d: %v", len(handles), want, keys)
	}
	for _, h := range handles { // the warm-up: each pair's first call creates its series
		c.observeCall(h, ctx, time.Millisecond, nil)
	}
	observeAll := func() {
		for _, h := range handles {
			c.observeCall(h, ctx, time.Millisecond, nil)
		}
	}
	if allocs := testing.AllocsPerRun(1000, observeAll); allocs != 0 {
		t.Fatalf("observing a call of each of %d (kind, size) pairs allocates %v times", len(handles), allocs)
	}
	// The failure series, created by a first failure, likewise. (Telling
	// the reason of a failure is not part of this: failures are rare.)
	m := c.metrics
	for _, k := range allKinds {
		for r := range failReasons {
			m.failureSeries(k, r).Inc()
		}
	}
	failAll := func() {
		for _, k := range allKinds {
			for r := range failReasons {
				m.failureSeries(k, r).Inc()
			}
		}
	}
	if allocs := testing.AllocsPerRun(1000, failAll); allocs != 0 {
		t.Fatalf("counting a failure of each kind and reason allocates %v times", allocs)
	}

	families, err := c.metricsGatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	// Each pair: the warm-up, AllocsPerRun's own warm-up run, 1000 runs.
	durations := family(t, families, metricCallDuration)
	if len(durations.Metric) != len(handles) {
		t.Errorf("%d histogram series, want %d", len(durations.Metric), len(handles))
	}
	for _, s := range durations.Metric {
		if key, n := seriesKey(s), s.GetHistogram().GetSampleCount(); !keys[key] || n != 1002 {
			t.Errorf("%s counts %d observations, want 1002 for each of %v", key, n, keys)
		}
	}
	failures := family(t, families, metricCallFailures)
	if want := len(allKinds) * failReasons; len(failures.Metric) != want {
		t.Errorf("%d failure series, want %d", len(failures.Metric), want)
	}
	for _, s := range failures.Metric {
		if v := s.GetCounter().GetValue(); v != 1002 {
			t.Errorf("%s{%s} = %v, want 1002", metricCallFailures, seriesKey(s), v)
		}
	}
}

// Ranks' goroutines may make the first call of a (kind, size) at once (an
// async call completing while the caller's next one does): they must all
// land in one series, and none be lost.
func TestMetricsFirstCallsRacingShareOneSeries(t *testing.T) {
	c := newJob(t, 1, WithMetricsAddr("127.0.0.1:0"))[0]
	ctx := context.Background()
	h := &Handle{call: ring.Call{Kind: ring.Broadcast, DType: ring.Int64, Count: 100}, view: c.cur()}
	const goroutines, calls = 8, 50
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			<-start
			for range calls {
				c.observeCall(h, ctx, time.Microsecond, nil)
				c.metrics.failureSeries(ring.Broadcast, failError).Inc()
			}
		})
	}
	close(start)
	wg.Wait()
	families, err := c.metricsGatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	durations := family(t, families, metricCallDuration)
	if len(durations.Metric) != 1 {
		t.Fatalf("%d histogram series, want 1", len(durations.Metric))
	}
	if key, n := seriesKey(durations.Metric[0]), durations.Metric[0].GetHistogram().GetSampleCount(); key != "kind=broadcast,rank=0,size=<=4KiB" || n != goroutines*calls {
		t.Errorf("%s counts %d calls, want kind=broadcast,rank=0,size=<=4KiB with %d", key, n, goroutines*calls)
	}
	failures := family(t, families, metricCallFailures)
	if len(failures.Metric) != 1 {
		t.Fatalf("%d failure series, want 1", len(failures.Metric))
	}
	if key, v := seriesKey(failures.Metric[0]), failures.Metric[0].GetCounter().GetValue(); key != "kind=broadcast,rank=0,reason=error" || v != goroutines*calls {
		t.Errorf("%s{%s} = %v, want {kind=broadcast,rank=0,reason=error} = %d", metricCallFailures, key, v, goroutines*calls)
	}
}

func TestMetricsSizeClasses(t *testing.T) {
	for _, tc := range []struct {
		bytes int64
		want  string
	}{
		{0, "<=4KiB"}, {4096, "<=4KiB"}, {4097, "<=64KiB"}, {64 << 10, "<=64KiB"}, {64<<10 + 1, "<=1MiB"},
		{1 << 20, "<=1MiB"}, {1<<20 + 1, "<=16MiB"}, {16 << 20, "<=16MiB"}, {16<<20 + 1, ">16MiB"}, {1 << 40, ">16MiB"},
	} {
		if got := sizeClasses[sizeClass(tc.bytes)].label; got != tc.want {
			t.Errorf("sizeClass(%d) = %s, want %s", tc.bytes, got, tc.want)
		}
	}
	for _, tc := range []struct {
		call ring.Call
		size int
		want int64
	}{
		{ring.Call{Kind: ring.Allreduce, DType: ring.Float64, Count: 10}, 4, 80},
		{ring.Call{Kind: ring.Allgather, DType: ring.Int32, Count: 10}, 4, 160},
		{ring.Call{Kind: ring.ReduceScatter, DType: ring.Float32, Count: 40}, 4, 160},
		{ring.Call{Kind: ring.Barrier, DType: ring.Int32}, 4, 0},
	} {
		if got := callBytes(tc.call, tc.size); got != tc.want {
			t.Errorf("callBytes(%v, size %d) = %d, want %d", tc.call, tc.size, got, tc.want)
		}
	}
}
