package ring

import (
	"fmt"
	"strconv"
)

// DType is the element type of a buffer. The zero value is invalid so that a
// forgotten field is caught instead of silently meaning float32.
type DType uint8

// Element types. Uint8 is "raw bytes": it can be broadcast or gathered but
// not reduced.
const (
	Float32 DType = iota + 1
	Float64
	Int32
	Int64
	Uint8
	maxDType = Uint8
)

// Size returns the size of one element in bytes (0 for an invalid DType).
func (d DType) Size() int {
	switch d {
	case Float32, Int32:
		return 4
	case Float64, Int64:
		return 8
	case Uint8:
		return 1
	}
	return 0
}

func (d DType) valid() bool { return d >= Float32 && d <= maxDType }

// reducible reports whether reduction kernels exist for d.
func (d DType) reducible() bool { return d >= Float32 && d <= Int64 }

func (d DType) String() string {
	switch d {
	case Float32:
		return "float32"
	case Float64:
		return "float64"
	case Int32:
		return "int32"
	case Int64:
		return "int64"
	case Uint8:
		return "uint8"
	}
	return "dtype(" + strconv.Itoa(int(d)) + ")"
}

// Op is a reduction operator. The zero value is invalid.
//
// Sum and Prod wrap around on integer overflow. Avg is a Sum followed by one
// division by the ring size, performed once by the owner of each segment
// after the reduce-scatter phase and before the allgather phase, so every rank
// receives identical bytes; for integers the division truncates toward zero.
// Min and Max use Go's builtin min/max: for floats a NaN operand makes the
// result NaN and -0 orders before +0.
type Op uint8

// Reduction operators.
const (
	Sum Op = iota + 1
	Avg
	Min
	Max
	Prod
	maxOp = Prod
)

func (o Op) valid() bool { return o >= Sum && o <= maxOp }

func (o Op) String() string {
	switch o {
	case Sum:
		return "Sum"
	case Avg:
		return "Avg"
	case Min:
		return "Min"
	case Max:
		return "Max"
	case Prod:
		return "Prod"
	}
	return "Op(" + strconv.Itoa(int(o)) + ")"
}

// Kind names a collective. The zero value means "unset": each Ring method
// fills in its own kind, and rejects a Call whose Kind names another one.
type Kind uint8

// Collective kinds.
const (
	Allreduce Kind = iota + 1
	Broadcast
	Allgather
	ReduceScatter
	Barrier
	Shift
	maxKind = Shift
)

func (k Kind) valid() bool { return k >= Allreduce && k <= maxKind }

