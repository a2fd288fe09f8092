// Package raftgroup replicates a job's membership among a small group of
// processes with raft (go.etcd.io/raft/v3), so that losing the process
// that serves the rendezvous does not lose the job: every replica applies
// the same log of membership events to its own membership.Machine, and
// whichever replica leads carries out the actions.
//
// A Replica is driven as raft's RawNode is: the caller ticks it, feeds it
// the messages of the other replicas, proposes events, and calls Ready for
// the messages to send and the actions that the newly committed events
// produced. It starts no goroutine and does no I/O itself, so the tests
// run a whole group, its elections, failovers and partitions, over an
// in-memory network, deterministically.
//
// Only a majority of the group commits anything: a replica cut off with a
// minority proposes in vain, and its Machine stays where the majority
// left it until it hears from the majority again (then it catches up).
package raftgroup
