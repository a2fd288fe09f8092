package p2p

// Elastic membership.
//
// In an elastic job (RendezvousConfig.Elastic, Config.Elastic) the set of
// members changes while the job runs, in numbered membership epochs (0 at
// start). Every member keeps its libp2p peer ID for life and gets a rank
// per epoch. When the rendezvous loses a member (its control stream
// breaks: a killed process; or stays silent for HeartbeatTimeout: a frozen
// or cut-off host) it does not abort the job: it announces epoch e+1 to
// every remaining member ("reconfig"), whose Node fails its current epoch at
// once (Err is a *MembershipChangeError, the data links are closed, so a
// blocked transfer returns). Each member then calls Reconfigure, which
// forms the new epoch exactly like the start of a job: table (survivors in
// their old order, then joiners), gater, ack, go, links. Data-link proofs
// include the epoch, so nothing of an old ring reaches the new one. A
// member that is lost while an epoch forms makes the rendezvous move on to
// the next epoch, and every Reconfigure follows it.
//
// Only the side of a partition that holds the rendezvous goes on: a member
// that loses its control stream stops for good (*CutOffError).
//
// This file holds the types of elastic membership; a member's calls are
// elastic_member.go, and what the rendezvous tells it elastic_ctl.go (the
// rendezvous' side is package membership, driven by rendezvous.go).

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// ElasticConfig makes a rendezvous elastic (RendezvousConfig.Elastic).
type ElasticConfig struct {
	// MinSize is the fewest members the job runs with (--min-np); 0 = 1.
	// Below it the rendezvous waits up to WaitTimeout for joiners, then
	// aborts the job.
	MinSize int
	// MaxSize is the most members the job admits (--max-np); 0 = Size.
	// Further joiners wait until there is room.
	MaxSize int
	// WaitTimeout is how long the job may stay below MinSize; 0 = 600s.
	WaitTimeout time.Duration
	// HeartbeatTimeout is how long a member's control stream may be silent
	// before it counts as lost; 0 = 3s. Pings go out every quarter of it.
	// Members must use the same value (Config.HeartbeatTimeout).
	HeartbeatTimeout time.Duration
}

const (
	defaultHeartbeatTimeout = 3 * time.Second
	defaultWaitTimeout      = 600 * time.Second
)

func defaultHeartbeat(d time.Duration) time.Duration {
	if d <= 0 {
		return defaultHeartbeatTimeout
	}
	return d
}

// elasticHello is what a hello says about elastic mode: 0 for a fixed-size
// member, else its heartbeat bound in ms (which must be the rendezvous').
func elasticHello(cfg Config) int64 {
	if !cfg.Elastic {
		return 0
	}
	return max(cfg.HeartbeatTimeout.Milliseconds(), 1)
}

// Member identifies a member of an elastic job in one epoch.
type Member struct {
	Rank int     // its rank in that epoch
	ID   peer.ID // stable for the member's life
	Host string  // its HostID
	// HostName is the name of its host in messages: the launcher's
	// (gorun's -H or discovery name) when it set GORUN_HOST, else the OS
	// host name; "" from an older peer.
	HostName string
	Addr     string // where the rendezvous saw its control connection come from
	Proc     string // the launcher's id of its process (Config.ProcID), "" if none
}

// LostMember is a member that is no longer in the job: lost without a
// clean Close, or (Left) gone gracefully at a commit boundary (Depart).
type LostMember struct {
	Member
	Cause string // "disconnected", "stopped responding: ...", "unreachable: ...", "left the job (SIGTERM)"
	// Left: it left at a commit every member took (Node.Depart), handing
	// over its unique state there; no step is lost.
	Left bool
}

func (l LostMember) String() string {
	return fmt.Sprintf("rank %d (host %s, %s) %s", l.Rank, l.HostLabel(), l.Addr, l.Cause)
}

// HostLabel is the name of m's host for messages: HostName, or else the
// host name part of its HostID.
func (m Member) HostLabel() string {
	if m.HostName != "" {
		return m.HostName
	}
	name, _, _ := strings.Cut(m.Host, "/")
	return name
}

// View describes the epoch a Reconfigure (or Grow, or an elastic Join)
// put this node in.
type View struct {
	Epoch int
	Rank  int
	Size  int
	Peers []Peer
	// Lost: the members of the epoch this node was last in (the View its
	// previous Reconfigure, Grow or Join returned) that are not in this
	// one, with their ranks in that epoch and why they went. Epochs formed
	// and overtaken in between (a further loss while the job re-formed)
	// are folded in, so nothing lost is missing and the ranks are the ones
	// the caller knew.
	Lost []LostMember
	// Joined: the ranks, in this epoch, of the members that were not in
	// the epoch this node was last in (they have none of the job's state
	// yet).
	Joined []int
}

