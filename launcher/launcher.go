package launcher

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorun/gorun/p2p"
)

// Job describes what to launch.
type Job struct {
	NP      int      // number of ranks
	Program string   // executable path (or a Go package directory, see BuildIfPackage)
	Args    []string // its arguments
	Env     []string // extra NAME=VALUE pairs for every rank

	Timeout      time.Duration // collective timeout handed to ranks (GORUN_TIMEOUT); 0 = their default
	StartTimeout time.Duration // every rank must register within this; 0 = 30 s
	Grace        time.Duration // between SIGTERM and SIGKILL when stopping ranks; 0 = 5 s
	MaxRestarts  int           // relaunch the whole job this many times after a failure

	// Elastic, if set, makes the job elastic (see Elastic): a rank's
	// failure, once the job runs, costs a membership change instead of the
	// job, and MaxRestarts only counts failures of the job as a whole.
	Elastic *Elastic

	// Hosts lists where ranks run, filled in order (host 0 takes the first
	// Slots ranks, and so on). Nil means every rank on this host. Hosts for
	// which IsLocalHost is true run their ranks without ssh; the others are
	// reached with SSH and run Program (same path) in WorkDir (same path).
	Hosts            []Host
	SSH              SSH
	WorkDir          string // working directory of remote ranks; "" = gorun's
	NetworkInterface string // interface name or CIDR ranks listen on when hosts are remote; "" = pick one
	OutputDir        string // if set, also write DIR/rank.N/{stdout,stderr}

	Stdout, Stderr io.Writer // where prefixed rank output goes; nil = os.Stdout, os.Stderr
	// Console, if set, is where output goes instead (one Console can be
	// shared with BuildIfPackage, so its status line and messages are
	// drawn the same way); nil = NewConsole(Stdout, Stderr).
	Console *Console
	// Line, if set, receives every complete output line instead of the
	// default "[rank] line" writer (which folds identical lines of several
	// ranks, draws the ranks' statuses on a terminal, and leaves out what
	// the ranks write to stderr while the job is stopped from outside); the
	// ranks' statuses are then not shown.
	Line func(rank int, stderr bool, line []byte)
	// FoldWindow is how long a line waits for other ranks to print the
	// same, to be printed once for all of them; 0 = DefaultFoldWindow,
	// negative = never fold.
	FoldWindow time.Duration
	Verbose    bool
	Logf       func(format string, args ...any) // gorun's own messages; nil = to the Console
}

// RankError says which rank failed a job and how.
type RankError struct {
	Rank       int
	Host       string   // "" when every rank runs on this host
	PID        int      // of the rank, or of its ssh client for a remote rank
	Status     string   // "exit status 3", "signal: killed", "did not register within 30s"
	LastStderr []string // its last lines of stderr
	// StderrShown says that LastStderr was printed just above (and has not
	// scrolled away), so the message does not repeat it.
	StderrShown bool
	// Same are the other ranks that failed with the same status and the
	// same last stderr lines (rank numbers in them aside): a usage error, or
	// the same bug, is reported once.
	Same []int
	// LeftEarly are the ranks that closed their communicator while the job
	// was still running, e.g. "rank 1 closed its communicator after call
	// #3": the ranks still in later calls failed
	// because of them, so they are named before the rank that failed.
	LeftEarly []string
	// JobCause is the first cause of the job's abort as the rendezvous
	// heard it ("rank 2 (...) stopped responding: no heartbeat within 4s",
	// "rank 1 aborted: ..."), when there was one: the rank named above may
	// only be the first to exit because of it.
	JobCause string
	// Lost is JobCause when it was a rank that stopped responding (a host
	// that died, a rank frozen): that rank, not the first to exit, is the
	// culprit, so the message starts with it, naming its host. Fixed-size
	// jobs only: an elastic job's rendezvous re-forms the job instead, and
	// numbers its members per epoch, not as gorun numbers its processes.
	Lost string
	// Others are the other ranks seen failing at about the same time, e.g.
	// "rank 1 (exit status 1)": when a rank fails cleanly its peers may exit
	// first, so the rank named above is a guess the user can check here.
	Others []string
}

