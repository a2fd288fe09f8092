package membership

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

var sprintf = fmt.Sprintf

// register accepts a process (Welcome, then what its registration
// changes) or refuses it.
func (m *Machine) register(now time.Time, e Register) {
	p := &proc{id: e.ID, key: e.Rank, rank: e.Rank, info: e.Info, args: e.Args, joiner: e.Joiner, stableRank: -1, ackEpoch: -1}
	if e.Joiner {
		p.key, p.rank = -1, -1
	}
	if err := m.admit(p, e.Heartbeat); err != nil {
		who := fmt.Sprintf("rank %d", e.Rank)
		if e.Joiner {
			who = "joiner " + e.Info.PeerID
		}
		m.logf("rendezvous: refused %s from %s: %v", who, e.Info.Addr, err)
		if e.Joiner {
			m.procEvent(ProcSentAway, p, -1, err.Error())
		}
		m.emit(Refuse{To: e.ID, Why: err.Error()})
		return
	}
	m.procs[p.id] = p
	m.send(p, Message{Kind: Welcome})
	if p.joiner {
		m.logf("rendezvous: joiner %s registered from %s", e.Info.PeerID, e.Info.Addr)
		if m.el.waiting && !m.aborted {
			m.form(now)
		}
		return
	}
	m.logf("rendezvous: rank %d registered from %s", p.rank, e.Info.Addr)
	m.afterRegister(now)
}

// admit checks a registration and records it, or says why not.
func (m *Machine) admit(p *proc, heartbeat int64) error {
	switch {
	case !m.cfg.Elastic && heartbeat != 0:
		return errors.New("this job is not elastic: join it without Config.Elastic (and not as a joiner)")
	case m.cfg.Elastic && heartbeat == 0:
		return errors.New("this job is elastic: join it with Config.Elastic")
	case m.cfg.Elastic && heartbeat != max(m.cfg.Heartbeat.Milliseconds(), 1):
		return fmt.Errorf("heartbeat bound %v differs from the job's %v (Config.HeartbeatTimeout)",
			time.Duration(heartbeat)*time.Millisecond, m.cfg.Heartbeat)
	}
	if p.joiner {
		return m.admitJoiner(p)
	}
	// Once the job runs, a rank's registration is refused as closed even
	// if its rank is still registered: a replaced process (a pod the
	// kubelet restarted) learns that the job runs, not that its rank is
	// taken, which before the start means its predecessor's loss is not
	// noticed yet.
	switch {
	case m.aborted:
		return errors.New("job already aborted")
	case p.rank < 0 || p.rank >= m.cfg.Size:
		return fmt.Errorf("rank %d out of range [0,%d)", p.rank, m.cfg.Size)
	case m.tableSent:
		if m.cfg.Elastic {
			return errors.New("registration closed: the job runs; join it as a joiner (rank -1)")
		}
		return errors.New("registration closed")
	case m.regs[p.rank] != nil:
		return fmt.Errorf("rank %d already registered from %s", p.rank, m.regs[p.rank].info.Addr)
	}
	m.regs[p.rank] = p
	return nil
}

func (m *Machine) admitJoiner(p *proc) error {
	switch {
	case !m.cfg.Elastic:
		return errors.New("this job is not elastic: a joiner (rank -1) can not join it")
	case m.aborted:
		return errors.New("job already aborted")
	case m.tableSent && len(m.el.members) == 0:
		// Nobody could admit it, nor give it the job's state.
		return errors.New("the job has no members left (its last member finished or was lost): there is nobody to join")
	case m.tableSent && m.argsRefusal(p.args) != "":
		// Admitted, it would train something else or call other
		// collectives, and fail the job that ran fine before it came.
		return errors.New(m.argsRefusal(p.args))
	}
	p.key = m.el.nextKey
	m.el.nextKey++
	m.regs[p.key] = p
	m.el.pending = append(m.el.pending, p)
	return nil
}

