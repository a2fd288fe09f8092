package collective

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorun/gorun/p2p"
	"github.com/gorun/gorun/ring"
)

// Comm is one rank's membership in a job. Its collectives run one at a time,
// in the order they were called, on a background goroutine, so that async
// calls can overlap with the caller's own work while every rank still runs
// the same sequence (each call's sequence number travels in every message and
// a rank that called something else fails fast).
type Comm struct {
	compression          *compressionState // codecs, residuals and stats of compressed allreduces
	localRank, localSize int
	timeout              time.Duration
	logf                 func(string, ...any)
	warnf                func(string, ...any) // stall warnings

	node *p2p.Node
	rdv  *p2p.Rendezvous // non-nil when this rank hosts the rendezvous
	// replica is this rank's replica of the job's rendezvous group (nil:
	// it hosts none; env_replica.go).
	replica *p2p.Rendezvous
	// cfgGroup: rdv is replica 1 of the job's rendezvous group (srun).
	cfgGroup bool
	// relay: the group's port on this pod, relayed to replica (Kubernetes;
	// elastic_pod.go).
	relay *replicaRelay

	// recorder is the flight recorder a hang diagnosis reads (flightrec.go).
	recorder flightRecorder

	// view is the membership epoch calls are numbered in: rank, size, ring.
	// A fixed-size job has one for its life; an elastic one gets a new one
	// at every reconfiguration (elastic_comm.go). Read without a lock from
	// any goroutine, so Rank and Size are race-free.
	view            atomic.Pointer[commView]
	elastic         bool
	joiner          bool                   // elastic: started as a joiner (rank -1)
	heartbeat       time.Duration          // elastic: the heartbeat bound of the job
	leaveWhy        atomic.Pointer[string] // elastic: RequestLeave's reason, until the rank left
	chunkBytes      int
	allreducePolicy ring.AllreducePolicy // GORUN_ALLREDUCE_ALGORITHMS
	autotune        bool                 // GORUN_AUTOTUNE: time the links' choices (links_refine.go)
	// links is what the ranks measured and agreed (nil: not measured, on
	// one host). An elastic job measures them in its first epoch that
	// spans hosts and hands them on to later epochs (links_elastic.go).
	links   *AgreedLinks
	phase   func(ring.Call, string, time.Time, time.Time)
	drained chan struct{} // cap 1: the worker's queue became empty

	// life is cancelled, with the cause, when the job is aborted: by this
	// rank's own failure, by another rank, or by Close.
	life   context.Context
	cancel context.CancelCauseFunc
	// callCancel ends the context of the collective running now (nil
	// between calls); life's end calls it (cancelCall), which spares every
	// call a context.AfterFunc of its own on life. Like a Handle's channel
	// made only for queued calls, and no closure per call, it keeps down
	// what every collective pays however small it is (BenchmarkCallOverhead;
	// see BENCHMARKS.md, "Per-call overhead").
	callMu     sync.Mutex
	callCancel context.CancelFunc

	// Lock order: mu is never held while waiting for execMu, except by
	// prepare's inline path when no reconfiguration is under way; a
	// reconfiguration sets reconfiguring (under mu) before it takes
	// execMu, and then takes mu inside it (adopt), so prepare queues
	// instead while it runs.
	mu            sync.Mutex // guards seq, closed, pending, reconfiguring and the order of sends to queue
	seq           uint64
	closed        bool
	reconfiguring bool       // quiesce/reconfigure/grow hold or wait for execMu: calls queue, never inline
	pending       int        // calls queued for the worker and not finished
	execMu        sync.Mutex // held while a collective runs on the ring

	// closing ends (first thing in Close) the waits of a reconfiguration,
	// so that Close does not wait for a membership that may take
	// --elastic-timeout to form.
	closing     context.Context
	closeCancel context.CancelCauseFunc
	queue       chan *Handle
	stopped     chan struct{} // closed when the worker has exited

	stats struct {
		collectives, bytes, nanos atomic.Uint64
		queueNanos, waitNanos     atomic.Uint64
		inlineNanos               atomic.Uint64 // synchronous calls run on the caller's goroutine
		stalls                    atomic.Uint64
	}

	testReconfigHook func() // tests: called by grow and reconfigure once quiesced (holding execMu)

	tl             *Timeline // nil: no timeline
	ownTL          bool      // opened from GORUN_TIMELINE: Close closes it
	stallThreshold time.Duration
	stall          stallWatch // the running call's stall warning (stall.go)
	metrics        *metricsServer
}

