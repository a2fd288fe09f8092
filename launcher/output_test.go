package launcher

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// scriptedReader returns one chunk per Read, as a pipe does when the writer
// wrote it and nothing more is buffered; a func step runs between reads.
type scriptedReader struct{ steps []any }

func (r *scriptedReader) Read(p []byte) (int, error) {
	for len(r.steps) > 0 {
		step := r.steps[0]
		r.steps = r.steps[1:]
		switch s := step.(type) {
		case func():
			s()
		case string:
			return copy(p, s), nil
		}
	}
	return 0, io.EOF
}

// testSink is the output of a one-host job of np ranks, on con.
func testSink(con *Console, np int) *rankSink {
	lay := &layout{hosts: []Host{{Name: "localhost", Slots: np}}, pl: placement{host: make([]int, np)}, used: 1}
	return newRankSink(Job{NP: np, Console: con}, lay.labels(), lay.rankHosts(), nil)
}

// forwardScript runs a rank's stderr through the forwarder: statuses and
// lines, and a line of its stdout in the middle (hook).
func forwardScript(s *rankSink) {
	p := &rankProc{rank: 0, tail: &tail{max: 20}, out: s}
	p.pipes.Add(1)
	p.forward(&scriptedReader{steps: []any{
		"\rstep 1/3",
		"\rstep 2", "/3", // a status written in two pieces
		"\r\x1b[Kepoch 1 done\n", // the bar cleared, then a line
		"a\rb\nx\r\n",            // a line shows what follows its last \r; \r\n ends a line
		"\rstep 3/3 with a long description that does not fit",
		func() { s.line(0, false, []byte("result 1")) }, // stdout, on the same terminal
		"\r" + strings.Repeat(" ", 40) + "\r",           // a blank status clears it
		"\rlast status",                                 // never ended: cleared at the end
	}}, true)
	s.finish()
}

func TestForwardDrawsStatusesOnTerminal(t *testing.T) {
	var screen bytes.Buffer
	con := newTermConsole(&screen, &screen, true, 30)
	forwardScript(testSink(con, 1))
	want := "[0] step 1/3" +
		"\r\x1b[K[0] step 2" +
		"\r\x1b[K[0] step 2/3" +
		"\r\x1b[K" + "[0] epoch 1 done\n" +
		"[0] b\n[0] x\n" +
		"[0] step 3/3 with a long desc" + // cut to 29 of 30 columns
		"\r\x1b[K" + "[0] result 1\n" + "[0] step 3/3 with a long desc" +
		"\r\x1b[K" +
		"[0] last status" +
		"\r\x1b[K"
	if got := screen.String(); got != want {
		t.Errorf("the terminal got\n%q\nwant\n%q", got, want)
	}
}

func TestForwardWithoutTerminalPrintsNoStatus(t *testing.T) {
	var stdout, stderr bytes.Buffer
	con := NewConsole(&stdout, &stderr)
	forwardScript(testSink(con, 1))
	if got, want := stderr.String(), "[0] epoch 1 done\n[0] b\n[0] x\n"; got != want {
		t.Errorf("stderr %q, want %q", got, want)
	}
	if got, want := stdout.String(), "[0] result 1\n"; got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
}

// A line on stderr while a status is shown is written in one piece: the
// status erased, the line, the status drawn again.
func TestConsoleErasesStatusAroundLines(t *testing.T) {
	var out, screen bytes.Buffer
	con := newTermConsole(&out, &screen, false, 0)
	con.setStatus("a", "bar 1")
	con.writeLine(true, []byte("err line"))
	con.writeLine(false, []byte("out line")) // stdout is not the terminal: left alone
	con.setStatus("b", "other")              // the most recent status shows
	con.setStatus("b", " \x1b[0m ")          // blank: back to a's
	con.clearStatuses("a")
	want := "bar 1" + "\r\x1b[Kerr line\nbar 1" + "\r\x1b[Kother" + "\r\x1b[Kbar 1" + "\r\x1b[K"
	if screen.String() != want {
		t.Errorf("terminal got %q, want %q", screen.String(), want)
	}
	if out.String() != "out line\n" {
		t.Errorf("stdout got %q", out.String())
	}
}

