// The ranks' output: split into lines, folded when several ranks print the
// same, prefixed and handed to the console or --output-dir.

package launcher

import (
	"bytes"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// maxLine is the longest line gorun holds: a stream that writes more without
// a newline has it passed on as a line of its own.
const maxLine = 1 << 20

// lineSplitter cuts one output stream of a rank into lines and a status. A
// status is the text after a '\r' that no '\n' has ended yet, which is how a
// progress bar redraws itself; a line is what a '\n' ends, as a terminal
// would show it (see visible).
type lineSplitter struct {
	pending []byte // the line not ended yet
}

// feed adds b to the stream and calls line for every line it ends. The slice
// line gets is only valid during the call.
func (s *lineSplitter) feed(b []byte, line func([]byte)) {
	for {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			break
		}
		s.pending = append(s.pending, b[:i]...)
		line(visible(s.pending))
		s.pending = s.pending[:0]
		b = b[i+1:]
	}
	s.pending = append(s.pending, b...)
	// Only what follows the last '\r' can still show (a trailing '\r' keeps
	// the text before it): drop the rest, so a bar redrawn for hours does not
	// grow the buffer.
	if len(s.pending) > 1 {
		if i := bytes.LastIndexByte(s.pending[:len(s.pending)-1], '\r'); i > 0 {
			s.pending = s.pending[:copy(s.pending, s.pending[i:])]
		}
	}
	if len(s.pending) > maxLine {
		line(visible(s.pending))
		s.pending = s.pending[:0]
	}
}

// status is the stream's current status: the visible text of the unended
// line if it holds a '\r', else "" (no status).
func (s *lineSplitter) status() string {
	if bytes.IndexByte(s.pending, '\r') < 0 {
		return ""
	}
	return string(visible(s.pending))
}

// finish is called at the end of the stream: an unended line without a '\r'
// is still a line; one with a '\r' was a status, which ends with the stream.
func (s *lineSplitter) finish(line func([]byte)) {
	if len(s.pending) > 0 && bytes.IndexByte(s.pending, '\r') < 0 {
		line(visible(s.pending))
	}
	s.pending = nil
}

// forwardStream reads one stream of a rank until it ends, handing on lines
// and status changes. A status is taken when a read leaves nothing more
// buffered in the pipe (it returned less than the buffer), so a bar drawn in
// several writes is seen whole.
func forwardStream(r io.Reader, line func([]byte), status func(string)) {
	var sp lineSplitter
	shown := ""
	setStatus := func(s string) {
		if s != shown && status != nil {
			status(s)
		}
		shown = s
	}
	// A line ends the status of its stream (the terminal moves on to the
	// next line): clear it first, so the status is not redrawn in between.
	lineAfterStatus := func(l []byte) {
		setStatus("")
		line(l)
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			sp.feed(buf[:n], lineAfterStatus)
			if n < len(buf) {
				setStatus(sp.status())
			}
		}
		if err != nil {
			sp.finish(lineAfterStatus)
			setStatus("")
			return
		}
	}
}

// DefaultFoldWindow is how long a line is held, by default, for other ranks
// to print the same (Job.FoldWindow).
const DefaultFoldWindow = 100 * time.Millisecond

// folder prints the ranks' lines, folding identical lines that several ranks
// print at about the same time into one, prefixed with the set of ranks
// ("[0-3] usage: ..."), so a usage message or a --help is shown once, not
// once per rank.
//
// Each rank has a queue of lines not printed yet. The oldest line at the head
// of a queue is printed, together with every other head that is the same
// line (same text, same stream), as soon as every rank that could still
// print it (its stream is open) has, or another rank's head is a different
// line, or it has waited the window. So no line is lost, each rank's lines
// keep their order, lines are printed in the order they arrived (but for the
// copies folded into one), and a line waits at most the window, and only
// while no other rank prints something different. A rank's status changes
// queue behind its lines, so its bar never runs ahead of them, and are drawn
// as soon as they reach the head.
type folder struct {
	mu      sync.Mutex
	con     *Console
	labels  []string      // per rank: "2", or "host:2"
	hosts   []string      // per rank: its host, "" on a one-host job
	window  time.Duration // < 0: no folding
	queues  [][]heldLine
	open    [][2]bool // per rank: stdout, stderr not ended yet
	lastErr []int64   // per rank: the console's line count after its last stderr line
	// status draws a rank's status; nil when statuses are not shown.
	status func(rank int, isErr bool, text string)
	timer  *time.Timer
	closed bool
}

type heldLine struct {
	text     string
	isErr    bool
	isStatus bool // a status change, not a line
	at       time.Time
}

