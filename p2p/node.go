package p2p

// A rank's membership in a job (Node): joining (Join), its state, the
// job table, aborting and closing. The control stream is ctl.go, the data
// links link.go and the files it names, elastic membership elastic*.go.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorun/gorun/ring"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
	ma "github.com/multiformats/go-multiaddr"
)

// Data plane modes (Config.DataPlane).
const (
	DataPlaneAuto      = "auto"
	DataPlanePlaintext = "plaintext"
	DataPlaneTLS       = "tls"
	DataPlaneLibp2p    = "libp2p"
)

// ErrClosed is Node.Err() after an orderly Close that was not preceded by
// an abort.
var ErrClosed = errors.New("p2p: node closed")

// Config configures Join.
type Config struct {
	Rank, Size int
	JobKey     []byte // shared secret, >= 16 bytes
	// Rendezvous is the rendezvous service's "host:port", or a list of a
	// replicated group's replicas, "host:port,ID@host:port,..." (an entry
	// without ID is replica 1, the one the group starts from): tried in
	// turn, and one that does not lead redirects to the leader.
	Rendezvous string
	ListenIP   string // IP the libp2p host (and the TCP data ports) listen on and advertise; "" = 127.0.0.1
	// DataPlane: "auto" (default): same host -> shared memory set up over an
	// authenticated unix abstract socket (the socket itself with NoShm),
	// different hosts -> a TCP connection of its own per link secured by
	// libp2p's TLS 1.3 (peer IDs checked, no yamux);
	// "plaintext": different hosts use raw TCP authenticated by the job key
	// (no cipher); "tls": TLS over TCP between every pair, same host
	// included; "libp2p": like auto, but different hosts use a libp2p stream
	// (TLS + yamux on the host's connection), as before tcp-tls. A peer
	// that advertises no TCP data port is reached over a libp2p stream.
	DataPlane string
	// Timeout bounds every setup step and dead-peer detection on the
	// control path (in elastic mode, HeartbeatTimeout is the dead-peer
	// bound); 0 = 60s.
	Timeout time.Duration
	Logf    func(format string, args ...any) // optional
	// HostID overrides the detected host identity (hostname, network
	// namespace, boot id). Ranks with equal HostIDs use unix sockets in
	// "auto" mode. Mostly for tests.
	HostID string
	// HostName is the name this rank's host goes by in messages (a lost
	// member's host): "" = $GORUN_HOST (the name the launcher knows it
	// by, e.g. gorun's -H name), else the OS host name.
	HostName string
	// NoShm keeps links between ranks of one host on unix sockets instead
	// of shared memory (shm.go), as GORUN_SHM=0 does. A pair of ranks uses
	// shared memory only if both allow it.
	NoShm bool
	// Elastic joins an elastic job (the rendezvous has an ElasticConfig):
	// losing a member starts a new membership epoch instead of aborting
	// (see elastic.go). With Rank -1 the process is a joiner: it asks to
	// join a running job, and Join returns once it is a member of an epoch
	// (Size is then ignored).
	Elastic bool
	// HeartbeatTimeout, in elastic mode, is how long the rendezvous may be
	// silent before this rank counts itself cut off (pings go out every
	// quarter of it); 0 = 3s. It must match the rendezvous'. Without
	// Elastic, Timeout is the heartbeat bound, as it always was.
	HeartbeatTimeout time.Duration
	// ProcID is the launcher's identity of this process, sent in the
	// hello so that the rendezvous' reports (RendezvousConfig.OnProc,
	// Change) name it; "" = $GORUN_PROC_ID, which gorun sets.
	ProcID string
	// Args are the program's arguments (nil: os.Args[1:]), sent in the
	// hello: an elastic job's rendezvous refuses a joiner whose arguments
	// differ from those the job's ranks started with (a joiner started by
	// hand with other flags would train something else, or call other
	// collectives, and fail the job later).
	Args []string
	// Replica, if set, is the replica of the job's replicated rendezvous
	// that this process hosts (StartRendezvous with a GroupConfig): the
	// hello offers it, and the group adds it. The caller closes it after
	// the node.
	Replica *Rendezvous
	// RendezvousReplica is the group id of the replica at Rendezvous,
	// whose peer ID derives from it: 0 (or 1) for the launcher's or rank
	// 0's; another when the rank found the group's leader itself
	// (FindEtcdLeader).
	RendezvousReplica uint64
	// Relocate, if set, says where the rendezvous is now (its replica's
	// group id and address), for a registration that does not reach it:
	// a leader found in etcd may have been lost since, and its successor
	// is found there again (FindEtcdLeader).
	Relocate func(ctx context.Context) (uint64, string, error)
}

