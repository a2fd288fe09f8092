package ring

import "context"

// Transport is everything the ring schedule needs from the network: an
// ordered, reliable byte stream to the next rank and one from the previous
// rank. Framing (headers, fingerprints, chunk boundaries) belongs to the ring,
// so a transport is just two pipes with deadlines.
//
// SendNext and RecvPrev are called from different goroutines at the same
// time (the sender and the receiver of a pipelined collective), but each one
// is never called concurrently with itself.
//
// The Ring sends each message with one SendNext call: a HeaderSize-byte
// header, then (unless the chunk is empty) one payload buffer. It reads a
// message with two RecvPrev calls, header first, so that the header can be
// checked before the payload is read. The transport needs no framing of its
// own; NewMemRing provides an in-memory implementation.
type Transport interface {
	// SendNext writes every buffer, in order, to the next rank. The buffers
	// may be reused as soon as SendNext returns. It fails when ctx is done,
	// reporting context.Cause(ctx) if the context carries one.
	SendNext(ctx context.Context, bufs ...[]byte) error
	// RecvPrev reads exactly len(buf) bytes from the previous rank. It fails
	// when ctx is done, reporting context.Cause(ctx) if the context carries
	// one, or when the stream breaks (naming the peer).
	RecvPrev(ctx context.Context, buf []byte) error
}

// Concurrency is an optional interface of a Transport that waits
// differently when the collective runs goroutines of its own (a pipelined
// sender beside the caller's receiver, one sender and receiver per peer).
// A transport that parks a waiting thread in a system call should then let
// those goroutines run first, which costs a thread wake-up the single
// goroutine of a small collective does not need. The Ring calls
// Concurrent(true) before it starts such goroutines and Concurrent(false)
// after they ended; calls nest (a count).
type Concurrency interface {
	Concurrent(on bool)
}

// LinkBuffers is an optional interface of a Transport whose links hold
// more than SmallBytes unread (p2p's shared-memory links hold 2 MiB).
// A ring step, or a pairwise exchange round, whose message to a peer fits
// in half of that link's buffer then runs as the small ones do: send,
// then receive, on the caller's goroutine, without the sender goroutine
// whose hand-offs cost more than the copy for messages of a few hundred
// KiB (see BENCHMARKS.md, "Link buffers"). Half, because a link may hold
// one message of the step before while its reader is still busy with its
// own send (with room for one message only, such schedules deadlocked).
// The choice is each rank's own: the messages on every link are the same
// either way.
type LinkBuffers interface {
	// LinkBuffer is how many bytes the link to rank holds unread; 0 if
	// the transport cannot promise more than SmallBytes.
	LinkBuffer(rank int) int
}

// ViewReceiver is an optional interface of a Transport that can hand over
// what it received without copying it first (a shared-memory ring's bytes,
// in place). The ring reduces a received chunk straight from them, which
// saves a copy of every reduced byte.
type ViewReceiver interface {
	// RecvFromView receives the next n bytes from rank (the previous
	// rank, or over a Mesh any rank) and hands them to use, in order, as
	// one or more spans of any length (an element may straddle two), each
	// valid only during its call. It follows RecvPrev's and RecvFrom's
	// rules otherwise.
	RecvFromView(ctx context.Context, rank, n int, use func(span []byte)) error
}

// Mesh is a Transport that also reaches every rank directly. Compressed
// allreduce needs it: each rank sends its compressed share of segment j
// straight to j's owner, so no partial sum is ever re-compressed on the way
// (see compressed.go).
//
// SendTo and RecvFrom follow the rules of SendNext and RecvPrev, per peer:
// calls for different peers may run concurrently, calls for the same peer
// and direction never do. The stream to a peer is the same ordered stream
// that SendNext uses when the peer is the next rank (and RecvPrev, for the
// previous rank), so callers must not interleave the two for one peer
// within a collective.
type Mesh interface {
	Transport
	SendTo(ctx context.Context, rank int, bufs ...[]byte) error
	RecvFrom(ctx context.Context, rank int, buf []byte) error
}

// GroupedSteps is an optional interface of a Transport that says how a
// ring step too large to send before receiving should run: true, as
// groups of chunks that fit, each sent then received on the caller's
// goroutine (Ring.runGrouped); false, by a sender goroutine beside the
// receiver. p2p says true where every rank has a CPU of its own but none
// to spare for a second goroutine.
type GroupedSteps interface {
	GroupedSteps() bool
}