// summaryLines is how many of a rank's last stderr lines the message
// repeats when they are not just above.
const summaryLines = 5

// scrollLines: a rank's last stderr line counts as still on the screen when
// at most this many lines were printed after it.
const scrollLines = 10

func (e *RankError) Error() string {
	var b strings.Builder
	if e.Lost != "" && len(e.LeftEarly) == 0 {
		fmt.Fprintf(&b, "%s, so the job was aborted; then ", e.Lost)
	}
	if len(e.LeftEarly) > 0 {
		fmt.Fprintf(&b, "%s while other ranks were still making collective calls (every rank must make the same calls before Close); then ",
			strings.Join(e.LeftEarly, ", "))
	}
	if e.Host == "" {
		fmt.Fprintf(&b, "rank %d (pid %d) failed: %s", e.Rank, e.PID, e.Status)
	} else {
		fmt.Fprintf(&b, "rank %d on host %s failed: %s", e.Rank, e.Host, e.Status)
	}
	if e.StderrShown && len(e.LastStderr) > 0 {
		b.WriteString(" (its stderr is above)")
	}
	if len(e.Same) > 0 {
		fmt.Fprintf(&b, "; %s failed the same way (%s)", rankList(e.Same), e.Status)
	}
	if e.JobCause != "" && e.Lost == "" && len(e.LeftEarly) == 0 { // a departure or a lost rank is said already
		fmt.Fprintf(&b, "; the job was aborted because %s", e.JobCause)
	}
	if len(e.Others) > 0 {
		fmt.Fprintf(&b, "; also failed: %s", strings.Join(e.Others, ", "))
	}
	if !e.StderrShown && len(e.LastStderr) > 0 {
		fmt.Fprintf(&b, "; its last stderr lines:")
		for _, l := range e.LastStderr[max(0, len(e.LastStderr)-summaryLines):] {
			fmt.Fprintf(&b, "\n    %s", l)
		}
	}
	return b.String()
}

// rankList is "rank 2" or "ranks 1, 2, 3".
func rankList(ranks []int) string {
	s := make([]string, len(ranks))
	for i, r := range ranks {
		s[i] = strconv.Itoa(r)
	}
	if len(s) == 1 {
		return "rank " + s[0]
	}
	return "ranks " + strings.Join(s, ", ")
}

// StoppedError is what Run returns when the job was stopped from outside
// (ctx ended: Ctrl-C, SIGTERM, or gorun's output was closed) rather than by
// a rank failing: every rank was stopped, none is to blame.
type StoppedError struct {
	Cause   error // context.Cause of Run's ctx, or an *OutputClosedError
	NP      int   // ranks in the job
	Stopped int   // ranks that were still running and were stopped
	Killed  int   // of them, how many needed SIGKILL after the grace period
	Joiners int   // elastic jobs: of them, joiners not admitted yet
	// Hidden is how many lines the ranks wrote to stderr while being stopped
	// (the abort errors the stop itself causes), left out of the output
	// (--output-dir keeps them; --verbose shows them).
	Hidden int
}

func (e *StoppedError) Error() string {
	return fmt.Sprintf("stopped: %v; %s", e.Cause, e.Outcome())
}

func (e *StoppedError) Unwrap() error { return e.Cause }

// Outcome says what became of the ranks: "all 4 ranks stopped", ...
func (e *StoppedError) Outcome() string {
	var b strings.Builder
	switch {
	case e.Stopped == e.NP && e.NP == 1:
		b.WriteString("its rank stopped")
	case e.Stopped == e.NP:
		fmt.Fprintf(&b, "all %d ranks stopped", e.NP)
	default:
		fmt.Fprintf(&b, "%d of %d ranks were still running and stopped", e.Stopped, e.NP)
	}
	if e.Joiners > 0 {
		fmt.Fprintf(&b, " (%d of them joiner%s not admitted yet)", e.Joiners, plural(e.Joiners))
	}
	if e.Killed > 0 {
		fmt.Fprintf(&b, " (%d killed after the grace period)", e.Killed)
	}
	if e.Hidden > 0 {
		lines := "lines"
		if e.Hidden == 1 {
			lines = "line"
		}
		fmt.Fprintf(&b, " (--verbose shows the %d stderr %s they wrote while stopping)", e.Hidden, lines)
	}
	return b.String()
}

