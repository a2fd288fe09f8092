// gorun's terminal or plain output: its own messages, the ranks' lines,
// and the ranks' status lines drawn live below them on a terminal.

package launcher

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"

	"github.com/rivo/uniseg"
	"golang.org/x/term"
)

// EnvTTY is set to 1 in every rank's environment when gorun's stderr is a
// terminal, so a rank knows that a status line it draws (text after a '\r',
// not ended by '\n') will be shown live at the bottom of that terminal.
const EnvTTY = "GORUN_TTY"

// eraseLine returns the cursor to the start of the line and erases it.
const eraseLine = "\r\x1b[K"

// Console is where gorun writes: the ranks' lines, its own messages and, when
// its stderr is a terminal, one live status line at the bottom of the screen
// (a rank's progress bar, or gorun's own "building" timer). Every write goes
// through one mutex: before a line is written the status is erased, and after
// it the status is drawn again, so lines and the status never mix.
//
// A write that fails because the reader went away (EPIPE: gorun | head; EIO:
// the terminal closed) makes Closed ready; Run stops the job when it is.
type Console struct {
	mu         sync.Mutex
	stdout     io.Writer
	stderr     io.Writer
	term       bool       // stderr is a terminal: statuses are drawn on it
	stdoutTerm bool       // stdout is a terminal too: erase the status before writing to it
	width      func() int // columns of the terminal, 0 if unknown
	statuses   []consoleStatus
	shown      string // the status line on the screen now, "" if none
	lines      int64  // lines written so far
	dead       [2]bool
	closed     chan struct{}
	closeErr   error
}

type consoleStatus struct{ key, text string }

// NewConsole writes to stdout and stderr; statuses are drawn when stderr is a
// terminal.
func NewConsole(stdout, stderr io.Writer) *Console {
	c := &Console{stdout: stdout, stderr: stderr, closed: make(chan struct{})}
	if f, ok := stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fd := int(f.Fd())
		c.term = true
		c.width = func() int {
			w, _, err := term.GetSize(fd)
			if err != nil {
				return 0
			}
			return w
		}
		if o, ok := stdout.(*os.File); ok && term.IsTerminal(int(o.Fd())) {
			c.stdoutTerm = true
		}
	}
	return c
}

// newTermConsole is a Console that takes its writers for a terminal of the
// given width (for tests).
func newTermConsole(stdout, stderr io.Writer, stdoutTerm bool, width int) *Console {
	c := NewConsole(stdout, stderr)
	c.term, c.stdoutTerm = true, stdoutTerm
	c.width = func() int { return width }
	return c
}

// Terminal says whether statuses are drawn (stderr is a terminal).
func (c *Console) Terminal() bool { return c.term }

// Closed is ready once stdout or stderr can no longer be written.
func (c *Console) Closed() <-chan struct{} { return c.closed }

// Logf writes one of gorun's own messages, "gorun: ...", to stderr.
func (c *Console) Logf(format string, args ...any) {
	c.writeLine(true, fmt.Appendf(nil, "gorun: "+format, args...))
}

// writeLine writes line and a newline to stderr (toErr) or stdout, with the
// status erased around it when both are on the terminal.
func (c *Console) writeLine(toErr bool, line []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lines++
	switch {
	case c.shown == "" || !toErr && !c.stdoutTerm:
		c.write(b2i(toErr), append(line[:len(line):len(line)], '\n'))
	case toErr:
		// One write, so the terminal never shows the line without the
		// status erased first.
		b := make([]byte, 0, len(eraseLine)+len(line)+1+len(c.shown))
		b = append(append(append(append(b, eraseLine...), line...), '\n'), c.shown...)
		c.write(stderrStream, b)
	default:
		c.write(stderrStream, []byte(eraseLine))
		c.write(stdoutStream, append(line[:len(line):len(line)], '\n'))
		c.write(stderrStream, []byte(c.shown))
	}
}

// lineCount is how many lines have been written so far.
func (c *Console) lineCount() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lines
}

// setStatus sets the status under key (a rank's stream, or gorun's build);
// blank text removes it. The screen shows the most recently set status. On
// anything but a terminal it does nothing.
func (c *Console) setStatus(key, text string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.term {
		return
	}
	for i, s := range c.statuses {
		if s.key == key {
			if s.text == text {
				return
			}
			c.statuses = append(c.statuses[:i], c.statuses[i+1:]...)
			break
		}
	}
	if !blank(text) {
		c.statuses = append(c.statuses, consoleStatus{key, text})
	}
	c.redraw()
}

