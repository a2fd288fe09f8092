package membership

import "time"

// Action is what the driver must do after a Step, in order.
type Action interface{ action() }

// Send: send Msg to process To.
type Send struct {
	To  ID
	Msg Message
}

// Refuse: tell process To why its registration is refused and close its
// connection. It is not part of the job.
type Refuse struct {
	To  ID
	Why string
}

// Abort: the job is aborted; tell every process still connected the
// Cause. Unresponsive: because rank Rank (at Addr) stopped responding
// (Why). LeftEarly: because rank Rank closed its communicator after call
// Seq while others were in later calls.
type Abort struct {
	Cause        string
	Unresponsive bool
	LeftEarly    bool
	Rank         int
	Addr, Why    string
	Seq          uint64
}

// ProcEvent: what became of a process of an elastic job (for the
// launcher): Rank in the newest epoch, -1 for a joiner not admitted.
type ProcEvent struct {
	Kind  ProcKind
	Rank  int
	Info  Info
	Cause string
	// AfterLeave: a member had already left the job cleanly (it was
	// finishing). Members: how many members are left.
	AfterLeave bool
	Members    int
}

// ProcKind is what became of a process (ProcEvent).
type ProcKind int

const (
	// ProcLost: a member was lost (disconnected, stopped responding,
	// unreachable, or closed during a reconfiguration).
	ProcLost ProcKind = iota + 1
	// ProcLeft: a member left cleanly (Close) in an established epoch.
	ProcLeft
	// ProcSentAway: a joiner was refused, or sent away before it was
	// admitted.
	ProcSentAway
	// ProcDeparted: a member left the job gracefully at a commit (Grow
	// with Leave): no step lost.
	ProcDeparted
)

// Established: every member acknowledged the table of Epoch (> 0), which
// is now the job's membership.
type Established struct {
	Epoch  int
	Lost   []Lost   // Rank: in the previous established epoch
	Joined []Joined // Rank: in this epoch
	Size   int
	Took   time.Duration // from the first loss (or grow request) to now
}

// Joined is a member that joined in an epoch.
type Joined struct {
	Rank int
	Info Info
}

// Log: a line for the rendezvous' log.
type Log struct{ Text string }

// AllRegistered: every rank of the start registered and the table went
// out.
type AllRegistered struct{}

// AllGone: after the start, every registered process is gone.
type AllGone struct{}

// WaitForMembers: the elastic job fell below its minimum size at Since:
// send WaitTick now and then, and WaitExpired once the wait timeout
// passed, while Machine.Waiting(Since) holds.
type WaitForMembers struct{ Since time.Time }

// CheckLinkLater: a member reported a broken link with another; after half
// the heartbeat bound (time for a lost process to show as lost), Step
// LinkCheck with this.
type CheckLinkLater struct {
	Epoch          int
	Reporter, Peer ID
	Text           string
}

// LeaveNotice: rank Rank announced it leaves after call LastCall (for
// RendezvousConfig.OnLeave).
type LeaveNotice struct {
	Rank     int
	LastCall uint64
}

// ResetProgress: the ranks changed; the collective progress recorded by
// rank is void.
type ResetProgress struct{}

func (Send) action()           {}
func (Refuse) action()         {}
func (Abort) action()          {}
func (ProcEvent) action()      {}
func (Established) action()    {}
func (Log) action()            {}
func (AllRegistered) action()  {}
func (AllGone) action()        {}
func (WaitForMembers) action() {}
func (CheckLinkLater) action() {}
func (LeaveNotice) action()    {}
func (ResetProgress) action()  {}

// MessageKind is the kind of a Message.
type MessageKind int

const (
	// Welcome: the registration is accepted.
	Welcome MessageKind = iota + 1
	// Missing: the ranks (Ranks) that have not registered yet.
	Missing
	// Table: the members of Epoch in rank order (Members), who was lost
	// since the last established epoch (Lost) and which ranks joined
	// (JoinedRanks).
	Table
	// Go: every member installed the table of Epoch; Pending joiners wait.
	Go
	// Reconfig: Epoch is being formed (Text: why; Lost: who is gone).
	Reconfig
	// Waiting: the job is below its minimum size (Text says for what).
	Waiting
	// GrowNone: the grow of Epoch found nobody to admit and nobody leaving.
	GrowNone
	// Departed: the member left the job at the commit of Epoch (Text).
	Departed
	// Dropped: the member is dropped from the job (Text: why).
	Dropped
	// SentAway: the joiner is not admitted (Text: why).
	SentAway
	// LeavingNotice: rank Rank leaves after call Seq.
	LeavingNotice
	// LateNotice: rank Rank is in call Seq, later than the receiver's last.
	LateNotice
)

// Message is what a Send carries.
type Message struct {
	Kind        MessageKind
	Epoch       int
	Text        string
	Members     []ID
	Lost        []Lost
	JoinedRanks []int
	Pending     int
	Ranks       []int
	Rank        int
	Seq         uint64
}

// Lost is a member that is no longer in the job.
type Lost struct {
	Rank  int // in the last epoch it was part of
	Info  Info
	Cause string
	Left  bool // it left gracefully at a commit
}
