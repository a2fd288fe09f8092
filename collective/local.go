package collective

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/gorun/gorun/p2p"
)

// LocalJob is a job whose ranks all run in this process: what a unit test of
// a training loop, or an example, needs without gorun (as
// torch.multiprocessing.spawn is for PyTorch). The ranks talk over the same
// authenticated links as in a real job (unix sockets on one host).
type LocalJob struct {
	// Comms holds the job's communicators; Comms[r] is rank r at the start
	// (in an elastic job ranks change: ask a Comm for its Rank).
	Comms []*Comm
	rdv   *p2p.Rendezvous

	// Elastic jobs (WithElastic).
	key     []byte
	opts    []Option
	mu      sync.Mutex
	joiners []*Comm        // started by Join, closed by Close
	crashed map[*Comm]bool // their Close errors are expected
}

// WithElasticLimits sets, for StartLocal with WithElastic, the fewest and
// the most members of the elastic job it hosts (gorun's --min-np and
// --max-np): 0 means 1 and the initial size. Init ignores it.
func WithElasticLimits(minSize, maxSize int) Option {
	return func(c *config) { c.minSize, c.maxSize = minSize, maxSize }
}

// StartLocal starts a rendezvous on 127.0.0.1 with a fresh job key and n
// ranks initialised concurrently, each with opts plus its rank, the
// rendezvous and the key. Startup is bounded by ctx and by the timeout of
// opts (WithTimeout; default DefaultTimeout); the rendezvous logs through
// WithLogger's function. On error nothing is left running. Close the job
// when done.
//
// With WithElastic among opts the job is elastic: the rendezvous it hosts
// keeps the job going when a member is lost (see RunElastic), between
// WithElasticLimits' sizes. Crash kills a rank as kill -9 would, and Join
// starts a joiner.
func StartLocal(ctx context.Context, n int, opts ...Option) (*LocalJob, error) {
	if n < 1 {
		return nil, fmt.Errorf("gorun: a local job needs at least one rank, not %d", n)
	}
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.timeout <= 0 {
		cfg.timeout = DefaultTimeout
	}
	key := p2p.NewJobKey()
	rc := p2p.RendezvousConfig{ListenAddr: "127.0.0.1:0", Size: n, JobKey: key, Timeout: cfg.timeout, Logf: cfg.logf}
	if cfg.elastic {
		hb := cfg.heartbeat
		if hb <= 0 {
			hb = DefaultHeartbeatTimeout
		}
		rc.Elastic = &p2p.ElasticConfig{MinSize: cfg.minSize, MaxSize: cfg.maxSize, HeartbeatTimeout: hb}
	}
	rdv, err := p2p.StartRendezvous(ctx, rc)
	if err != nil {
		return nil, err
	}
	j := &LocalJob{Comms: make([]*Comm, n), rdv: rdv, key: key, opts: opts, crashed: map[*Comm]bool{}}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := append([]Option{WithRank(r, n), WithRendezvous(rdv.Addr(), false), WithJobKey(key)}, opts...)
			j.Comms[r], errs[r] = Init(ctx, o...)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		j.Close()
		return nil, err
	}
	return j, nil
}

// Crash makes comm's rank vanish as a process killed with kill -9 does:
// its links and its control stream break without a word, so the other
// members see a lost member, not a Close. comm's own calls fail from then
// on (with a *CutOffError); Close still releases it. For tests of elastic
// jobs.
func (j *LocalJob) Crash(comm *Comm) {
	j.mu.Lock()
	j.crashed[comm] = true
	j.mu.Unlock()
	if comm.node != nil {
		comm.node.SimulateCrash()
	}
}

// Freeze makes comm's rank look like a process stopped with SIGSTOP to the
// rest of the job: no heartbeats, and nothing from the rendezvous is
// handled, until the returned thaw is called (SIGCONT). The caller also
// stops the rank's own work meanwhile (a stopped process does nothing). In
// an elastic job the others go on without it after the heartbeat bound.
func (j *LocalJob) Freeze(comm *Comm) (thaw func()) {
	if comm.node == nil {
		return func() {}
	}
	j.mu.Lock()
	j.crashed[comm] = true // dropped by the job: its Close may fail
	j.mu.Unlock()
	comm.node.SimulateFreeze()
	return comm.node.SimulateThaw
}

// Join starts a process that asks to join the running elastic job (rank
// -1), with the job's options; it returns once the members admitted it (at
// their next Commit), or when ctx ends. Close closes it with the job.
func (j *LocalJob) Join(ctx context.Context) (*Comm, error) {
	if j.key == nil {
		return nil, fmt.Errorf("gorun: Join: the local job was not started by StartLocal")
	}
	o := append([]Option{WithRank(-1, len(j.Comms)), WithRendezvous(j.rdv.Addr(), false), WithJobKey(j.key)}, j.opts...)
	c, err := Init(ctx, o...)
	if err != nil {
		return nil, err
	}
	j.mu.Lock()
	j.joiners = append(j.joiners, c)
	j.mu.Unlock()
	return c, nil
}

// Close closes every rank's Comm (and joiner's), concurrently (a clean
// Close waits for its peers to finish their side of the links), then the
// rendezvous. It returns the ranks' errors joined, except those of ranks
// that Crash killed.
func (j *LocalJob) Close() error {
	j.mu.Lock()
	comms := append(slices.Clone(j.Comms), j.joiners...)
	j.mu.Unlock()
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		if c == nil {
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); errs[r] = c.Close() }()
	}
	wg.Wait()
	j.rdv.Close()
	j.mu.Lock()
	defer j.mu.Unlock()
	for r, c := range comms {
		if j.crashed[c] {
			errs[r] = nil
		}
	}
	return errors.Join(errs...)
}