// Run launches the job and waits for it. It returns nil when every rank
// exited 0, a *RankError when a rank failed (after stopping the others), a
// *HostError when a remote host could not be reached (before starting
// anything), or a *StoppedError when ctx ended or the output was closed
// (after stopping every rank).
func Run(ctx context.Context, job Job) error {
	if job.NP < 1 {
		return fmt.Errorf("-np must be at least 1, got %d", job.NP)
	}
	if job.Program == "" {
		return errors.New("no program to run: write gorun -np N PROGRAM [ARGS...]")
	}
	if e := job.Elastic; e != nil {
		switch {
		case e.MinNP < 0 || e.MinNP > job.NP:
			return fmt.Errorf("elastic job: --min-np %d must be between 1 and -np %d", e.MinNP, job.NP)
		case e.MaxNP != 0 && e.MaxNP < job.NP:
			return fmt.Errorf("elastic job: --max-np %d is below -np %d", e.MaxNP, job.NP)
		case e.Timeout < 0 || e.HeartbeatTimeout < 0 || e.DiscoveryInterval < 0 || e.DiscoveryTimeout < 0 || e.CooldownBase < 0 || e.CooldownMax < 0:
			return errors.New("elastic job: durations must not be negative")
		}
	}
	if job.StartTimeout <= 0 {
		job.StartTimeout = 30 * time.Second
	}
	if job.Grace <= 0 {
		job.Grace = 5 * time.Second
	}
	if job.Stdout == nil {
		job.Stdout = os.Stdout
	}
	if job.Stderr == nil {
		job.Stderr = os.Stderr
	}
	if job.Console == nil {
		job.Console = NewConsole(job.Stdout, job.Stderr)
	}
	if job.Logf == nil {
		job.Logf = job.Console.Logf
	}
	// gorun's output closing (gorun ... | head) stops the job like Ctrl-C.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-job.Console.Closed():
			cancel(job.Console.closedErr())
		case <-ctx.Done():
		}
	}()
	lay, err := makeLayout(ctx, &job)
	if err != nil {
		return err
	}
	np := job.NP // a restart may have fewer ranks if fewer slots are listed
	var files *outputFiles
	if job.OutputDir != "" {
		if files, err = openOutputDir(job.OutputDir, job.NP); err != nil {
			return err
		}
		defer files.close()
	}
	for attempt := 0; ; attempt++ {
		err = runOnce(ctx, job, lay, files, attempt)
		if err == nil || ctx.Err() != nil || attempt >= job.MaxRestarts {
			return err
		}
		var he *HostError
		if errors.As(err, &he) {
			return err
		}
		job.Logf("restart %d of %d (GORUN_RESTART_COUNT=%d) after failure: %v", attempt+1, job.MaxRestarts, attempt+1, err)
		if e := job.Elastic; e != nil && e.DiscoveryScript != "" {
			// Restart where the script says the hosts are now, not on its
			// first list.
			if l, err := rediscover(ctx, &job, np); err != nil {
				job.Logf("--host-discovery-script %s before the restart: %v; restarting on the hosts it listed last (%s)", e.DiscoveryScript, err, FormatHosts(job.Hosts))
			} else {
				lay = l
			}
		}
	}
}

