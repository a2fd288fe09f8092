// Package ring implements bandwidth-optimal, pipelined ring collectives —
// Allreduce, ReduceScatter, Allgather, Broadcast, Barrier and Shift — over a
// minimal Transport (an ordered byte stream to the next rank and one from the
// previous rank), in the manner of Horovod, Gloo and NCCL's ring algorithms.
//
// # Algorithms
//
// Each collective lives in its own file with its schedule explained at the
// top: allreduce.go (ring reduce-scatter + ring allgather), and the other
// allreduce algorithms: direct.go (every buffer to every rank, folded in
// rank order), scattergather.go (direct reduce-scatter + direct allgather
// over a Mesh), recdoubling.go (recursive doubling), rabenseifner.go
// (recursive halving + doubling), hierarchical.go (within hosts, then
// across); policy.go chooses among them by size, rank count and transport
// (Config.Allreduce, AllreducePolicy, ParseAllreducePolicy); exchange.go
// has the point-to-point framing the Mesh schedules share. Then
// reducescatter.go,
// allgather.go, broadcast.go (pipelined chain from the root; small buffers
// straight from the root over a Mesh), barrier.go (dissemination over a
// Mesh, a token around the ring otherwise),
// shift.go (each rank's buffer to the next rank, e.g. a buddy copy),
// and compressed.go (a compressed allreduce over a Mesh: every rank sends
// its encoded share of each segment straight to the segment's owner, which
// reduces in float32, encodes the sum once and sends the same bytes to
// everybody, chunk by chunk with one sender and one receiver per peer).
// The ring collectives share one engine (a collective's steps in plan.go,
// run by engine.go; phases.go times them, fold.go reduces what arrives):
// every segment is cut into chunks of at most Config.ChunkBytes, a sender
// goroutine and a receiver goroutine run concurrently, and a chunk is
// forwarded as soon as it has been received and reduced, so transfer and
// reduction overlap. A step that fits half of what the links buffer
// (LinkBuffers) is instead sent, then received, on the caller's
// goroutine, and so is a larger one, in groups of chunks that fit, where
// the transport says a sender goroutine would find no CPU of its own
// (GroupedSteps). Reduction kernels are in kernels.go.
//
// # Framing and safety
//
// Every message is a fixed HeaderSize-byte little-endian header (magic,
// version, the call fingerprint Kind/Seq/Op/DType/Count/Root, sender rank,
// step, chunk index, element offset, payload length, membership epoch; see
// header.go) followed by the payload. The receiver checks the header
// against the call it is running and the position it expects before reading
// the payload: another membership epoch (Config.Epoch) yields *EpochError,
// a different fingerprint *MismatchError, anything else a protocol error
// naming the sending rank. The ring knows the epoch as a number only;
// membership is the caller's (package p2p and collective). Empty segments (Count 0, or Count < Size)
// still send one header-only message per step, so mismatches are caught
// for every call.
//
// # Determinism
//
// The order in which contributions are combined depends only on the ring
// size and the buffer length (each algorithm documents its order), and
// every rank ends with bytes that either the segment's owner computed or
// every rank computed by the same expression, so results are bitwise
// identical across ranks and across runs. Avg is computed as Sum followed
// by a single division by Size (truncating for integers). The algorithm is
// part of every message's fingerprint (Call.Algo), so ranks whose policies
// chose differently fail with *MismatchError.
//
// # Concurrency
//
// A Ring runs one collective at a time; callers serialize calls. Scratch
// buffers are kept in the Ring and reused, so a steady-state call performs a
// small constant number of allocations (context and goroutine), none per
// chunk. Stats may be read concurrently.
//
// # Testing
//
// NewMemRing returns in-memory transports (bounded pipes honouring context
// cancellation, with Close for failure injection) so the ring can be tested
// and benchmarked without I/O.
package ring
