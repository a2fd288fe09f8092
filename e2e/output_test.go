package e2e

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// labelRE splits "[0-1,3] text" into the ranks and the text.
var labelRE = regexp.MustCompile(`^\[([0-9,-]+)\] (.*)$`)

// byRank undoes gorun's prefixes and folding: each rank's lines, in order.
func byRank(t *testing.T, lines []string) map[int][]string {
	t.Helper()
	out := map[int][]string{}
	for _, l := range lines {
		m := labelRE.FindStringSubmatch(l)
		if m == nil {
			t.Errorf("line without a rank prefix: %q", l)
			continue
		}
		for _, part := range strings.Split(m[1], ",") {
			lo, hi, isRange := strings.Cut(part, "-")
			a, _ := strconv.Atoi(lo)
			b := a
			if isRange {
				b, _ = strconv.Atoi(hi)
			}
			for r := a; r <= b; r++ {
				out[r] = append(out[r], m[2])
			}
		}
	}
	return out
}

// statusProgLines are the lines rankprog's status mode prints, per stream.
func statusProgLines(tty string) (stdout, stderr []string) {
	stdout = []string{"tty=" + tty}
	for i := 1; i <= 50; i++ {
		stdout = append(stdout, fmt.Sprintf("result %d", i))
	}
	stderr = []string{"checkpoint 10", "checkpoint 20", "checkpoint 30", "checkpoint 40", "checkpoint 50"}
	stderr = slices.Insert(stderr, 2, "half 25")
	return stdout, append(stderr, "half 50")
}

func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}

// A rank drawing a status ("\rstep 3/50", in pieces) between its lines:
// without a terminal gorun prints whole lines, in order, and no status.
func TestGorunStatusNotInPlainOutput(t *testing.T) {
	out, errOut, code := run(t, []string{"RANKPROG_MODE=status"}, gorunBin, "-np", "2", rankprogBin)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	wantOut, wantErr := statusProgLines("")
	gotOut, gotErr := byRank(t, splitLines(out)), byRank(t, splitLines(errOut))
	for r := range 2 {
		if !slices.Equal(gotOut[r], wantOut) {
			t.Errorf("rank %d stdout lines:\n%q\nwant\n%q", r, gotOut[r], wantOut)
		}
		if !slices.Equal(gotErr[r], wantErr) {
			t.Errorf("rank %d stderr lines:\n%q\nwant\n%q", r, gotErr[r], wantErr)
		}
	}
	if strings.ContainsAny(out+errOut, "\r\x1b") || strings.Contains(out+errOut, "step") {
		t.Errorf("status text or control characters in the output:\nstdout:\n%q\nstderr:\n%q", out, errOut)
	}
}

// openPTY opens a pseudo-terminal of 40 rows and 200 columns.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	fd := int(master.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	slave, err = os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetWinsize(int(slave.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 40, Col: 200}); err != nil {
		t.Fatal(err)
	}
	return master, slave
}

// screen plays terminal output: it returns the lines that scrolled up and
// the last line, as they show.
func screen(b []byte) (lines []string, last string) {
	var cells []rune
	cursor := 0
	s := string(b)
	for i := 0; i < len(s); {
		switch {
		case strings.HasPrefix(s[i:], "\x1b["):
			j := i + 2
			for j < len(s) && (s[j] < 0x40 || s[j] > 0x7e) {
				j++
			}
			if j < len(s) && s[j] == 'K' {
				cells = cells[:min(cursor, len(cells))]
			}
			i = j + 1
			continue
		case s[i] == '\r':
			cursor = 0
		case s[i] == '\n':
			lines = append(lines, string(cells))
			cells, cursor = nil, 0
		default:
			r := []rune(s[i:])[0]
			if cursor < len(cells) {
				cells[cursor] = r
			} else {
				cells = append(cells, r)
			}
			cursor++
			i += len(string(r))
			continue
		}
		i++
	}
	return lines, string(cells)
}