// maxArgsBytes bounds the arguments a hello carries; longer ones are sent
// as their digest, which still compares.
const maxArgsBytes = 8 << 10

// helloArgs are the arguments as a hello carries them.
func helloArgs(args []string) []string {
	n := 0
	for _, a := range args {
		n += len(a) + 1
	}
	if n <= maxArgsBytes {
		return args
	}
	h := sha256.New()
	for _, a := range args {
		h.Write([]byte(a))
		h.Write([]byte{0})
	}
	return []string{fmt.Sprintf("(%d arguments, %d bytes, sha256 %x)", len(args), n, h.Sum(nil))}
}

// Peer describes one rank of the job.
type Peer struct {
	Rank   int
	ID     peer.ID
	Addrs  []string
	HostID string
	Link   string // "shm", "unix", "tcp-plaintext", "tcp-tls", "libp2p-tls" for every other rank, "" for this one
}

// Node is one rank's membership in a job.
type Node struct {
	cfg   Config
	h     host.Host  // this rank's libp2p host
	g     *gater     // admits the rendezvous and the job's peers to h
	rzID  peer.ID    // the rendezvous' peer ID
	hosts hostGuard  // h closes only between dials
	data  dataPlane  // how this rank's data links are reached and made (accept.go)
	ctl   *ctlClient // the control stream to the rendezvous (ctl.go)

	// mu guards job, links, fatal and the replacement of cur, and in
	// other types what says "under Node.mu": an epoch's err, the elastic
	// state, lifecycle.stopped, dataPlane.handshakes and simHooks.thaw.
	mu    sync.Mutex
	job   jobTable   // under mu
	links epochLinks // under mu: the current epoch's (epoch_links.go)
	// cur is the membership epoch this node is in (a fixed-size job has
	// only epoch 0): its rank, size and fate. Replaced under mu; read
	// without a lock where only its immutable fields are needed.
	cur atomic.Pointer[epochRun]
	// fatal, under mu, is set once this node can never take part again
	// (abort, Close, cut off from the rendezvous): no new epoch starts.
	fatal error
	el    elasticNode // elastic mode only (elastic.go)

	life lifecycle
	sim  simHooks // tests (hooks.go)
}

// jobTable is the job's table (the current epoch's, in elastic mode) as
// this rank knows it.
type jobTable struct {
	table   []tableItem
	peers   []Peer
	missing []int // the ranks the rendezvous last reported as not registered
}

// lifecycle is how far a node is in ending, and what it waits for then.
type lifecycle struct {
	closing atomic.Bool
	// departedJob: this member left the elastic job (Depart, Quit); its
	// Close announces nothing the others must act on.
	departedJob atomic.Bool
	stopped     bool // under Node.mu: no new handler goroutines
	closeOnce   sync.Once
	stop        chan struct{} // closed by shutdown
	wg          sync.WaitGroup
}

func (n *Node) logf(format string, args ...any) {
	rank := n.cfg.Rank
	if ep := n.cur.Load(); ep != nil {
		rank = ep.rank
	}
	if rank < 0 {
		n.cfg.Logf("joiner: "+format, args...)
		return
	}
	n.cfg.Logf("rank %d: "+format, append([]any{rank}, args...)...)
}

// rank and size are this node's in its current epoch (cfg's in a
// fixed-size job).
func (n *Node) rank() int { return n.cur.Load().rank }
func (n *Node) size() int { return n.cur.Load().size }

// hbTimeout is how long a silent control stream is tolerated.
func (n *Node) hbTimeout() time.Duration {
	if n.cfg.Elastic {
		return n.cfg.HeartbeatTimeout
	}
	return n.cfg.Timeout
}

