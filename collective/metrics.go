package collective

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// EnvMetricsAddr, when set ("host:port" or ":port"), makes every rank serve
// its counters in Prometheus text format at /metrics; a rank listens on the
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

// WriteMetrics writes the Comm's counters in Prometheus text format, each
// labelled with the rank.
func (c *Comm) WriteMetrics(w io.Writer) error {
	s := c.Stats()
	lbl := fmt.Sprintf(`{rank="%d"}`, c.Rank())
	type metric struct {
		name, kind, help string
		v                float64
	}
	ms := []metric{
		{"gorun_collectives_total", "counter", "Collectives completed.", float64(s.Collectives)},
		{"gorun_collective_bytes_total", "counter", "Bytes of user buffers passed to collectives.", float64(s.Bytes)},
		{"gorun_wire_payload_bytes_sent_total", "counter", "Payload bytes this rank sent on the wire.", float64(s.PayloadBytesSent)},
		{"gorun_wire_header_bytes_sent_total", "counter", "Framing bytes this rank sent on the wire.", float64(s.HeaderBytesSent)},
		{"gorun_wire_payload_bytes_received_total", "counter", "Payload bytes this rank received.", float64(s.PayloadBytesRecv)},
		{"gorun_wire_messages_sent_total", "counter", "Messages this rank sent on the wire.", float64(s.MessagesSent)},
		{"gorun_communication_seconds_total", "counter", "Time spent inside collectives.", s.CommTime.Seconds()},
		{"gorun_queue_seconds_total", "counter", "Time calls spent queued behind earlier calls.", s.QueueTime.Seconds()},
		{"gorun_wait_seconds_total", "counter", "Time callers spent blocked waiting for collectives.", s.WaitTime.Seconds()},
		{"gorun_stall_warnings_total", "counter", "Stall warnings logged.", float64(s.Stalls)},
	}
	for _, m := range ms {
		if _, err := fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n%s%s %s\n", m.name, m.help, m.name, m.kind, m.name, lbl,
			strconv.FormatFloat(m.v, 'g', -1, 64)); err != nil {
			return err
		}
	}
	return nil
}

type metricsServer struct {
	srv *http.Server
	ln  net.Listener
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

func (c *Comm) serveMetrics(addr string) (*metricsServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		c.WriteMetrics(w)
	})
	m := &metricsServer{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, ln: ln}
	go m.srv.Serve(ln)
	return m, nil
}
