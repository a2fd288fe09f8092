package launcher

import (
	"bytes"
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/p2p"
)

// Defaults of an elastic job (Elastic).
const (
	DefaultDiscoveryInterval = 3 * time.Second   // Horovod polls its script every few seconds too
	DefaultDiscoveryTimeout  = 10 * time.Second  // one run of the discovery script
	DefaultElasticTimeout    = 600 * time.Second // below MinNP, as Horovod's --elastic-timeout
	DefaultHeartbeatTimeout  = 3 * time.Second
	DefaultCooldownBase      = 10 * time.Second // Horovod's --blacklist-cooldown-range 10 100
	DefaultCooldownMax       = 100 * time.Second
)

// Elastic makes a job elastic (Job.Elastic): a rank that fails, or a host
// that goes, costs the job a membership change, not the job. The job
// starts with Job.NP ranks; when a rank is lost, the rendezvous forms a
// new membership epoch with the others (which the ranks follow, see
// p2p.Node.Reconfigure), and gorun starts a joiner (GORUN_RANK=-1) in its
// place once its host's cooldown is over. Every rank gets GORUN_ELASTIC=1
// and GORUN_HEARTBEAT_TIMEOUT.
type Elastic struct {
	// MinNP is the fewest ranks the job runs with; below it, the
	// rendezvous waits Timeout for joiners, then aborts the job. 0 = 1.
	MinNP int
	// MaxNP is the most ranks it runs with; 0 = NP, or with a
	// DiscoveryScript, as many as the script lists slots.
	MaxNP int
	// DiscoveryScript, if set, is run every DiscoveryInterval (each run
	// bounded by DiscoveryTimeout) and prints the hosts as "host:slots"
	// lines (ParseDiscovery). New slots get joiners, up to MaxNP; the
	// ranks of a host that leaves the list (or of slots it no longer
	// lists) are stopped. A failed run is logged and the last list kept.
	// Job.Hosts is then the script's first list.
	DiscoveryScript   string
	DiscoveryInterval time.Duration // 0 = DefaultDiscoveryInterval
	DiscoveryTimeout  time.Duration // 0 = DefaultDiscoveryTimeout
	Timeout           time.Duration // how long below MinNP; 0 = DefaultElasticTimeout
	HeartbeatTimeout  time.Duration // a silent rank is lost after this; 0 = DefaultHeartbeatTimeout
	// A host on which a rank failed gets no new rank for CooldownBase,
	// doubled with each further failure in a row, up to CooldownMax (see
	// cooldown). 0 = the defaults.
	CooldownBase, CooldownMax time.Duration
	// JobKeyFile, if set, holds the job key (hex), so that a rank started
	// by hand (GORUN_RANK=-1, GORUN_JOB_KEY_FILE) can join the running
	// job: it is read if it exists (it must not be readable by others),
	// else created, mode 0600, with a new key. gorun then prints the
	// command that starts such a joiner (joinCommand).
	JobKeyFile string
}

func (e *Elastic) withDefaults(np int) Elastic {
	c := *e
	c.MinNP = cmp.Or(c.MinNP, 1)
	c.DiscoveryInterval = cmp.Or(c.DiscoveryInterval, DefaultDiscoveryInterval)
	c.DiscoveryTimeout = cmp.Or(c.DiscoveryTimeout, DefaultDiscoveryTimeout)
	c.Timeout = cmp.Or(c.Timeout, DefaultElasticTimeout)
	c.HeartbeatTimeout = cmp.Or(c.HeartbeatTimeout, DefaultHeartbeatTimeout)
	c.CooldownBase = cmp.Or(c.CooldownBase, DefaultCooldownBase)
	c.CooldownMax = max(cmp.Or(c.CooldownMax, DefaultCooldownMax), c.CooldownBase)
	if c.MaxNP == 0 && c.DiscoveryScript == "" {
		c.MaxNP = np
	}
	return c
}

// maxRendezvousSize is the rendezvous' admission cap when the discovery
// script, not --max-np, bounds the job: gorun itself starts no more ranks
// than the script lists slots.
const maxRendezvousSize = 1 << 16

// cooldown keeps hosts on which ranks failed from getting new ranks for a
// while, never for good (Horovod's blacklist bans a host for the rest of
// the job, horovod#3264): a host's first failure costs it base, each
// further failure in a row doubles that, up to max. Failures while the
// host is cooling down already are the same incident (a host that dies
// takes all its ranks at once) and do not count again. A host that runs
// for max after its cooldown ended without a failure starts from base
// again. Times are passed in, so tests need no clock.
type cooldown struct {
	base, max time.Duration
	hosts     map[string]*hostCooldown
}

type hostCooldown struct {
	failures int       // in a row
	until    time.Time // no new rank before
}

func newCooldown(base, max time.Duration) *cooldown {
	return &cooldown{base: base, max: max, hosts: map[string]*hostCooldown{}}
}

// failed records a failure on host at now. It returns the host's cooldown
// from now, its failures in a row, and whether this failure started a new
// cooldown (false: the host was cooling down already).
func (c *cooldown) failed(host string, now time.Time) (d time.Duration, failures int, started bool) {
	h := c.hosts[host]
	if h == nil {
		h = &hostCooldown{}
		c.hosts[host] = h
	}
	if now.Before(h.until) {
		return h.until.Sub(now), h.failures, false
	}
	if h.failures > 0 && now.Sub(h.until) >= c.max {
		h.failures = 0 // healthy for a while: forgiven
	}
	h.failures++
	d = c.base
	for i := 1; i < h.failures && d < c.max; i++ {
		d *= 2
	}
	d = min(d, c.max)
	h.until = now.Add(d)
	return d, h.failures, true
}

// until is when host may get new ranks again (zero: now).
func (c *cooldown) until(host string) time.Time {
	if h := c.hosts[host]; h != nil {
		return h.until
	}
	return time.Time{}
}

// ordinal is "1st", "2nd", "3rd", "4th", ...
func ordinal(n int) string {
	suffix := "th"
	if n%100 < 11 || n%100 > 13 {
		switch n % 10 {
		case 1:
			suffix = "st"
		case 2:
			suffix = "nd"
		case 3:
			suffix = "rd"
		}
	}
	return strconv.Itoa(n) + suffix
}