// Join starts this rank's host, registers with the rendezvous, waits for the
// whole job and connects the data links to and from every other rank. The
// returned Node no longer depends on ctx.
func Join(ctx context.Context, cfg Config) (*Node, error) {
	joiner := cfg.Elastic && cfg.Rank == -1
	if joiner {
		cfg.Size = 0
	} else if cfg.Size < 1 || cfg.Rank < 0 || cfg.Rank >= cfg.Size {
		return nil, fmt.Errorf("p2p: rank %d out of range for size %d", cfg.Rank, cfg.Size)
	}
	if len(cfg.JobKey) < minKeyLen {
		return nil, fmt.Errorf("p2p: job key of %d bytes, need >= %d", len(cfg.JobKey), minKeyLen)
	}
	switch cfg.DataPlane {
	case "":
		cfg.DataPlane = DataPlaneAuto
	case DataPlaneAuto, DataPlanePlaintext, DataPlaneTLS, DataPlaneLibp2p:
	default:
		return nil, fmt.Errorf("p2p: unknown data plane %q", cfg.DataPlane)
	}
	cfg.Timeout = defaultTimeout(cfg.Timeout)
	if cfg.Elastic {
		cfg.HeartbeatTimeout = defaultHeartbeat(cfg.HeartbeatTimeout)
	}
	if cfg.Logf == nil {
		cfg.Logf = nopLogf
	}
	if cfg.ListenIP == "" {
		cfg.ListenIP = "127.0.0.1"
	}
	ip := net.ParseIP(cfg.ListenIP)
	if ip == nil {
		return nil, fmt.Errorf("p2p: ListenIP %q is not an IP address", cfg.ListenIP)
	}
	if cfg.HostID == "" {
		cfg.HostID = detectHostID()
	}
	if cfg.ProcID == "" {
		cfg.ProcID = os.Getenv("GORUN_PROC_ID")
	}
	if cfg.HostName == "" {
		cfg.HostName = os.Getenv("GORUN_HOST")
	}
	if cfg.HostName == "" {
		cfg.HostName, _ = os.Hostname()
	}
	if cfg.Args == nil && len(os.Args) > 0 {
		cfg.Args = os.Args[1:]
	}
	if len(cfg.ProcID) > maxProcID {
		return nil, fmt.Errorf("p2p: ProcID of %d bytes, at most %d", len(cfg.ProcID), maxProcID)
	}
	_, rzID, err := replicaIdentity(cfg.JobKey, cfg.RendezvousReplica)
	if err != nil {
		return nil, err
	}
	rzList, err := rendezvousList(cfg.Rendezvous)
	if err != nil {
		return nil, fmt.Errorf("p2p: %w", err)
	}
	if len(rzList) == 1 && cfg.RendezvousReplica > 1 && !strings.Contains(cfg.Rendezvous, "@") {
		rzList[0].ID = cfg.RendezvousReplica
	}
	if len(rzList) == 1 {
		// One rendezvous: a name that does not resolve is a mistake to
		// report now. In a list, a replica's name may be gone with its
		// pod or node while the others serve.
		rctx, rcancel := context.WithTimeout(ctx, cfg.Timeout)
		_, err = resolveHostPort(rctx, rzList[0].Addr)
		rcancel()
		if err != nil {
			return nil, fmt.Errorf("p2p: rendezvous: %w", err)
		}
	}
	n := &Node{
		cfg: cfg, rzID: rzID,
		data:  dataPlane{handshakes: map[io.Closer]struct{}{}},
		links: newEpochLinks(cfg.Size),
		life:  lifecycle{stop: make(chan struct{})},
	}
	n.ctl = newCtlClient(n)
	first := &epochRun{rank: cfg.Rank, size: cfg.Size, done: make(chan struct{})}
	if cfg.Elastic {
		// Epoch 0 starts with the first table; until then the node is in
		// no epoch.
		first.epoch = -1
		n.el.init()
	}
	n.cur.Store(first)
	n.data.shm = shmEnabled(cfg)
	if n.data.shmBytes, err = shmCapacity(); err != nil {
		return nil, fmt.Errorf("p2p: rank %d: %w", cfg.Rank, err)
	}
	n.g = newGater(rzID, n.logf)
	sk, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, err
	}
	la, err := ipMultiaddr(ip, 0)
	if err != nil {
		return nil, err
	}
	if n.h, err = newHost(sk, la, n.g); err != nil {
		return nil, fmt.Errorf("p2p: rank %d: libp2p host: %w", cfg.Rank, err)
	}
	// tcp-tls links run libp2p's TLS handshake on their own sockets, with
	// the host's identity, so a link's peer ID is the one in the table.
	if n.data.sec, err = libp2ptls.New(libp2ptls.ID, sk, nil); err != nil {
		n.shutdown()
		return nil, fmt.Errorf("p2p: rank %d: tls: %w", cfg.Rank, err)
	}
	n.h.SetStreamHandler(ringProto, n.handleRingStream)
	if err := n.listenData(ip); err != nil {
		n.shutdown()
		return nil, fmt.Errorf("p2p: rank %d: %w", cfg.Rank, err)
	}
	if err := n.setup(ctx, rzList); err != nil {
		n.abortLocal(err)
		n.shutdown()
		if cfg.Elastic {
			return nil, n.wrapErr(err)
		}
		return nil, fmt.Errorf("p2p: rank %d: %w", cfg.Rank, err)
	}
	return n, nil
}