// Change is what RendezvousConfig.OnChange is told once a new epoch is
// established (every member acknowledged its table).
type Change struct {
	Epoch  int
	Lost   []LostMember // Rank: in the previous established epoch
	Joined []Member     // Rank: in this epoch
	Size   int
	Took   time.Duration // from the first loss (or grow request) to the go
}

// MembershipChangeError is a Node's Err (and what its blocked transfers
// return) when the rendezvous started a new epoch: the current one can not
// complete. Call Node.Reconfigure to go on in the new one.
type MembershipChangeError struct {
	Rank   int          // this node's rank in Epoch
	Epoch  int          // the epoch that ended
	Next   int          // the epoch being formed
	Lost   []LostMember // who was lost, if anybody
	Reason string       // why the rendezvous started the new epoch
}

func (e *MembershipChangeError) Error() string {
	what := e.Reason
	if len(e.Lost) > 0 {
		parts := make([]string, len(e.Lost))
		for i, l := range e.Lost {
			parts[i] = l.String()
		}
		what = strings.Join(parts, "; ")
	}
	return fmt.Sprintf("p2p: rank %d: membership epoch %d ended: %s; call Reconfigure to go on in epoch %d",
		e.Rank, e.Epoch, what, e.Next)
}

// CutOffError is why a member of an elastic job stops for good: it lost its
// control stream to the rendezvous, which goes on without it (if it still
// has enough members).
type CutOffError struct {
	Rank       int
	Rendezvous string        // host:port
	Silence    time.Duration // since the rendezvous was last heard
	Err        error         // what the control stream reported
}

func (e *CutOffError) Error() string {
	return fmt.Sprintf("rank %d: cut off from the rendezvous at %s for %v (%v): this rank stops; the job goes on without it if the rendezvous still has --min-np members",
		e.Rank, e.Rendezvous, e.Silence, e.Err)
}

func (e *CutOffError) Unwrap() error { return e.Err }

// epochRun is one membership epoch of a node: a fixed-size job has one.
// epoch, rank, size and the channels never change; err is under Node.mu.
type epochRun struct {
	epoch      int
	rank, size int
	done       chan struct{}
	err        error
	goCh       chan struct{} // elastic: closed on the rendezvous' go for this epoch
	goClosed   atomic.Bool
	reported   map[int]bool // elastic, under Node.mu: peers whose broken link was reported
	view       View         // elastic: without Peers
}

// elasticNode is a node's elastic-mode state; fields without a comment are
// under Node.mu.
type elasticNode struct {
	pending    atomic.Int64 // joiners the rendezvous would admit now
	latest     int          // newest epoch announced by a reconfig or table
	table      *msg         // newest table not installed yet
	tableEpoch int
	change     *MembershipChangeError // the newest reconfig, for epochs it overtakes
	waiting    string                 // the rendezvous' last "waiting for members" status
	growNone   chan struct{}          // closed when the Grow under way admitted nobody
	growEpoch  int                    // the epoch that Grow (or Depart) is for
	departed   chan struct{}          // closed when the rendezvous let the Depart under way go
	tableCh    chan struct{}          // cap 1: a table, a status or a fatal error arrived
	// shown: the peers of the View last returned to the caller; causes:
	// why each member lost since then went, from every table installed
	// since (a table only lists the losses since the epoch before it).
	shown  []Peer
	causes map[peer.ID]LostMember
}

func (e *elasticNode) init() {
	e.latest, e.tableEpoch = -1, -1
	e.tableCh = make(chan struct{}, 1)
}

func (e *elasticNode) wake() {
	if e.tableCh == nil {
		return
	}
	select {
	case e.tableCh <- struct{}{}:
	default:
	}
}

// ErrLeft is why a node (and a Comm) that left an elastic job gracefully
// (Depart) takes no further part: match it with errors.Is.
var ErrLeft = errors.New("left the elastic job")

// LeftError says that this member left the job at a commit boundary, and
// why (e.g. "SIGTERM"). It matches ErrLeft.
type LeftError struct {
	Rank int // its rank in the last epoch it was in
	Why  string
}

func (e *LeftError) Error() string {
	return fmt.Sprintf("rank %d left the elastic job at a commit (%s); the others go on from that commit", e.Rank, e.Why)
}

func (e *LeftError) Is(target error) bool { return target == ErrLeft }
