package p2p

// The control and handshake wire format: framed JSON messages, their
// types and checks, and the HMAC proofs over the job key.

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Wire format: every message is a 4-byte big-endian length followed by a JSON
// object. JSON keeps the protocol debuggable and versionable; the length
// prefix with a hard cap means a hostile or confused peer can never make us
// allocate more than maxFrame bytes or read forever.
const maxFrame = 4 << 20

// maxSmallFrame caps frames read before the peer is authenticated (hellos,
// data handshakes), so a stranger can not make us allocate much.
const maxSmallFrame = 64 << 10

// maxProcID bounds a hello's process id (Config.ProcID).
const maxProcID = 128

// Message types.
const (
	tChallenge = "challenge" // server -> client: nonce
	tHello     = "hello"     // client -> server: rank, proof, nonce, contact info
	tWelcome   = "welcome"   // server -> client: proof that the server knows the key
	tError     = "error"     // server -> client: registration refused; data acceptor -> dialer: handshake ended (text)
	tTable     = "table"     // server -> client: the job table
	tAck       = "ack"       // client -> server: table installed in the gater
	tGo        = "go"        // server -> client: every rank acked; dial now
	tPing      = "ping"      // both ways: heartbeat (server adds missing ranks)
	tAbort     = "abort"     // both ways: job aborted
	tAbortOK   = "abortok"   // client -> server: the abort was read
	tLeave     = "leave"     // client -> server: orderly exit
	tBye       = "bye"       // server -> client: leave recorded
	tDChal     = "dchal"     // data acceptor -> dialer: nonce
	tDHello    = "dhello"    // data dialer -> acceptor: rank, link, proof, nonce
	tDOK       = "dok"       // data acceptor -> dialer: proof
	tProgress  = "progress"  // client -> server: last collective entered (Seq); server -> client: every rank's (Progress)
	tProgQuery = "progq"     // client -> server: send me every rank's progress
	tLeaving   = "leaving"   // client -> server: I leave after call Seq; server -> client: rank Rank leaves after call Seq
	tLate      = "late"      // client -> server: I am in call Seq, after a rank left; server -> that leaver: rank Rank was
	tLateOK    = "lateok"    // server -> client: your late report reached the leavers
	tHangAsk   = "hangask"   // client -> server: I stalled in call Seq: diagnose the job (diagnose.go)
	tStateAsk  = "stateq"    // server -> client: send your state for hang diagnosis gathering Text (its id)
	tState     = "state"     // client -> server: my progress (Seq) and state (Text: a RankState and the gathering's id, as JSON)
	tHang      = "hang"      // server -> client that asked: the diagnosis (Text, a HangReport as JSON; Rank: the recipient's rank)

	// Elastic mode only (see elastic.go).
	tReconfig = "reconfig" // server -> member: epoch Epoch begins, Lost are gone; fail the current epoch
	tWaiting  = "waiting"  // server -> member: below the minimum size, waiting for joiners (Text)
	tLinkFail = "linkfail" // member -> server: my link with rank Rank broke in epoch Epoch (Text)
	tGrow     = "grow"     // member -> server: admit the pending joiners after epoch Epoch
	tGrowNone = "grownone" // server -> member: every member asked to grow epoch Epoch, nobody to admit
	tDropped  = "dropped"  // server -> member: you are no longer a member (Text); stop
	tDeparted = "departed" // server -> member that asked to leave at a grow (Leave): it left the job; stop
	tQuit     = "quit"     // member -> server: I leave now, outside a commit (Text: why); a loss

	// A replicated rendezvous only (see rz_group.go).
	tRedirect = "redirect" // replica -> client: I do not lead the group; replica Seq (0: unknown yet) does
)