// Option configures Init. Explicit options win over the environment.
type Option func(*config)

type config struct {
	ownProcess           bool // Init's: the process runs this rank alone (fitGOMAXPROCS)
	rank, size           int
	localRank, localSize int
	rendezvous           string
	hostRendezvous       bool
	jobKey               []byte
	timeout              time.Duration
	listenIP             string
	dataPlane            string
	chunkBytes           int
	allreduce            ring.AllreducePolicy
	autotune             bool
	logf                 func(string, ...any)
	setRank, setLocal    bool
	timeline             *Timeline
	timelinePath         string
	stallThreshold       time.Duration
	metricsAddr          string
	warnf                func(string, ...any)
	compression          compressionConfig
	elastic              bool
	heartbeat            time.Duration
	minSize, maxSize     int // StartLocal's elastic rendezvous, or the bounds of a replica's membership
	// replica: host a replica of the job's rendezvous group (a rank gorun
	// chose), with the job's bounds minSize, maxSize and elasticWait.
	replica      bool
	replicaSpare bool
	elasticWait  time.Duration
	group        bool // rank 0 hosts replica 1 of the group (srun, Kubernetes)
	// pods: the group's replicas are on the pods of a Kubernetes job
	// (elastic_pod.go).
	pods *podGroup
	// replicaID, replicaPort: the ID and port of this rank's replica
	// under srun; srunJoin: where a joining srun step finds the group
	// (slurm_group.go).
	replicaID   uint64
	replicaPort int
	srunJoin    *slurmJoin
	// etcd: the membership is kept in etcd (env_etcd.go): the rank finds
	// the rendezvous (the replica that leads) there.
	etcd *p2p.EtcdGroup
}

// WithRank sets this process's rank and the job size instead of reading them
// from the environment.
func WithRank(rank, size int) Option {
	return func(c *config) { c.rank, c.size, c.setRank = rank, size, true }
}

// WithLocalRank sets the rank among the ranks on this host, and their number.
func WithLocalRank(localRank, localSize int) Option {
	return func(c *config) { c.localRank, c.localSize, c.setLocal = localRank, localSize, true }
}

// WithRendezvous names the rendezvous service ("host:port"). With host set,
// rank 0 starts it in-process there, as when a job runs without gorun.
func WithRendezvous(addr string, host bool) Option {
	return func(c *config) { c.rendezvous, c.hostRendezvous = addr, host }
}

// WithJobKey sets the shared secret every rank of the job must hold.
func WithJobKey(key []byte) Option { return func(c *config) { c.jobKey = key } }

// WithTimeout bounds every collective (default 60 s, or GORUN_TIMEOUT): a
// dead or frozen peer turns into an error on every rank within it.
func WithTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithListenIP sets the IP this rank listens on and advertises to its peers.
func WithListenIP(ip string) Option { return func(c *config) { c.listenIP = ip } }

// WithDataPlane chooses how ring data travels: "auto" (no cipher between
// ranks of one host, TLS over a TCP connection per link between hosts),
// "tls", "plaintext" or "libp2p" (libp2p streams between hosts).
func WithDataPlane(mode string) Option { return func(c *config) { c.dataPlane = mode } }

// WithChunkBytes overrides the ring's pipelining chunk size.
func WithChunkBytes(n int) Option { return func(c *config) { c.chunkBytes = n } }

// WithTimeline makes the Comm write its events to tl (which several Comms
// may share; the caller closes it), instead of to GORUN_TIMELINE.
func WithTimeline(tl *Timeline) Option { return func(c *config) { c.timeline = tl } }

// WithTimelinePath makes the Comm write its own trace file, as
// GORUN_TIMELINE=path does: path for a one-rank job, path.rankN otherwise.
// Close finishes the file.
func WithTimelinePath(path string) Option { return func(c *config) { c.timelinePath = path } }

// WithStallThreshold sets how long a collective may wait before the rank
// logs a stall warning (default 60 s or half the timeout, whichever is
// shorter, or GORUN_STALL_THRESHOLD; negative disables it). The warning
// does not end the call: the timeout does.
func WithStallThreshold(d time.Duration) Option { return func(c *config) { c.stallThreshold = d } }