func TestVisible(t *testing.T) {
	for in, want := range map[string]string{
		"plain":                    "plain",
		"a\rb":                     "b",
		"crlf\r":                   "crlf",
		"50%\r":                    "50%",
		"\r[bar]\x1b[2K\r":         "",
		"\r\x1b[Ktext":             "text",
		"old\r\x1b[2Knew":          "new",
		"\r" + "   " + "\r" + "ok": "ok",
	} {
		if got := string(visible([]byte(in))); got != want {
			t.Errorf("visible(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestFitWidth(t *testing.T) {
	for _, tc := range []struct {
		in    string
		width int
		want  string
	}{
		{"short", 10, "short"},
		{"0123456789", 10, "012345678"},
		{"▕███░░░▏ 50%", 6, "▕███░"},
		{"\x1b[31mred text\x1b[0m", 5, "\x1b[31mred \x1b[0m"},
		{"日本語テキスト", 7, "日本語"},
	} {
		if got := fitWidth(tc.in, tc.width); got != tc.want {
			t.Errorf("fitWidth(%q, %d) = %q, want %q", tc.in, tc.width, got, tc.want)
		}
	}
}

// A status waits behind its rank's held lines (the bar never runs ahead of
// the lines printed before it); another rank's status does not wait.
func TestStatusQueuesBehindHeldLines(t *testing.T) {
	var screen bytes.Buffer
	con := newTermConsole(&screen, &screen, true, 80)
	s := testSink(con, 2)
	s.fold.window = time.Hour
	s.line(0, false, []byte("epoch 1 done")) // held: rank 1 might print it too
	s.setStatus(0, true, "epoch 2 step 1")
	s.setStatus(0, true, "epoch 2 step 2") // replaces the one not drawn yet
	s.setStatus(1, true, "rank 1 bar")
	if got, want := screen.String(), "[1] rank 1 bar"; got != want {
		t.Fatalf("terminal %q, want only rank 1's status %q", got, want)
	}
	s.streamEnded(1, false) // rank 1 cannot print the line any more
	want := "[1] rank 1 bar" + "\r\x1b[K[0] epoch 1 done\n[1] rank 1 bar" + "\r\x1b[K[0] epoch 2 step 2"
	if got := screen.String(); got != want {
		t.Errorf("terminal\n%q\nwant\n%q", got, want)
	}
	s.rankExited(0)
	s.finish()
	if got, want := screen.String(), want+"\r\x1b[K[1] rank 1 bar"+"\r\x1b[K"; got != want {
		t.Errorf("after the end:\n%q\nwant\n%q", got, want)
	}
}

// syncBuffer is a bytes.Buffer that says when it was written.
type syncBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	written chan struct{}
}

func newSyncBuffer() *syncBuffer { return &syncBuffer{written: make(chan struct{}, 1000)} }

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case s.written <- struct{}{}:
	default:
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func testFolder(np int, window time.Duration) (*folder, *syncBuffer) {
	out := newSyncBuffer()
	labels := make([]string, np)
	for r := range labels {
		labels[r] = strconv.Itoa(r)
	}
	return newFolder(NewConsole(out, out), labels, make([]string, np), window), out
}

// With a window of an hour, whatever is printed at once was not waited for.
func TestFolderFoldsAsSoonAsEveryRankPrinted(t *testing.T) {
	f, out := testFolder(3, time.Hour)
	for _, r := range []int{2, 0} {
		f.line(r, true, []byte("usage: train [flags]"))
	}
	if out.String() != "" {
		t.Fatalf("printed before rank 1 could join: %q", out.String())
	}
	f.line(1, true, []byte("usage: train [flags]"))
	f.line(1, true, []byte("  -lr float"))
	f.line(0, true, []byte("  -lr float"))
	f.streamEnded(2, true) // rank 2 exits before printing the second line
	if want := "[0-2] usage: train [flags]\n[0-1]   -lr float\n"; out.String() != want {
		t.Errorf("got %q, want %q", out.String(), want)
	}
}

func TestFolderDoesNotHoldDifferentLines(t *testing.T) {
	f, out := testFolder(3, time.Hour)
	f.line(0, false, []byte("rank 0: epoch 1 loss 0.31"))
	f.line(1, false, []byte("rank 1: epoch 1 loss 0.29"))
	f.line(2, false, []byte("rank 2: epoch 1 loss 0.30"))
	f.line(0, false, []byte("same"))
	f.line(1, true, []byte("same")) // another stream: not the same line
	want := "[0] rank 0: epoch 1 loss 0.31\n[1] rank 1: epoch 1 loss 0.29\n[2] rank 2: epoch 1 loss 0.30\n[0] same\n"
	if out.String() != want {
		t.Errorf("got %q, want %q (the last line is held: no other rank prints)", out.String(), want)
	}
	f.flush()
	if want += "[1] same\n"; out.String() != want {
		t.Errorf("after flush got %q, want %q", out.String(), want)
	}
}

func TestFolderHoldsALoneLineOnlyForTheWindow(t *testing.T) {
	f, out := testFolder(2, 20*time.Millisecond)
	start := time.Now()
	f.line(0, false, []byte("only rank 0 prints this"))
	for out.String() == "" {
		select {
		case <-out.written:
		case <-time.After(10 * time.Second):
			t.Fatal("the line was never printed")
		}
	}
	if out.String() != "[0] only rank 0 prints this\n" {
		t.Errorf("got %q", out.String())
	}
	t.Logf("held %v", time.Since(start))
}

// Ranks printing concurrently, from a few lines so that many fold: every
// line is printed, and each rank's lines in its order.
func TestFolderLosesNoLineAndKeepsEachRanksOrder(t *testing.T) {
	const np, n = 4, 300
	f, out := testFolder(np, time.Millisecond)
	sent := make([][]string, np)
	var wg sync.WaitGroup
	for r := range np {
		rng := rand.New(rand.NewPCG(uint64(r), 1))
		for range n {
			sent[r] = append(sent[r], fmt.Sprintf("line %c", 'a'+rng.IntN(2)))
		}
		wg.Go(func() {
			for i, l := range sent[r] {
				f.line(r, i%7 == 0, []byte(l))
			}
			f.streamEnded(r, false)
			f.streamEnded(r, true)
		})
	}
	wg.Wait()
	f.flush()
	got := make([][]string, np)
	folded := 0
	re := regexp.MustCompile(`^\[([0-9,-]+)\] (.*)$`)
	for _, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		m := re.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("line %q", l)
		}
		ranks := expandRanks(t, m[1])
		if len(ranks) > 1 {
			folded++
		}
		for _, r := range ranks {
			got[r] = append(got[r], m[2])
		}
	}
	for r := range np {
		if !slices.Equal(got[r], sent[r]) {
			t.Errorf("rank %d: printed %d lines, sent %d, or not in order", r, len(got[r]), len(sent[r]))
		}
	}
	t.Logf("%d lines of %d ranks printed as %d lines, %d of them folded", np*n, np, strings.Count(out.String(), "\n"), folded)
}

