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