// WithMetricsAddr serves this rank's counters in Prometheus text format at
// http://addr/metrics, as GORUN_METRICS_ADDR does (there, the port is
// offset by the local rank so that ranks sharing a host do not collide).
func WithMetricsAddr(addr string) Option { return func(c *config) { c.metricsAddr = addr } }

// WithLogger receives the Comm's diagnostics. By default they are dropped,
// or printed with log.Printf when GORUN_VERBOSE is set (gorun --verbose):
// failures do not need them, since every error names its rank and cause.
func WithLogger(logf func(format string, args ...any)) Option {
	return func(c *config) { c.logf = logf }
}

// Init joins the job. It reads the environment gorun sets for every rank
// (or mpirun's, Slurm's or torchrun's), applies opts on top, finds the other
// ranks through the rendezvous, proves it holds the job key, and connects
// the ring. With no launcher environment and no options it returns a
// single-rank Comm, so a training program also runs as a plain binary.
func Init(ctx context.Context, opts ...Option) (*Comm, error) {
	env, err := readEnv(os.Getenv)
	if err != nil {
		return nil, fmt.Errorf("gorun: %w", err)
	}
	bound, bindWarning, err := applyCPUBinding(env, os.Getenv)
	if err != nil {
		return nil, fmt.Errorf("gorun: rank %d: %w", env.rank, err)
	}
	cfg := config{
		rank: env.rank, size: env.size, localRank: env.localRank, localSize: env.localSize,
		rendezvous: env.rendezvous, hostRendezvous: env.hostRendezvous, jobKey: env.jobKey,
		listenIP: os.Getenv(EnvListenIP), dataPlane: os.Getenv(EnvDataPlane),
		replica: env.replica, replicaSpare: env.replicaSpare, group: env.group, minSize: env.minNP, maxSize: env.maxNP, elasticWait: env.elasticWait,
		pods: env.pods, replicaID: env.replicaID, replicaPort: env.replicaPort, srunJoin: env.srunJoin,
		etcd: env.etcd,
	}
	if env.source == "" {
		cfg.size, cfg.localSize = 1, 1
	}
	if s := os.Getenv(EnvTimeout); s != "" {
		if cfg.timeout, err = parseTimeout(s); err != nil {
			return nil, fmt.Errorf("gorun: %w", err)
		}
	}
	if s := os.Getenv(EnvChunkBytes); s != "" {
		if cfg.chunkBytes, err = strconv.Atoi(s); err != nil || cfg.chunkBytes <= 0 {
			return nil, fmt.Errorf("gorun: %s=%q is not a positive byte count", EnvChunkBytes, s)
		}
	}
	if cfg.allreduce, err = readAllreducePolicy(os.Getenv); err != nil {
		return nil, fmt.Errorf("gorun: %w", err)
	}
	if cfg.autotune, err = readAutotune(os.Getenv); err != nil {
		return nil, fmt.Errorf("gorun: %w", err)
	}
	cfg.timelinePath = os.Getenv(EnvTimeline)
	if s := os.Getenv(EnvStallThreshold); s != "" {
		if cfg.stallThreshold, err = parseDuration(EnvStallThreshold, s); err != nil {
			return nil, fmt.Errorf("gorun: %w", err)
		}
	}
	envMetrics := os.Getenv(EnvMetricsAddr)
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.metricsAddr == "" && envMetrics != "" {
		if cfg.metricsAddr, err = offsetPort(envMetrics, cfg.localRank); err != nil {
			return nil, fmt.Errorf("gorun: %s: %w", EnvMetricsAddr, err)
		}
	}
	if cfg.setRank && !cfg.setLocal {
		cfg.localRank, cfg.localSize = max(cfg.rank, 0), cfg.size
	}
	if cfg.timeout <= 0 {
		cfg.timeout = DefaultTimeout
	}
	cfg.warnf = cfg.logf
	if cfg.warnf == nil {
		cfg.warnf = log.Printf // warnings are printed even when diagnostics are not
	}
	if cfg.logf == nil {
		cfg.logf = func(string, ...any) {}
		if os.Getenv(EnvVerbose) != "" {
			cfg.logf = log.Printf
		}
	}
	if bound != "" {
		cfg.logf("gorun: rank %d: %s", env.rank, bound)
	}
	if bindWarning != "" {
		cfg.warnf("gorun: rank %d: %s", env.rank, bindWarning)
	}
	if env.elastic {
		cfg.elastic = true
		if cfg.heartbeat == 0 {
			cfg.heartbeat = env.heartbeat
		}
	}
	if cfg.elastic && cfg.rank == -1 {
		// A joiner: its rank and the job's size come from the rendezvous.
		cfg.size = max(cfg.size, 1)
	} else if cfg.size < 1 || cfg.rank < 0 || cfg.rank >= cfg.size {
		return nil, fmt.Errorf("gorun: rank %d is not within a job of size %d", cfg.rank, cfg.size)
	}
	toward := cfg.rendezvous
	if toward == "" && cfg.etcd != nil {
		// The membership is in etcd: the rendezvous is found there, and
		// the ranks reach etcd from the address they reach each other on.
		toward = strings.Join(cfg.etcd.Endpoints, ",")
	}
	if cfg.listenIP == "" && env.source != "" && env.source != "gorun" && (cfg.size > 1 || cfg.elastic) && toward != "" {
		// Started by a scheduler (srun, Kubernetes, mpirun): nobody chose
		// this rank's address, so take the one its host reaches the
		// rendezvous from, as gorun does for the ranks it starts.
		rctx, cancel := context.WithTimeout(ctx, cfg.timeout)
		cfg.listenIP, err = defaultListenIP(rctx, toward, env.localSizeKnown && cfg.localSize < cfg.size)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("gorun: rank %d: %w", cfg.rank, err)
		}
	}
	cfg.ownProcess = true
	return newComm(ctx, cfg)
}