// stepCtx bounds one setup step by Timeout, with a cause naming the step.
func (n *Node) stepCtx(ctx context.Context, what string) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, n.cfg.Timeout,
		fmt.Errorf("timed out after %v %s", n.cfg.Timeout, what))
}

func (n *Node) setup(ctx context.Context, rzList []groupItem) error {
	if err := n.register(ctx, rzList); err != nil {
		return err
	}
	if n.cfg.Elastic {
		// The first epoch forms like any later one.
		_, err := n.reconfigure(ctx, false)
		return err
	}
	// Phase 1: the table.
	if err := n.waitFor(ctx, "waiting for the job table (ranks not registered yet)", n.ctl.tableReady); err != nil {
		return err
	}
	// Written before tableReady closed.
	if err := n.installTable(n.ctl.table); err != nil {
		return err
	}
	if err := n.ctl.send(&msg{T: tAck, Rank: n.rank()}); err != nil {
		return fmt.Errorf("ack to rendezvous: %w", err)
	}
	// Phase 2: every rank's gater is ready.
	if err := n.waitFor(ctx, "waiting for go (ranks that have not acked the table)", n.ctl.goCh); err != nil {
		return err
	}
	return n.connectLinks(ctx)
}

// waitFor waits for ready, bounded by ctx and Timeout; a failure names the
// ranks the rendezvous last reported as missing.
func (n *Node) waitFor(ctx context.Context, what string, ready <-chan struct{}) error {
	sctx, cancel := n.stepCtx(ctx, what)
	defer cancel()
	ep := n.cur.Load()
	select {
	case <-ready:
		return nil
	case <-ep.done:
		return n.epochErr(ep)
	case <-sctx.Done():
		if m := n.getMissing(); len(m) > 0 {
			return fmt.Errorf("%s: missing ranks %v: %w", what, m, context.Cause(sctx))
		}
		return fmt.Errorf("%s: %w", what, context.Cause(sctx))
	}
}

func (n *Node) getMissing() []int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.job.missing)
}

// installTable validates the table, opens the gater for the job's peers and
// records their addresses.
func (n *Node) installTable(t []tableItem) error {
	peers, err := parseTable(t, n.cfg.Size, n.cfg.Rank, n.h.ID())
	if err != nil {
		return err
	}
	n.g.allow(n.addPeers(peers)...)
	n.mu.Lock()
	n.job = jobTable{table: t, peers: peers}
	n.expectLinks() // the links of which we are the higher rank
	n.mu.Unlock()
	return nil
}

// addPeers records the peers' addresses in the peerstore and returns their
// IDs.
func (n *Node) addPeers(peers []Peer) []peer.ID {
	me := n.h.ID()
	ids := make([]peer.ID, len(peers))
	for i, p := range peers {
		ids[i] = p.ID
		if p.ID == me {
			continue
		}
		var mas []ma.Multiaddr
		for _, a := range p.Addrs {
			if m, err := ma.NewMultiaddr(a); err == nil {
				mas = append(mas, m)
			}
		}
		n.h.Peerstore().AddAddrs(p.ID, mas, peerstore.PermanentAddrTTL)
	}
	return ids
}

