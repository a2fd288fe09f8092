package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestChooseProgress(t *testing.T) {
	for _, tc := range []struct {
		flag     string
		env      map[string]string
		terminal bool // stderr
		want     progressStyle
	}{
		{"auto", nil, true, progressBar},
		{"auto", nil, false, noProgress},
		{"on", nil, false, progressLines},
		{"on", nil, true, progressBar},
		{"off", nil, true, noProgress},
		// Under gorun stderr is a pipe; GORUN_TTY says whether gorun shows
		// status lines on a terminal.
		{"auto", map[string]string{"GORUN_RANK": "0", "GORUN_TTY": "1"}, false, progressBar},
		{"auto", map[string]string{"GORUN_RANK": "0"}, false, noProgress},
		{"on", map[string]string{"GORUN_RANK": "0"}, false, progressLines},
		{"off", map[string]string{"GORUN_RANK": "0", "GORUN_TTY": "1"}, false, noProgress},
		// A terminal on stderr under gorun (gorun --output-dir? a test
		// harness?) is not gorun's terminal: only GORUN_TTY counts.
		{"auto", map[string]string{"GORUN_RANK": "0"}, true, noProgress},
	} {
		got := chooseProgress(tc.flag, func(k string) string { return tc.env[k] }, tc.terminal)
		if got != tc.want {
			t.Errorf("--progress %s, env %v, stderr terminal %v: style %d, want %d", tc.flag, tc.env, tc.terminal, got, tc.want)
		}
	}
}

// fakeClock advances only when told to.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

// lastStatus is the status line a terminal would show last: the text after
// the last '\r', without the erase escape.
func lastStatus(out string) string {
	out = strings.TrimSuffix(out, eraseToEOL)
	return out[strings.LastIndex(out, "\r")+1:]
}

// The bar covers the whole run: after 51 steps of 10 ms out of 2×100, it
// says 25 %, 6400 samples/s and 1.5 s to go — not "[0s:0s]" and not
// "0 samples/hr" at the start. It never writes a newline, and clears
// itself after the last step.
func TestProgressBarShowsRunRateAndETA(t *testing.T) {
	var out bytes.Buffer
	clock := &fakeClock{t: time.Unix(1000, 0)}
	p := newProgress(progressBar, &out, 0, clock.now, 2, 100, 64, 0)
	for step := 1; step <= 51; step++ {
		clock.advance(10 * time.Millisecond)
		p.stepDone(step)
		if step == 1 {
			if got, want := lastStatus(out.String()), "epoch 1/2 step 1/100, 6400 samples/s, ETA 2.0s"; !strings.HasSuffix(got, want) {
				t.Fatalf("after the first step the status is %q, want it to end with %q", got, want)
			}
		}
	}
	got := lastStatus(out.String())
	for _, want := range []string{"  25% ▕█████░░░░░░░░░░░░░░░▏", "epoch 1/2 step 51/100, 6400 samples/s, ETA 1.5s"} {
		if !strings.Contains(got, want) {
			t.Errorf("status after 51 steps is %q, want it to contain %q", got, want)
		}
	}
	// Throttled: steps 1, 11, 21, 31, 41 and 51 drew, each in one write
	// that starts with '\r'.
	if n := strings.Count(out.String(), "\r"); n != 6 {
		t.Errorf("%d redraws in 51 steps of 10 ms, want 6 (one per 100 ms):\n%q", n, out.String())
	}
	for step := 52; step <= 200; step++ {
		clock.advance(10 * time.Millisecond)
		p.stepDone(step)
	}
	if s := out.String(); strings.Contains(s, "\n") || strings.Contains(s, "samples/hr") || !strings.HasSuffix(s, eraseLine) {
		t.Errorf("the bar wrote a newline, a rate per hour, or did not clear itself at the end:\n%q", s)
	}
}

// A run resumed at step 100 of 200 counts only its own steps in the rate:
// the restored ones took no time in this process.
func TestProgressBarAfterResume(t *testing.T) {
	var out bytes.Buffer
	clock := &fakeClock{t: time.Unix(1000, 0)}
	p := newProgress(progressBar, &out, 0, clock.now, 2, 100, 64, 100)
	clock.advance(20 * time.Millisecond)
	p.stepDone(101)
	got := lastStatus(out.String())
	for _, want := range []string{"  50% ▕", "epoch 2/2 step 1/100, 3200 samples/s, ETA 2.0s"} {
		if !strings.Contains(got, want) {
			t.Errorf("status %q lacks %q", got, want)
		}
	}
}

// A status wider than the terminal would wrap, and '\r' would redraw only
// its last row: it is cut to the width.
func TestProgressBarFitsTerminal(t *testing.T) {
	var out bytes.Buffer
	clock := &fakeClock{t: time.Unix(1000, 0)}
	p := newProgress(progressBar, &out, 40, clock.now, 2, 100, 64, 0)
	clock.advance(10 * time.Millisecond)
	p.stepDone(1)
	if got := lastStatus(out.String()); len([]rune(got)) != 39 {
		t.Errorf("status %q has %d columns on a 40-column terminal, want 39", got, len([]rune(got)))
	}
}