// msg is the single wire message type; unused fields are omitted.
type msg struct {
	T       string      `json:"t"`
	Rank    int         `json:"rank,omitempty"`
	Link    int         `json:"link,omitempty"` // data: rank that sends on the link
	Nonce   []byte      `json:"nonce,omitempty"`
	Proof   []byte      `json:"proof,omitempty"`
	Addrs   []string    `json:"addrs,omitempty"`
	HostID  string      `json:"host,omitempty"`
	Unix    string      `json:"unix,omitempty"`
	TCPPort int         `json:"tcp,omitempty"`
	TLSPort int         `json:"tlsport,omitempty"`
	Text    string      `json:"text,omitempty"`
	Missing []int       `json:"missing,omitempty"`
	Table   []tableItem `json:"table,omitempty"`
	Seq     uint64      `json:"seq,omitempty"`
	// Left marks an abort caused by rank Rank leaving after call Seq.
	Left bool `json:"left,omitempty"`
	// Progress is every rank's last reported Seq, indexed by rank.
	Progress []uint64 `json:"progress,omitempty"`

	// Elastic mode only: all zero, hence absent, in a fixed-size job.
	Epoch   int        `json:"epoch,omitempty"`   // membership epoch
	Joiner  bool       `json:"joiner,omitempty"`  // hello: a process that asks to join a running job
	Elastic int64      `json:"elastic,omitempty"` // hello: the member is elastic, with this heartbeat bound (ms)
	Pending int        `json:"pending,omitempty"` // ping: joiners waiting to be admitted
	Lost    []lostItem `json:"lost,omitempty"`    // reconfig, table: members that are gone
	Joined  []int      `json:"joined,omitempty"`  // table: ranks (in the new epoch) of the members that joined
	// HostName, in an elastic hello: the name of its host in messages
	// (Config.HostName).
	HostName string `json:"hostname,omitempty"`
	// Args, in an elastic hello: the program's arguments (Config.Args).
	Args []string `json:"args,omitempty"`
	// Leave, in a grow: the member leaves the job at this commit boundary
	// (Text: why, e.g. "SIGTERM").
	Leave bool `json:"leave,omitempty"`
	// Proc, in a hello: the launcher's identity of the process
	// (Config.ProcID, GORUN_PROC_ID), so that the rendezvous' reports
	// name the launcher's processes exactly. Not authenticated beyond the
	// job key; for messages and bookkeeping only.
	Proc string `json:"proc,omitempty"`
	// Shm, in a data hello over a unix socket: the dialer offers to move
	// the link to shared memory; in the answer: the acceptor agrees.
	Shm bool `json:"shm,omitempty"`

	// A replicated rendezvous only (rz_group.go). MID, in a welcome: the
	// process' id in the membership; in a hello with Resume: the id it
	// had, to take up again with a new leader. Group, in a welcome or a
	// ping: every replica of the group. Replica, in a hello: the replica
	// this process hosts, for the group to add.
	MID     int64       `json:"mid,omitempty"`
	Resume  bool        `json:"resume,omitempty"`
	Group   []groupItem `json:"group,omitempty"`
	Replica *groupItem  `json:"replica,omitempty"`
}

// groupItem is one replica of a replicated rendezvous.
type groupItem struct {
	ID    uint64 `json:"id"`
	Addr  string `json:"addr"`            // "host:port"
	Spare bool   `json:"spare,omitempty"` // in a hello: GroupConfig.Spare
}

// lostItem is a member that left the job without a clean Close.
type lostItem struct {
	Rank  int    `json:"rank"` // its rank in the last epoch it was part of
	ID    string `json:"id"`
	Host  string `json:"host"`
	Addr  string `json:"addr"`
	Cause string `json:"cause"`
	Proc  string `json:"proc,omitempty"` // its hello's Proc
	Left  bool   `json:"left,omitempty"` // it left gracefully at a commit boundary
	Name  string `json:"name,omitempty"` // its host's name in messages (Config.HostName)
}

// tableItem is one rank's entry of the job table.
type tableItem struct {
	Rank    int      `json:"rank"`
	ID      string   `json:"id"` // libp2p peer ID (string form)
	Addrs   []string `json:"addrs"`
	HostID  string   `json:"host"`
	Unix    string   `json:"unix,omitempty"`
	TCPPort int      `json:"tcp,omitempty"`     // tcp-plaintext data port
	TLSPort int      `json:"tlsport,omitempty"` // tcp-tls data port
}

const nonceLen = 32

func writeMsg(w io.Writer, m *msg) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if len(b) > maxFrame {
		return fmt.Errorf("message %q too large (%d bytes)", m.T, len(b))
	}
	buf := make([]byte, 4+len(b))
	binary.BigEndian.PutUint32(buf, uint32(len(b)))
	copy(buf[4:], b)
	_, err = w.Write(buf)
	return err
}

// readMsg reads one frame. It never allocates more than maxFrame and checks
// the basic shape of the message (known type, sane field sizes).
func readMsg(r io.Reader) (*msg, error) { return readMsgMax(r, maxFrame) }