// makeLayout places job's ranks on its hosts (localhost if none), checks
// the remote hosts over ssh and picks the address the rendezvous listens
// on. It may set job.WorkDir.
func makeLayout(ctx context.Context, job *Job) (*layout, error) {
	if len(job.Hosts) == 0 {
		job.Hosts = []Host{{Name: "localhost", Slots: job.NP}}
	}
	pl, err := place(job.Hosts, job.NP)
	if err != nil {
		return nil, err
	}
	lay := &layout{hosts: job.Hosts, pl: pl, remote: make([]bool, len(job.Hosts))}
	// Only hosts that get a rank take part.
	var remotes []string
	for i, h := range job.Hosts {
		if pl.localSize[i] > 0 && !IsLocalHost(h.Name) {
			lay.remote[i] = true
			remotes = append(remotes, h.Name)
		}
		if pl.localSize[i] > 0 {
			lay.used++
		}
	}
	lay.listenIP = "127.0.0.1"
	if len(remotes) == 0 && job.Elastic != nil && job.Elastic.DiscoveryScript != "" && job.NetworkInterface != "" {
		// Remote hosts may come later from the script: they must reach
		// the rendezvous.
		if lay.listenIP, err = interfaceIP(job.NetworkInterface); err != nil {
			return nil, err
		}
		if job.WorkDir == "" {
			if job.WorkDir, err = os.Getwd(); err != nil {
				return nil, err
			}
		}
	}
	if len(remotes) > 0 {
		if job.WorkDir == "" {
			if job.WorkDir, err = os.Getwd(); err != nil {
				return nil, err
			}
		}
		if job.Verbose {
			job.Logf("checking that %s can be reached over %s", strings.Join(remotes, ", "), job.SSH.via())
		}
		t0 := time.Now()
		infos, err := checkHosts(ctx, job.SSH, remotes)
		if err != nil {
			return nil, err
		}
		if job.Verbose {
			job.Logf("all %d remote hosts reachable (%v)", len(remotes), time.Since(t0).Round(time.Millisecond))
		}
		var why string
		if job.NetworkInterface != "" {
			lay.listenIP, err = interfaceIP(job.NetworkInterface)
			why = "--network-interface " + job.NetworkInterface
		} else {
			lay.listenIP, why, err = chooseLauncherIP(infos, remotes)
		}
		if err != nil {
			return nil, err
		}
		if job.Verbose {
			job.Logf("rendezvous and local ranks use %s (%s); remote ranks listen on the address their host reaches it from", lay.listenIP, why)
		}
	}
	return lay, nil
}

// layout is where the ranks of a job run.
type layout struct {
	hosts    []Host
	pl       placement
	remote   []bool // per host: reached with ssh
	used     int    // hosts with at least one rank
	listenIP string // rendezvous and local ranks
}

func (l *layout) multiHost() bool { return l.used > 1 }

// labels are the output prefixes: "rank" on one host, "host:rank" on more.
func (l *layout) labels() []string {
	out := make([]string, len(l.pl.host))
	for r := range out {
		if l.multiHost() {
			out[r] = l.hosts[l.pl.host[r]].Name + ":" + strconv.Itoa(r)
		} else {
			out[r] = strconv.Itoa(r)
		}
	}
	return out
}

// rankHosts is each rank's host on a job of many hosts, else "" for all.
func (l *layout) rankHosts() []string {
	out := make([]string, len(l.pl.host))
	if l.multiHost() {
		for r := range out {
			out[r] = l.hosts[l.pl.host[r]].Name
		}
	}
	return out
}

// outputFiles are the per-rank files of --output-dir.
type outputFiles struct {
	dir   string
	mu    sync.Mutex
	files [][2]*os.File // rank -> stdout, stderr
}

// rediscover runs the discovery script again and lays the job out on the
// hosts it lists: np ranks (the job's -np), or as many as it lists slots
// if fewer (never below --min-np). job is changed only if that works.
func rediscover(ctx context.Context, job *Job, np int) (*layout, error) {
	e := job.Elastic
	hosts, err := Discover(ctx, e.DiscoveryScript, e.DiscoveryTimeout)
	if err != nil {
		return nil, err
	}
	j := *job
	j.Hosts = hosts
	j.NP = min(np, TotalSlots(hosts))
	if j.NP < max(e.MinNP, 1) {
		return nil, fmt.Errorf("it lists %s, %d slots, below --min-np %d", FormatHosts(hosts), TotalSlots(hosts), max(e.MinNP, 1))
	}
	lay, err := makeLayout(ctx, &j)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(hosts, job.Hosts) {
		job.Logf("restarting on the hosts --host-discovery-script lists now: %s, %d rank%s (was %s)", FormatHosts(hosts), j.NP, plural(j.NP), FormatHosts(job.Hosts))
	}
	*job = j
	return lay, nil
}