func newComm(ctx context.Context, cfg config) (_ *Comm, err error) {
	c := &Comm{
		localRank: cfg.localRank, localSize: cfg.localSize,
		timeout: cfg.timeout, logf: cfg.logf,
		queue: make(chan *Handle, 1024), stopped: make(chan struct{}), drained: make(chan struct{}, 1),
		tl: cfg.timeline, stallThreshold: cfg.stallThreshold, warnf: cfg.warnf,
		elastic: cfg.elastic, chunkBytes: cfg.chunkBytes, allreducePolicy: cfg.allreduce, autotune: cfg.autotune, joiner: cfg.elastic && cfg.rank == -1,
	}
	if c.elastic {
		c.heartbeat = cfg.heartbeat
		if c.heartbeat <= 0 {
			c.heartbeat = DefaultHeartbeatTimeout
		}
	}
	// Until the job tells it otherwise (a joiner learns its rank at Join).
	c.view.Store(&commView{rank: max(cfg.rank, 0), size: cfg.size, ctx: context.Background()})
	if c.warnf == nil {
		c.warnf = log.Printf
	}
	if c.stallThreshold == 0 {
		// Warn before the timeout ends the call, or the warning never shows.
		c.stallThreshold = min(DefaultStallThreshold, c.timeout/2)
	}
	c.life, c.cancel = context.WithCancelCause(context.Background())
	context.AfterFunc(c.life, c.cancelCall)
	c.closing, c.closeCancel = context.WithCancelCause(context.Background())
	defer func() {
		if err != nil {
			c.shutdown(err)
		}
	}()
	if cfg.timeline != nil || cfg.timelinePath != "" {
		c.phase = c.tracePhase
	}
	who := fmt.Sprintf("rank %d", cfg.rank)
	if cfg.rank < 0 {
		who = "joiner"
	}
	// Before joining: an elastic job's first epoch times its codec with
	// its links (adopt, links_elastic.go).
	if c.compression, err = newCompressionState(cfg.compression, os.Getenv); err != nil {
		return nil, fmt.Errorf("gorun: %w", err)
	}

	var transport ring.Transport
	if cfg.size > 1 || cfg.elastic {
		if cfg.rendezvous == "" && cfg.etcd == nil {
			return nil, fmt.Errorf("gorun: %s of %d: no rendezvous address (WithRendezvous, or launch with gorun)", who, cfg.size)
		}
		if len(cfg.jobKey) == 0 {
			return nil, fmt.Errorf("gorun: %s of %d: no job key (WithJobKey, %s, or launch with gorun)", who, cfg.size, EnvJobKey)
		}
		if cfg.elastic && cfg.hostRendezvous && !cfg.group {
			return nil, fmt.Errorf("gorun: %s: an elastic job needs a rendezvous that outlives every rank: launch it with gorun (--min-np/--max-np) or srun, or use StartLocal with WithElastic, not a rendezvous hosted by rank 0", who)
		}
		setup, cancel := context.WithTimeout(ctx, cfg.timeout)
		defer cancel()
		if cfg.pods != nil && cfg.group && cfg.rank == 0 && podGroupRunning(setup, cfg.pods, cfg.size) {
			// A replaced pod 0: the group runs without it (elastic_pod.go).
			cfg = podJoiner(cfg, 0)
			c.joiner, who = true, "joiner (replaced pod 0)"
		}
		if cfg.hostRendezvous && cfg.rank == 0 {
			// A host name (Slurm's first node, a pod's DNS name) is where
			// the others find rank 0; rank 0 itself listens on every
			// interface at that port.
			listenAddr, err := hostingListenAddr(setup, cfg.rendezvous)
			if err != nil {
				return nil, fmt.Errorf("gorun: rank 0: %w", err)
			}
			rc := p2p.RendezvousConfig{ListenAddr: listenAddr, Size: cfg.size, JobKey: cfg.jobKey, Timeout: cfg.timeout, Logf: cfg.logf}
			if cfg.group {
				// Replica 1 of the job's rendezvous group (env_replica.go).
				rc.Elastic = &p2p.ElasticConfig{MinSize: cfg.minSize, MaxSize: cfg.maxSize, WaitTimeout: cfg.elasticWait, HeartbeatTimeout: c.heartbeat}
				rc.Group = &p2p.GroupConfig{ID: 1, Advertise: cfg.rendezvous}
				c.cfgGroup = true
			}
			c.rdv, err = p2p.StartRendezvous(setup, rc)
			if err != nil {
				if errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use") {
					return nil, fmt.Errorf("gorun: rank 0: hosting the rendezvous on %s: %w: another job on this host may hold the port; choose another with %s (the port) or %s (host:port) for every rank", cfg.rendezvous, err, EnvRendezvousPort, EnvRendezvousAddr)
				}
				return nil, fmt.Errorf("gorun: rank 0: hosting the rendezvous on %s: %w", cfg.rendezvous, err)
			}
		}
		if cfg.elastic && cfg.replica && cfg.rank >= 0 {
			if c.replica, err = startReplica(setup, cfg, c.heartbeat); err != nil {
				return nil, fmt.Errorf("gorun: rank %d: %w", cfg.rank, err)
			}
		}
		var rzReplica uint64
		if cfg.etcd != nil {
			if rzReplica, cfg.rendezvous, err = findEtcdLeader(setup, cfg); err != nil {
				return nil, fmt.Errorf("gorun: %s: %w", who, err)
			}
		}
		if cfg.srunJoin != nil && cfg.etcd == nil && cfg.rank == -1 {
			// Fail within the timeout, saying where it looked, rather
			// than wait for a group that is not there (a group kept in
			// etcd is found there instead).
			if err := cfg.srunJoin.waitGroup(setup); err != nil {
				return nil, fmt.Errorf("gorun: %s: %w", who, err)
			}
		}
		if cfg.elastic && cfg.rank == -1 {
			// A joiner waits as long as the job runs without it: the
			// members admit it at their next commit (Grow).
			setup = ctx
		}
		var relocate func(context.Context) (uint64, string, error)
		if cfg.etcd != nil {
			// The leader found in etcd may be lost before this rank reaches
			// it (a process replacing a lost leader's, started before the
			// lost one's lease expired): its successor is found there too.
			group := *cfg.etcd
			relocate = func(ctx context.Context) (uint64, string, error) { return p2p.FindEtcdLeader(ctx, group) }
		}
		join := func(setup context.Context, cfg config, rendezvous string) (*p2p.Node, error) {
			return p2p.Join(setup, p2p.Config{
				Rank: cfg.rank, Size: cfg.size, JobKey: cfg.jobKey, Rendezvous: rendezvous, RendezvousReplica: rzReplica,
				ListenIP: cfg.listenIP, DataPlane: cfg.dataPlane, Timeout: cfg.timeout, Logf: cfg.logf,
				Elastic: cfg.elastic, HeartbeatTimeout: c.heartbeat, Replica: c.hostedReplica(), Relocate: relocate,
			})
		}
		switch {
		case cfg.pods != nil:
			err = c.joinAsPod(ctx, setup, &cfg, &who, join)
		case cfg.etcd != nil && cfg.rank >= 0:
			// A process of a job kept in etcd may replace a lost one
			// (Kubernetes restarts pods): the job then runs, and it joins.
			err = c.joinOrRejoin(ctx, setup, &cfg, &who, true, cfg.rendezvous, join, etcdJoiner)
		default:
			c.node, err = join(setup, cfg, cfg.rendezvous)
		}
		if err != nil {
			return nil, fmt.Errorf("gorun: %s: joining the job at %s: %w", who, cfg.rendezvous, err)
		}
		c.node.SetCallReporter(c.recorder.snapshot)
		if cfg.ownProcess {
			machine, host := c.node.MachineRanks()
			fitGOMAXPROCS(machine, host, os.Getenv, cfg.logf, cfg.rank)
		}
		if cfg.elastic {
			// The epoch Join put the node in (Reconfigure returns its View
			// at once while it lasts; if it ended already, the next one).
			pv, err := c.node.Reconfigure(setup)
			if err != nil {
				return nil, fmt.Errorf("gorun: %s: joining the job at %s: %w", who, cfg.rendezvous, err)
			}
			if err := c.adopt(pv); err != nil {
				return nil, err
			}
		} else {
			transport = c.node.Transport()
			go func() {
				select {
				case <-c.node.Done():
					c.cancel(c.node.Err())
				case <-c.life.Done():
				}
			}()
		}
	}
	if !cfg.elastic {
		var hosts []int
		if c.node != nil {
			hosts = hostIndices(c.node.Peers())
		}
		rc := ring.Config{Rank: cfg.rank, Size: cfg.size, ChunkBytes: cfg.chunkBytes, Phase: c.phase,
			Hosts: hosts, Allreduce: c.allreducePolicy}
		if mesh, ok := transport.(ring.Mesh); ok && spansHosts(hosts) {
			mctx, cancel := context.WithTimeout(ctx, cfg.timeout)
			links, err := measureLinks(mctx, mesh, cfg.rank, cfg.size, hosts, cfg.chunkBytes, c.compression.cfg.codec)
			if err == nil {
				err = agreeAutotune(mctx, mesh, cfg.rank, cfg.size, c.autotune)
			}
			cancel()
			if err != nil {
				return nil, fmt.Errorf("gorun: rank %d: %w", cfg.rank, err)
			}
			c.links, rc.Links = &links, &links.Links
			c.compression.adoptLinks(links, cfg.size, hosts, cfg.chunkBytes)
		}
		rg, err := ring.New(rc, transport)
		if err != nil {
			return nil, fmt.Errorf("gorun: %w", err)
		}
		v := &commView{rank: cfg.rank, size: cfg.size, ring: rg, ctx: context.Background(), links: c.links}
		if c.links != nil {
			v.refine = c.refinerFor(rg, *c.links, cfg.size, hosts)
			if cfg.rank == 0 {
				c.logf("gorun: rank 0: %s", policyReport(rg, c.links, c.compression))
			}
		}
		c.view.Store(v)
	}
	rank, size := c.Rank(), c.Size()
	if c.tl == nil && cfg.timelinePath != "" {
		if c.tl, err = OpenTimeline(timelinePath(cfg.timelinePath, rank, size)); err != nil {
			return nil, fmt.Errorf("gorun: rank %d: %w", rank, err)
		}
		c.ownTL = true
	}
	if cfg.metricsAddr != "" {
		if c.metrics, err = c.serveMetrics(cfg.metricsAddr); err != nil {
			return nil, fmt.Errorf("gorun: rank %d: metrics on %s: %w", rank, cfg.metricsAddr, err)
		}
	}
	go c.worker()
	return c, nil
}