// Discover runs a host discovery script once, bounded by timeout, and
// parses what it printed (ParseDiscovery). The error says what went wrong
// and ends with the script's last stderr line, if any.
func Discover(ctx context.Context, script string, timeout time.Duration) ([]Host, error) {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(timeout, DefaultDiscoveryTimeout))
	defer cancel()
	cmd := exec.CommandContext(ctx, script)
	// Its own process group, killed whole on timeout: a script that runs
	// ssh or sleeps must not outlive its run, nor hold its pipes open.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	var out, errb limitedBuffer
	out.max, errb.max = 1<<20, 64<<10
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if cmd.Process != nil {
		// Whatever the script left behind (a background child, an ssh
		// master) goes with it: it must not pile up, one per interval.
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if ctx.Err() == context.DeadlineExceeded {
		return nil, fmt.Errorf("did not finish within %v%s", cmp.Or(timeout, DefaultDiscoveryTimeout), stderrHint(errb.String()))
	}
	if errors.Is(err, exec.ErrWaitDelay) && cmd.ProcessState != nil && cmd.ProcessState.Success() {
		// It exited 0 but left a process holding its output open: what it
		// printed before it exited is the list (the leftover is killed).
		err = nil
	}
	if err != nil {
		return nil, fmt.Errorf("%v%s", err, stderrHint(errb.String()))
	}
	return ParseDiscovery(out.String())
}

