package membership

import (
	"cmp"
	"slices"
	"time"
)

// Config is a job's membership settings.
type Config struct {
	Size int // ranks that start the job
	// Heartbeat is how long a control connection may be silent before
	// its process counts as lost.
	Heartbeat time.Duration
	// Elastic makes a lost member start a new epoch instead of aborting
	// the job, and lets joiners in. MinSize <= Size <= MaxSize, both set.
	Elastic     bool
	MinSize     int
	MaxSize     int
	WaitTimeout time.Duration // how long the job may stay below MinSize
}

// proc is one registered process, as the Machine sees it.
type proc struct {
	id   ID
	key  int // its key in Machine.regs: the rank it registered as, or a serial number for a joiner
	rank int // its rank (in the newest epoch, in an elastic job)
	info Info
	args []string

	joiner bool
	acked  bool // fixed-size job: installed the table
	left   bool // closed its communicator cleanly
	gone   bool // its control connection ended
	// leaving: it announced it leaves after call lastCall; behind: it
	// reported being in a later call than a rank that left.
	leaving  bool
	lastCall uint64
	behind   bool

	// Elastic.
	member     bool // in the newest epoch's table (or a survivor waiting for one)
	ackEpoch   int  // the last epoch whose table it acked
	stableRank int  // its rank in the last established epoch, -1 if none
	growReq    bool // asked to grow the current epoch
	leaveReq   bool // with its grow request: it leaves the job (leaveWhy)
	leaveWhy   string
	departed   bool // it left the job gracefully at a commit
	removed    bool // taken out of the members (lost, dropped, departed)
	// growSeq: the sequence number of its last Grow taken (a repeat,
	// sent again after the rendezvous' leader changed, is ignored);
	// grewNone: that request was answered GrowNone in epoch grewNoneAt;
	// departText, departEpoch: its Departed message, to tell it again.
	growSeq     uint64
	grewNone    bool
	grewNoneAt  int
	departText  string
	departEpoch int
	quitWhy     string // it said it quits outside a commit: why
}

// Machine is a job's membership. Its zero value is not usable: call New.
type Machine struct {
	cfg   Config
	procs map[ID]*proc
	regs  map[int]*proc // registered and not forgotten, by key

	tableSent bool // the start's table went out (every rank registered)
	goSent    bool // fixed-size job: every rank acked it
	aborted   bool
	abortText string // the cause the processes were told
	allGone   bool

	el elastic

	out []Action // the current Step's actions
}

// elastic is the state of an elastic job's epochs.
type elastic struct {
	epoch       int     // the newest epoch (being formed, or established)
	members     []*proc // its members in rank order (while waiting: the survivors)
	tableSent   bool    // its table went out
	goSent      bool    // it is established
	pending     []*proc // joiners not admitted yet, in arrival order
	lostView    []Lost  // lost since the last established epoch (ranks of that epoch)
	changeStart time.Time
	waiting     bool // below MinSize, waiting for joiners
	waitSince   time.Time
	nextKey     int    // regs key of the next joiner
	leftClean   bool   // a member left the job cleanly: it is finishing
	reason      string // why the newest epoch began (its Reconfig's text)
	// args: the arguments every rank of epoch 0 started with, which a
	// joiner must have too; argsVary: they differed, so nothing is
	// checked.
	args     []string
	argsVary bool
	// linkCheck is epoch+1 of the epoch whose broken link is being looked
	// at (0: none); relinked is the pair whose link broke, and the epoch
	// that re-formed the ring because of it.
	linkCheck int
	relinked  struct {
		a, b  *proc
		epoch int
	}
}

// New returns the membership of a job that has not started.
func New(cfg Config) *Machine {
	m := &Machine{cfg: cfg, procs: map[ID]*proc{}, regs: map[int]*proc{}}
	m.el.nextKey = cfg.Size
	return m
}

// Step applies ev at time now and returns what the driver must do, in
// order.
func (m *Machine) Step(now time.Time, ev Event) []Action {
	m.out = nil
	switch e := ev.(type) {
	case Register:
		m.register(now, e)
	case Ack:
		m.ack(now, e)
	case Disconnected:
		m.disconnected(now, e)
	case Leave:
		if p := m.procs[e.ID]; p != nil {
			p.left = true
			m.logf("rendezvous: rank %d left", p.rank)
		}
	case Leaving:
		m.leavingAfter(e)
	case Late:
		m.late(e)
	case AbortRequest:
		if p := m.procs[e.ID]; p != nil {
			m.abort(Abort{Cause: sprintf("rank %d aborted: %s", p.rank, e.Text)})
		}
	case LinkFailed:
		m.linkFailed(e)
	case LinkCheck:
		m.linkCheck(now, e.CheckLinkLater)
	case Grow:
		m.grow(now, e)
	case WaitTick:
		m.waitTick(now, e.Since)
	case WaitExpired:
		m.waitExpired(now, e.Since)
	}
	out := m.out
	m.out = nil
	return out
}

func (m *Machine) emit(a Action)             { m.out = append(m.out, a) }
func (m *Machine) send(p *proc, msg Message) { m.emit(Send{To: p.id, Msg: msg}) }
func (m *Machine) logf(format string, args ...any) {
	m.emit(Log{Text: sprintf(format, args...)})
}

