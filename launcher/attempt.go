// What one attempt of a job holds and does whatever its kind: the
// rendezvous its ranks meet at, the environment they share, starting
// them, and ending the attempt. runFixed (fixed.go) and runElastic
// (elastic_run.go) each add only their own loop over what happens to the
// ranks.

package launcher

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/p2p"
)

// attempt is one attempt of a job (Job.MaxRestarts makes more). Its fields
// are used by the goroutine of the attempt's loop only, except where said.
type attempt struct {
	ctx    context.Context
	job    Job
	lay    *layout
	number int // GORUN_RESTART_COUNT
	// heartbeat is the rendezvous' bound on a rank's silence (--timeout,
	// or an elastic job's --heartbeat-timeout); a remote rank's ssh
	// session gives up on a host silent for twice as long, when the
	// rendezvous has long lost its ranks (SSH.sessionArgs).
	heartbeat time.Duration

	key        []byte
	rdv        *p2p.Rendezvous
	departures *departureLog // written by the rendezvous' goroutines
	out        *rankSink
	common     []string // every rank's environment
	procs      []*rankProc
	running    int
	exited     chan *rankProc // each process, once it has exited
	stops      sync.WaitGroup // stops of single ranks under way
}

func newAttempt(ctx context.Context, job Job, lay *layout, number int) *attempt {
	return &attempt{ctx: ctx, job: job, lay: lay, number: number, heartbeat: cmp.Or(job.Timeout, collective.DefaultTimeout),
		departures: &departureLog{lastCall: map[int]uint64{}}, exited: make(chan *rankProc, max(job.NP, 16))}
}

// startRendezvous starts the rendezvous on the layout's address with the
// job key a.key. cfg holds what the kind of job adds (Elastic, OnChange,
// OnProc); its OnLeave and OnAbort, if set, are called after the
// departures log has recorded the event. With --verbose, gorun says where
// it listens and what it starts, followed by more (the kind's own).
func (a *attempt) startRendezvous(cfg p2p.RendezvousConfig, more string) error {
	job := a.job
	onLeave, onAbort := cfg.OnLeave, cfg.OnAbort
	cfg.ListenAddr = net.JoinHostPort(a.lay.listenIP, "0")
	cfg.Size = job.NP
	cfg.JobKey = a.key
	cfg.Timeout = cmp.Or(job.Timeout, collective.DefaultTimeout)
	cfg.Logf = job.Logf
	if !job.Verbose {
		// A refused process (a stranger, a joiner with other arguments)
		// learns why itself, but the job's owner should too, even when
		// quiet; and where the rendezvous group's lead is (a replicated
		// rendezvous: rdzv_group.go).
		cfg.Logf = func(format string, args ...any) {
			if line := fmt.Sprintf(format, args...); strings.HasPrefix(line, "rendezvous: refused") ||
				strings.HasPrefix(line, "rendezvous: replica ") {
				job.Logf("%s", line)
			}
		}
	}
	cfg.OnHang = (&hangLog{logf: job.Logf}).report
	cfg.OnLeave = func(rank int, lastCall uint64) {
		a.departures.record(rank, lastCall)
		if onLeave != nil {
			onLeave(rank, lastCall)
		}
	}
	cfg.OnAbort = func(ab p2p.Abort) {
		a.departures.aborted(ab)
		if onAbort != nil {
			onAbort(ab)
		}
	}
	rdv, err := p2p.StartRendezvous(a.ctx, cfg)
	if err != nil {
		return fmt.Errorf("starting the rendezvous: %w", err)
	}
	a.rdv = rdv
	if job.Verbose {
		job.Logf("rendezvous at %s, starting %d ranks of %s on %d host(s)%s", rdv.Addr(), job.NP, job.Program, a.lay.used, more)
	}
	return nil
}

// setEnv sets what every rank's environment starts with: the job's -x
// variables, then gorun's (extra: those of the kind of job), which win.
func (a *attempt) setEnv(extra ...string) {
	job := a.job
	a.common = append(slices.Clone(job.Env),
		collective.EnvSize+"="+strconv.Itoa(job.NP),
		collective.EnvRendezvous+"="+a.rdv.Addr(),
		collective.EnvJobKey+"="+hex.EncodeToString(a.key),
		collective.EnvRestartCount+"="+strconv.Itoa(a.number),
	)
	a.common = append(a.common, extra...)
	if job.Timeout > 0 {
		a.common = append(a.common, collective.EnvTimeout+"="+job.Timeout.String())
	}
	if job.Verbose {
		a.common = append(a.common, collective.EnvVerbose+"=1")
	}
}