// String returns the lower-case name used as an error prefix ("allreduce").
func (k Kind) String() string {
	switch k {
	case Allreduce:
		return "allreduce"
	case Broadcast:
		return "broadcast"
	case Allgather:
		return "allgather"
	case ReduceScatter:
		return "reducescatter"
	case Barrier:
		return "barrier"
	case Shift:
		return "shift"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Name returns the capitalised name used in messages ("Allreduce").
func (k Kind) Name() string {
	switch k {
	case Allreduce:
		return "Allreduce"
	case Broadcast:
		return "Broadcast"
	case Allgather:
		return "Allgather"
	case ReduceScatter:
		return "ReduceScatter"
	case Barrier:
		return "Barrier"
	case Shift:
		return "Shift"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Call describes one collective call. Every rank must issue the same calls
// in the same order; the fingerprint (Kind, Seq, Op, DType, Count, Root) of
// the call travels in every message header and a receiver that sees a
// different fingerprint fails with *MismatchError.
//
// Fields that a kind does not use are zeroed before the fingerprint is
// taken: Op for Broadcast/Allgather/Barrier, Root for everything but
// Broadcast, DType and Count for Barrier.
type Call struct {
	Kind  Kind
	Seq   uint64 // sequence number chosen by the caller (e.g. per-communicator counter)
	Op    Op
	DType DType
	Count int    // elements in this rank's input buffer
	Root  int    // Broadcast only
	Name  string // optional tensor name, only used in messages; not part of the fingerprint
	// Codec names the compression of an Allreduce ("" or "none": none;
	// "fp16", "bf16", "int8"); see compressed.go. Part of the fingerprint.
	Codec string
	// Algo is the schedule the call runs. The Ring sets it when it picks
	// the algorithm (callers leave it zero); it is part of the fingerprint,
	// so ranks that picked differently fail with *MismatchError.
	Algo Algorithm
}

// String formats the call, e.g. "Allreduce(float32[1000], Sum)",
// "Broadcast(float32[8], root=0)", "Allgather(int64[4])", "Barrier()".
// A non-empty Name is appended as `, name="..."` inside the parentheses.
func (c Call) String() string {
	var s string
	switch c.Kind {
	case Allreduce, ReduceScatter:
		s = fmt.Sprintf("%s(%s[%d], %s", c.Kind.Name(), c.DType, c.Count, c.Op)
		if c.Codec != "" && c.Codec != "none" {
			s += ", " + c.Codec
		}
		if c.Algo != AlgoRing {
			s += ", " + c.Algo.String()
		}
	case Broadcast:
		s = fmt.Sprintf("%s(%s[%d], root=%d", c.Kind.Name(), c.DType, c.Count, c.Root)
	case Barrier:
		s = "Barrier("
		if c.Name != "" {
			return s + fmt.Sprintf("name=%q)", c.Name)
		}
	default:
		s = fmt.Sprintf("%s(%s[%d]", c.Kind.Name(), c.DType, c.Count)
	}
	if c.Name != "" {
		s += fmt.Sprintf(", name=%q", c.Name)
	}
	return s + ")"
}

// normalize zeroes the fields that kind k does not use.
func (c Call) normalize() Call {
	switch c.Kind {
	case Broadcast:
		c.Op = 0
		c.Codec = ""
	case Allgather, Shift:
		c.Op, c.Root = 0, 0
	case Barrier:
		c.Op, c.Root, c.DType, c.Count = 0, 0, 0, 0
	default:
		c.Root = 0
	}
	if c.Kind != Allreduce || c.Codec == "none" {
		c.Codec = ""
	}
	return c
}

// sameFingerprint reports whether two normalized calls match.
func sameFingerprint(a, b Call) bool {
	return a.Kind == b.Kind && a.Seq == b.Seq && a.Op == b.Op &&
		a.DType == b.DType && a.Count == b.Count && a.Root == b.Root && a.Codec == b.Codec && a.Algo == b.Algo
}

// MismatchError reports that two ranks issued different collectives at the
// same point. It is detected by the receiving rank (LocalRank) when the
// header of a message from RemoteRank carries another call fingerprint.
// Remote is decoded from the header, so Remote.Name is always empty.
type MismatchError struct {
	Local, Remote         Call
	LocalRank, RemoteRank int
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("%s #%d: rank %d called %s but rank %d called %s",
		e.Local.Kind, e.Local.Seq, e.LocalRank, e.Local, e.RemoteRank, e.Remote)
}

// EpochError reports a message from another membership epoch than the
// receiving Ring's (Config.Epoch): a peer still on the ring of an earlier
// (or later) membership. Its data is never used. With elastic membership
// this means the links of two epochs were mixed up, which the epoch-bound
// link handshakes should prevent; the job should stop rather than guess.
type EpochError struct {
	Call          Call   // the receiver's call
	Rank, From    int    // receiving rank, sending rank
	Local, Remote uint32 // the receiver's epoch and the message's
}

func (e *EpochError) Error() string {
	why := "a peer of an older ring is still sending"
	if e.Remote > e.Local {
		why = "this rank is behind: a newer membership exists"
	}
	return fmt.Sprintf("%s #%d: rank %d: message from rank %d of membership epoch %d, this ring is in epoch %d: refused (%s; its data is not used)",
		e.Call.Kind, e.Call.Seq, e.Rank, e.From, e.Remote, e.Local, why)
}

// Stats are cumulative traffic counters of a Ring. Payload bytes are the
// tensor bytes only; header bytes are the fixed-size framing.
type Stats struct {
	PayloadBytesSent uint64
	HeaderBytesSent  uint64
	MessagesSent     uint64
	PayloadBytesRecv uint64
}