// Rank is this process's rank, 0..Size()-1. In an elastic job it is the
// rank in the current membership epoch: a reconfiguration may change it.
func (c *Comm) Rank() int { return c.view.Load().rank }

// Size is the number of ranks in the job (in the current membership epoch,
// in an elastic job).
func (c *Comm) Size() int { return c.view.Load().size }

// AllreduceAlgorithm names the algorithm ("direct", "scatter-gather",
// "ring", ...; see ring.Algorithm) an uncompressed allreduce of a float
// buffer of bytes bytes runs on the current ring, as chosen by
// GORUN_ALLREDUCE_ALGORITHMS or the measured defaults. It is "" while no
// ring exists (an elastic membership epoch being formed).
func (c *Comm) AllreduceAlgorithm(bytes int) string {
	rg := c.cur().ring
	if rg == nil {
		return ""
	}
	return rg.AllreduceAlgorithm(bytes).String()
}

// cur is the membership epoch calls are numbered in now.
func (c *Comm) cur() *commView { return c.view.Load() }

// LocalRank is this process's rank among the ranks on its host.
func (c *Comm) LocalRank() int { return c.localRank }

// LocalSize is the number of ranks on this host.
func (c *Comm) LocalSize() int { return c.localSize }

// Timeout is the bound on every collective.
func (c *Comm) Timeout() time.Duration { return c.timeout }

