// Package p2p is gorun's network layer: it turns a set of independently
// started processes (ranks) that share a job key into a ring of
// authenticated byte streams, plus a control path that spreads aborts.
//
// # Pieces
//
//   - Every rank runs a libp2p host (TCP + TLS 1.3 + yamux only). TLS gives
//     every host a cryptographic peer ID; a ConnectionGater refuses every peer
//     ID that is not in the job's table, so a stranger on the network can not
//     even complete a libp2p handshake with a rank.
//   - A rendezvous service (StartRendezvous), itself a libp2p host, is hosted
//     by the gorun launcher or in-process by rank 0. Its ed25519 identity is
//     derived from the job key, so a rank that knows only the key and
//     "host:port" can dial it and is sure (via TLS) that it talks to the real
//     rendezvous, and nothing else (no DHT, no bootstrap list) is needed.
//   - Membership (protocol /gorun/rendezvous/1): mutual challenge-response
//     with HMAC-SHA256 over the job key. When all ranks registered, the
//     rendezvous sends the table to everyone, waits for every rank to install
//     it in its gater (ack) and only then says "go", so no rank dials a peer
//     whose gater would still refuse it.
//   - Control path: the registration stream stays open for the whole job.
//     Aborts are relayed to every rank; a stream that breaks without a prior
//     "leave" is broadcast as "rank N (addr) disconnected". Both ends send
//     heartbeats and put a read deadline of Timeout on the stream, so a frozen
//     (SIGSTOPped) process is noticed within Timeout. Close announces "rank L
//     leaves after call #N" (its last SetProgress) before it ends its links;
//     the rendezvous relays it to every rank and tells RendezvousConfig.OnLeave.
//     A rank in, or entering, a later call fails at once with a
//     *PeerLeftError, reports it, and the leaver's Close returns an
//     *EarlyCloseError naming the ranks it left behind.
//   - Data plane: one ordered byte stream per ordered pair of ranks i -> j
//     (a full mesh, set up at Join; Node.Mesh), of which the ring edges
//     r -> r+1 carry SendNext/RecvPrev. The lower rank of a pair dials both
//     of its links (simultaneous dials of the same pair make
//     a fraction of libp2p TLS handshakes fail, go-libp2p#2925). Ranks on the
//     same host use a unix abstract socket (no file to clean up, no cipher,
//     the kernel does the copy), authenticated by an HMAC handshake, and
//     then move the data to a ring buffer in shared memory ("shm", shm.go:
//     a memfd passed over that socket, futex wake-ups, the socket left to
//     watch the peer) unless a rank turns it off (Config.NoShm,
//     GORUN_SHM=0) or the setup fails, which keeps the unix socket.
//     Different hosts (and, with DataPlane "tls", every pair) use a TCP
//     connection of their own per link ("tcp-tls"), secured by libp2p's TLS
//     1.3 handshake with the ranks' libp2p identities (the acceptor checks
//     the peer ID is the table's for the rank the dialer claims to be), with
//     the same HMAC handshake inside and no stream multiplexer: records go
//     straight to the socket. With DataPlane "plaintext" different hosts use
//     raw TCP with the HMAC handshake alone. With DataPlane "libp2p", or to a
//     peer that advertises no TCP port, a libp2p stream (/gorun/ring/1, TLS
//     and yamux on the hosts' connection) is used. An accepted connection
//     must finish its handshake within a few seconds (5 s, or Timeout if
//     shorter), whatever Timeout is, and Close drops the ones still in it,
//     so a silent stranger on a data port holds up nothing.
//
// # Failure model
//
// Every blocking step is bounded by the caller's context and by
// Config.Timeout, and its error says what (which rank) was being waited for.
// When a Node aborts (Abort, an abort relayed by the rendezvous, a
// disconnected rank, or a lost rendezvous) its data links are closed, so a
// collective blocked in SendNext/RecvPrev (or SendTo/RecvFrom) returns at
// once with Node.Err().
//
// # Elastic membership
//
// Opt-in (RendezvousConfig.Elastic, Config.Elastic; without them nothing
// above changes). The job's membership moves through numbered epochs (0 at
// start); every member keeps its libp2p peer ID and gets a rank per epoch.
// The control stream's heartbeat bound is then HeartbeatTimeout (3 s;
// pings every quarter of it, from a goroutine that shares nothing with the
// data transfers), and Timeout stays the bound of setup steps.
//
//   - Loss. When the rendezvous loses a member's control stream
//     (disconnected: a killed process; silent for HeartbeatTimeout: a
//     frozen or cut-off host) it starts epoch e+1 and sends every remaining
//     member "reconfig". The member's current epoch fails at once: Err is a
//     *MembershipChangeError naming the lost members (rank, host, address,
//     cause) and the links are closed, so blocked transfers return it. A
//     rank whose link breaks first reports it to the rendezvous and waits
//     for its verdict: if the peer is gone its control stream is gone too
//     (a loss); if both are alive, the ring is re-formed with the same
//     members, and if that link fails again the member that could not be
//     reached is dropped (it gets a "dropped" message and stops). Abort
//     still aborts the whole job.
//   - Re-forming. Node.Reconfigure waits for the new table (survivors in
//     their old order, then joiners), installs it in the gater (lost peer
//     IDs are refused from then on), acks, waits for go and connects the
//     new links, whose handshake proofs include the epoch, so nothing of
//     an old ring reaches the new one. If the membership changes again
//     meanwhile (a member lost while the epoch forms), the rendezvous moves
//     on to the next epoch and every Reconfigure follows. Below MinSize the
//     rendezvous sends "waiting for N more members, S s left" statuses and
//     aborts the job after WaitTimeout ("job below --min-np ...").
//   - Grow. A joiner (Join with Rank -1) registers with the same proof and
//     waits; members see PendingJoiners through the pings. When every
//     member has called Node.Grow for the same epoch, the rendezvous admits
//     the joiners waiting then (up to MaxSize) in the next epoch, or tells
//     the members nobody waits. Any reconfiguration admits waiting joiners.
//   - Partition. Only the rendezvous' side goes on: a member whose control
//     stream fails (the rendezvous unreachable past HeartbeatTimeout) stops
//     for good with a *CutOffError and never re-forms on its own; a member
//     that can not complete a reconfiguration step ends its control stream,
//     so the others go on without it.
//   - Leaving. Close keeps its meaning (leave.go); a member that closes
//     while an epoch forms counts as lost for that epoch.
//
// RendezvousConfig.OnChange is told every established epoch after 0
// (lost and joined members, size, how long the change took). The package
// knows members, epochs, tables and links only: restoring and
// re-broadcasting the training state after a change is the caller's.
package p2p