// On a terminal, the ranks get GORUN_TTY=1 and their statuses show on the
// last line, erased before each output line and drawn again after it: the
// lines that scroll up are whole and in order, and the status is gone at the
// end.
func TestGorunStatusOnTerminal(t *testing.T) {
	master, slave := openPTY(t)
	defer master.Close()
	cmd := exec.Command(gorunBin, "-np", "2", rankprogBin)
	cmd.Env = append(os.Environ(), "RANKPROG_MODE=status")
	cmd.Stdout, cmd.Stderr = slave, slave
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	var term bytes.Buffer
	read := make(chan struct{})
	go func() { io.Copy(&term, master); close(read) }() // ends with EIO once gorun exits
	select {
	case <-read:
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		t.Fatal("gorun did not finish")
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%v\n%q", err, term.String())
	}
	raw := strings.ReplaceAll(term.String(), "\r\n", "\n") // the terminal's own newline translation
	lines, last := screen([]byte(raw))
	wantOut, wantErr := statusProgLines("1")
	got := byRank(t, lines)
	for r := range 2 {
		var outs, errs []string
		for _, l := range got[r] {
			if strings.HasPrefix(l, "tty=") || strings.HasPrefix(l, "result") {
				outs = append(outs, l)
			} else {
				errs = append(errs, l)
			}
		}
		if !slices.Equal(outs, wantOut) || !slices.Equal(errs, wantErr) {
			t.Errorf("rank %d: the terminal shows\n%q\n%q\nwant\n%q\n%q", r, outs, errs, wantOut, wantErr)
		}
	}
	if !regexp.MustCompile(`\[[01]\] step \d+/50`).MatchString(raw) {
		t.Errorf("no status was drawn: %q", raw)
	}
	if last != "" {
		t.Errorf("the last line still shows %q", last)
	}
	if t.Failed() {
		t.Logf("terminal bytes: %q", raw)
	}
}

// foldEnv widens the window in which ranks' identical lines fold (100ms by
// default) so that ranks started late on a busy machine (go test ./... runs
// packages side by side) still join: lines are printed as soon as every rank
// has printed them or exited, so this makes nothing slower.
var foldEnv = []string{"GORUN_FOLD_WINDOW=20s"}

// A bad flag to the program: its usage is printed once, for all ranks, and
// the summary names one rank and says the others failed the same way.
func TestGorunFoldsTheSameErrorOfEveryRank(t *testing.T) {
	start := time.Now()
	out, errOut, code := run(t, foldEnv, gorunBin, "-np", "3", rankprogBin, "--epochs=x")
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("took %v: lines were held for the fold window, not printed once every rank had", took)
	}
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	usage := []string{
		`invalid value "x" for flag -epochs: parse error`,
		"Usage of " + rankprogBin + ":",
		"  -batch int", "    \tsamples per step and rank (default 32)",
		"  -epochs int", "    \tpasses over the data (default 1)",
		"  -lr float", "    \tlearning rate (default 0.1)",
	}
	lines := splitLines(errOut)
	if len(lines) == 0 {
		t.Fatalf("no stderr; stdout:\n%s", out)
	}
	summary := lines[len(lines)-1]
	got := byRank(t, lines[:len(lines)-1])
	for r := range 3 {
		if !slices.Equal(got[r], usage) {
			t.Errorf("rank %d's lines: %q", r, got[r])
		}
	}
	if !regexp.MustCompile(`^gorun: job failed: rank 0 \(pid \d+\) failed: exit status 2 \(its stderr is above\); ranks 1, 2 failed the same way \(exit status 2\)$`).MatchString(summary) {
		t.Errorf("summary %q", summary)
	}
	if len(lines) != len(usage)+1 {
		t.Errorf("%d lines of stderr, want the usage once (%d lines) and the summary:\n%s", len(lines), len(usage), errOut)
	}
	t.Logf("stderr:\n%s", errOut)
}

// The program's --help, on every rank, is printed once; with
// GORUN_FOLD_WINDOW=0, once per rank.
func TestGorunFoldsTheProgramsHelp(t *testing.T) {
	out, errOut, code := run(t, foldEnv, gorunBin, "-np", "4", rankprogBin, "--help")
	if code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
	want := "[0-3] Usage of " + rankprogBin + ":\n[0-3]   -batch int\n"
	if !strings.HasPrefix(errOut, want) || strings.Count(errOut, "\n") != 7 || out != "" {
		t.Errorf("stdout %q\nstderr:\n%s\nwant the usage once, starting with:\n%s", out, errOut, want)
	}

	_, errOut, _ = run(t, []string{"GORUN_FOLD_WINDOW=0"}, gorunBin, "-np", "4", rankprogBin, "--help")
	for r := range 4 {
		if n := strings.Count(errOut, fmt.Sprintf("[%d] Usage of", r)); n != 1 {
			t.Errorf("GORUN_FOLD_WINDOW=0: rank %d's usage printed %d times, want once unfolded:\n%s", r, n, errOut)
		}
	}
}
