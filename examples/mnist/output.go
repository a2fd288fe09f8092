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

	"golang.org/x/term"

	"github.com/gorun/gorun/collective"
)

// output is what this rank prints: everything on rank 0, only errors and
// the final parameter checksum elsewhere unless --verbose. Rank 0 also shows
// its progress on stderr (progress.go).
type output struct {
	cfg        *Config
	rank, size int
	loud       bool      // rank 0, or --verbose
	stdout     io.Writer // summaries
	stderr     io.Writer // progress
	style      progressStyle
	// ownTerminal: the bar is on a terminal this process writes to itself,
	// not through gorun, and shares it with stdout. A line printed while the
	// bar is shown would start after the bar, so printf erases the bar
	// first and redraws it after. (Under gorun, gorun does that.)
	ownTerminal bool
	prog        *progress
	progArgs    [3]int // epochs, steps per epoch, global batch: for a rank that becomes rank 0
	metrics     *os.File
}

func newOutput(cfg *Config, rank, size int) *output {
	o := &output{cfg: cfg, rank: rank, size: size, loud: rank == 0 || cfg.Verbose, stdout: os.Stdout, stderr: os.Stderr}
	if rank == 0 {
		o.style = chooseProgress(cfg.Progress, os.Getenv, term.IsTerminal(int(os.Stderr.Fd())))
		o.ownTerminal = o.style == progressBar && os.Getenv("GORUN_RANK") == ""
	}
	return o
}

// openMetrics creates the --metrics file on rank 0, before training, so
// that a bad path fails at once rather than after the first epoch.
func (o *output) openMetrics() error {
	if o.rank != 0 || o.cfg.Metrics == "" {
		return nil
	}
	f, err := os.Create(o.cfg.Metrics)
	if err != nil {
		return fmt.Errorf("--metrics %s: %w", o.cfg.Metrics, err)
	}
	o.metrics = f
	return nil
}

// startProgress begins showing the run's progress from step first (> 0
// when resuming).
func (o *output) startProgress(epochs, steps, global, first int) {
	o.progArgs = [3]int{epochs, steps, global}
	cols := 0
	if o.ownTerminal {
		cols, _, _ = term.GetSize(int(os.Stderr.Fd()))
	}
	o.prog = newProgress(o.style, o.stderr, cols, time.Now, epochs, steps, global, first)
}

// setRank follows a reset of an elastic job: the rank that is rank 0 now
// prints the summaries, shows the progress from step on, and appends to
// the --metrics file (the old rank 0 wrote the epochs before), and the
// final report covers size ranks.
func (o *output) setRank(rank, size, step int) {
	was0 := o.rank == 0
	o.rank, o.size = rank, size
	o.loud = rank == 0 || o.cfg.Verbose
	switch {
	case rank == 0 && !was0:
		o.style = chooseProgress(o.cfg.Progress, os.Getenv, term.IsTerminal(int(os.Stderr.Fd())))
		o.ownTerminal = o.style == progressBar && os.Getenv("GORUN_RANK") == ""
		if o.progArgs[1] > 0 {
			o.startProgress(o.progArgs[0], o.progArgs[1], o.progArgs[2], step)
		}
		if o.cfg.Metrics != "" && o.metrics == nil {
			if f, err := os.OpenFile(o.cfg.Metrics, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644); err == nil {
				o.metrics = f
			}
		}
	case rank != 0 && was0:
		o.stopProgress()
		o.style, o.ownTerminal = noProgress, false
	}
}

// stopProgress erases the status line for good: at the end of training,
// and before an error is printed.
func (o *output) stopProgress() {
	o.prog.clear()
	o.prog = nil
}

func (o *output) printf(format string, args ...any) {
	if !o.loud {
		return
	}
	if o.ownTerminal {
		o.prog.clear()
		defer o.prog.redraw()
	}
	fmt.Fprintf(o.stdout, format, args...)
}

func (o *output) header(train, test *Dataset, m Model, plan BatchPlan, cfg *Config) {
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
	local := strconv.Itoa(plan.MaxLocal())
	if !plan.Even() {
		local = fmt.Sprintf("%d-%d", plan.MaxLocal()-1, plan.MaxLocal())
	}
	global := strconv.Itoa(plan.Global)
	if cfg.Batch == 0 && cfg.GlobalBatch == 0 {
		global += " (default)"
	}
	o.printf("mnist: %d rank(s) × batch %s × %d micro-batch(es) = global batch %s; %s; compression %s; seed %d; GOMAXPROCS %d\n",
		o.size, local, plan.K, global, opt, cfg.Compression, cfg.Seed, runtime.GOMAXPROCS(0))
	if !plan.Even() {
		o.printf("mnist: global batch %d does not split evenly over %d rank(s) × %d micro-batch(es): the micro-batches of ranks 0..%d hold %s samples, and each one's gradient is weighted by its size, so every step averages over exactly %d samples\n",
			plan.Global, plan.Size, plan.K, plan.Size-1, plan.Describe(), plan.Global)
	}
}