func openOutputDir(dir string, np int) (*outputFiles, error) {
	o := &outputFiles{dir: dir}
	for range np {
		if err := o.add(); err != nil {
			o.close()
			return nil, err
		}
	}
	return o, nil
}

// ensure makes sure DIR/rank.N exists for every N <= n (an elastic job's
// process n; a restarted job's processes use the files of the attempt
// before, which has the same numbers).
func (o *outputFiles) ensure(n int) error {
	for {
		o.mu.Lock()
		have := len(o.files)
		o.mu.Unlock()
		if have > n {
			return nil
		}
		if err := o.add(); err != nil {
			return err
		}
	}
}

// add creates DIR/rank.N/{stdout,stderr} for the next rank N.
func (o *outputFiles) add() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	d := filepath.Join(o.dir, "rank."+strconv.Itoa(len(o.files)))
	if err := os.MkdirAll(d, 0o755); err != nil {
		return fmt.Errorf("--output-dir: %w", err)
	}
	var fs [2]*os.File
	for i, name := range []string{"stdout", "stderr"} {
		f, err := os.Create(filepath.Join(d, name))
		if err != nil {
			if fs[0] != nil {
				fs[0].Close()
			}
			return fmt.Errorf("--output-dir: %w", err)
		}
		fs[i] = f
	}
	o.files = append(o.files, fs)
	return nil
}

func (o *outputFiles) write(rank int, isErr bool, line []byte) {
	buf := make([]byte, 0, len(line)+1)
	buf = append(append(buf, line...), '\n')
	o.mu.Lock()
	if rank >= 0 && rank < len(o.files) {
		o.files[rank][b2i(isErr)].Write(buf)
	}
	o.mu.Unlock()
}

func (o *outputFiles) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, fs := range o.files {
		for _, f := range fs {
			if f != nil {
				f.Close()
			}
		}
	}
}

type rankProc struct {
	rank   int    // in an elastic job, the process's number (see elasticRun.label)
	host   string // "" on a single-host job
	remote bool
	via    string // how a remote rank was started: "ssh" or "srun"
	// Elastic jobs: where it runs (also on one host), whether it started
	// as a joiner, its GORUN_LOCAL_RANK, and whether gorun stopped it on
	// purpose (its host left the discovery list).
	hostName  string
	joiner    bool
	localRank int
	stopReq   atomic.Bool
	frozen    atomic.Bool // ended by gorun: stopped by a signal and lost, or a straggler
	// What the rendezvous said of it (elastic jobs; by GORUN_PROC_ID;
	// used by runElastic's goroutine only).
	rdvLost        bool   // lost as a member
	rdvLostCause   string // why
	lostAfterLeave bool   // lost after a member had left cleanly
	sentAway       bool   // a joiner refused, or sent away before admission
	sentAwayWhy    string
	admitted       bool   // a joiner admitted to an established epoch
	left           bool   // left the job cleanly (its Close): it ends on its own
	departed       string // left the job gracefully at a commit (SIGTERM): why; the others went on
	cmd            *exec.Cmd
	stdin          *os.File // remote ranks: the ssh session's stdin
	tail           *tail
	out            *rankSink
	pipes          sync.WaitGroup
	err            error // from Wait
	done           chan struct{}
}

var missingRE = regexp.MustCompile(`missing ranks \[([0-9 ]*)\]`)