// Without a terminal, --progress on prints whole lines: one per tenth of an
// epoch (not at its end, where the epoch summary follows) ...
func TestProgressLines(t *testing.T) {
	var out bytes.Buffer
	clock := &fakeClock{t: time.Unix(1000, 0)}
	p := newProgress(progressLines, &out, 0, clock.now, 2, 100, 64, 0)
	for step := 1; step <= 200; step++ {
		clock.advance(10 * time.Millisecond)
		p.stepDone(step)
	}
	s := out.String()
	if strings.Contains(s, "\r") || !strings.HasSuffix(s, "\n") {
		t.Fatalf("plain progress is not whole lines:\n%q", s)
	}
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	if len(lines) != 18 {
		t.Fatalf("%d lines for 2 epochs, want 9 per epoch:\n%s", len(lines), s)
	}
	for i, want := range map[int]string{
		0:  "progress: epoch 1/2 step 10/100, 6400 samples/s, ETA 1.9s",
		8:  "progress: epoch 1/2 step 90/100, 6400 samples/s, ETA 1.1s",
		9:  "progress: epoch 2/2 step 10/100, 6400 samples/s, ETA 0.9s",
		17: "progress: epoch 2/2 step 90/100, 6400 samples/s, ETA 0.1s",
	} {
		if lines[i] != want {
			t.Errorf("line %d is %q, want %q", i, lines[i], want)
		}
	}
}

// ... and at least one every 10 s when a tenth of an epoch takes longer.
func TestProgressLinesSlowEpoch(t *testing.T) {
	var out bytes.Buffer
	clock := &fakeClock{t: time.Unix(1000, 0)}
	p := newProgress(progressLines, &out, 0, clock.now, 1, 1000, 64, 0)
	for step := 1; step <= 8; step++ {
		clock.advance(3 * time.Second)
		p.stepDone(step)
	}
	want := "progress: epoch 1/1 step 4/1000, 21 samples/s, ETA 49m48s\nprogress: epoch 1/1 step 8/1000, 21 samples/s, ETA 49m36s\n"
	if out.String() != want {
		t.Errorf("got\n%swant\n%s", out.String(), want)
	}
}

func TestFormatETA(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                        "0.0s",
		1490 * time.Millisecond:  "1.5s",
		12300 * time.Millisecond: "12s",
		65 * time.Second:         "1m05s",
		time.Hour + 2*time.Minute + 20*time.Second: "1h02m",
	} {
		if got := formatETA(d); got != want {
			t.Errorf("formatETA(%v) = %q, want %q", d, got, want)
		}
	}
}

// screen replays what a terminal does with the bytes it gets: '\r' goes to
// the start of the line, '\n' to the next one, and the two erase escapes
// erase. It returns the finished lines.
func screen(b string) []string {
	var lines []string
	var line []rune
	col := 0
	for len(b) > 0 {
		switch {
		case strings.HasPrefix(b, eraseToEOL):
			line, b = line[:col], b[len(eraseToEOL):]
			continue
		case strings.HasPrefix(b, "\033[2K"):
			line, b = nil, b[len("\033[2K"):]
			continue
		}
		r, size := utf8.DecodeRuneInString(b)
		b = b[size:]
		switch r {
		case '\r':
			col = 0
		case '\n':
			lines, line, col = append(lines, string(line)), nil, 0
		default:
			if col < len(line) {
				line[col] = r
			} else {
				line = append(line, r)
			}
			col++
		}
	}
	return lines
}

// On its own terminal (no gorun), the example shares it between the bar
// (stderr) and the result lines (stdout): every line must come out whole,
// with no piece of the bar in front of it, and the bar comes back after.
func TestOwnTerminalLinesAreClean(t *testing.T) {
	var term bytes.Buffer // stdout and stderr both go to the terminal
	clock := &fakeClock{t: time.Unix(1000, 0)}
	o := &output{cfg: &Config{Epochs: 2}, loud: true, stdout: &term, stderr: &term, style: progressBar, ownTerminal: true}
	o.prog = newProgress(o.style, o.stderr, 0, clock.now, 2, 10, 64, 0)
	var want []string
	for step := 1; step <= 20; step++ {
		clock.advance(50 * time.Millisecond)
		o.prog.stepDone(step)
		if step%5 == 0 {
			line := fmt.Sprintf("checkpoint: step %d saved", step)
			o.printf("%s\n", line)
			want = append(want, line)
			if step < 20 && !strings.HasPrefix(lastStatus(term.String()), "  ") {
				t.Fatalf("the bar was not redrawn after the line at step %d: %q", step, term.String())
			}
		}
	}
	o.stopProgress()
	o.printf("final: done\n")
	want = append(want, "final: done")
	got := screen(term.String())
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the terminal shows\n%s\nwant\n%s\nbytes: %q", strings.Join(got, "\n"), strings.Join(want, "\n"), term.String())
	}
}