// parseTable checks a table received from the rendezvous against what this
// rank knows (job size, its own rank and peer ID) and decodes the peer IDs.
func parseTable(t []tableItem, size, rank int, self peer.ID) ([]Peer, error) {
	if _, err := checkTable(t); err != nil {
		return nil, err
	}
	if len(t) != size {
		return nil, fmt.Errorf("rendezvous sent a table of %d ranks, job size is %d", len(t), size)
	}
	peers := make([]Peer, len(t))
	seen := make(map[peer.ID]int, len(t))
	for i, it := range t {
		id, err := peer.Decode(it.ID)
		if err != nil {
			return nil, fmt.Errorf("table: rank %d: bad peer ID: %w", i, err)
		}
		if j, dup := seen[id]; dup {
			return nil, fmt.Errorf("table: ranks %d and %d have the same peer ID", j, i)
		}
		seen[id] = i
		if i == rank && id != self {
			return nil, fmt.Errorf("table: rank %d is %s, not this host (%s)", i, id, self)
		}
		peers[i] = Peer{Rank: i, ID: id, Addrs: slices.Clone(it.Addrs), HostID: it.HostID}
	}
	return peers, nil
}

// Transport returns the data links as a ring.Transport (nil when Size is
// 1). The value also implements ring.Mesh; see Mesh. In elastic mode it is
// the current epoch's: after Reconfigure, call it again.
func (n *Node) Transport() ring.Transport {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.links.tr == nil {
		return nil
	}
	return n.links.tr
}

// Mesh returns the data links to and from every rank (nil when Size is 1).
// Its SendNext/RecvPrev streams are the SendTo/RecvFrom streams of the ring
// neighbours. In elastic mode it is the current epoch's.
func (n *Node) Mesh() ring.Mesh {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.links.tr == nil {
		return nil
	}
	return n.links.tr
}

// Peers returns the job table (of the current epoch, in elastic mode).
func (n *Node) Peers() []Peer {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := slices.Clone(n.job.peers)
	for i := range out {
		out[i].Addrs = slices.Clone(out[i].Addrs)
	}
	return out
}

// Rank returns this node's rank (in the current epoch, in elastic mode).
func (n *Node) Rank() int { return n.rank() }

// Size returns the number of ranks in the job (in the current epoch, in
// elastic mode).
func (n *Node) Size() int { return n.size() }

// HostID returns this rank's host identity.
func (n *Node) HostID() string { return n.cfg.HostID }

// MachineRanks returns how many ranks of the job, this one included, run
// on this rank's machine (its kernel), and how many of them on its host:
// the machine's ranks are those of its host and of other network
// namespaces or containers there, and all of them share its CPUs.
func (n *Node) MachineRanks() (machine, host int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range n.job.peers {
		if p.HostID == n.cfg.HostID {
			host++
		}
	}
	return machineRanks(n.job.peers, n.cfg.HostID), host
}

func machineRanks(peers []Peer, host string) int {
	k := 0
	for _, p := range peers {
		if sameMachine(p.HostID, host) {
			k++
		}
	}
	return k
}

// PeerID returns this rank's libp2p peer ID.
func (n *Node) PeerID() peer.ID { return n.h.ID() }

// Addrs returns this rank's libp2p listen addresses.
func (n *Node) Addrs() []ma.Multiaddr { return n.h.Addrs() }

// Done is closed when the job is aborted (here, by another rank, or because
// the control path is lost) and after Close. In elastic mode it is the
// current epoch's: it is also closed when the membership changes (Err is
// then a *MembershipChangeError), and after Reconfigure Done returns the
// new epoch's channel.
func (n *Node) Done() <-chan struct{} { return n.cur.Load().done }

// Err returns why Done was closed, or nil while the job (the current epoch,
// in elastic mode) runs.
func (n *Node) Err() error { return n.epochErr(n.cur.Load()) }

// epochErr returns why epoch ep ended, or nil.
func (n *Node) epochErr(ep *epochRun) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return ep.err
}

// Abort tells every rank that the job is aborted and fails all blocked
// data transfers. Idempotent; only the first cause counts.
func (n *Node) Abort(cause error) {
	text := "aborted"
	if cause != nil {
		text = cause.Error()
	}
	if !n.abortLocal(fmt.Errorf("rank %d aborted: %s", n.rank(), text)) {
		return
	}
	n.logf("aborting: %s", text)
	if n.ctl.registered() && !n.life.closing.Load() && !n.ctl.closed() {
		if err := n.ctl.send(&msg{T: tAbort, Rank: max(n.rank(), 0), Text: text}); err != nil {
			n.logf("could not send abort to rendezvous: %v", err)
		}
	}
}