func stderrHint(s string) string {
	if l := lastLine(s); l != "" {
		return ": " + l
	}
	return ""
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// ElasticError is why an elastic job failed as a whole: the rendezvous
// aborted it (below --min-np for longer than --elastic-timeout, or a rank
// aborted it), or no rank was left.
type ElasticError struct {
	Cause   string   // the rendezvous' abort cause; "" when no rank was left
	NP      int      // ranks at start
	Started int      // processes started, joiners included
	Lost    []string // "rank 2: killed by signal 9 (SIGKILL)", in order
	Stopped int      // processes gorun stopped because their host left the discovery list
	// Departed: "rank 2: SIGTERM", the ranks that left gracefully at a
	// commit (the job went on without them), in order.
	Departed []string
	// LastStderr: the last stderr lines of the last rank lost, when no
	// rank was left.
	LastStderr []string
	// LateFailed: processes that failed after the job had begun to finish
	// (a rank exited 0), which fails it as it would a fixed-size job;
	// Finished ranks had exited 0.
	LateFailed []string
	Finished   int
}

func (e *ElasticError) Error() string {
	var b strings.Builder
	switch {
	case e.Cause != "":
		fmt.Fprintf(&b, "the rendezvous aborted the elastic job: %s", hostIDRE.ReplaceAllString(e.Cause, "$1"))
	case len(e.LateFailed) > 0:
		fmt.Fprintf(&b, "%s failed after the job had begun to finish, when %d rank%s had exited 0: as in a fixed-size job, that fails the job",
			strings.Join(e.LateFailed, " and "), e.Finished, plural(e.Finished))
	case len(e.Lost) == 0 && len(e.Departed) > 0:
		fmt.Fprintf(&b, "every rank left the job before it finished (%s): nobody is left to train", strings.Join(e.Departed, "; "))
	default:
		fmt.Fprintf(&b, "no rank left: of the %d processes the elastic job started, %d were lost", e.Started, len(e.Lost))
		if len(e.Departed) > 0 {
			fmt.Fprintf(&b, " and %d left (%s)", len(e.Departed), strings.Join(e.Departed, "; "))
		}
		if e.Stopped > 0 {
			fmt.Fprintf(&b, " and %d stopped because the discovery script no longer listed their hosts (or slots)", e.Stopped)
		}
	}
	fmt.Fprintf(&b, " (it started with %d ranks", e.NP)
	if j := e.Started - e.NP; j > 0 {
		fmt.Fprintf(&b, " and %d joiner%s", j, plural(j))
	}
	b.WriteString(")")
	if len(e.Lost) > 0 {
		fmt.Fprintf(&b, "; lost: %s", strings.Join(e.Lost, "; "))
	}
	if len(e.LastStderr) > 0 {
		b.WriteString("; the last one's last stderr lines:")
		for _, l := range e.LastStderr[max(0, len(e.LastStderr)-summaryLines):] {
			fmt.Fprintf(&b, "\n    %s", l)
		}
	}
	return b.String()
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// ChangeLine is how gorun reports a membership change of an elastic job:
// "membership epoch 1: 3 ranks (lost rank 2 on host a (proc 2, pid 7895):
// disconnected), reset took 21ms". Ranks are those of the epoch before for
// the lost, of the new epoch for the joined; proc, if not nil, names a
// member's process as gorun's other lines do ("proc 2, pid 7895"; "" for
// none of gorun's).
func ChangeLine(c p2p.Change, proc func(p2p.Member) string) string {
	var parts []string
	who := func(m p2p.Member) string {
		s := fmt.Sprintf("rank %d on host %s", m.Rank, hostOfID(m.Host))
		if proc != nil {
			if p := proc(m); p != "" {
				s += " (" + p + ")"
			}
		}
		return s
	}
	for _, l := range c.Lost {
		if l.Left {
			parts = append(parts, fmt.Sprintf("%s %s", who(l.Member), l.Cause))
			continue
		}
		parts = append(parts, fmt.Sprintf("lost %s: %s", who(l.Member), l.Cause))
	}
	for _, j := range c.Joined {
		parts = append(parts, "joined "+who(j))
	}
	if len(parts) == 0 {
		parts = []string{"same members, links set up again"}
	}
	return fmt.Sprintf("membership epoch %d: %d rank%s (%s), reset took %v",
		c.Epoch, c.Size, plural(c.Size), strings.Join(parts, "; "), roundTook(c.Took))
}

// roundTook rounds a reset time to what is worth reading: 0.8ms, 12ms,
// 1.23s.
func roundTook(d time.Duration) time.Duration {
	switch {
	case d < time.Millisecond:
		return d.Round(100 * time.Microsecond)
	case d < time.Second:
		return d.Round(time.Millisecond)
	}
	return d.Round(10 * time.Millisecond)
}

// hostIDRE matches a p2p host ID ("name/net:[4026531833]/boot-id", see
// p2p.Config.HostID) in the rendezvous' messages: the name is what the user
// knows the host by.
var hostIDRE = regexp.MustCompile(`([^\s/(),]+)/net:\[\d+\]/[0-9a-f-]{36}`)

// hostOfID is the host name in a p2p host ID ("name/netns/boot").
func hostOfID(id string) string {
	name, _, _ := strings.Cut(id, "/")
	return cmp.Or(name, "?")
}

// exitText says how a rank ended, for gorun's messages: "killed by signal
// 9 (SIGKILL)", "exit status 3", or for a remote rank what ssh passed on.
func exitText(p *rankProc) string {
	var ee *exec.ExitError
	if !p.remote && errors.As(p.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return fmt.Sprintf("killed by signal %d (%s)", int(ws.Signal()), unix.SignalName(ws.Signal()))
		}
	}
	return status(p)
}

// elasticRun is one attempt of an elastic job. Its fields are used by the
// goroutine of runElastic only, except where said.
type elasticRun struct {
	*attempt
	el    Elastic
	multi bool // output prefixes and messages name hosts

	hosts   []Host         // where ranks may run now: -H, or the script's last list
	perHost map[string]int // running processes per host

	cd         *cooldown
	registered bool // every rank of epoch 0 registered: joiners may come
	// finishing: a rank exited 0, or a member left the job cleanly (see
	// handleRdv): the job ends, no more joiners.
	finishing bool
	finished  int
	lost      []string
	departed  []string // "rank 2: SIGTERM", the ranks that left gracefully
	// byHand: what became of members gorun did not start (joiners
	// started by hand), for the summary: "rank 3 on host a: disconnected".
	byHandLost, byHandLeft []string
	lastLost               *rankProc
	refill                 *time.Timer
	warned                 map[string]bool // hosts gorun said it can not use
	rdvMembers             func() int      // the rendezvous' Members
	// The rendezvous' reports (OnProc, OnChange), queued by its
	// goroutines for the run's goroutine, which handles them in order
	// (handleRdv); rdvWake says there are some.
	rdvMu    sync.Mutex
	rdvQueue []rdvReport
	rdvWake  chan struct{}
	// aborted says that the rendezvous aborted the job (written by the
	// rendezvous' goroutine).
	aborted    chan struct{}
	lastEpoch  int         // the last established epoch logged
	empty      *time.Timer // finishing with no member left: end the rest after --grace
	emptyArmed bool
	// lateFailed: processes that failed after the job had begun to
	// finish (as a fixed-size job, that fails the job).
	lateFailed []string
}

// rdvReport is one of the rendezvous' reports: a process event, an
// established epoch, or a member's announcement that it leaves.
type rdvReport struct {
	proc   *p2p.ProcEvent
	change *p2p.Change
	// leaving: a rank announced that it leaves the job (OnLeave, the
	// start of its Close). The rendezvous calls OnLeave before it confirms
	// the leave, so before the rank's Close returns and the process can
	// exit; its ProcLeft comes when the rank's stream ends, which may be
	// after the exit.
	leaving bool
}

func (e *elasticRun) report(r rdvReport) {
	e.rdvMu.Lock()
	e.rdvQueue = append(e.rdvQueue, r)
	e.rdvMu.Unlock()
	select {
	case e.rdvWake <- struct{}{}:
	default:
	}
}

// EnvProcID is gorun's identity of a process of an elastic job (its
// number, as in its output prefix), which p2p sends in its hello so that
// the rendezvous' reports name exactly that process.
const EnvProcID = "GORUN_PROC_ID"

// runElastic runs one attempt of an elastic job: like runFixed, but a rank
// that fails once the job runs is logged and replaced rather than failing
// the job. It returns nil when the ranks left exited 0, an *ElasticError
// when the rendezvous aborted the job or no rank was left, a *StoppedError
// when ctx ended, and as runFixed for what goes wrong while the ranks of
// epoch 0 register (before that the job has nothing to go on with).
func runElastic(ctx context.Context, job Job, lay *layout, files *outputFiles, number int) error {
	el := job.Elastic.withDefaults(job.NP)
	e := &elasticRun{attempt: newAttempt(ctx, job, lay, number), el: el,
		multi: lay.multiHost() || el.DiscoveryScript != "",
		hosts: slices.Clone(job.Hosts), perHost: map[string]int{},
		cd: newCooldown(el.CooldownBase, el.CooldownMax), warned: map[string]bool{},
		rdvWake: make(chan struct{}, 1), aborted: make(chan struct{}, 1)}
	if err := e.startRendezvous(); err != nil {
		return err
	}
	defer e.rdv.Close()
	e.rdvMembers = e.rdv.Members
	e.logJoinCommand()
	e.setEnv(collective.EnvElastic+"=1", collective.EnvHeartbeatTimeout+"="+el.HeartbeatTimeout.String())
	labels, hostLabels := make([]string, job.NP), make([]string, job.NP)
	for r := range job.NP {
		labels[r], hostLabels[r] = e.label(r, lay.hosts[lay.pl.host[r]].Name)
	}
	e.openOutput(labels, hostLabels, files)
	for r := range job.NP {
		h := lay.hosts[lay.pl.host[r]]
		if err := e.start(h.Name, r, lay.pl.localRank[r], lay.pl.localSize[lay.pl.host[r]]); err != nil {
			return e.abandon(fmt.Errorf("starting rank %d%s: %w", r, onHost(hostLabels[r]), err), e.gone)
		}
	}

	registered := e.waitRegistered()
	dctx, stopDiscovery := context.WithCancel(ctx)
	var discovered <-chan []Host
	var discovery sync.WaitGroup
	if el.DiscoveryScript != "" {
		ch := make(chan []Host)
		discovered = ch
		discovery.Add(1)
		go func() { defer discovery.Done(); e.discover(dctx, ch) }()
	}
	defer func() {
		stopDiscovery()
		discovery.Wait()
	}()
	e.refill = time.NewTimer(time.Hour)
	e.refill.Stop()
	defer e.refill.Stop()
	e.empty = time.NewTimer(time.Hour)
	e.empty.Stop()
	defer e.empty.Stop()

	failure := e.loop(registered, discovered)
	stopDiscovery()
	if err := e.end(failure, e.gone); err != nil {
		return err
	}
	return e.outcome()
}

// startRendezvous starts the elastic rendezvous, with the job key of
// --job-key-file if there is one. Its reports are queued for the run's
// goroutine (report).
func (e *elasticRun) startRendezvous() error {
	job, el := e.job, e.el
	e.key = p2p.NewJobKey()
	if el.JobKeyFile != "" {
		var err error
		if e.key, err = jobKeyFile(el.JobKeyFile); err != nil {
			return err
		}
	}
	maxSize := el.MaxNP
	if maxSize == 0 {
		maxSize = max(maxRendezvousSize, job.NP)
	}
	return e.attempt.startRendezvous(p2p.RendezvousConfig{
		OnLeave: func(int, uint64) { e.report(rdvReport{leaving: true}) },
		OnAbort: func(p2p.Abort) {
			select {
			case e.aborted <- struct{}{}:
			default:
			}
		},
		Elastic: &p2p.ElasticConfig{MinSize: el.MinNP, MaxSize: maxSize, WaitTimeout: el.Timeout, HeartbeatTimeout: el.HeartbeatTimeout},
		// Called on rendezvous goroutines (OnProc under its lock):
		// queued for the run's goroutine, never blocking (so is OnLeave's
		// report).
		OnChange: func(c p2p.Change) { e.report(rdvReport{change: &c}) },
		OnProc:   func(ev p2p.ProcEvent) { e.report(rdvReport{proc: &ev}) },
	}, fmt.Sprintf("; elastic: --min-np %d, --max-np %s", el.MinNP, maxNPText(el)))
}

// logJoinCommand prints, with --job-key-file, the command that starts a
// rank by hand that joins this job.
func (e *elasticRun) logJoinCommand() {
	job, el := e.job, e.el
	if el.JobKeyFile == "" {
		if job.Verbose {
			job.Logf("give --job-key-file FILE to let ranks started by hand join this job")
		}
		return
	}
	vars := []string{
		collective.EnvElastic + "=1",
		collective.EnvRank + "=-1",
		collective.EnvSize + "=" + strconv.Itoa(job.NP),
		collective.EnvRendezvous + "=" + e.rdv.Addr(),
		collective.EnvJobKeyFile + "=" + el.JobKeyFile,
		collective.EnvHeartbeatTimeout + "=" + el.HeartbeatTimeout.String(),
	}
	if job.Timeout > 0 {
		vars = append(vars, collective.EnvTimeout+"="+job.Timeout.String())
	}
	if e.number > 0 {
		vars = append(vars, collective.EnvRestartCount+"="+strconv.Itoa(e.number))
	}
	job.Logf("to add a rank by hand (it joins at the next commit boundary, up to --max-np %s): %s",
		maxNPText(el), joinCommand(vars, job.Env, job.Program, job.Args))
}

// loop handles what happens to the job until every process has ended or
// the job failed as a whole; it returns the failure.
func (e *elasticRun) loop(registered <-chan error, discovered <-chan []Host) error {
	for e.running > 0 {
		select {
		case p := <-e.exited:
			// What the rendezvous said before the exit counts for it.
			e.handleRdv()
			e.running--
			e.gone(p)
			if !e.registered && p.err != nil && !p.stopReq.Load() {
				// Before the first table nobody can go on without it.
				return firstCause(p, e.exited, &e.running)
			}
			e.exitedRank(p)
		case err := <-registered:
			if err != nil {
				if e.ctx.Err() == nil {
					return startTimeoutError(e.job, e.lay, err)
				}
				break
			}
			e.registered = true
			e.fill()
		case <-e.aborted:
			return e.failed(e.departures.abortCause())
		case <-e.rdvWake:
			e.handleRdv()
		case <-e.empty.C:
			e.endRemaining()
		case hosts := <-discovered:
			e.setHosts(hosts)
		case <-e.refill.C:
			e.fill()
		case <-e.ctx.Done():
			stopped := e.stoppedFromOutside(e.running)
			stopped.Joiners = e.waitingJoiners(nil)
			return stopped
		}
	}
	return nil
}

// gone takes an exited process off its host's count.
func (e *elasticRun) gone(p *rankProc) { e.perHost[p.hostName]-- }

// outcome is the result of a job whose processes all ended on their own:
// nil if it finished (with a summary of what it went through, if it went
// through anything), else its *ElasticError.
func (e *elasticRun) outcome() error {
	if cause := e.departures.abortCause(); cause != "" {
		return e.failed(cause)
	}
	if len(e.lateFailed) > 0 {
		err := e.failed("")
		err.Finished, err.LateFailed = e.finished, slices.Clone(e.lateFailed)
		return err
	}
	if e.finished == 0 {
		return e.failed("")
	}
	if err := e.failed(""); len(err.Lost) > 0 || len(err.Departed) > 0 || err.Stopped > 0 || len(e.procs) > e.job.NP || len(e.byHandLost)+len(e.byHandLeft) > 0 {
		var b strings.Builder
		fmt.Fprintf(&b, "elastic job done: %d rank%s finished; %d processes started in all", e.finished, plural(e.finished), len(e.procs))
		if len(err.Lost) > 0 {
			fmt.Fprintf(&b, ", %d lost (%s)", len(err.Lost), strings.Join(err.Lost, "; "))
		}
		if len(err.Departed) > 0 {
			fmt.Fprintf(&b, ", %d left gracefully (%s)", len(err.Departed), strings.Join(err.Departed, "; "))
		}
		if n := len(e.byHandLost); n > 0 {
			fmt.Fprintf(&b, "; of the ranks started by hand, %d lost (%s)", n, strings.Join(e.byHandLost, "; "))
		}
		if n := len(e.byHandLeft); n > 0 {
			fmt.Fprintf(&b, "; of the ranks started by hand, %d left gracefully (%s)", n, strings.Join(e.byHandLeft, "; "))
		}
		if err.Stopped > 0 {
			fmt.Fprintf(&b, ", %d stopped as the discovery script dropped their hosts", err.Stopped)
		}
		e.job.Logf("%s", b.String())
	}
	return nil
}

// jobKeyFile reads the job key from path, or creates path (mode 0600)
// with a new one.
func jobKeyFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		key := p2p.NewJobKey()
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("--job-key-file: %w", err)
		}
		_, err = fmt.Fprintln(f, hex.EncodeToString(key))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, fmt.Errorf("--job-key-file: %w", err)
		}
		return key, nil
	}
	if err != nil {
		return nil, fmt.Errorf("--job-key-file: %w", err)
	}
	if st, err := os.Stat(path); err == nil && st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("--job-key-file %s is readable by others (mode %v): chmod 600 %s", path, st.Mode().Perm(), path)
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(key) < 16 {
		return nil, fmt.Errorf("--job-key-file %s does not hold a hex key of at least 32 digits: remove it and gorun writes a new one", path)
	}
	return key, nil
}

