package collective

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/gorun/gorun/p2p"
)

// A replicated rendezvous (p2p's GroupConfig): in an elastic job the
// membership is kept by a group of replicas, one in gorun and one in each
// of a few ranks on other hosts, so that losing the leader's process or
// host does not end the job. gorun tells the ranks that host one
// (GORUN_RDZV_REPLICA), and every rank the job's elastic bounds, which
// each replica's membership must share.
const (
	// EnvRdzvReplica "1": this rank hosts a replica of the job's
	// rendezvous group (gorun sets it for two ranks on other hosts than
	// its own; ignored for a joiner).
	EnvRdzvReplica = "GORUN_RDZV_REPLICA"
	// EnvMinNP, EnvMaxNP: the elastic job's --min-np and --max-np;
	// EnvElasticWait: how long it may stay below --min-np (--elastic-timeout).
	EnvMinNP       = "GORUN_MIN_NP"
	EnvMaxNP       = "GORUN_MAX_NP"
	EnvElasticWait = "GORUN_ELASTIC_WAIT"
)

// readReplica reads whether this rank hosts a replica, and the bounds its
// membership needs.
func readReplica(getenv func(string) string, e *launchEnv) error {
	switch v := strings.TrimSpace(getenv(EnvRdzvReplica)); v {
	case "", "0":
		return nil
	case "1":
	default:
		return fmt.Errorf("%s=%q: want 1 (host a replica of the rendezvous) or 0", EnvRdzvReplica, v)
	}
	if !e.elastic || e.rank < 0 {
		return nil // only the members of an elastic job's start host one
	}
	e.replica = true
	var err error
	if e.minNP, err = positiveInt(getenv, EnvMinNP); err != nil {
		return err
	}
	if e.maxNP, err = positiveInt(getenv, EnvMaxNP); err != nil {
		return err
	}
	if e.minNP > e.size || e.size > e.maxNP {
		return fmt.Errorf("%s=%d, %s=%d: the job's %d ranks are not within them", EnvMinNP, e.minNP, EnvMaxNP, e.maxNP, e.size)
	}
	s := getenv(EnvElasticWait)
	if s == "" {
		return fmt.Errorf("%s is not set: a replica of the rendezvous needs the job's wait below %s", EnvElasticWait, EnvMinNP)
	}
	if e.elasticWait, err = parseDuration(EnvElasticWait, s); err != nil || e.elasticWait <= 0 {
		return fmt.Errorf("%s=%q is not a positive duration (write 600s)", EnvElasticWait, s)
	}
	return nil
}

func positiveInt(getenv func(string) string, name string) (int, error) {
	s := strings.TrimSpace(getenv(name))
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%s=%q is not a positive number (a replica of the rendezvous needs it)", name, s)
	}
	return n, nil
}

// startReplica starts this rank's replica of the rendezvous group, on the
// address the rank listens on; the group's leader adds it once the rank's
// hello offers it.
func startReplica(ctx context.Context, cfg config, heartbeat time.Duration) (*p2p.Rendezvous, error) {
	ip := cmp.Or(cfg.listenIP, "127.0.0.1")
	rz, err := p2p.StartRendezvous(ctx, p2p.RendezvousConfig{
		ListenAddr: net.JoinHostPort(ip, "0"), Size: cfg.size, JobKey: cfg.jobKey, Timeout: cfg.timeout, Logf: cfg.logf,
		Elastic: &p2p.ElasticConfig{MinSize: cfg.minSize, MaxSize: cfg.maxSize, WaitTimeout: cfg.elasticWait, HeartbeatTimeout: heartbeat},
		Group:   &p2p.GroupConfig{ID: p2p.ReplicaID(cfg.rank)},
	})
	if err != nil {
		return nil, fmt.Errorf("hosting a replica of the rendezvous (%s=1): %w", EnvRdzvReplica, err)
	}
	return rz, nil
}
