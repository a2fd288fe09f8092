package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progressStyle is how rank 0 shows how far training is.
type progressStyle int

const (
	noProgress    progressStyle = iota
	progressBar                 // a status line on stderr, redrawn in place after '\r'
	progressLines               // whole lines on stderr, for logs
)

// chooseProgress picks the style from --progress and where stderr goes.
//
// Under gorun (GORUN_RANK set) a rank's stderr is a pipe, and gorun owns the
// terminal: it sets GORUN_TTY=1 when its own stderr is one, and then shows
// the text a rank writes after a '\r' (without a '\n') as a status line
// below the output lines, erased and redrawn around each of them. So a rank
// draws the bar on stderr when GORUN_TTY=1, and never opens /dev/tty, whose
// writes would land between gorun's lines. Elsewhere stderr itself says
// whether there is a terminal. Without one, a bar's '\r' redraws would pile
// up into one huge line, so "auto" shows nothing and "on" prints lines.
func chooseProgress(flag string, getenv func(string) string, stderrIsTerminal bool) progressStyle {
	if flag == "off" {
		return noProgress
	}
	terminal := stderrIsTerminal
	if getenv("GORUN_RANK") != "" {
		terminal = getenv("GORUN_TTY") == "1"
	}
	switch {
	case terminal:
		return progressBar
	case flag == "on":
		return progressLines
	}
	return noProgress
}

// How often the bar is redrawn at most, and how long plain-line mode stays
// silent at most.
const (
	barInterval  = 100 * time.Millisecond
	lineInterval = 10 * time.Second
)

// progress shows the whole run, all epochs: its rate and ETA come from the
// optimizer steps this process has done since it started training (steps
// restored from a checkpoint took no time here and do not count). The
// rate includes the evaluation between epochs, so the ETA does too.
//
// The bar is progressbar's, used as a renderer only: the description
// carries the epoch, step, rate and ETA computed here, with a clock that
// tests can drive. (progressbar's own times caused "[0s:0s]" and
// "0 samples/hr": there was one bar per epoch, and an epoch here takes
// under a second, which its whole-second times truncate to 0s; and each
// bar first rendered at Add(0), before any sample, at a rate of 0.)
type progress struct {
	style  progressStyle
	w      io.Writer
	now    func() time.Time
	epochs int // of the run
	steps  int // optimizer steps per epoch
	global int // samples per step
	first  int // the run's step when this process started training
	cols   int // the terminal's width, 0 if unknown (under gorun)

	start time.Time
	step  int // optimizer steps done in the run, restored ones included
	last  time.Time
	bar   *progressbar.ProgressBar
	drawn bool // a status line is on the screen
}

// done says the run's last step was counted: the bar was cleared for good.
func (p *progress) done() bool { return p.step >= p.epochs*p.steps }

// newProgress returns nil for noProgress; a nil *progress does nothing.
func newProgress(style progressStyle, w io.Writer, cols int, now func() time.Time, epochs, steps, global, first int) *progress {
	if style == noProgress || first >= epochs*steps {
		return nil
	}
	t := now()
	return &progress{style: style, w: w, cols: cols, now: now, epochs: epochs, steps: steps, global: global,
		first: first, start: t, step: first, last: t}
}

// stepDone counts one optimizer step; step is the run's step count after it.
func (p *progress) stepDone(step int) {
	if p == nil {
		return
	}
	p.step = step
	t := p.now()
	total := p.epochs * p.steps
	switch p.style {
	case progressBar:
		// The first step draws at once, later ones at most every
		// barInterval, and the last one always (it clears the bar).
		if p.bar != nil && t.Sub(p.last) < barInterval && step < total {
			return
		}
		p.last = t
		p.draw()
	case progressLines:
		// A line each tenth of an epoch (not at its end: the epoch's
		// summary follows), or after lineInterval without one.
		inEpoch := (step-1)%p.steps + 1
		tenth := inEpoch*10/p.steps > (inEpoch-1)*10/p.steps
		if (tenth && inEpoch < p.steps) || t.Sub(p.last) >= lineInterval {
			p.last = t
			fmt.Fprintf(p.w, "progress: %s\n", p.describe(t))
		}
	}
}

// describe says where the run is, e.g. "epoch 3/10 step 40/125, 9850
// samples/s, ETA 12s".
func (p *progress) describe(t time.Time) string {
	epoch, inEpoch := (p.step-1)/p.steps+1, (p.step-1)%p.steps+1
	s := fmt.Sprintf("epoch %d/%d step %d/%d", epoch, p.epochs, inEpoch, p.steps)
	done, el := p.step-p.first, t.Sub(p.start)
	if done <= 0 || el <= 0 {
		return s
	}
	perStep := el / time.Duration(done)
	eta := perStep * time.Duration(p.epochs*p.steps-p.step)
	return fmt.Sprintf("%s, %.0f samples/s, ETA %s", s, float64(done*p.global)/el.Seconds(), formatETA(eta))
}

// draw writes the status line in one write: "\r", the text, and an erase
// to the end of the line, so that gorun never sees half a status. The bar
// is progressbar's, rendered into a string (its writer is io.Discard) and
// showing the percentage of the whole run.
func (p *progress) draw() {
	if p.bar == nil {
		p.bar = progressbar.NewOptions64(int64(p.epochs*p.steps),
			progressbar.OptionSetWriter(io.Discard),
			progressbar.OptionShowDescriptionAtLineEnd(),
			progressbar.OptionSetPredictTime(false), // the description has the run's ETA
			progressbar.OptionSetWidth(20),
			progressbar.OptionSetTheme(progressbar.Theme{Saucer: "█", SaucerPadding: "░", BarStart: "▕", BarEnd: "▏"}),
		)
	}
	// Describe renders with the new description; Set64 renders again when
	// the percentage changes. In this order the last render has both, also
	// on the last step (a finished bar ignores Describe).
	p.bar.Describe(p.describe(p.last))
	p.bar.Set64(int64(p.step))
	text := strings.TrimRight(strings.TrimPrefix(p.bar.String(), "\r"), " ")
	if p.cols > 0 {
		// A line longer than the terminal would wrap, and "\r" would then
		// redraw only its last row.
		if r := []rune(text); len(r) >= p.cols {
			text = string(r[:p.cols-1])
		}
	}
	io.WriteString(p.w, "\r"+text+eraseToEOL)
	p.drawn = true
	if p.done() {
		p.clear()
	}
}

// The terminal escapes of a status line: erase the rest of the line after
// it; erase the whole line and return to its start, which leaves an empty
// status (no text after the last '\r'), which gorun takes as "none".
const (
	eraseToEOL = "\033[K"
	eraseLine  = "\033[2K\r"
)

// clear erases the status line, if one is shown. Output lines on a terminal
// that gorun does not manage go between clear and redraw.
func (p *progress) clear() {
	if p == nil || !p.drawn {
		return
	}
	io.WriteString(p.w, eraseLine)
	p.drawn = false
}

// redraw shows the status line again after clear.
func (p *progress) redraw() {
	if p == nil || p.bar == nil || p.done() {
		return
	}
	p.draw()
}

// formatETA rounds to what a person reads: tenths under 10 s, then
// seconds, minutes, hours.
func formatETA(d time.Duration) string {
	switch {
	case d < 10*time.Second:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Round(time.Second).Seconds()))
	case d < time.Hour:
		d = d.Round(time.Second)
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	d = d.Round(time.Minute)
	return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
}