// gorunSets are the variables gorun sets for every rank of an elastic job
// after the job's -x variables (Job.Env), so that gorun's values win.
var gorunSets = []string{collective.EnvElastic, collective.EnvRank, collective.EnvSize, collective.EnvRendezvous,
	collective.EnvJobKey, collective.EnvJobKeyFile, collective.EnvHeartbeatTimeout, collective.EnvRestartCount,
	collective.EnvLocalRank, collective.EnvLocalSize, collective.EnvHost, EnvProcID}

// joinCommand is the shell command that starts a rank by hand as the job's
// ranks are started: vars (gorun's GORUN_* for a joiner), then the job's
// -x variables (env) but those gorun sets itself (vars, gorunSets: the
// ranks get gorun's values), then the program and its arguments, each
// word quoted for a POSIX shell where it needs to be. A variable whose name
// the shell does not take in an assignment (FOO.BAR) is passed by env(1).
func joinCommand(vars, env []string, program string, args []string) string {
	set := map[string]bool{}
	for _, name := range gorunSets {
		set[name] = true
	}
	for _, v := range vars {
		name, _, _ := strings.Cut(v, "=")
		set[name] = true
	}
	all := slices.Clone(vars)
	for _, v := range env {
		if name, _, _ := strings.Cut(v, "="); !set[name] {
			all = append(all, v)
		}
	}
	var words []string
	useEnv := false
	for _, v := range all {
		name, value, _ := strings.Cut(v, "=")
		if shellName(name) {
			words = append(words, name+"="+shellQuote(value))
		} else {
			words, useEnv = append(words, shellQuote(v)), true
		}
	}
	if useEnv {
		words = append([]string{"env"}, words...)
	}
	prog := shellQuote(program)
	if strings.Contains(prog, "=") && !strings.HasPrefix(prog, "'") {
		// The shell would take NAME=VALUE there for an assignment.
		prog = "'" + prog + "'"
	}
	words = append(words, prog)
	for _, a := range args {
		words = append(words, shellQuote(a))
	}
	return strings.Join(words, " ")
}