// epoch prints the one-line summary and writes the metrics line.
func (o *output) epoch(r EpochResult) error {
	o.printf("epoch %*d/%d  loss %.4f  train %6.2f%%  test %6.2f%%  %6.2f s  comm %4.1f%%  %6.0f samples/s\n",
		len(strconv.Itoa(o.cfg.Epochs)), r.Epoch, o.cfg.Epochs, r.Loss, 100*r.TrainAcc, 100*r.TestAcc,
		r.Seconds, 100*r.CommShare, r.SamplesPerS)
	return o.writeMetrics(r)
}

// writeMetrics appends epochs to the --metrics file. A resumed run first
// writes the epochs of its checkpoint's history, so that the file always
// holds the whole run.
func (o *output) writeMetrics(rs ...EpochResult) error {
	if o.metrics == nil {
		return nil
	}
	for _, r := range rs {
		b, _ := json.Marshal(r)
		if _, err := o.metrics.Write(append(b, '\n')); err != nil {
			return fmt.Errorf("--metrics %s: %w", o.cfg.Metrics, err)
		}
	}
	return nil
}

// finishedRun says why a rerun trains nothing: the checkpoint already holds
// the end of the run (a finished job saves its last step).
func (o *output) finishedRun(dir string, step, total int, hist []EpochResult) {
	acc := ""
	if len(hist) > 0 {
		acc = fmt.Sprintf(", test accuracy %.2f%%", 100*hist[len(hist)-1].TestAcc)
	}
	if step == total {
		o.printf("mnist: %s holds a checkpoint of the finished run (step %d of %d%s); nothing to train. Use a new --checkpoint-dir or more --epochs to continue\n",
			dir, step, total, acc)
		return
	}
	o.printf("mnist: %s holds a checkpoint at step %d, past the %d steps of --epochs %d (%d epochs%s); nothing to train. Use a new --checkpoint-dir or more --epochs to continue\n",
		dir, step, total, o.cfg.Epochs, len(hist), acc)
}

// final prints the report: accuracy, time, bytes per rank, checksum, and
// writes the plot. trained is false when the checkpoint already held the
// finished run: there are then no bytes of this process to report, and
// every rank skips their allreduce alike.
func (o *output) final(ctx context.Context, comm *collective.Comm, hist []EpochResult, total time.Duration, hash string, trained bool) error {
	var bytes []float64
	if trained {
		// Bytes this rank sent: on the wire, and what the same collectives
		// would have sent uncompressed. Rank 0 gathers them with a Sum
		// allreduce where each rank fills its own slot.
		st := comm.Stats()
		cs, _ := comm.CompressionStats()
		wire := st.PayloadBytesSent + st.HeaderBytesSent
		raw := wire - cs.WireBytes + cs.RawBytes
		bytes = make([]float64, 2*o.size)
		bytes[2*o.rank], bytes[2*o.rank+1] = float64(raw), float64(wire)
		if err := comm.Allreduce(ctx, bytes, collective.Sum); err != nil {
			return err
		}
	}
	if o.metrics != nil {
		if err := o.metrics.Close(); err != nil {
			return fmt.Errorf("--metrics %s: %w", o.cfg.Metrics, err)
		}
	}
	if len(hist) > 0 {
		last := hist[len(hist)-1]
		var sum float64
		for _, h := range hist {
			sum += h.Seconds
		}
		if trained {
			// The model's epochs, not this rank's: a joiner took part in
			// the last ones only.
			part := ""
			if len(hist) < last.Epoch {
				part = fmt.Sprintf(" (this rank took part in the last %d)", len(hist))
			}
			o.printf("final: test accuracy %.2f%% after %d epochs%s; %.1f s total, %.2f s per epoch\n",
				100*last.TestAcc, last.Epoch, part, total.Seconds(), sum/float64(len(hist)))
		} else {
			o.printf("final: test accuracy %.2f%% after %d epochs; %.2f s per epoch (from the checkpoint)\n",
				100*last.TestAcc, len(hist), sum/float64(len(hist)))
		}
	}
	if bytes != nil && o.size > 1 {
		var parts []string
		for r := range o.size {
			parts = append(parts, fmt.Sprintf("rank %d %s → %s", r, mb(bytes[2*r]), mb(bytes[2*r+1])))
		}
		o.printf("final: bytes sent per rank, raw → on the wire: %s\n", strings.Join(parts, ", "))
	}
	o.printf("final: parameters sha256 %s (rank %d; the ranks were checked identical after every epoch)\n", hash, o.rank)
	if o.rank == 0 && o.cfg.Plot != "" && len(hist) > 0 {
		if err := writePlot(o.cfg.Plot, hist); err != nil {
			return fmt.Errorf("--plot %s: %w", o.cfg.Plot, err)
		}
		o.printf("final: curves written to %s\n", o.cfg.Plot)
	}
	return nil
}

func mb(b float64) string { return fmt.Sprintf("%.1f MB", b/1e6) }