// lostRank names the rank that stopped responding, if that was the job's
// abort a, with its host, as gorun names ranks ("rank 2 on host node2
// (/ip4/...) stopped responding: no heartbeat within 5s"); "" for any
// other cause.
func lostRank(a p2p.Abort, procs []*rankProc) string {
	if !a.Unresponsive {
		return ""
	}
	for _, p := range procs {
		if p.rank == a.Rank && p.host != "" {
			return fmt.Sprintf("rank %d on host %s (%s) stopped responding: %s", a.Rank, p.host, a.Addr, a.Why)
		}
	}
	return a.Cause
}

// departureLog records, from the rendezvous, the ranks that closed their
// communicator and the last collective call each had made.
type departureLog struct {
	mu       sync.Mutex
	lastCall map[int]uint64
	abort    p2p.Abort // the first abort (Cause "": none yet)
}

func (d *departureLog) aborted(a p2p.Abort) {
	d.mu.Lock()
	if d.abort.Cause == "" {
		d.abort = a
	}
	d.mu.Unlock()
}

func (d *departureLog) firstAbort() p2p.Abort {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.abort
}

func (d *departureLog) abortCause() string { return d.firstAbort().Cause }

func (d *departureLog) record(rank int, lastCall uint64) {
	d.mu.Lock()
	d.lastCall[rank] = lastCall
	d.mu.Unlock()
}

// leftEarly names the ranks of a failed job that closed their
// communicator while it ran: the others were still calling collectives
// they could never finish. (Such a rank may still be in Close, waiting for
// its links to drain, when gorun stops the job, so its exit status says
// nothing.)
//
// When every rank closed, only those that closed before another rank's last
// call left early: ranks that all closed after the same call (each failing
// on its own afterwards, e.g. on a bad flag checked after Init) left
// nobody behind.
func (d *departureLog) leftEarly(procs []*rankProc) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	allLeft, last := true, uint64(0)
	for _, p := range procs {
		call, left := d.lastCall[p.rank]
		allLeft = allLeft && left
		last = max(last, call)
	}
	var out []string
	for _, p := range procs {
		if call, left := d.lastCall[p.rank]; left && !(allLeft && call == last) {
			out = append(out, fmt.Sprintf("rank %d%s closed its communicator after call #%d", p.rank, onHost(p.host), call))
		}
	}
	return out
}

// causeWindow is how long, after a rank fails, gorun waits for other ranks'
// exits before naming the culprit.
const causeWindow = 500 * time.Millisecond

// firstCause names the rank that made the job fail. The first rank seen to
// fail is often a survivor reporting a lost peer (a remote rank's death
// reaches gorun through ssh, later than its peers notice it), so gorun
// collects the failures of a short window and prefers a rank killed by a
// signal; otherwise the first one.
func firstCause(first *rankProc, exited <-chan *rankProc, running *int) *RankError {
	failed := []*rankProc{first}
	timer := time.NewTimer(causeWindow)
	defer timer.Stop()
wait:
	for *running > 0 && !killedBySignal(first) {
		select {
		case p := <-exited:
			*running--
			if p.err != nil {
				failed = append(failed, p)
				if killedBySignal(p) {
					break wait
				}
			}
		case <-timer.C:
			break wait
		}
	}
	culprit := first
	for _, p := range failed {
		if killedBySignal(p) {
			culprit = p
			break
		}
	}
	// Ranks that failed the same way are reported once, by the lowest.
	shown, same := culprit, []int(nil)
	var others []string
	for _, o := range failed {
		switch {
		case o == culprit:
		case sameFailure(o, culprit):
			same = append(same, o.rank)
			if o.rank < shown.rank {
				shown = o
			}
		default:
			others = append(others, fmt.Sprintf("rank %d%s (%s)", o.rank, onHost(o.host), status(o)))
		}
	}
	if len(same) > 0 {
		same = append(same, culprit.rank)
		same = slices.DeleteFunc(same, func(r int) bool { return r == shown.rank })
		slices.Sort(same)
	}
	p := shown
	return &RankError{Rank: p.rank, Host: p.host, PID: p.cmd.Process.Pid, Status: status(p), LastStderr: p.tail.lines(), Same: same, Others: others}
}