// shellName says whether name can be assigned in a POSIX shell command
// (NAME=value cmd): letters, digits and _, not starting with a digit.
func shellName(name string) bool {
	if name == "" || name[0] >= '0' && name[0] <= '9' {
		return false
	}
	return !strings.ContainsFunc(name, func(r rune) bool {
		return !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	})
}

// shellQuote quotes s as one word for a POSIX shell, only if it needs it:
// a word of letters, digits and @%+=:,./_- is left as it is; any other
// (with a space, a quote, $, ~, *, [, ...), or the empty word, is put in
// single quotes, each ' in it closing them, escaped (\') and opening them
// again.
func shellQuote(s string) string {
	if s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("@%+=:,./_-", r))
	}) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func maxNPText(el Elastic) string {
	if el.MaxNP == 0 {
		return "the discovery script's slots"
	}
	return strconv.Itoa(el.MaxNP)
}

// failed is the job's failure as a whole; cause "" means no rank was left.
func (e *elasticRun) failed(cause string) *ElasticError {
	err := &ElasticError{Cause: cause, NP: e.job.NP, Started: len(e.procs), Lost: slices.Clone(e.lost), Departed: slices.Clone(e.departed)}
	for _, p := range e.procs {
		if p.stopReq.Load() && p.departed == "" {
			err.Stopped++
		}
	}
	if cause == "" && e.lastLost != nil {
		err.LastStderr = e.lastLost.tail.lines()
	}
	return err
}

// label is a process's output prefix and host label ("" on one host):
// processes are numbered in the order gorun starts them, so the ranks of
// epoch 0 keep their rank as number and joiners come after them. (A rank's
// number in later epochs is the rendezvous' to give; gorun's messages use
// the number the process started with.)
func (e *elasticRun) label(n int, host string) (label, hostLabel string) {
	if e.multi {
		return host + ":" + strconv.Itoa(n), host
	}
	return strconv.Itoa(n), ""
}

// name is how gorun's messages name a process: "rank 2" for a rank of
// epoch 0, "joiner 5" for one started later, and where it runs.
func (e *elasticRun) name(p *rankProc) string {
	s := "rank " + strconv.Itoa(p.rank)
	if p.joiner {
		s = "joiner " + strconv.Itoa(p.rank)
	}
	if e.multi {
		s += " on host " + p.hostName
	}
	if !p.remote && p.cmd != nil && p.cmd.Process != nil {
		s += fmt.Sprintf(" (pid %d)", p.cmd.Process.Pid)
	}
	return s
}

// start starts a process on host: rank r of epoch 0, or a joiner (r = -1).
func (e *elasticRun) start(host string, r, localRank, localSize int) error {
	n := len(e.procs)
	label, hostLabel := e.label(n, host)
	if n >= e.job.NP {
		if err := e.out.add(label, hostLabel); err != nil {
			return err
		}
	}
	remote := !IsLocalHost(host)
	env := append(e.common[:len(e.common):len(e.common)],
		collective.EnvRank+"="+strconv.Itoa(r),
		collective.EnvLocalRank+"="+strconv.Itoa(localRank),
		collective.EnvLocalSize+"="+strconv.Itoa(localSize),
		collective.EnvHost+"="+host,
		EnvProcID+"="+strconv.Itoa(n),
	)
	p := &rankProc{rank: n, host: hostLabel, hostName: host, joiner: r < 0, localRank: localRank,
		remote: remote, via: e.job.SSH.via(), tail: &tail{max: 20}, out: e.out, done: make(chan struct{})}
	if err := e.startRank(p, host, env, e.lay.listenIP != "127.0.0.1"); err != nil {
		return err
	}
	e.perHost[host]++
	return nil
}

