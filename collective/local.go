package collective

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/gorun/gorun/p2p"
)

// LocalJob is a job whose ranks all run in this process: what a unit test of
// a training loop, or an example, needs without gorun (as
// torch.multiprocessing.spawn is for PyTorch). The ranks talk over the same
// authenticated links as in a real job (unix sockets on one host).
type LocalJob struct {
	// Comms holds the job's communicators; Comms[r] is rank r.
	Comms []*Comm
	rdv   *p2p.Rendezvous
}

// StartLocal starts a rendezvous on 127.0.0.1 with a fresh job key and n
// ranks initialised concurrently, each with opts plus its rank, the
// rendezvous and the key. Startup is bounded by ctx and by the timeout of
// opts (WithTimeout; default DefaultTimeout); the rendezvous logs through
// WithLogger's function. On error nothing is left running. Close the job
// when done.
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
	rdv, err := p2p.StartRendezvous(ctx, p2p.RendezvousConfig{ListenAddr: "127.0.0.1:0", Size: n, JobKey: key,
		Timeout: cfg.timeout, Logf: cfg.logf})
	if err != nil {
		return nil, err
	}
	j := &LocalJob{Comms: make([]*Comm, n), rdv: rdv}
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

// Close closes every rank's Comm, concurrently (a clean Close waits for its
// peers to finish their side of the links), then the rendezvous. It returns
// the ranks' errors joined.
func (j *LocalJob) Close() error {
	errs := make([]error, len(j.Comms))
	var wg sync.WaitGroup
	for r, c := range j.Comms {
		if c == nil {
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); errs[r] = c.Close() }()
	}
	wg.Wait()
	j.rdv.Close()
	return errors.Join(errs...)
}