// afterRegister tells every rank who is still missing or, once every rank
// registered, sends the table (phase 1 of the start).
func (m *Machine) afterRegister(now time.Time) {
	missing := m.missing()
	var table []ID
	if len(missing) == 0 && !m.tableSent {
		m.tableSent = true
		m.emit(AllRegistered{})
		for i := range m.cfg.Size {
			table = append(table, m.regs[i].id)
		}
		if m.cfg.Elastic {
			m.startElastic(now)
			m.refuseEarlyJoiners()
		}
		m.logf("rendezvous: all %d ranks registered, sending table", m.cfg.Size)
	}
	msg := Message{Kind: Missing, Ranks: missing}
	if table != nil {
		msg = Message{Kind: Table, Members: table}
	}
	for _, p := range m.conns() {
		if !p.joiner {
			m.send(p, msg)
		}
	}
}

// startElastic makes the registered ranks the members of epoch 0.
func (m *Machine) startElastic(now time.Time) {
	el := &m.el
	el.members = make([]*proc, m.cfg.Size)
	for i := range m.cfg.Size {
		p := m.regs[i]
		p.member = true
		el.members[i] = p
		if i == 0 {
			el.args = p.args
		} else if !slices.Equal(p.args, el.args) {
			el.argsVary = true
		}
	}
	el.tableSent = true
	el.changeStart = now
}

// admissible is how many pending joiners the next epoch would admit.
func (m *Machine) admissible() int {
	if !m.cfg.Elastic {
		return 0
	}
	return max(0, min(len(m.el.pending), m.cfg.MaxSize-len(m.el.members)))
}

// argsRefusal is why a joiner with arguments args may not join, or "" if
// it may.
func (m *Machine) argsRefusal(args []string) string {
	if m.el.argsVary || slices.Equal(args, m.el.args) {
		return ""
	}
	return fmt.Sprintf("its program arguments %s differ from those the job's ranks started with, %s: start it with the job's arguments (gorun --job-key-file prints the whole command)",
		quoteArgs(args), quoteArgs(m.el.args))
}

// refuseEarlyJoiners sends away the joiners that registered before the
// job's ranks did (their arguments could not be compared then) and whose
// arguments differ from the ranks'.
func (m *Machine) refuseEarlyJoiners() {
	m.el.pending = slices.DeleteFunc(m.el.pending, func(p *proc) bool {
		why := m.argsRefusal(p.args)
		if why == "" {
			return false
		}
		m.logf("rendezvous: refused joiner %s from %s: %s", p.info.PeerID, p.info.Addr, why)
		m.send(p, Message{Kind: SentAway, Text: why})
		m.procEvent(ProcSentAway, p, -1, why)
		return true
	})
}

// sendAwayPending sends away the joiners not admitted yet once the job has
// no member left: nobody will admit them (nor has the state to give them).
func (m *Machine) sendAwayPending(why string) {
	if len(m.el.members) > 0 {
		return
	}
	for _, p := range m.el.pending {
		m.send(p, Message{Kind: SentAway, Text: why})
		m.procEvent(ProcSentAway, p, -1, why)
	}
	m.el.pending = nil
}

// quoteArgs shows arguments as Go quotes them, in brackets: [] for none.
func quoteArgs(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = strconv.Quote(a)
	}
	return "[" + strings.Join(q, " ") + "]"
}

// ack records that id installed the table of a fixed-size job, or of an
// elastic job's epoch.
func (m *Machine) ack(now time.Time, e Ack) {
	p := m.procs[e.ID]
	if p == nil {
		return
	}
	if m.cfg.Elastic {
		m.elasticAck(now, p, e.Epoch)
		return
	}
	p.acked = true
	if m.tableSent && !m.goSent && len(m.unacked()) == 0 {
		m.goSent = true
		m.logf("rendezvous: all ranks acked the table, go")
		for _, o := range m.conns() {
			m.send(o, Message{Kind: Go})
		}
	}
}