// exitedRank handles the exit of a process once the job runs.
func (e *elasticRun) exitedRank(p *rankProc) {
	defer e.endStragglers()
	byGorun := p.frozen.Load() // ended by gorun: its exit status is gorun's doing
	switch {
	case p.departed != "":
		// It left the job at a commit (said when the rendezvous let it
		// go): neither finished nor lost, whatever its exit status.
		if p.err != nil {
			e.job.Logf("%s exited with %s after it left the job", e.name(p), errText(p))
		}
		why := p.departed
		if p.stopReq.Load() {
			why += ", as the discovery script dropped its slot"
		} else if d, _, started := e.cd.failed(p.hostName, time.Now()); started && e.wouldRefill(p.hostName) {
			// Its host is probably going away (a drain, a spot VM): no
			// new rank there for a while, as after a failure.
			e.job.Logf("no new rank on host %s for %v (a rank left it; --blacklist-cooldown)", p.hostName, d.Round(time.Millisecond))
		}
		e.departed = append(e.departed, fmt.Sprintf("%s: %s", strings.TrimSuffix(e.name(p), pidSuffix(p)), why))
	case p.stopReq.Load():
		// gorun stopped it (its host left the list): said when stopped.
		if e.job.Verbose {
			e.job.Logf("%s ended (%s)", e.name(p), cmp.Or(errText(p), "exit status 0"))
		}
	case p.err == nil && !byGorun:
		e.finished++
		e.finishing = true
	case e.departures.abortCause() != "":
		// The rendezvous aborted the job: the ranks end because of it, and
		// the summary says why.
	case e.finishing:
		// After the first rank finished, a rank that fails fails the job
		// (as in a fixed-size job), unless gorun ended it, the rendezvous
		// sent it away (a joiner never admitted), or the rendezvous had
		// lost it before the job began to finish. None costs a host a
		// cooldown: no new rank comes any more. The job is finishing as
		// soon as a rank announced its leave (handleRdv), which the
		// rendezvous reports before that rank can exit: a rank that left
		// cleanly and then fails is this case even when its exit is
		// handled before those of the ranks that finished before it (the
		// processes' waits hand exits over in any order).
		how := cmp.Or(errText(p), "exit status 0")
		switch {
		case byGorun:
			e.job.Logf("%s ended after the job had begun to finish: ended by gorun", e.name(p))
		case p.sentAway:
			e.job.Logf("%s ended after the job had begun to finish: %s (a joiner the rendezvous sent away)", e.name(p), how)
		case p.rdvLost && !p.lostAfterLeave:
			e.job.Logf("%s ended after the job had begun to finish: %s (the rendezvous had lost it before: %s)", e.name(p), how, p.rdvLostCause)
		default:
			e.lateFailed = append(e.lateFailed, fmt.Sprintf("%s (%s)", strings.TrimSuffix(e.name(p), pidSuffix(p)), how))
			e.lastLost = p
			e.job.Logf("%s failed after the job had begun to finish: %s; the job fails", e.name(p), how)
		}
	case p.sentAway:
		// A joiner the rendezvous refused (or sent away before admitting
		// it): not a member, so not lost, and no failure of its host.
		e.job.Logf("%s ended (%s): the rendezvous sent it away: %s", e.name(p), cmp.Or(errText(p), "exit status 0"), p.sentAwayWhy)
	default:
		how := cmp.Or(errText(p), "exit status 0")
		if byGorun {
			how = "stopped (SIGSTOP) until the rendezvous lost it, then ended by gorun"
		}
		e.lost = append(e.lost, fmt.Sprintf("%s: %s", strings.TrimSuffix(e.name(p), pidSuffix(p)), how))
		e.lastLost = p
		members := e.membersRunning()
		still := fmt.Sprintf("%d still running", members)
		if j := e.waitingJoiners(p); j > 0 {
			still += fmt.Sprintf(" and %d joiner%s not admitted yet", j, plural(j))
		}
		if members >= e.el.MinNP {
			e.job.Logf("%s was lost: %s; the job goes on without it (%s, --min-np %d)",
				e.name(p), how, still, e.el.MinNP)
		} else {
			e.job.Logf("%s was lost: %s; %s, below --min-np %d: the job waits up to --elastic-timeout %v for ranks to join, then fails",
				e.name(p), how, still, e.el.MinNP, e.el.Timeout)
		}
		d, n, started := e.cd.failed(p.hostName, time.Now())
		if started && e.wouldRefill(p.hostName) {
			e.job.Logf("no new rank on host %s for %v (its %s failure in a row; the cooldown doubles with each, up to %v)",
				p.hostName, d.Round(time.Millisecond), ordinal(n), e.el.CooldownMax)
		}
	}
	e.fill()
}

// stopping says whether gorun is ending p on purpose.
func stopping(p *rankProc) bool { return p.stopReq.Load() || p.frozen.Load() }

// membersRunning counts the running processes that are members of the
// job: ranks of epoch 0 and admitted joiners, not those gorun is ending.
func (e *elasticRun) membersRunning() int {
	n := 0
	for _, p := range e.procs {
		if !isDone(p) && !stopping(p) && !p.rdvLost && p.departed == "" && (!p.joiner || p.admitted) {
			n++
		}
	}
	return n
}

// waitingJoiners counts the running joiners not admitted yet (but
// except).
func (e *elasticRun) waitingJoiners(except *rankProc) int {
	n := 0
	for _, p := range e.procs {
		if p != except && !isDone(p) && !stopping(p) && p.joiner && !p.admitted && !p.sentAway {
			n++
		}
	}
	return n
}

// procOf is the process whose GORUN_PROC_ID is id (nil: none of this
// run's, e.g. a joiner started by hand).
func (e *elasticRun) procOf(id string) *rankProc {
	n, err := strconv.Atoi(id)
	if err != nil || n < 0 || n >= len(e.procs) || strconv.Itoa(n) != id {
		return nil
	}
	return e.procs[n]
}