// Err is nil while the Comm is usable, and otherwise says why it is not.
// In an elastic job it is a *MembershipChangeError from the moment the
// current membership epoch ends until RunElastic (or the next
// reconfiguration) moves the Comm into the next one.
func (c *Comm) Err() error {
	if c.life.Err() != nil {
		return context.Cause(c.life)
	}
	return c.cur().endErr()
}

// ErrClosed is returned by calls on a Comm after Close.
var ErrClosed = errors.New("gorun: communicator is closed")

// PeerLeftError is the cause of a collective that failed because another
// rank closed its Comm after an earlier call (see Close); EarlyCloseError is
// what Close returns on that rank. Match them with errors.As.
type (
	PeerLeftError   = p2p.PeerLeftError
	EarlyCloseError = p2p.EarlyCloseError
)

// Close leaves the job in order. Collectives already called finish first;
// later calls return ErrClosed. Every rank must have made the same calls:
// a rank still in (or entering) a call after this rank's last one fails at
// once with a *PeerLeftError naming this rank, and Close then returns an
// *EarlyCloseError naming those ranks (after waiting, at most the timeout,
// for every peer to close or fail).
func (c *Comm) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.queue)
	c.mu.Unlock()
	if c.closeCancel != nil {
		c.closeCancel(ErrClosed) // a reconfiguration under way gives up now
	}
	<-c.stopped
	c.execMu.Lock() // a synchronous call running inline finishes first
	defer c.execMu.Unlock()
	return c.shutdown(ErrClosed)
}