// clearStatuses removes every status whose key starts with prefix.
func (c *Console) clearStatuses(prefix string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	kept := c.statuses[:0]
	for _, s := range c.statuses {
		if len(s.key) < len(prefix) || s.key[:len(prefix)] != prefix {
			kept = append(kept, s)
		}
	}
	clear(c.statuses[len(kept):])
	c.statuses = kept
	c.redraw()
}

func (c *Console) redraw() {
	want := ""
	if n := len(c.statuses); n > 0 {
		want = fitWidth(c.statuses[n-1].text, c.width())
	}
	if want == c.shown {
		return
	}
	var b []byte
	if c.shown != "" {
		b = append(b, eraseLine...)
	}
	b = append(b, want...)
	c.shown = want
	c.write(stderrStream, b)
}

// The console's two streams, as write takes them (stdout and stderr may be
// the same writer, so the stream is named, not guessed from the writer).
const (
	stdoutStream = 0
	stderrStream = 1
)

// write writes b to stream i (stdoutStream or stderrStream); once it has
// failed because its reader is gone, it is not written again, and Closed
// becomes ready.
func (c *Console) write(i int, b []byte) {
	w := c.stdout
	if i == stderrStream {
		w = c.stderr
	}
	if c.dead[i] {
		return
	}
	if _, err := w.Write(b); err != nil && (errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.EIO)) {
		c.dead[i] = true
		if c.closeErr == nil {
			c.closeErr = &OutputClosedError{Stream: [2]string{"standard output", "standard error"}[i], Err: err}
			close(c.closed)
		}
	}
}

// closedErr is why Closed is ready.
func (c *Console) closedErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closeErr
}

// OutputClosedError says gorun stopped the job because it could no longer
// write the ranks' output: the reader of its stdout or stderr went away
// (gorun ... | head) or its terminal closed.
type OutputClosedError struct {
	Stream string // "standard output" or "standard error"
	Err    error
}

func (e *OutputClosedError) Error() string {
	why := "broken pipe"
	if errors.Is(e.Err, syscall.EIO) {
		why = "the terminal is gone"
	}
	return fmt.Sprintf("%s was closed (%s)", e.Stream, why)
}

func (e *OutputClosedError) Unwrap() error { return e.Err }

// lineWriter is an io.Writer that hands whole lines to the console (for go
// build's output); Flush writes a last line without a newline.
type lineWriter struct {
	con   *Console
	toErr bool
	sp    lineSplitter
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.sp.feed(p, w.emit)
	return len(p), nil
}

func (w *lineWriter) Flush() { w.sp.finish(w.emit) }

func (w *lineWriter) emit(line []byte) { w.con.writeLine(w.toErr, line) }

// visible is what a terminal shows of a line that may hold carriage
// returns: the text after the last '\r' (a trailing '\r', as in "\r\n" or a
// bar drawn as "50%\r", leaves the text before it), and after the last
// "erase line" escape.
func visible(b []byte) []byte {
	b = bytes.TrimRight(b, "\r")
	if i := bytes.LastIndexByte(b, '\r'); i >= 0 {
		b = b[i+1:]
	}
	if i := bytes.LastIndex(b, []byte("\x1b[2K")); i >= 0 {
		b = b[i+len("\x1b[2K"):]
	}
	for _, erase := range []string{"\x1b[K", "\x1b[0K"} {
		b = bytes.TrimPrefix(b, []byte(erase))
	}
	return b
}

// blank says whether s shows nothing: only spaces and escape sequences.
func blank(s string) bool {
	for i := 0; i < len(s); i++ {
		if n := csiLen(s[i:]); n > 0 {
			i += n - 1
			continue
		}
		switch s[i] {
		case ' ', '\t', '\r', '\n':
		default:
			return false
		}
	}
	return true
}

// csiLen is the length of the ANSI control sequence (ESC [ ... final byte)
// at the start of s, or 0.
func csiLen(s string) int {
	if len(s) < 2 || s[0] != 0x1b || s[1] != '[' {
		return 0
	}
	for i := 2; i < len(s); i++ {
		if s[i] >= 0x40 && s[i] <= 0x7e {
			return i + 1
		}
	}
	return 0
}

// fitWidth cuts s to fewer than width columns (escape sequences take none),
// so the status never wraps: erasing it erases only the last line.
func fitWidth(s string, width int) string {
	if width <= 1 {
		return s
	}
	cols, escapes := 0, false
	state := -1
	for i := 0; i < len(s); {
		if n := csiLen(s[i:]); n > 0 {
			i += n
			escapes = true
			continue
		}
		cluster, _, w, st := uniseg.FirstGraphemeClusterInString(s[i:], state)
		state = st
		if cols+w > width-1 {
			if escapes {
				return s[:i] + "\x1b[0m"
			}
			return s[:i]
		}
		cols += w
		i += len(cluster)
	}
	return s
}
