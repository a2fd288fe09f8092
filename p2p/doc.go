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
//     the kernel does the copy), authenticated by an HMAC handshake.
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
package p2p
