package membership

import "time"

// Event is something that happened to the job, for Machine.Step.
type Event interface{ event() }

// ID names one process (one control connection) for the Machine; the
// driver chooses it and never reuses it.
type ID int

// Info is what the Machine says about a process in its messages and
// reports; it never interprets it.
type Info struct {
	PeerID   string // libp2p peer ID
	Host     string // its HostID
	HostName string // its host's name in messages, "" if it gave none
	Addr     string // where its control connection came from
	Proc     string // the launcher's id of the process, "" if none
	// Contact is how the other processes reach it, in the driver's own
	// encoding: it goes into the tables, and a replicated rendezvous
	// needs it in its log, for a new leader sends the tables too.
	Contact string `json:",omitempty"`
	// Replica is the rendezvous replica this process hosts (0: none): a
	// new leader counts the ranks of the lost leader's host as lost as
	// soon as every other rank came back, instead of waiting for them.
	Replica      uint64 `json:",omitempty"`
	ReplicaAddr  string `json:",omitempty"` // where the other replicas reach it
	ReplicaSpare bool   `json:",omitempty"` // it replaces lost replicas rather than complete the group
}

// Register: a process said hello (with the job key checked) and asks to
// be rank Rank, or to join a running elastic job (Joiner).
type Register struct {
	ID     ID
	Rank   int
	Joiner bool
	// Heartbeat is the elastic heartbeat bound its hello gave, in
	// milliseconds; 0: it is not elastic.
	Heartbeat int64
	Args      []string
	Info      Info
}

// Ack: the process installed the table of Epoch (0 in a fixed-size job).
type Ack struct {
	ID    ID
	Epoch int
}

// Disconnected: the control connection of a process ended. Timeout: it
// fell silent past the heartbeat bound. Quit: it said it quits outside a
// commit, and why.
type Disconnected struct {
	ID      ID
	Timeout bool
	Quit    string
	Err     string // what ended it, for the log
	// Cause, if set, is why it counts as lost in the job's messages
	// (else "disconnected", or Timeout's or Quit's wording).
	Cause string `json:",omitempty"`
}

// Leave: the process closed its communicator cleanly (its Disconnected
// follows).
type Leave struct{ ID ID }

// Leaving: the process announced that it leaves after collective call
// LastCall.
type Leaving struct {
	ID       ID
	LastCall uint64
}

// Late: the process is in call Call, after ranks left following earlier
// calls.
type Late struct {
	ID   ID
	Call uint64
}

// AbortRequest: the process asks to abort the job.
type AbortRequest struct {
	ID   ID
	Text string
}

// LinkFailed: in Epoch, the process could not use its link with the member
// of rank Rank.
type LinkFailed struct {
	ID    ID
	Epoch int
	Rank  int
	Text  string
}

// LinkCheck: the wait that CheckLinkLater asked for is over.
type LinkCheck struct{ CheckLinkLater }

// Grow: the member asks, at a commit of Epoch, to admit the waiting
// joiners; Leave: it leaves the job there (Why).
type Grow struct {
	ID    ID
	Epoch int
	Leave bool
	Why   string
	// Seq numbers the member's requests from 1 (0: unnumbered, always
	// taken): one it sent again to a new rendezvous leader, not knowing
	// whether the old one took it, is taken once.
	Seq uint64
}

// WaitTick: time to tell the members again how long the job, below its
// minimum size since Since, may still wait.
type WaitTick struct{ Since time.Time }

// WaitExpired: the wait below the minimum size that began at Since ran
// out.
type WaitExpired struct{ Since time.Time }

func (Register) event()     {}
func (Ack) event()          {}
func (Disconnected) event() {}
func (Leave) event()        {}
func (Leaving) event()      {}
func (Late) event()         {}
func (AbortRequest) event() {}
func (LinkFailed) event()   {}
func (LinkCheck) event()    {}
func (Grow) event()         {}
func (WaitTick) event()     {}
func (WaitExpired) event()  {}