// abortLocal records err as the cause (first one wins), closes Done and the
// data links, and ends this node's part in the job for good (no later
// epoch). It reports whether this call was the first.
func (n *Node) abortLocal(err error) bool {
	n.mu.Lock()
	if n.fatal != nil {
		n.mu.Unlock()
		return false
	}
	n.fatal = err
	ep := n.cur.Load()
	if ep.err != nil {
		// The epoch had already ended (a membership change): a
		// reconfiguration in progress ends with this cause instead.
		ep = &epochRun{epoch: ep.epoch, rank: ep.rank, size: ep.size, done: make(chan struct{})}
		n.cur.Store(ep)
	}
	links := n.endEpochLocked(ep, err)
	n.mu.Unlock()
	n.el.wake()
	if !errors.Is(err, ErrClosed) && !errors.Is(err, ErrLeft) {
		n.logf("job aborted: %v", err)
	}
	for _, l := range links {
		l.close()
	}
	return true
}

// endEpochLocked records why ep ended and closes its Done; it returns the
// links to close (outside mu). Called with mu held, ep.err nil.
func (n *Node) endEpochLocked(ep *epochRun, err error) []*link {
	ep.err = err
	close(ep.done)
	if n.cur.Load() != ep {
		return nil
	}
	return slices.Clone(n.links.all)
}

// Close leaves the job in an orderly way: the rendezvous records the leave
// (so nobody treats it as a crash), then links and host are closed. Bounded
// by Timeout. A healthy rank first announces that it leaves after its last
// SetProgress call: a rank in a later call fails at once with a
// *PeerLeftError, and Close returns an *EarlyCloseError naming those ranks.
func (n *Node) Close() error {
	var err error
	n.life.closeOnce.Do(func() {
		// Before the links end, so that a peer reading EOF from this rank
		// learns why at the same time.
		lastCall, announced := n.ctl.announceLeaving()
		n.drainLinks()
		n.life.closing.Store(true)
		if n.ctl.registered() && !n.ctl.closed() {
			start := time.Now()
			if e := n.ctl.send(&msg{T: tLeave, Rank: max(n.rank(), 0)}); e == nil {
				// One Timeout bounds the whole leave (send + confirmation).
				t := time.NewTimer(max(n.cfg.Timeout-time.Since(start), 0))
				select {
				case <-n.ctl.bye:
				case <-n.ctl.dead:
				case <-t.C:
					n.logf("rendezvous did not confirm leave within %v", n.cfg.Timeout)
				}
				t.Stop()
			}
		}
		// Reports of peers left behind came before the bye, and the drain
		// waited for their links to end.
		var early error
		if announced {
			early = n.ctl.earlyCloseErr(lastCall)
		}
		n.abortLocal(ErrClosed)
		err = errors.Join(early, n.shutdown())
	})
	return err
}

// shutdown releases everything without talking to the rendezvous.
func (n *Node) shutdown() error {
	n.life.closing.Store(true)
	n.mu.Lock()
	n.life.stopped = true
	n.mu.Unlock()
	closeIfOpen(n.life.stop)
	n.data.closeListeners()
	n.closeHandshakes()
	n.mu.Lock()
	links := slices.Clone(n.links.all)
	n.mu.Unlock()
	for _, l := range links {
		l.close()
	}
	if n.ctl.registered() {
		n.ctl.s.Close()
	}
	var err error
	if n.h != nil {
		err = n.hosts.close(n.h)
	}
	n.life.wg.Wait()
	// Links accepted after the node stopped.
	n.mu.Lock()
	accepted := n.links.accepted
	n.mu.Unlock()
	for {
		select {
		case l := <-accepted:
			l.close()
		default:
			return err
		}
	}
}

func ipOfAddrs(addrs []string) string {
	for _, a := range addrs {
		m, err := ma.NewMultiaddr(a)
		if err != nil {
			continue
		}
		if v, err := m.ValueForProtocol(ma.P_IP4); err == nil {
			return v
		}
		if v, err := m.ValueForProtocol(ma.P_IP6); err == nil {
			return v
		}
	}
	return ""
}