func newFolder(con *Console, labels, hosts []string, window time.Duration) *folder {
	n := len(labels)
	f := &folder{con: con, labels: labels, hosts: hosts, window: window,
		queues: make([][]heldLine, n), open: make([][2]bool, n), lastErr: make([]int64, n)}
	for r := range f.open {
		f.open[r] = [2]bool{true, true}
		f.lastErr[r] = -1
	}
	return f
}

// line takes a line of a rank.
func (f *folder) line(rank int, isErr bool, text []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if rank < 0 || rank >= len(f.queues) {
		f.emit([]int{rank}, string(text), isErr)
		return
	}
	f.queues[rank] = append(f.queues[rank], heldLine{text: string(text), isErr: isErr, at: time.Now()})
	f.pump()
}

// add makes room for one more rank, numbered len(labels): a process an
// elastic job starts later (a joiner) gets the next number.
func (f *folder) add(label, host string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.labels = append(f.labels, label)
	f.hosts = append(f.hosts, host)
	f.queues = append(f.queues, nil)
	f.open = append(f.open, [2]bool{true, true})
	f.lastErr = append(f.lastErr, -1)
}

// setStatus takes a status change of a rank's stream ("" clears it).
func (f *folder) setStatus(rank int, isErr bool, text string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.status == nil || rank < 0 || rank >= len(f.queues) {
		return
	}
	q := f.queues[rank]
	if n := len(q); n > 0 && q[n-1].isStatus && q[n-1].isErr == isErr {
		q[n-1].text = text // not drawn yet: only the latest matters
		return
	}
	f.queues[rank] = append(q, heldLine{text: text, isErr: isErr, isStatus: true, at: time.Now()})
	f.pump()
}

// streamEnded says a rank's stream ended: it cannot join a fold any more.
func (f *folder) streamEnded(rank int, isErr bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if rank >= 0 && rank < len(f.open) {
		f.open[rank][b2i(isErr)] = false
	}
	f.pump()
}

// flush prints every line held, in order, and holds none from now on.
func (f *folder) flush() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	f.pump()
	if f.timer != nil {
		f.timer.Stop()
	}
}

// lastStderr is the console's line count after the last stderr line of rank
// was printed, or -1 if none was.
func (f *folder) lastStderr(rank int) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastErr[rank]
}

func (f *folder) pump() {
	for {
		// Statuses at the head of a queue wait for nothing.
		for r, q := range f.queues {
			for len(q) > 0 && q[0].isStatus {
				f.status(r, q[0].isErr, q[0].text)
				q = q[1:]
			}
			f.queues[r] = q
		}
		oldest := -1
		for r, q := range f.queues {
			if len(q) > 0 && (oldest < 0 || q[0].at.Before(f.queues[oldest][0].at)) {
				oldest = r
			}
		}
		if oldest < 0 {
			return
		}
		h := f.queues[oldest][0]
		var group []int
		complete, differs := true, false
		for r, q := range f.queues {
			switch {
			case f.window < 0 && r != oldest:
			case len(q) > 0 && q[0].text == h.text && q[0].isErr == h.isErr:
				group = append(group, r)
			case len(q) > 0:
				differs = true
			case f.open[r][b2i(h.isErr)]:
				complete = false
			}
		}
		if !f.closed && !complete && !differs && f.window > 0 {
			if wait := time.Until(h.at.Add(f.window)); wait > 0 {
				if f.timer == nil {
					f.timer = time.AfterFunc(wait, f.tick)
				} else {
					f.timer.Reset(wait)
				}
				return
			}
		}
		for _, r := range group {
			f.queues[r] = f.queues[r][1:]
		}
		f.emit(group, h.text, h.isErr)
	}
}

func (f *folder) tick() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pump()
}

func (f *folder) emit(ranks []int, text string, isErr bool) {
	label := f.label(ranks)
	b := make([]byte, 0, len(label)+3+len(text))
	b = append(append(append(append(b, '['), label...), "] "...), text...)
	f.con.writeLine(isErr, b)
	if isErr {
		n := f.con.lineCount()
		for _, r := range ranks {
			if r >= 0 && r < len(f.lastErr) {
				f.lastErr[r] = n
			}
		}
	}
}

// label names a set of ranks: "2", "0-3", "0,2", or with hosts
// "node1:0-1,node2:2-3".
func (f *folder) label(ranks []int) string {
	if len(ranks) == 1 {
		if r := ranks[0]; r >= 0 && r < len(f.labels) {
			return f.labels[r]
		}
		return strconv.Itoa(ranks[0])
	}
	ranks = slices.Sorted(slices.Values(ranks))
	var parts []string
	for i := 0; i < len(ranks); {
		j := i
		for j+1 < len(ranks) && ranks[j+1] == ranks[j]+1 && f.host(ranks[j+1]) == f.host(ranks[i]) {
			j++
		}
		p := strconv.Itoa(ranks[i])
		if j > i {
			p += "-" + strconv.Itoa(ranks[j])
		}
		if h := f.host(ranks[i]); h != "" {
			p = h + ":" + p
		}
		parts = append(parts, p)
		i = j + 1
	}
	return strings.Join(parts, ",")
}

