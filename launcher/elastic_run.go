// One attempt of an elastic job: its state, its loop over what happens to
// the job, and its outcome; how it starts its processes and names them.

package launcher

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/p2p"
)

// elasticRun is one attempt of an elastic job. Its fields are used by the
// goroutine of runElastic only, except where said.
type elasticRun struct {
	*attempt
	el    Elastic
	multi bool // output prefixes and messages name hosts
	// replicas: the ranks of the start that host a replica of the
	// rendezvous group (rdzv_group.go); empty: gorun's rendezvous is
	// alone.
	replicas map[int]bool
	spares   map[int]bool // the ranks that host a spare replica (GORUN_RDZV_REPLICA=spare)

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
	aborted chan struct{}
	// unreachable: hosts gorun said were cut off from the job (cutOff),
	// until a new rank starts there.
	unreachable map[string]bool
	lastEpoch   int         // the last established epoch logged
	empty       *time.Timer // finishing with no member left: end the rest after --grace
	emptyArmed  bool
	// lateFailed: processes that failed after the job had begun to
	// finish (as a fixed-size job, that fails the job).
	lateFailed []string
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
		rdvWake: make(chan struct{}, 1), aborted: make(chan struct{}, 1), unreachable: map[string]bool{}}
	e.heartbeat = el.HeartbeatTimeout
	e.replicas, e.spares = replicaRanks(lay, el.groupReplicas())
	if el.Etcd != nil {
		// In etcd every candidate stands for leader at once: no spares.
		for r := range e.spares {
			e.replicas[r] = true
		}
		e.spares = nil
	}
	if err := e.startRendezvous(); err != nil {
		return err
	}
	// Closed once every process ended: nothing needs the rendezvous then
	// (and a replica of a group whose other replicas are gone could only
	// wait in vain for the job's end to reach it).
	defer e.rdv.CloseNow()
	e.rdvMembers = e.rdv.Members
	e.logJoinCommand()
	e.setEnv(append([]string{collective.EnvElastic + "=1", collective.EnvHeartbeatTimeout + "=" + el.HeartbeatTimeout.String()},
		e.replicaEnv()...)...)
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
	// A rank cut off with its host may be seen to be so only now, as the
	// job ends: that is still said, and counted among the lost.
	err := e.end(failure, func(p *rankProc) {
		p.exitHandled = true
		e.gone(p)
		e.cutOff(p)
	})
	if ee, ok := err.(*ElasticError); ok {
		ee.Lost = slices.Clone(e.lost)
	}
	if err == nil {
		err = e.outcome()
	}
	return noRestart(err, e.procs)
}

// startRendezvous starts the elastic rendezvous, with the job key of
// --job-key-file if there is one. Its reports are queued for the run's
// goroutine (report).
func (e *elasticRun) startRendezvous() error {
	el := e.el
	e.key = p2p.NewJobKey()
	if el.JobKeyFile != "" {
		var err error
		if e.key, err = jobKeyFile(el.JobKeyFile); err != nil {
			return err
		}
	}
	return e.attempt.startRendezvous(p2p.RendezvousConfig{
		Group:   e.groupConfig(),
		OnLeave: func(int, uint64) { e.report(rdvReport{leaving: true}) },
		OnAbort: func(p2p.Abort) {
			select {
			case e.aborted <- struct{}{}:
			default:
			}
		},
		Elastic: &p2p.ElasticConfig{MinSize: el.MinNP, MaxSize: e.maxSize(), WaitTimeout: el.Timeout, HeartbeatTimeout: el.HeartbeatTimeout},
		// Called on rendezvous goroutines (OnProc under its lock):
		// queued for the run's goroutine, never blocking (so is OnLeave's
		// report).
		OnChange: func(c p2p.Change) { e.report(rdvReport{change: &c}) },
		OnProc:   func(ev p2p.ProcEvent) { e.report(rdvReport{proc: &ev}) },
	}, fmt.Sprintf("; elastic: --min-np %d, --max-np %s", el.MinNP, maxNPText(el)))
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
			// What the rendezvous said before it aborted counts for the
			// ends that follow.
			e.handleRdv()
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
	if r >= 0 && e.replicas[r] && n == r {
		env = append(env, collective.EnvRdzvReplica+"=1")
	} else if r >= 0 && e.spares[r] && n == r {
		env = append(env, collective.EnvRdzvReplica+"=spare")
	}
	p := &rankProc{rank: n, host: hostLabel, hostName: host, joiner: r < 0, localRank: localRank,
		remote: remote, via: e.job.SSH.via(), tail: &tail{max: 20}, out: e.out, done: make(chan struct{})}
	if err := e.startRank(p, host, env, e.lay.listenIP != "127.0.0.1"); err != nil {
		return err
	}
	e.perHost[host]++
	delete(e.unreachable, host) // a new rank there: a new cut is a new incident
	return nil
}
