package raftgroup

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/gorun/gorun/membership"
)

// Config configures a Replica.
type Config struct {
	ID uint64 // this replica's id, not 0
	// Peers: every replica's id, this one's included, for a group that
	// starts with them; empty: this replica joins a running group, which
	// adds it (AddReplica) and sends it the log.
	Peers []uint64
	// Addrs: where the Peers are reached (the driver's addresses), kept
	// in the log with the group's changes so every replica learns them.
	Addrs map[uint64]string
	// ElectionTicks is how many Ticks without a leader's word start an
	// election (at least 2×HeartbeatTicks); HeartbeatTicks how often a
	// leader speaks. The caller picks the tick so that an election fits
	// in the membership's heartbeat bound.
	ElectionTicks, HeartbeatTicks int
	Membership                    membership.Config
}

// Replica is one member of the rendezvous group.
type Replica struct {
	id      uint64
	rn      *raft.RawNode
	storage *raft.MemoryStorage
	m       *membership.Machine
	addrs   map[uint64]string // every replica of the group, by id, as the log says
}

// Applied is what one committed event did: the actions its Step returned,
// which the leader (Leader) carries out and the others only note.
type Applied struct {
	Index   uint64 // its place in the log
	At      time.Time
	Event   membership.Event
	Actions []membership.Action
}

// Ready is what a Replica asks of its caller: send Messages to the other
// replicas (in any order, unreliably), and, on the leader, carry out the
// Applied events' actions in order.
type Ready struct {
	Messages []*raftpb.Message
	Applied  []Applied
	Leader   bool // this replica leads the group (as of this Ready)
	// GroupChanged: a replica was added or removed (see Replicas).
	GroupChanged bool
}

// New starts a replica of a new group.
func New(cfg Config) (*Replica, error) {
	if cfg.ID == 0 {
		return nil, errors.New("raftgroup: replica id 0")
	}
	cfg.HeartbeatTicks = max(cfg.HeartbeatTicks, 1)
	cfg.ElectionTicks = max(cfg.ElectionTicks, 2*cfg.HeartbeatTicks, 10)
	st := raft.NewMemoryStorage()
	rn, err := raft.NewRawNode(&raft.Config{
		ID: cfg.ID, ElectionTick: cfg.ElectionTicks, HeartbeatTick: cfg.HeartbeatTicks, Storage: st,
		MaxSizePerMsg: 1 << 20, MaxInflightMsgs: 256,
		// A leader cut off from the majority steps down, and a replica
		// that was cut off does not disturb the group when it returns.
		CheckQuorum: true, PreVote: true,
		Logger: quietLogger{},
	})
	if err != nil {
		return nil, fmt.Errorf("raftgroup: replica %d: %w", cfg.ID, err)
	}
	if len(cfg.Peers) > 0 {
		peers := make([]raft.Peer, len(cfg.Peers))
		for i, id := range cfg.Peers {
			peers[i] = raft.Peer{ID: id, Context: []byte(cfg.Addrs[id])}
		}
		if err := rn.Bootstrap(peers); err != nil {
			return nil, fmt.Errorf("raftgroup: replica %d: %w", cfg.ID, err)
		}
	}
	return &Replica{id: cfg.ID, rn: rn, storage: st, m: membership.New(cfg.Membership), addrs: map[uint64]string{}}, nil
}

// AddReplica asks the group to add replica id, reached at addr. It comes
// in as a learner, which receives the log but does not count in the
// majority: a replica that is unreachable, or slow to catch up, can not
// take the group's majority away. PromoteCaughtUp makes it a voter once
// it has the log.
func (r *Replica) AddReplica(id uint64, addr string) error {
	return r.rn.ProposeConfChange(&raftpb.ConfChange{Type: raftpb.ConfChangeAddLearnerNode.Enum(), NodeId: proto.Uint64(id), Context: []byte(addr)})
}

// RemoveReplica proposes to take replica id out of the group (one whose
// process is gone): the majority is then counted without it, and a new
// replica can take its place.
func (r *Replica) RemoveReplica(id uint64) error {
	return r.rn.ProposeConfChange(&raftpb.ConfChange{Type: raftpb.ConfChangeRemoveNode.Enum(), NodeId: proto.Uint64(id)})
}

// PromoteCaughtUp, on the leader, proposes to make a voter of the first
// learner that has every committed entry; it returns its id (0: none).
// One group change at a time: the caller waits for GroupChanged before
// the next.
func (r *Replica) PromoteCaughtUp() (uint64, error) {
	st := r.rn.Status()
	if st.RaftState != raft.StateLeader {
		return 0, nil
	}
	for id := range st.Config.Learners {
		if pr, ok := st.Progress[id]; ok && pr.Match >= st.HardState.GetCommit() {
			cc := &raftpb.ConfChange{Type: raftpb.ConfChangeAddNode.Enum(), NodeId: proto.Uint64(id), Context: []byte(r.addrs[id])}
			return id, r.rn.ProposeConfChange(cc)
		}
	}
	return 0, nil
}

// TransferLeader, on the leader, hands the lead to replica to (a voter
// that has the log): it takes over at once instead of after an election.
func (r *Replica) TransferLeader(to uint64) { r.rn.TransferLeader(to) }