func (f *folder) host(r int) string {
	if r < 0 || r >= len(f.hosts) {
		return ""
	}
	return f.hosts[r]
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// rankSink is where the ranks' output goes during one attempt of a job: the
// --output-dir files, then the folder (or Job.Line), and the ranks'
// statuses, through the folder, to the console when it is a terminal.
type rankSink struct {
	files   *outputFiles
	deliver func(rank int, isErr bool, line []byte)
	fold    *folder // nil when Job.Line takes the lines
	con     *Console
	verbose bool
	// exited marks ranks that have exited: a status they left queued is not
	// drawn. It grows when an elastic job starts a joiner (add).
	exitedMu sync.Mutex
	exited   []bool
	// stopping is set once the job is being stopped from outside; from then
	// on the ranks' stderr lines are only counted (hidden), not shown (with
	// Job.Line, which shows them is up to its owner).
	stopping atomic.Bool
	hidden   atomic.Int64
}

// newRankSink takes each rank's output prefix (labels) and host ("" on a
// one-host job).
func newRankSink(job Job, labels, hosts []string, files *outputFiles) *rankSink {
	s := &rankSink{files: files, deliver: job.Line, con: job.Console, verbose: job.Verbose,
		exited: make([]bool, len(labels))}
	if s.deliver == nil {
		window := job.FoldWindow
		if window == 0 {
			window = DefaultFoldWindow
		}
		s.fold = newFolder(job.Console, labels, hosts, window)
		s.deliver = s.fold.line
		if job.Console.Terminal() {
			s.fold.status = s.drawStatus
		}
	}
	return s
}

// add makes room for the output of one more rank, numbered after the
// others (an elastic job's joiner).
func (s *rankSink) add(label, host string) error {
	if s.files != nil {
		s.exitedMu.Lock()
		n := len(s.exited)
		s.exitedMu.Unlock()
		if err := s.files.ensure(n); err != nil {
			return err
		}
	}
	if s.fold != nil {
		s.fold.add(label, host)
	}
	s.exitedMu.Lock()
	s.exited = append(s.exited, false)
	s.exitedMu.Unlock()
	return nil
}

func (s *rankSink) hasExited(rank int) bool {
	s.exitedMu.Lock()
	defer s.exitedMu.Unlock()
	return rank >= 0 && rank < len(s.exited) && s.exited[rank]
}

// showsStatuses says whether the ranks' statuses are drawn.
func (s *rankSink) showsStatuses() bool { return s.fold != nil && s.fold.status != nil }

func (s *rankSink) line(rank int, isErr bool, text []byte) {
	if s.files != nil {
		s.files.write(rank, isErr, text)
	}
	if isErr && s.stopping.Load() && !s.verbose && s.fold != nil {
		s.hidden.Add(1)
		return
	}
	s.deliver(rank, isErr, text)
}

func (s *rankSink) setStatus(rank int, isErr bool, text string) {
	if s.showsStatuses() {
		s.fold.setStatus(rank, isErr, text)
	}
}

func statusKey(rank int) string { return "rank/" + strconv.Itoa(rank) + "/" }

func (s *rankSink) drawStatus(rank int, isErr bool, text string) {
	key := statusKey(rank) + strconv.Itoa(b2i(isErr))
	if blank(text) || s.hasExited(rank) {
		s.con.setStatus(key, "")
		return
	}
	s.con.setStatus(key, "["+s.fold.label([]int{rank})+"] "+text) // only the folder draws statuses
}

func (s *rankSink) streamEnded(rank int, isErr bool) {
	if s.fold != nil {
		s.fold.streamEnded(rank, isErr)
	}
}

// rankExited clears the statuses of a rank that has exited (something it
// started may still hold its pipes).
func (s *rankSink) rankExited(rank int) {
	if s.fold != nil {
		// The folder draws statuses under its lock (drawStatus): hold it,
		// so a status being drawn can not land after this clear.
		s.fold.mu.Lock()
		defer s.fold.mu.Unlock()
	}
	s.exitedMu.Lock()
	if rank >= 0 && rank < len(s.exited) {
		s.exited[rank] = true
	}
	s.exitedMu.Unlock()
	if s.showsStatuses() {
		s.con.clearStatuses(statusKey(rank))
	}
}

// finish prints every line still held and clears the ranks' statuses.
func (s *rankSink) finish() {
	if s.fold != nil {
		s.fold.flush()
	}
	if s.showsStatuses() {
		s.con.clearStatuses("rank/")
	}
}
