// Package ringsim simulates gorun's allreduce at sizes no test machine
// reaches (thousands of ranks on hundreds of hosts, up to 1 GiB, at 10 to
// 400 Gbit/s): it runs the real schedules of package ring, every rank a
// goroutine with its own ring.Ring, over an in-memory transport whose
// messages take the time an α-β network model gives them on a virtual
// clock. It is for gorun's developers (the policy's defaults at scale,
// BENCHMARKS.md's tables), through gorun sim; users do not import it.
//
// # The model
//
// Hosts join one switch. Each host has a NIC of Network.Bandwidth bits per
// second in each direction, which its ranks share; ranks of one host talk
// over links of their own (shared memory) of Network.LocalBandwidth. A
// message is one ring SendTo (a header and a chunk of at most
// ring.Config.ChunkBytes):
//
//   - between hosts, it waits for the sending host's NIC, which sends
//     one message at a time, taking turns among the links (rank pairs)
//     that have one waiting, for b·β (β = 8/Bandwidth); its first byte
//     reaches the receiving host α (Network.Latency) after it started to
//     leave, and the receiving NIC takes messages in, one at a time, in
//     the order they reach it, for b·β each, so that the last byte is in
//     no earlier than α after it left. A host that sends to or receives
//     from several hosts at once divides its bandwidth among them;
//   - within a host, it takes the link's α and b/LocalBandwidth, after
//     the link's previous message.
//
// Sends never wait: a link buffers without bound, and the sender's bytes
// are on their way (gorun's links buffer 2 MiB in shared memory and a few
// MiB in a socket; the schedules' dependencies, not the buffers, bound how
// far a sender runs ahead). A receive returns once the bytes it asks for
// are in. The model has no CPU: reductions, copies and the hand-offs
// between a schedule's goroutines take no virtual time, so where a link
// is faster than a core can reduce (hundreds of Gbit/s), times are lower
// bounds. Within those terms the model is the α-β (Hockney) one, with a
// shared NIC: a ring allreduce on p hosts of one rank takes exactly
// 2(p-1)·(α + (n/p + h)·β), h the 56-byte header (TestRingAllreduceIsAlphaBeta).
//
// # The method
//
// A discrete-event simulation. The clock is Time (picoseconds) and moves
// only when the simulator moves it. At an instant, every rank's
// goroutines run as far as they can: they reduce real data, and call the
// transport. A send records the message; a receive takes bytes already in
// or waits. When no goroutine can run any more (settle.go says how that is
// known without touching the schedules), the messages sent at this
// instant go onto the network sorted by sender, receiver and their order
// on the link, never in the order the Go scheduler happened to run the
// goroutines; the clock then jumps to the next event (a NIC done with a
// message, a message in), whose deliveries wake the receivers waiting for
// them. Ties go in the order the events were scheduled. So a simulation
// gives the same time, to the picosecond, on every run
// (TestDeterministic), and since the ranks run the real schedules with
// real data, each rank's result is checked against the sum of the inputs.
//
// # Large buffers
//
// 4096 ranks of 1 GiB do not fit a machine. A schedule's timing depends
// only on how many bytes each message carries, so a run may shrink the
// buffer by a scale k (a power of two) and the chunk size with it, and
// count every payload byte as k on the wire (the header stays 56 bytes):
// the schedule sends the same messages in the same order, each standing
// for the full-size one, and the shrunk data is still reduced and
// checked. Simulate picks the smallest k that fits Allreduce.Memory and
// keeps every segment (a rank's share, n/N) and every chunk a whole number
// of elements, so nothing is split differently (TestScaledRunMatchesFull
// checks the two runs agree to the picosecond). One choice still sees the
// shrunk sizes: whether a step is small enough to send before receiving
// (ring.SmallBytes), which may run a step of a scaled run without the
// sender goroutine its full size would use; in virtual time that is the
// same one-chunk step, and only a multi-chunk step's pipelining differs.
//
// # What it is not
//
// Packet loss, TCP's congestion control, a switch's buffers and a
// token-bucket shaper's burst are not modelled; BENCHMARKS.md ("Simulator")
// compares the model with gorun on network-namespace hosts joined by
// shaped links.
package ringsim
