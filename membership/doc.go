// Package membership is the rendezvous' bookkeeping of who is in a job,
// as a deterministic state machine: registration and the start of a job,
// the membership epochs of an elastic job (losses, joiners, graceful
// leaves, broken links, waiting below the minimum size) and how a job
// finishes or aborts.
//
// It does no I/O: no network, no goroutines, no clock reads. A driver
// (p2p's Rendezvous) turns what happens on its connections and timers into
// Events, calls Machine.Step with the time it read, and carries out the
// Actions it gets back, in order: it sends the Messages, starts the
// timers asked for and tells its callbacks. The same events in the same
// order always give the same actions, which is what lets the tests run
// every transition without a network (machine_test.go) and what a
// replicated rendezvous needs: every replica that applies the same log of
// events holds the same membership.
//
// The driver must
//   - call Step for one Machine from one goroutine at a time;
//   - carry out one Step's actions before the next Step's (messages of
//     epoch e reach every member before those of e+1); Sends to different
//     processes may go concurrently, those to one process in order;
//   - carry out Welcome before anything else sent to that process.
//
// Processes are named by an ID of the driver's choosing (one per control
// connection).
package membership