func readMsgMax(r io.Reader, limit uint32) (*msg, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > limit {
		return nil, fmt.Errorf("frame of %d bytes exceeds limit %d", n, limit)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return decodeMsg(b)
}

func decodeMsg(b []byte) (*msg, error) {
	var m msg
	d := json.NewDecoder(bytes.NewReader(b))
	if err := d.Decode(&m); err != nil {
		return nil, fmt.Errorf("bad message: %w", err)
	}
	if err := m.check(); err != nil {
		return nil, err
	}
	return &m, nil
}

// check validates what every receiver relies on, independent of state.
func (m *msg) check() error {
	switch m.T {
	case tChallenge, tDChal:
		if len(m.Nonce) != nonceLen {
			return fmt.Errorf("bad %s: nonce of %d bytes", m.T, len(m.Nonce))
		}
	case tHello, tDHello:
		if m.Epoch < 0 || m.Pending < 0 || m.Elastic < 0 {
			return fmt.Errorf("bad %s: negative epoch or heartbeat", m.T)
		}
		if len(m.Nonce) != nonceLen || len(m.Proof) != sha256.Size {
			return fmt.Errorf("bad %s: nonce/proof size", m.T)
		}
		if m.Rank < 0 || m.Link < 0 {
			return fmt.Errorf("bad %s: negative rank", m.T)
		}
		if len(m.Proc) > maxProcID {
			return fmt.Errorf("bad %s: process id of %d bytes (at most %d)", m.T, len(m.Proc), maxProcID)
		}
		if !validPort(m.TCPPort) || !validPort(m.TLSPort) {
			return fmt.Errorf("bad %s: tcp port %d / tls port %d", m.T, m.TCPPort, m.TLSPort)
		}
	case tWelcome, tDOK:
		if len(m.Proof) != sha256.Size {
			return fmt.Errorf("bad %s: proof size", m.T)
		}
	case tTable:
		if _, err := checkTable(m.Table); err != nil {
			return err
		}
	case tProgress, tProgQuery, tHangAsk, tStateAsk, tState, tHang:
		if m.Rank < 0 {
			return fmt.Errorf("bad %s: negative rank", m.T)
		}
	case tAbort, tAbortOK, tError, tAck, tGo, tPing, tLeave, tBye, tLeaving, tLate, tLateOK,
		tReconfig, tWaiting, tLinkFail, tGrow, tGrowNone, tDropped, tDeparted, tQuit, tRedirect:
		if m.Rank < 0 {
			return fmt.Errorf("bad %s: negative rank", m.T)
		}
	default:
		return fmt.Errorf("unknown message type %q", m.T)
	}
	return nil
}

// checkTable verifies that the table lists ranks 0..len-1 exactly once each,
// in order, with plausible contents; it returns the size.
func checkTable(t []tableItem) (int, error) {
	if len(t) == 0 {
		return 0, errors.New("bad table: empty")
	}
	for i, it := range t {
		if it.Rank != i {
			return 0, fmt.Errorf("bad table: entry %d has rank %d", i, it.Rank)
		}
		if it.ID == "" {
			return 0, fmt.Errorf("bad table: rank %d has no peer ID", i)
		}
		if !validPort(it.TCPPort) || !validPort(it.TLSPort) {
			return 0, fmt.Errorf("bad table: rank %d tcp port %d / tls port %d", i, it.TCPPort, it.TLSPort)
		}
	}
	return len(t), nil
}

func validPort(p int) bool { return p >= 0 && p <= 65535 }

// mac computes HMAC-SHA256(key, label || parts...). Every part has a fixed
// size or is length-prefixed so distinct inputs can not collide.
func mac(key []byte, label string, parts ...[]byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(label))
	var l [4]byte
	for _, p := range parts {
		binary.BigEndian.PutUint32(l[:], uint32(len(p)))
		h.Write(l[:])
		h.Write(p)
	}
	return h.Sum(nil)
}

func u64(v int) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(v))
	return b[:]
}

func registerProof(key, nonce []byte, peerID string, rank int) []byte {
	return mac(key, "gorun register", nonce, []byte(peerID), u64(rank))
}

func welcomeProof(key, nonce []byte, serverID string) []byte {
	return mac(key, "gorun rendezvous", nonce, []byte(serverID))
}

// dataProof and dataOKProof authenticate the two ends of a data link of
// membership epoch `epoch`, so that a dial (or a replayed handshake) from
// another epoch is refused and bytes of an old ring never reach the new one.
// Epoch 0 adds no part: a fixed-size job, which is always in epoch 0, keeps
// the proofs it always had, and since parts are length-prefixed an epoch-0
// proof still differs from every later epoch's.
func dataProof(key, nonce []byte, rank, link, epoch int) []byte {
	return mac(key, "gorun data", epochParts(epoch, nonce, u64(rank), u64(link))...)
}

func dataOKProof(key, nonce []byte, rank, link, epoch int) []byte {
	return mac(key, "gorun data ok", epochParts(epoch, nonce, u64(rank), u64(link))...)
}

func epochParts(epoch int, parts ...[]byte) [][]byte {
	if epoch == 0 {
		return parts
	}
	return append(parts, u64(epoch))
}
