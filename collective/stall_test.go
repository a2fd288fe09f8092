package collective

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// A collective that waits longer than the stall threshold logs a warning
// naming its fingerprint and the ranks that have not called it yet; the call
// itself still completes.
func TestStallWarningNamesMissingRanks(t *testing.T) {
	var mu sync.Mutex
	var warnings []string
	logf := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		if strings.Contains(msg, "stall warning") {
			mu.Lock()
			warnings = append(warnings, msg)
			mu.Unlock()
		}
		t.Log(msg)
	}
	comms := newJob(t, 3, WithStallThreshold(300*time.Millisecond), WithLogger(logf))
	ctx := context.Background()
	mustAll(t, onEach(comms, func(c *Comm) error { return c.Barrier(ctx) }))
	mustAll(t, onEach(comms, func(c *Comm) error {
		if c.Rank() == 2 {
			time.Sleep(1100 * time.Millisecond) // the straggler
		}
		return c.Allreduce(ctx, make([]float32, 10), Sum, Name("layer3.grad"))
	}))
	// Calls shorter than the threshold, one after the other for longer
	// than it: the one timer re-armed for each call never fires, nor does
	// the slow call's after it ended.
	mu.Lock()
	after := len(warnings)
	mu.Unlock()
	for until := time.Now().Add(700 * time.Millisecond); time.Now().Before(until); {
		mustAll(t, onEach(comms, func(c *Comm) error { return c.Barrier(ctx) }))
	}
	mu.Lock()
	if len(warnings) != after {
		t.Errorf("stall warnings during calls shorter than the threshold: %q", warnings[after:])
	}
	defer mu.Unlock()
	if len(warnings) == 0 {
		t.Fatal("no stall warning")
	}
	// Ranks 0 and 1 waited 1.1 s: the warning repeats every 300 ms.
	if n := strings.Count(strings.Join(warnings, "\n"), "rank 0 has waited"); n < 2 {
		t.Errorf("rank 0 warned %d times about the 1.1 s wait, want the warning repeated", n)
	}
	found := false
	for _, w := range warnings {
		if strings.Contains(w, `call #2 Allreduce(float32[10], Sum, name="layer3.grad")`) &&
			strings.Contains(w, "ranks that have not entered it yet: rank 2 (last entered #1)") {
			found = true
		}
		if strings.Contains(w, "rank 2 has waited") {
			t.Errorf("the straggler itself warned: %s", w)
		}
	}
	if !found {
		t.Fatalf("no warning names the call and rank 2: %q", warnings)
	}
	if comms[0].Stats().Stalls == 0 {
		t.Fatal("Stats().Stalls is 0")
	}
}

// Counters are readable in code and served in Prometheus text format.
func TestMetrics(t *testing.T) {
	comms := newJob(t, 2, WithMetricsAddr("127.0.0.1:0"))
	ctx := context.Background()
	mustAll(t, onEach(comms, func(c *Comm) error {
		h := c.AllreduceAsync(ctx, make([]float64, 1000), Sum)
		if err := c.Allreduce(ctx, make([]float32, 1000), Sum); err != nil {
			return err
		}
		return h.Wait(ctx)
	}))
	s := comms[0].Stats()
	if s.Collectives != 2 || s.Bytes != 12000 || s.PayloadBytesSent == 0 || s.CommTime <= 0 {
		t.Fatalf("stats: %+v", s)
	}
	resp, err := http.Get("http://" + comms[1].MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		"# TYPE gorun_collectives_total counter\ngorun_collectives_total{rank=\"1\"} 2\n",
		"gorun_collective_bytes_total{rank=\"1\"} 12000\n",
		"gorun_wire_payload_bytes_sent_total{rank=\"1\"} ",
		"gorun_communication_seconds_total{rank=\"1\"} ",
		"gorun_wait_seconds_total{rank=\"1\"} ",
	} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("metrics lack %q:\n%s", want, body)
		}
	}
	if a, err := offsetPort("127.0.0.1:9100", 3); err != nil || a != "127.0.0.1:9103" {
		t.Fatalf("offsetPort = %q, %v", a, err)
	}
}

func TestStallThresholdDefault(t *testing.T) {
	for _, tc := range []struct {
		timeout, opt, want time.Duration
	}{{60 * time.Second, 0, 30 * time.Second}, {10 * time.Minute, 0, DefaultStallThreshold}, {60 * time.Second, 5 * time.Second, 5 * time.Second}} {
		opts := []Option{WithTimeout(tc.timeout)}
		if tc.opt != 0 {
			opts = append(opts, WithStallThreshold(tc.opt))
		}
		c, err := Init(context.Background(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		if c.stallThreshold != tc.want {
			t.Errorf("timeout %v, option %v: threshold %v, want %v", tc.timeout, tc.opt, c.stallThreshold, tc.want)
		}
		c.Close()
	}
}
