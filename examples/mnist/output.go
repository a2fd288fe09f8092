package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/gorun/gorun/collective"
)

// output is what this rank prints: everything on rank 0, only errors and
// the final parameter checksum elsewhere unless --verbose.
type output struct {
	cfg         *Config
	rank, size  int
	loud        bool      // rank 0, or --verbose
	stdout      io.Writer // summaries
	barW        io.Writer // progress bar destination, nil for none
	metrics     *os.File
	metricsErr  error
	description string
}

func newOutput(cfg *Config, rank, size int) *output {
	o := &output{cfg: cfg, rank: rank, size: size, loud: rank == 0 || cfg.Verbose, stdout: os.Stdout}
	if rank == 0 {
		o.barW = progressWriter(cfg.Progress)
		if cfg.Metrics != "" {
			o.metrics, o.metricsErr = os.Create(cfg.Metrics)
		}
	}
	return o
}

// progressWriter finds a terminal for the bar. Under gorun a rank's stdout
// and stderr are pipes that gorun forwards line by line, so a bar redrawn
// with \r would not show: rank 0 draws it on the controlling terminal
// (/dev/tty) instead, and skips it when there is none (CI, cron, ssh -T).
func progressWriter(mode string) io.Writer {
	if mode == "off" {
		return nil
	}
	if term.IsTerminal(int(os.Stderr.Fd())) {
		return os.Stderr
	}
	if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
		if term.IsTerminal(int(tty.Fd())) {
			return tty
		}
		tty.Close()
	}
	if mode == "on" {
		return os.Stderr
	}
	return nil
}

func (o *output) printf(format string, args ...any) {
	if o.loud {
		fmt.Fprintf(o.stdout, format, args...)
	}
}

func (o *output) header(train, test *Dataset, m Model, global, k int, cfg *Config) {
	src := "embedded MNIST digits"
	if cfg.Data != "" {
		src = cfg.Data
	}
	_, params, _ := m.Params()
	nparams := 0
	for _, p := range params {
		nparams += p.Len()
	}
	o.printf("mnist: %d train / %d test samples (%s); %s, %d parameters; BLAS %s\n",
		train.Len(), test.Len(), src, m.Describe(), nparams, blasName)
	opt := fmt.Sprintf("%s lr %g", cfg.Optimizer, cfg.LR)
	if cfg.Optimizer == "sgd" {
		opt += fmt.Sprintf(" momentum %g", cfg.Momentum)
	}
	o.printf("mnist: %d rank(s) × batch %d × %d micro-batch(es) = global batch %d; %s; compression %s; seed %d; GOMAXPROCS %d\n",
		o.size, cfg.Batch, k, global, opt, cfg.Compression, cfg.Seed, runtime.GOMAXPROCS(0))
}

// progress wraps the bar (nil on ranks without one): it counts samples,
// with the step in the description.
type progress struct {
	bar         *progressbar.ProgressBar
	epoch       string
	step, steps int
}

func (o *output) bar(epoch, steps, global, done int) *progress {
	if o.barW == nil {
		return nil
	}
	p := &progress{epoch: fmt.Sprintf("epoch %d/%d", epoch, o.cfg.Epochs), steps: steps}
	p.bar = progressbar.NewOptions(steps*global,
		progressbar.OptionSetWriter(o.barW),
		progressbar.OptionSetDescription(p.epoch),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("samples"),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionSetTheme(progressbar.Theme{Saucer: "█", SaucerPadding: "░", BarStart: "▕", BarEnd: "▏"}),
	)
	p.step = done
	p.bar.Add(done * global)
	return p
}

// add counts one optimizer step of n samples.
func (p *progress) add(n int) {
	if p != nil {
		p.step++
		p.bar.Describe(fmt.Sprintf("%s step %d/%d", p.epoch, p.step, p.steps))
		p.bar.Add(n)
	}
}

func (p *progress) finish() {
	if p != nil {
		p.bar.Finish()
	}
}

// epoch prints the one-line summary and writes the metrics line.
func (o *output) epoch(r EpochResult) error {
	o.printf("epoch %*d/%d  loss %.4f  train %6.2f%%  test %6.2f%%  %6.2f s  comm %4.1f%%  %6.0f samples/s\n",
		len(strconv.Itoa(o.cfg.Epochs)), r.Epoch, o.cfg.Epochs, r.Loss, 100*r.TrainAcc, 100*r.TestAcc,
		r.Seconds, 100*r.CommShare, r.SamplesPerS)
	if o.metricsErr != nil {
		return fmt.Errorf("--metrics: %w", o.metricsErr)
	}
	if o.metrics != nil {
		b, _ := json.Marshal(r)
		if _, err := o.metrics.Write(append(b, '\n')); err != nil {
			return fmt.Errorf("--metrics: %w", err)
		}
	}
	return nil
}

// final prints the report: accuracy, time, bytes per rank, checksum.
func (o *output) final(ctx context.Context, comm *collective.Comm, hist []EpochResult, total time.Duration, hash string) error {
	// Bytes this rank sent: on the wire, and what the same collectives
	// would have sent uncompressed. Rank 0 gathers them with a Sum
	// allreduce where each rank fills its own slot.
	st := comm.Stats()
	cs, _ := comm.CompressionStats()
	wire := st.PayloadBytesSent + st.HeaderBytesSent
	raw := wire - cs.WireBytes + cs.RawBytes
	bytes := make([]float64, 2*o.size)
	bytes[2*o.rank], bytes[2*o.rank+1] = float64(raw), float64(wire)
	if err := comm.Allreduce(ctx, bytes, collective.Sum); err != nil {
		return err
	}
	if o.metrics != nil {
		if err := o.metrics.Close(); err != nil {
			return fmt.Errorf("--metrics: %w", err)
		}
	}
	last := hist[len(hist)-1]
	var sum float64
	for _, h := range hist {
		sum += h.Seconds
	}
	o.printf("final: test accuracy %.2f%% after %d epochs; %.1f s total, %.2f s per epoch\n",
		100*last.TestAcc, len(hist), total.Seconds(), sum/float64(len(hist)))
	if o.size > 1 {
		var parts []string
		for r := range o.size {
			parts = append(parts, fmt.Sprintf("rank %d %s → %s", r, mb(bytes[2*r]), mb(bytes[2*r+1])))
		}
		o.printf("final: bytes sent per rank, raw → on the wire: %s\n", strings.Join(parts, ", "))
	}
	o.printf("final: parameters sha256 %s (rank %d; the ranks were checked identical after every epoch)\n", hash, o.rank)
	if o.rank == 0 && o.cfg.Plot != "" {
		if err := writePlot(o.cfg.Plot, hist); err != nil {
			return fmt.Errorf("--plot: %w", err)
		}
		o.printf("final: curves written to %s\n", o.cfg.Plot)
	}
	return nil
}

func mb(b float64) string { return fmt.Sprintf("%.1f MB", b/1e6) }