func expandRanks(t *testing.T, label string) []int {
	var out []int
	for _, part := range strings.Split(label, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err1 := strconv.Atoi(lo)
		b, err2 := a, error(nil)
		if isRange {
			b, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil {
			t.Fatalf("label %q", label)
		}
		for r := a; r <= b; r++ {
			out = append(out, r)
		}
	}
	return out
}

func TestFolderOff(t *testing.T) {
	f, out := testFolder(2, -1)
	f.line(0, true, []byte("usage"))
	f.line(1, true, []byte("usage"))
	if want := "[0] usage\n[1] usage\n"; out.String() != want {
		t.Errorf("got %q, want %q", out.String(), want)
	}
}

func TestFolderLabels(t *testing.T) {
	f, _ := testFolder(6, time.Hour)
	for _, tc := range []struct {
		ranks []int
		want  string
	}{
		{[]int{3}, "3"}, {[]int{0, 1, 2, 3}, "0-3"}, {[]int{2, 0}, "0,2"}, {[]int{0, 1, 3, 4, 5}, "0-1,3-5"},
	} {
		if got := f.label(tc.ranks); got != tc.want {
			t.Errorf("label(%v) = %q, want %q", tc.ranks, got, tc.want)
		}
	}
	f.labels = []string{"n1:0", "n1:1", "n2:2", "n2:3", "n2:4", "n3:5"}
	f.hosts = []string{"n1", "n1", "n2", "n2", "n2", "n3"}
	if got, want := f.label([]int{0, 1, 2, 3, 5}), "n1:0-1,n2:2-3,n3:5"; got != want {
		t.Errorf("label = %q, want %q", got, want)
	}
}

func TestRankErrorMessage(t *testing.T) {
	usage := []string{"flag provided but not defined: -epochs", "Usage of ./train:", "  -lr float", "    \tlearning rate", "  -batch int", "    \tbatch size"}
	e := &RankError{Rank: 0, PID: 7, Status: "exit status 2", LastStderr: usage, StderrShown: true, Same: []int{1, 2, 3}}
	if got, want := e.Error(), "rank 0 (pid 7) failed: exit status 2 (its stderr is above); ranks 1, 2, 3 failed the same way (exit status 2)"; got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	// Scrolled away: only the last few lines again.
	e = &RankError{Rank: 1, Host: "node2", Status: "exit status 1", LastStderr: usage, Others: []string{"rank 0 (exit status 2)"}}
	want := "rank 1 on host node2 failed: exit status 1; also failed: rank 0 (exit status 2); its last stderr lines:" +
		"\n    Usage of ./train:\n      -lr float\n        \tlearning rate\n      -batch int\n        \tbatch size"
	if got := e.Error(); got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

func TestSameFailureIgnoresRankNumbers(t *testing.T) {
	proc := func(rank int, code string, lines ...string) *rankProc {
		p := &rankProc{rank: rank, tail: &tail{max: 20}, err: fmt.Errorf("exit status %s", code)}
		for _, l := range lines {
			p.tail.add(l)
		}
		return p
	}
	a := proc(1, "2", "rank 1: allreduce #3: rank 2 aborted: recv from rank 0: EOF", "default 0.1")
	b := proc(2, "2", "rank 2: allreduce #3: rank 3 aborted: recv from rank 1: EOF", "default 0.1")
	c := proc(3, "1", "rank 3: allreduce #3: rank 0 aborted: recv from rank 2: EOF", "default 0.1")
	d := proc(0, "2", "rank 0: allreduce #4: rank 1 aborted: recv from rank 3: EOF", "default 0.1")
	if !sameFailure(a, b) {
		t.Error("a and b differ only in rank numbers")
	}
	if sameFailure(a, c) || sameFailure(a, d) {
		t.Error("another status, or another collective, is not the same failure")
	}
}