// openOutput makes the sink of the ranks' output, labels[r] and hosts[r]
// naming rank r; ranks are told when their statuses are drawn.
func (a *attempt) openOutput(labels, hosts []string, files *outputFiles) {
	a.out = newRankSink(a.job, labels, hosts, files)
	if a.out.showsStatuses() && !a.userSets(EnvTTY) {
		a.common = append(a.common, EnvTTY+"=1")
	}
}

// userSets says whether the job's -x variables set name.
func (a *attempt) userSets(name string) bool {
	return slices.ContainsFunc(a.job.Env, func(v string) bool { return strings.HasPrefix(v, name+"=") })
}

// startRank starts p, with env (a.common and the rank's own variables),
// on host: through ssh if p is remote, else here, where setListenIP
// gives it GORUN_LISTEN_IP (the address the rendezvous listens on) unless
// the job's -x variables set it.
func (a *attempt) startRank(p *rankProc, host string, env []string, setListenIP bool) error {
	var err error
	if p.remote {
		err = startRemote(a.job, p, host, a.lay.listenIP, 2*a.heartbeat, env, a.exited)
	} else {
		if setListenIP && !a.userSets(collective.EnvListenIP) {
			env = append(env, collective.EnvListenIP+"="+a.lay.listenIP)
		}
		err = startLocal(a.job, p, append(os.Environ(), env...), a.lay.spansHosts(), a.exited)
	}
	if err != nil {
		return err
	}
	a.procs = append(a.procs, p)
	a.running++
	return nil
}

// abandon ends an attempt whose ranks could not all be started: those
// started are stopped, and err is returned.
func (a *attempt) abandon(err error, onExit func(*rankProc)) error {
	stopAll(a.procs, a.job.Grace)
	a.drain(onExit)
	a.out.finish()
	return err
}

// waitRegistered says when every rank of the start has registered with the
// rendezvous, or why not within --start-timeout.
func (a *attempt) waitRegistered() <-chan error {
	registered := make(chan error, 1)
	go func() {
		rctx, cancel := context.WithTimeout(a.ctx, a.job.StartTimeout)
		defer cancel()
		registered <- a.rdv.WaitRegistered(rctx)
	}()
	return registered
}

// stoppedFromOutside is the attempt's end when its context ended (Ctrl-C,
// SIGTERM, gorun's output closed): what the ranks print on their way out
// (abort errors the stop itself causes) is not news.
func (a *attempt) stoppedFromOutside(np int) *StoppedError {
	a.out.stopping.Store(true)
	return &StoppedError{Cause: context.Cause(a.ctx), NP: np, Stopped: a.running}
}

// drain waits for every process still running to exit (their goroutines
// hand them to a.exited, which must be read); onExit, if set, sees each.
func (a *attempt) drain(onExit func(*rankProc)) {
	for a.running > 0 {
		p := <-a.exited
		a.running--
		if onExit != nil {
			onExit(p)
		}
	}
}

// end ends the attempt with failure (nil: every process ended on its
// own). On a failure the processes still running are stopped (SIGTERM,
// SIGKILL after --grace); then every exit is awaited (onExit, if set,
// sees each), the output flushed, and the failure completed with what
// only the end tells: for a *StoppedError, how many ranks were killed and
// how many lines hidden; for a *RankError, whether the culprit's stderr
// is still on the screen, who left early and what aborted the job.
func (a *attempt) end(failure error, onExit func(*rankProc)) error {
	job := a.job
	var stopped *StoppedError
	errors.As(failure, &stopped)
	if failure != nil {
		t0 := time.Now()
		killed := stopAll(a.procs, job.Grace)
		if stopped != nil {
			stopped.Killed = killed
		}
		if job.Verbose {
			job.Logf("stopped the remaining ranks in %v", time.Since(t0).Round(time.Millisecond))
		}
	}
	a.drain(onExit)
	a.stops.Wait()
	a.out.finish()
	if stopped != nil {
		stopped.Hidden = int(a.out.hidden.Load())
	}
	var re *RankError
	if errors.As(failure, &re) {
		if a.out.fold != nil {
			last := a.out.fold.lastStderr(re.Rank)
			re.StderrShown = last >= 0 && job.Console.lineCount()-last <= scrollLines
		}
		re.LeftEarly = a.departures.leftEarly(a.procs)
		re.JobCause = a.departures.abortCause()
	}
	return failure
}