// shutdown releases the network resources; it runs once the worker is idle
// (Close) or was never started (a failed Init).
func (c *Comm) shutdown(cause error) error {
	if c.closeCancel != nil {
		c.closeCancel(cause)
	}
	var failed error
	if c.life.Err() != nil && !errors.Is(context.Cause(c.life), ErrLeft) {
		// Only a failure of the job: a member of an elastic job that closes
		// while its epoch changes, or that left it, just leaves, and the
		// others go on.
		failed = context.Cause(c.life)
	}
	c.cancel(cause)
	var errs []error
	if c.node != nil {
		if failed == nil {
			if err := c.node.Close(); err != nil {
				errs = append(errs, fmt.Errorf("gorun: rank %d: %w", c.Rank(), err))
			}
		} else {
			c.node.Abort(failed)
			c.node.Close()
		}
	}
	if c.rdv != nil {
		if c.cfgGroup && (failed != nil || errors.Is(context.Cause(c.life), ErrLeft)) {
			c.rdv.CloseNow() // as a replica below: the job goes on without this process
		} else {
			errs = append(errs, c.rdv.Close())
		}
	}
	if c.relay != nil {
		c.relay.Close()
	}
	if c.replica != nil {
		if failed != nil || errors.Is(context.Cause(c.life), ErrLeft) {
			// The job goes on without this process (it left, was cut
			// off or dropped), or failed: hand the lead over and go,
			// rather than wait for the others to finish.
			c.replica.CloseNow()
		} else {
			c.replica.Close()
		}
	}
	if c.metrics != nil {
		c.metrics.close()
	}
	if c.ownTL {
		errs = append(errs, c.tl.Close())
	}
	return errors.Join(errs...)
}

// hostedReplica is the replica of the job's rendezvous group this rank
// hosts, nil if none: its own (GORUN_RDZV_REPLICA), or replica 1, which
// rank 0 hosts where no gorun does. The hello names it, so that a new
// leader knows which ranks went with the old one.
func (c *Comm) hostedReplica() *p2p.Rendezvous {
	if c.replica != nil {
		return c.replica
	}
	if c.cfgGroup {
		return c.rdv
	}
	return nil
}