// abort aborts the job once.
func (m *Machine) abort(a Abort) {
	if m.aborted {
		return
	}
	m.aborted, m.abortText = true, a.Cause
	m.emit(a)
}

// procEvent tells the launcher what became of p (rank: in the newest
// epoch).
func (m *Machine) procEvent(kind ProcKind, p *proc, rank int, cause string) {
	if !m.cfg.Elastic {
		return
	}
	n := len(m.el.members)
	if !m.tableSent {
		n = m.cfg.Size
	}
	m.emit(ProcEvent{Kind: kind, Rank: rank, Info: p.info, Cause: cause, AfterLeave: m.el.leftClean, Members: n})
}

// conns are the registered processes whose connection has not ended, by
// rank.
func (m *Machine) conns() []*proc {
	out := make([]*proc, 0, len(m.regs))
	for _, p := range m.regs {
		if !p.gone {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b *proc) int { return cmp.Or(a.rank-b.rank, int(a.id-b.id)) })
	return out
}

// Conns returns the processes still connected (and not forgotten), by
// rank: those an abort or a broadcast goes to.
func (m *Machine) Conns() []ID {
	ps := m.conns()
	ids := make([]ID, len(ps))
	for i, p := range ps {
		ids[i] = p.id
	}
	return ids
}

// Rank returns id's rank (in the newest epoch, in an elastic job), -1 if
// id is unknown.
func (m *Machine) Rank(id ID) int {
	if p := m.procs[id]; p != nil {
		return p.rank
	}
	return -1
}

// InJob says whether id is a rank of the job that has not closed: not a
// joiner waiting to be admitted, not gone cleanly.
func (m *Machine) InJob(id ID) bool {
	p := m.procs[id]
	return p != nil && !(p.joiner && !p.member) && !p.left
}

// Started says whether every rank of the start registered (the table went
// out).
func (m *Machine) Started() bool { return m.tableSent }

// Aborted says whether the job was aborted.
func (m *Machine) Aborted() bool { return m.aborted }

// Epoch returns the newest membership epoch (0 in a fixed-size job).
func (m *Machine) Epoch() int { return m.el.epoch }

// Established says whether the newest epoch is established.
func (m *Machine) Established() bool { return m.el.goSent }

// Members returns how many members an elastic job has now (after the
// start: those of the newest epoch, or the survivors waiting for one);
// Size before the start, and in a fixed-size job.
func (m *Machine) Members() int {
	if !m.cfg.Elastic || !m.tableSent {
		return m.cfg.Size
	}
	return len(m.el.members)
}

// Acked returns how many members acknowledged the table of epoch.
func (m *Machine) Acked(epoch int) int {
	n := 0
	for _, p := range m.el.members {
		if p.ackEpoch == epoch {
			n++
		}
	}
	return n
}

// PendingJoiners returns how many joiners wait to be admitted.
func (m *Machine) PendingJoiners() int { return len(m.el.pending) }

// Waiting says whether the job is (still) below its minimum size since
// since.
func (m *Machine) Waiting(since time.Time) bool {
	return m.el.waiting && m.el.waitSince.Equal(since) && !m.aborted
}

// WaitingSince says whether the job is below its minimum size, and since
// when: a new leader of a replicated rendezvous takes up that wait's
// timers.
func (m *Machine) WaitingSince() (time.Time, bool) {
	return m.el.waitSince, m.el.waiting && !m.aborted
}

// ProgressSize is how many ranks the collective progress covers.
func (m *Machine) ProgressSize() int {
	if m.cfg.Elastic && m.el.tableSent {
		return len(m.el.members)
	}
	return m.cfg.Size
}

// Ping is what a heartbeat tells a process: the ranks still missing
// before the start (or, in a fixed-size job, those that have not acked the
// table yet) and, in an elastic job, the newest epoch and how many joiners
// it would admit.
func (m *Machine) Ping() (missing []int, epoch, pending int) {
	if !m.tableSent {
		missing = m.missing()
	} else if !m.goSent && !m.cfg.Elastic {
		missing = m.unacked()
	}
	if m.cfg.Elastic {
		epoch, pending = m.el.epoch, m.admissible()
	}
	return missing, epoch, pending
}

// MissingRanks returns the ranks of the start that have not registered.
func (m *Machine) MissingRanks() []int { return m.missing() }

// Registered returns how many processes are registered.
func (m *Machine) Registered() int { return len(m.regs) }

func (m *Machine) missing() []int {
	var out []int
	for i := range m.cfg.Size {
		if m.regs[i] == nil {
			out = append(out, i)
		}
	}
	return out
}

func (m *Machine) unacked() []int {
	var out []int
	for i := range m.cfg.Size {
		if p := m.regs[i]; p == nil || !p.acked {
			out = append(out, i)
		}
	}
	return out
}

// lost describes p as lost (rank: in the newest epoch).
func (p *proc) lost(cause string) Lost {
	return Lost{Rank: p.rank, Info: p.info, Cause: cause}
}
