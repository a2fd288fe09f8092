// Package etcdlog replicates a job's membership through etcd: etcd is the
// replicated log and the leader election that membership/raftgroup
// provides with raft among the job's own processes. Losing any process of
// the job, or an etcd member short of the etcd cluster's majority, does
// not lose the membership.
//
// Every replica of a job keeps an etcd session (a lease kept alive while
// the process lives) and registers its address under
// /gorun/<job>/replicas/<id> with it. A candidate also stands for leader:
// it puts a key under /gorun/<job>/leader/ with its lease, and leads while
// its key is the oldest there (etcd's election recipe). The log is the keys
// /gorun/<job>/log/<index, 20 digits>, each a membership.Encode-d event;
// the leader appends with a transaction that holds only while its own
// election key is still the one it created, and only if the index is
// free, so a deposed leader can never append, and no entry is ever
// overwritten.
//
// Every replica watches the job's prefix from the revision it read first
// and applies the log entries in order to its own membership.Machine, as
// raft followers apply committed entries. One watch carries the log, the
// election keys and the registrations, in etcd's revision order: when a
// replica sees the previous leader's key go, it has already received every
// entry that leader appended (those came at earlier revisions), so it
// leads with the whole log applied.
//
// A Log starts goroutines of its own (the watch, the session, the
// appends); the caller drives it as it drives a raftgroup.Replica:
// Propose events, and call Ready, when Changed fires, for what the newly
// applied events did.
package etcdlog
