// One attempt of a fixed-size job: its ranks start together, and the
// first that fails fails the job (see failure.go for how gorun names it).

package launcher

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/p2p"
)

// runOnce runs one attempt of job, elastic (runElastic) or not (runFixed).
func runOnce(ctx context.Context, job Job, lay *layout, files *outputFiles, number int) error {
	if job.Elastic != nil {
		return runElastic(ctx, job, lay, files, number)
	}
	return runFixed(ctx, job, lay, files, number)
}

// runFixed runs one attempt of a fixed-size job. It returns nil when every
// rank exited 0, a *RankError when a rank failed (after stopping the
// others), a *StoppedError when ctx ended, and an error naming the ranks
// that did not register within --start-timeout.
func runFixed(ctx context.Context, job Job, lay *layout, files *outputFiles, number int) error {
	a := newAttempt(ctx, job, lay, number)
	a.key = p2p.NewJobKey()
	if err := a.startRendezvous(p2p.RendezvousConfig{}, ""); err != nil {
		return err
	}
	defer a.rdv.Close()
	a.setEnv()
	a.openOutput(lay.labels(), lay.rankHosts(), files)
	for r := range job.NP {
		h := lay.pl.host[r]
		env := append(a.common[:len(a.common):len(a.common)],
			collective.EnvRank+"="+strconv.Itoa(r),
			collective.EnvLocalRank+"="+strconv.Itoa(lay.pl.localRank[r]),
			collective.EnvLocalSize+"="+strconv.Itoa(lay.pl.localSize[h]),
			collective.EnvHost+"="+lay.hosts[h].Name,
		)
		p := &rankProc{rank: r, remote: lay.remote[h], via: job.SSH.via(), tail: &tail{max: 20}, out: a.out, done: make(chan struct{})}
		if lay.multiHost() {
			p.host = lay.hosts[h].Name
		}
		if err := a.startRank(p, lay.hosts[h].Name, env, lay.multiHost()); err != nil {
			return a.abandon(fmt.Errorf("starting rank %d%s: %w", r, onHost(p.host), err), nil)
		}
	}

	registered := a.waitRegistered()
	var failure error
	for a.running > 0 && failure == nil {
		select {
		case p := <-a.exited:
			a.running--
			if p.err != nil {
				failure = firstCause(p, a.exited, &a.running)
			}
		case err := <-registered:
			if err != nil && ctx.Err() == nil {
				failure = startTimeoutError(job, lay, err)
			}
		case <-ctx.Done():
			failure = a.stoppedFromOutside(job.NP)
		}
	}
	err := a.end(failure, nil)
	var re *RankError
	if errors.As(err, &re) {
		re.Lost = lostRank(a.departures.firstAbort(), a.procs)
	}
	return noRestart(err, a.procs)
}