// handleRdv handles the rendezvous' reports queued so far, in order.
func (e *elasticRun) handleRdv() {
	e.rdvMu.Lock()
	q := e.rdvQueue
	e.rdvQueue = nil
	e.rdvMu.Unlock()
	for _, r := range q {
		if c := r.change; c != nil {
			// Name hosts as gorun does (the -H or script name, not the
			// host's own name).
			for i := range c.Lost {
				if p := e.procOf(c.Lost[i].Proc); p != nil {
					c.Lost[i].Host = p.hostName
				}
			}
			for i := range c.Joined {
				if p := e.procOf(c.Joined[i].Proc); p != nil {
					c.Joined[i].Host = p.hostName
					p.admitted = true
				}
			}
			line := ChangeLine(*c, func(m p2p.Member) string {
				p := e.procOf(m.Proc)
				if p == nil {
					return ""
				}
				s := "proc " + strconv.Itoa(p.rank)
				if !p.remote && p.cmd != nil && p.cmd.Process != nil {
					s += ", pid " + strconv.Itoa(p.cmd.Process.Pid)
				}
				return s
			})
			if skipped := c.Epoch - e.lastEpoch - 1; skipped > 0 {
				if skipped == 1 {
					line += fmt.Sprintf(" (epoch %d was overtaken by a further change before it was established)", c.Epoch-1)
				} else {
					line += fmt.Sprintf(" (epochs %d to %d were overtaken by further changes before they were established)", e.lastEpoch+1, c.Epoch-1)
				}
			}
			e.lastEpoch = max(e.lastEpoch, c.Epoch)
			e.job.Logf("%s", line)
			continue
		}
		if r.leaving {
			// A rank leaves the job: it is finishing, as the rendezvous
			// takes it too (it sends the waiting joiners away). Unless
			// gorun is stopping a process (its host left the discovery
			// list), which may be the one that leaves, closing cleanly
			// on SIGTERM: then a member's ProcLeft, or an exit 0, says
			// so.
			if !slices.ContainsFunc(e.procs, func(p *rankProc) bool { return p.stopReq.Load() && !isDone(p) }) {
				e.finishing = true
			}
			continue
		}
		ev := r.proc
		p := e.procOf(ev.Member.Proc)
		left := ev.Kind == p2p.ProcLeft || ev.Kind == p2p.ProcLost && strings.HasPrefix(ev.Cause, "closed")
		if left && (p == nil || !stopping(p)) {
			// A member (maybe one started by hand) left cleanly.
			e.finishing = true
		}
		if ev.Kind == p2p.ProcDeparted && ev.Members == 0 {
			// The last member left: nobody would admit a joiner.
			e.finishing = true
		}
		if p == nil {
			who := fmt.Sprintf("rank %d on host %s (started by hand)", ev.Member.Rank, hostOfID(ev.Member.Host))
			switch ev.Kind {
			case p2p.ProcDeparted:
				e.job.Logf("%s left the job (%s): the job goes on with %d rank%s; no step lost", who, ev.Cause, ev.Members, plural(ev.Members))
				e.byHandLeft = append(e.byHandLeft, fmt.Sprintf("%s: %s", who, ev.Cause))
			case p2p.ProcLost:
				e.job.Logf("%s was lost: %s; the job goes on without it (%d members left)", who, ev.Cause, ev.Members)
				e.byHandLost = append(e.byHandLost, fmt.Sprintf("%s: %s", who, ev.Cause))
			}
			continue
		}
		switch {
		case left:
			// It closed cleanly (maybe while the others re-formed): it
			// ends on its own, and may take its time (a final save).
			p.left = true
		case ev.Kind == p2p.ProcLost:
			p.rdvLost, p.rdvLostCause, p.lostAfterLeave = true, ev.Cause, ev.AfterLeave
			if strings.HasPrefix(ev.Cause, "stopped responding") {
				e.endIfStopped(p)
			}
		case ev.Kind == p2p.ProcSentAway:
			p.sentAway, p.sentAwayWhy = true, ev.Cause
		case ev.Kind == p2p.ProcDeparted:
			p.departed = ev.Cause
			if ev.Members == 0 {
				e.job.Logf("%s left the job (%s): it was the last member; the job ends", e.name(p), ev.Cause)
			} else {
				e.job.Logf("%s left the job (%s): the job goes on with %d rank%s; no step lost", e.name(p), ev.Cause, ev.Members, plural(ev.Members))
			}
		}
	}
	e.endStragglers()
}

// endIfStopped ends p, which the rendezvous lost for its silence, if it is
// a process on this host that is stopped (SIGSTOP, Ctrl-Z, a tracer:
// state T or t in /proc): the job went on without it, and it would
// otherwise keep the job from ending. (A frozen process on another host
// is not seen here: it ends when it runs again and finds itself cut off,
// or when the job finishes, see endStragglers.)
func (e *elasticRun) endIfStopped(p *rankProc) {
	if p.remote || isDone(p) || stopping(p) || !processStopped(p.cmd.Process.Pid) {
		return
	}
	e.endProc(p, fmt.Sprintf("%s is stopped (SIGSTOP) and the rendezvous went on without it: ending it", e.name(p)))
}

// endProc stops p in the background (SIGTERM, SIGKILL after --grace), as
// ended by gorun, saying why.
func (e *elasticRun) endProc(p *rankProc, why string) {
	p.frozen.Store(true)
	e.job.Logf("%s", why)
	e.stops.Add(1)
	go func() {
		defer e.stops.Done()
		stopAll([]*rankProc{p}, e.job.Grace)
	}()
}

// endStragglers ends what keeps a finishing job from ending: a process
// the rendezvous lost that still runs (frozen on another host, or cut off
// from the rendezvous and stuck) is ended now; once the rendezvous has no
// member left, whatever still runs --grace later and never left it
// cleanly (a joiner that came too late, a process that never registered)
// is ended then.
func (e *elasticRun) endStragglers() {
	if !e.finishing || e.running == 0 {
		return
	}
	for _, p := range e.procs {
		if isDone(p) || stopping(p) || !p.rdvLost {
			continue
		}
		e.endProc(p, fmt.Sprintf("%s still runs after the job began to finish, though the rendezvous lost it (%s): ending it", e.name(p), p.rdvLostCause))
	}
	if !e.emptyArmed && e.rdvMembers() == 0 && e.anyToEnd() {
		e.emptyArmed = true
		e.empty.Reset(e.job.Grace)
	}
}

func (e *elasticRun) anyToEnd() bool {
	return slices.ContainsFunc(e.procs, func(p *rankProc) bool { return !isDone(p) && !stopping(p) && !p.left })
}

// endRemaining ends every process still running --grace after the
// finishing job's last member left the rendezvous (but those that left it
// cleanly: they end on their own).
func (e *elasticRun) endRemaining() {
	for _, p := range e.procs {
		if isDone(p) || stopping(p) || p.left {
			continue
		}
		e.endProc(p, fmt.Sprintf("%s still runs %v after the job's last member left the rendezvous (--grace): ending it", e.name(p), e.job.Grace))
	}
}

func errText(p *rankProc) string {
	if p.err == nil {
		return ""
	}
	return exitText(p)
}

func pidSuffix(p *rankProc) string {
	if p.remote || p.cmd == nil || p.cmd.Process == nil {
		return ""
	}
	return fmt.Sprintf(" (pid %d)", p.cmd.Process.Pid)
}

