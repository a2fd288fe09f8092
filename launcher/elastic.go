// The settings of an elastic job (Elastic) and their defaults.

package launcher

import (
	"cmp"
	"strconv"
	"time"

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
	// Replicas is how many replicas keep the job's membership (see
	// rdzv_group.go): 1 (0 counts as 1) is gorun's rendezvous alone; 3
	// or 5, a group of gorun's and those of ranks on other hosts, which
	// survives the loss of its leader's process or host.
	Replicas int
	// Etcd, if set, keeps the membership in etcd (--rdzv-backend etcd,
	// rdzv_group.go) instead of in gorun's rendezvous (and raft).
	Etcd *p2p.EtcdGroup
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

func maxNPText(el Elastic) string {
	if el.MaxNP == 0 {
		return "the discovery script's slots"
	}
	return strconv.Itoa(el.MaxNP)
}