// VoterIDs returns the replicas that count in the majority.
func (r *Replica) VoterIDs() []uint64 {
	return slices.Sorted(maps.Keys(r.rn.Status().Config.Voters.IDs()))
}

// Voters is how many replicas count in the group's majority.
func (r *Replica) Voters() int {
	return len(r.rn.Status().Config.Voters.IDs())
}

// Replicas returns every replica of the group by id, with its address, as
// the applied log says (a replica that joined learns them as it catches
// up).
func (r *Replica) Replicas() map[uint64]string {
	out := make(map[uint64]string, len(r.addrs))
	for id, a := range r.addrs {
		out[id] = a
	}
	return out
}

// ReportUnreachable tells raft that a message to id could not be sent, so
// the leader stops streaming to it until it answers again.
func (r *Replica) ReportUnreachable(id uint64) { r.rn.ReportUnreachable(id) }

// Campaign makes the replica stand for leader now rather than after an
// election timeout: a group that starts from one replica leads at once.
func (r *Replica) Campaign() error { return r.rn.Campaign() }

// ID is this replica's id.
func (r *Replica) ID() uint64 { return r.id }

// Tick advances the replica's logical clock by one tick.
func (r *Replica) Tick() { r.rn.Tick() }

// Step gives the replica a message from another replica.
func (r *Replica) Step(m *raftpb.Message) error { return r.rn.Step(m) }

// Propose asks the group to apply ev, which happened at time at. Any
// replica may propose: a follower forwards it to the leader. It is applied
// once a majority has it, which Ready reports; a proposal made without a
// leader, or lost with one, is dropped (ErrProposalDropped, or it never
// shows in Ready): the proposer proposes again if it still matters.
func (r *Replica) Propose(at time.Time, ev membership.Event) error {
	b, err := membership.Encode(at, ev)
	if err != nil {
		return err
	}
	return r.rn.Propose(b)
}

// Leader returns the id of the group's leader as this replica knows it (0:
// none).
func (r *Replica) Leader() uint64 { return r.rn.BasicStatus().Lead }

// Machine returns the replica's membership, to read (never Step) between
// calls.
func (r *Replica) Machine() *membership.Machine { return r.m }

// HasReady says whether Ready has something.
func (r *Replica) HasReady() bool { return r.rn.HasReady() }

// Ready persists the new log entries (in memory), applies the committed
// ones to the membership, and returns the messages to send and what the
// applied events did.
func (r *Replica) Ready() (Ready, error) {
	if !r.rn.HasReady() {
		return Ready{Leader: r.Leader() == r.id}, nil
	}
	rd := r.rn.Ready()
	if rd.HardState != nil && !raft.IsEmptyHardState(rd.HardState) {
		if err := r.storage.SetHardState(rd.HardState); err != nil {
			return Ready{}, err
		}
	}
	if err := r.storage.Append(rd.Entries); err != nil {
		return Ready{}, err
	}
	out := Ready{Messages: rd.Messages}
	for _, e := range rd.CommittedEntries {
		switch e.GetType() {
		case raftpb.EntryNormal:
			if len(e.GetData()) == 0 {
				continue // a new leader's empty entry
			}
			at, ev, err := membership.Decode(e.GetData())
			if err != nil {
				return Ready{}, fmt.Errorf("raftgroup: replica %d: entry %d: %w", r.id, e.GetIndex(), err)
			}
			out.Applied = append(out.Applied, Applied{Index: e.GetIndex(), At: at, Event: ev, Actions: r.m.Step(at, ev)})
		case raftpb.EntryConfChange:
			cc := &raftpb.ConfChange{}
			if err := proto.Unmarshal(e.GetData(), cc); err != nil {
				return Ready{}, err
			}
			r.rn.ApplyConfChange(cc)
			switch cc.GetType() {
			case raftpb.ConfChangeAddNode, raftpb.ConfChangeAddLearnerNode:
				r.addrs[cc.GetNodeId()] = string(cc.GetContext())
			case raftpb.ConfChangeRemoveNode:
				delete(r.addrs, cc.GetNodeId())
			}
			out.GroupChanged = true
		}
	}
	r.rn.Advance(rd)
	out.Leader = r.Leader() == r.id
	return out, nil
}

// quietLogger keeps raft's own chatter (elections, term changes) out of the
// job's output; the group's driver says what matters.
type quietLogger struct{}

func (quietLogger) Debug(...any)              {}
func (quietLogger) Debugf(string, ...any)     {}
func (quietLogger) Error(...any)              {}
func (quietLogger) Errorf(string, ...any)     {}
func (quietLogger) Info(...any)               {}
func (quietLogger) Infof(string, ...any)      {}
func (quietLogger) Warning(...any)            {}
func (quietLogger) Warningf(string, ...any)   {}
func (quietLogger) Fatal(v ...any)            { panic(fmt.Sprint(v...)) }
func (quietLogger) Fatalf(f string, v ...any) { panic(fmt.Sprintf(f, v...)) }
func (quietLogger) Panic(v ...any)            { panic(fmt.Sprint(v...)) }
func (quietLogger) Panicf(f string, v ...any) { panic(fmt.Sprintf(f, v...)) }