// target is how many processes the job should have running: NP on a fixed
// host list (lost ranks are replaced once their host's cooldown is over,
// so the job grows back to -np), and with a discovery script every slot it
// lists; never more than MaxNP.
func (e *elasticRun) target() int {
	t := e.job.NP
	if e.el.DiscoveryScript != "" {
		t = TotalSlots(e.hosts)
	}
	if e.el.MaxNP > 0 {
		t = min(t, e.el.MaxNP)
	}
	return t
}

// wouldRefill says whether host is still a place for new ranks (for the
// cooldown message: a host the script removed gets none anyway).
func (e *elasticRun) wouldRefill(host string) bool {
	return !e.finishing && slices.ContainsFunc(e.hosts, func(h Host) bool { return h.Name == host })
}

// fill starts joiners on free slots of hosts not cooling down until the
// job has target() processes, and arms the refill timer for the end of
// the earliest cooldown that keeps a free slot empty.
func (e *elasticRun) fill() {
	if !e.registered || e.finishing || e.departures.abortCause() != "" || e.ctx.Err() != nil {
		return
	}
	now := time.Now()
	var wake time.Time
	for e.running < e.target() {
		started := false
		for _, h := range e.hosts {
			if e.perHost[h.Name] >= h.Slots || !e.usable(h.Name) {
				continue
			}
			if u := e.cd.until(h.Name); now.Before(u) {
				if wake.IsZero() || u.Before(wake) {
					wake = u
				}
				continue
			}
			lr := e.freeLocalRank(h.Name)
			if err := e.start(h.Name, -1, lr, e.perHost[h.Name]+1); err != nil {
				e.job.Logf("could not start a joiner on host %s: %v", h.Name, err)
				d, n, ok := e.cd.failed(h.Name, now)
				if ok {
					e.job.Logf("no new rank on host %s for %v (its %s failure in a row)", h.Name, d, ordinal(n))
				}
				// Try again when its cooldown is over.
				if u := e.cd.until(h.Name); wake.IsZero() || u.Before(wake) {
					wake = u
				}
				continue
			}
			p := e.procs[len(e.procs)-1]
			pid := ""
			if !p.remote {
				pid = fmt.Sprintf("pid %d, ", p.cmd.Process.Pid)
			}
			e.job.Logf("started joiner %d%s (%sGORUN_RANK=-1) in a free slot: %d of the job's %d processes run (it joins when the ranks admit it)",
				p.rank, onHost(p.host), pid, e.running, e.target())
			started = true
			break
		}
		if !started {
			break
		}
	}
	if e.running < e.target() && !wake.IsZero() {
		e.refill.Reset(time.Until(wake))
	}
}

// usable says whether gorun can start ranks on host; if not, it says why
// once.
func (e *elasticRun) usable(host string) bool {
	if IsLocalHost(host) || e.lay.listenIP != "127.0.0.1" {
		return true
	}
	if !e.warned[host] {
		e.warned[host] = true
		e.job.Logf("can not start ranks on host %s from the discovery script: the job started on this host only, so its rendezvous listens on 127.0.0.1, which %s can not reach; start the job with --network-interface (or a remote host in the script's first list)", host, host)
	}
	return false
}

// freeLocalRank is the lowest GORUN_LOCAL_RANK no running process on host
// has.
func (e *elasticRun) freeLocalRank(host string) int {
	used := map[int]bool{}
	for _, p := range e.procs {
		if p.hostName == host && !isDone(p) {
			used[p.localRank] = true
		}
	}
	lr := 0
	for used[lr] {
		lr++
	}
	return lr
}

func isDone(p *rankProc) bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// setHosts takes a new host list from the discovery script: the ranks of
// hosts it no longer lists, and those beyond the slots it lists now
// (newest first), are stopped; free slots get joiners.
func (e *elasticRun) setHosts(hosts []Host) {
	old := e.hosts
	e.hosts = hosts
	e.job.Logf("--host-discovery-script lists %s (was %s)", FormatHosts(hosts), FormatHosts(old))
	slots := map[string]int{}
	for _, h := range hosts {
		slots[h.Name] = h.Slots
	}
	count := map[string]int{}
	var stop []*rankProc
	for _, p := range e.procs {
		if isDone(p) || p.stopReq.Load() {
			continue
		}
		count[p.hostName]++
	}
	for i := len(e.procs) - 1; i >= 0; i-- {
		p := e.procs[i]
		if isDone(p) || p.stopReq.Load() || count[p.hostName] <= slots[p.hostName] {
			continue
		}
		count[p.hostName]--
		stop = append(stop, p)
	}
	for _, p := range stop {
		p.stopReq.Store(true)
		why := "it no longer lists host " + p.hostName
		if slots[p.hostName] > 0 {
			why = fmt.Sprintf("it lists %d slot%s on host %s now", slots[p.hostName], plural(slots[p.hostName]), p.hostName)
		}
		e.job.Logf("stopping %s: %s (the job goes on without it)", e.name(p), why)
		e.stops.Add(1)
		go func() {
			defer e.stops.Done()
			stopAll([]*rankProc{p}, e.job.Grace)
		}()
	}
	e.fill()
}

// processStopped says whether pid is stopped by a signal (state T) or by
// a tracer (t).
func processStopped(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && (b[i+2] == 'T' || b[i+2] == 't')
}

// discover runs the discovery script every interval and hands each list
// that differs from the last one on; a failed run is logged (once until
// the script works again) and changes nothing.
func (e *elasticRun) discover(ctx context.Context, out chan<- []Host) {
	last := slices.Clone(e.hosts)
	lastErr := ""
	t := time.NewTicker(e.el.DiscoveryInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		hosts, err := Discover(ctx, e.el.DiscoveryScript, e.el.DiscoveryTimeout)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if msg := err.Error(); msg != lastErr {
				e.job.Logf("--host-discovery-script %s failed: %s; keeping the hosts it listed last (%s) and trying again every %v",
					e.el.DiscoveryScript, msg, FormatHosts(last), e.el.DiscoveryInterval)
				lastErr = msg
			}
			continue
		}
		if lastErr != "" {
			e.job.Logf("--host-discovery-script %s works again", e.el.DiscoveryScript)
			lastErr = ""
		}
		if slices.Equal(hosts, last) {
			continue
		}
		last = hosts
		select {
		case out <- hosts:
		case <-ctx.Done():
			return
		}
	}
}