// sameFailure says whether two ranks failed with the same status and the
// same last stderr lines, but for the rank numbers in them.
func sameFailure(a, b *rankProc) bool {
	if status(a) != status(b) {
		return false
	}
	la, lb := a.tail.lines(), b.tail.lines()
	la, lb = la[max(0, len(la)-summaryLines):], lb[max(0, len(lb)-summaryLines):]
	return slices.Equal(withoutRank(la), withoutRank(lb))
}

var rankNumberRE = regexp.MustCompile(`(?i)\b(ranks?)([ =:#]+)\d+`)

// withoutRank replaces the rank numbers in lines ("rank 3", "GORUN_RANK=3")
// with "#".
func withoutRank(lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = rankNumberRE.ReplaceAllString(l, "${1}${2}#")
	}
	return out
}

func killedBySignal(p *rankProc) bool {
	var ee *exec.ExitError
	if !errors.As(p.err, &ee) {
		return false
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && !p.remote {
		return true
	}
	c := ee.ExitCode()
	return p.remote && c > 128 && c < 160
}

func onHost(h string) string {
	if h == "" {
		return ""
	}
	return " on host " + h
}

// startTimeoutError names the ranks (and their hosts) that did not register.
func startTimeoutError(job Job, lay *layout, err error) error {
	m := missingRE.FindStringSubmatch(err.Error())
	if m == nil || strings.TrimSpace(m[1]) == "" {
		return fmt.Errorf("not every rank registered within --start-timeout %v: %w", job.StartTimeout, err)
	}
	var names []string
	for _, f := range strings.Fields(m[1]) {
		r, _ := strconv.Atoi(f)
		n := "rank " + f
		if lay.multiHost() && r >= 0 && r < len(lay.pl.host) {
			n += " on host " + lay.hosts[lay.pl.host[r]].Name
		}
		names = append(names, n)
	}
	return fmt.Errorf("%s did not register with the rendezvous within --start-timeout %v (is the program calling collective.Init? can the host reach %s?)",
		strings.Join(names, ", "), job.StartTimeout, lay.listenIP)
}

// status describes how a rank ended; for a remote rank, the status ssh
// passed on.
func status(p *rankProc) string {
	s := p.err.Error()
	if !p.remote {
		return s
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		via := cmp.Or(p.via, "ssh")
		switch c := ee.ExitCode(); {
		case c == 255 && via == "ssh":
			return s + " (from ssh: the connection failed or was lost)"
		case c == 1 && via != "ssh":
			// srun passes on its tasks' highest status and exits 1 when it
			// fails itself.
			return s + fmt.Sprintf(" (the rank's, or %s's own failure to start or keep the step: GORUN_SRUN_OPTS=-v shows its errors)", via)
		case c > 128 && c < 160:
			return fmt.Sprintf("%s (killed by signal %d: %v)", s, c-128, syscall.Signal(c-128))
		}
	}
	return s
}

func startLocal(job Job, p *rankProc, env []string, exited chan<- *rankProc) error {
	cmd := exec.Command(job.Program, job.Args...)
	cmd.Env = env
	return startCmd(job, p, cmd, nil, exited)
}

// startRemote runs the rank through ssh and the wrapper, and hands it its
// environment on stdin. gorun keeps stdin open: closing it (or writing
// "stop") makes the wrapper stop the rank.
func startRemote(job Job, p *rankProc, host, rdvIP string, env []string, exited chan<- *rankProc) error {
	block, err := envBlock(env)
	if err != nil {
		return err
	}
	args := append(job.SSH.args(host), remoteCommand(job.Grace, rdvIP, job.WorkDir, job.Program, job.Args))
	cmd := exec.Command(job.SSH.command(), args...)
	inR, inW, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd.Stdin = inR
	p.stdin = inW
	if err := startCmd(job, p, cmd, inR, exited); err != nil {
		inW.Close()
		return err
	}
	// A pipe holds 64 KiB, so this does not block (envBlock refuses more).
	if _, err := inW.Write(block); err != nil {
		inW.Close()
	}
	return nil
}

func startCmd(job Job, p *rankProc, cmd *exec.Cmd, stdin *os.File, exited chan<- *rankProc) error {
	// Its own process group, so that stopping a rank also stops what it
	// started; and it dies with gorun even if gorun is killed outright (a
	// remote rank's ssh dies, and the wrapper on the remote host stops it).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p.cmd = cmd
	// Our own pipes, not cmd.StdoutPipe: a rank's exit is noticed even if
	// something it started still holds the pipe open.
	outR, outW, err := os.Pipe()
	if err != nil {
		return err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return err
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	err = cmd.Start()
	outW.Close()
	errW.Close()
	if stdin != nil {
		stdin.Close()
	}
	if err != nil {
		outR.Close()
		errR.Close()
		return err
	}
	p.pipes.Add(2)
	go p.forward(outR, false)
	go p.forward(errR, true)
	go func() {
		p.err = cmd.Wait()
		p.out.rankExited(p.rank)
		if p.stdin != nil {
			p.stdin.Close()
		}
		// Give the reader a moment to drain what the rank wrote before it
		// exited, then close, so a leftover child cannot hold the job open.
		drained := make(chan struct{})
		go func() { p.pipes.Wait(); close(drained) }()
		select {
		case <-drained:
		case <-time.After(2 * time.Second):
			outR.Close()
			errR.Close()
			<-drained
		}
		close(p.done)
		exited <- p
	}()
	return nil
}

// forward hands on the stream's lines and status changes (see
// forwardStream); a last line without a newline is still delivered.
func (p *rankProc) forward(r io.Reader, isErr bool) {
	defer p.pipes.Done()
	forwardStream(r, func(l []byte) {
		if isErr {
			p.tail.add(string(l))
		}
		p.out.line(p.rank, isErr, l)
	}, func(s string) {
		p.out.setStatus(p.rank, isErr, s)
	})
	p.out.streamEnded(p.rank, isErr)
}

// stopAll stops every running rank: SIGTERM and SIGCONT to a local rank's
// process group, "stop" to a remote rank's wrapper (which does the same
// there, and SIGKILL after grace); after grace, SIGKILL to local ranks; a
// remote rank whose ssh has not ended a few seconds later has its ssh
// killed, which closes the session and makes the wrapper kill the rank. It
// returns how many ranks it had to kill.
func stopAll(procs []*rankProc, grace time.Duration) (killed int) {
	for _, p := range procs {
		select {
		case <-p.done:
			continue
		default:
		}
		if p.remote {
			p.stdin.Write([]byte("stop\n"))
			p.stdin.Close()
		} else {
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
			// A stopped process (SIGSTOP, Ctrl-Z) keeps SIGTERM pending
			// until it runs again: wake it, so it ends now rather than at
			// SIGKILL after grace.
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGCONT)
		}
	}
	if waitAll(procs, grace) {
		return 0
	}
	sent := map[*rankProc]bool{}
	for _, p := range procs {
		if !p.remote && kill(p) {
			sent[p] = true
		}
	}
	if !waitAll(procs, 5*time.Second) {
		for _, p := range procs {
			if kill(p) {
				sent[p] = true
			}
		}
	}
	return len(sent)
}

// kill sends SIGKILL to p's process group unless p has ended; it says
// whether it did.
func kill(p *rankProc) bool {
	select {
	case <-p.done:
		return false
	default:
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		return true
	}
}

// waitAll reports whether every proc ended within d.
func waitAll(procs []*rankProc, d time.Duration) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for _, p := range procs {
		select {
		case <-p.done:
		case <-deadline.C:
			return false
		}
	}
	return true
}

// tail keeps the last max lines of a stream.
type tail struct {
	mu  sync.Mutex
	max int
	buf []string
}

func (t *tail) add(l string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.buf) == t.max {
		copy(t.buf, t.buf[1:])
		t.buf = t.buf[:t.max-1]
	}
	t.buf = append(t.buf, l)
}

func (t *tail) lines() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.buf...)
}
