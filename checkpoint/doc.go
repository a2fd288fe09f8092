// Package checkpoint writes barrier checkpoints of a data-parallel job and
// brings a restarted job back to the last one, so that a job restarted by
// `gorun --max-restarts` computes exactly what it would have computed had
// nothing failed.
//
// A training loop registers its state once, restores, and saves every K
// steps:
//
//	w := make([]float32, n)                    // parameters, replicated
//	rng := rand.NewPCG(seed, uint64(rank))     // per-rank
//	var epoch int64                            // per-rank
//	st := new(checkpoint.State).Tensor("w", w).Binary("rng", rng).Int64("epoch", &epoch)
//	ckpt, err := checkpoint.New(comm, "/shared/ckpt")
//	start, found, err := ckpt.Restore(ctx, st) // found=false: a fresh start
//	for step := start; step < steps; step++ {
//		train(step)
//		if (step+1)%K == 0 {
//			if err := ckpt.Save(ctx, step+1, st); err != nil { log.Fatal(err) }
//		}
//	}
//	ckpt.Wait(ctx) // the deletion of old checkpoints runs in the background
//
// # Save
//
// Save is collective: every rank calls it with the same step. It
//
//  1. allgathers each rank's step, a fingerprint of its registered state,
//     whether its state could be encoded (a Blob's save func may fail on
//     one rank), the size of its per-rank blobs, its replication settings
//     (the number of replicas and the disk margin), whether the step is
//     already committed in its domain, and its free disk space
//     (syscall.Statfs). Every rank fails together, with an error naming
//     the ranks (and on a rank whose state failed, the cause), when a
//     rank's state could not be encoded, or ranks disagree on the
//     settings (naming the values) or the step; the step this Manager
//     restored or committed last, when it is still committed (a loop that
//     saves at its top saves again the step Restore returned), is not
//     saved again: every rank logs "checkpoint: step S is already
//     committed in DIR; not saved again" and returns nil. Another
//     committed checkpoint of the same step (one a restore skipped as
//     unloadable, or another run's) is replaced, with a log line. If any
//     rank sees less free space than the bytes its storage domain will
//     hold plus a margin (10%, at least 1 MiB), every rank fails with the
//     sizes and nothing is written;
//  2. has the lowest rank of every storage domain (below; with a shared
//     directory, rank 0) prepare DIR/step-<N>/: remove a stale, uncommitted
//     one that an earlier attempt at the step left;
//  3. has every rank write 1/N of the tensors' bytes (the concatenation of
//     the registered tensors, in order) and its own per-rank blobs, each to a
//     temporary name, fsynced and renamed, and then fsync the step's
//     directory once, after its last file (on S3 every object is durable
//     once its PutObject returns);
//  4. allgathers every file's size and sha256: the barrier that confirms
//     every file is durable;
//  5. has the lowest rank of every domain write manifest.json (step, world
//     size, each tensor's name, dtype, shape and byte range, each file's size
//     and sha256) to a temporary name, fsync it, rename it and fsync the
//     directories. The manifest is written last: a directory without
//     manifest.json is not a checkpoint, and no reader ever loads one;
//  6. allgathers the outcome, so every rank returns the same result. When
//     a domain's manifest could not be written the save fails on every
//     rank, and the error says in which hosts' directories the step is
//     committed nevertheless;
//  7. only when the step is committed in every domain, has the same ranks
//     apply retention, in the background (Save returns without waiting
//     for it): delete the committed steps newer than this one
//     (superseded: the job went on from an older checkpoint, after a
//     restore fell back past them; one line in the log names them), and
//     keep the newest K up to this step (WithKeep, default 2; this step is
//     never deleted), each by removing its manifest first, so that a crash
//     during the deletion leaves an uncommitted directory, never a broken
//     checkpoint.
//
// Retention is housekeeping, kept off the training path: it issues no
// collective, runs under the storage deadline and stops at the first
// deletion that fails, and its failure is logged once, by the rank that
// ran it, and never returned ("checkpoint: retention of step S at LOC:
// <what failed>; training goes on"); the next retention deletes what it
// left. The next save, or a restore, cuts short a retention still
// running (a store that does not answer) before it uses the store itself;
// Wait, at the end of training, waits for it. So call Wait before the
// program exits, after Save as after SaveAsync.
//
// The storage deadline (WithIOTimeout, default 30 minutes) bounds how long
// a rank waits for its store at one time: every storage operation of a
// save, and the wait of the next save, Restore or Wait for an
// asynchronous save's background work (which is then cancelled). A store
// that does not answer ends the save with a storage error that names the
// location and the cause, on every rank ("...: writing: not done within
// the storage deadline (30m0s, WithIOTimeout)"), never with a collective
// timeout: the collectives that wait on another rank's storage I/O (the
// agreement, the preparation and the barrier of steps 1, 2 and 4, the
// outcome of step 6, Wait's allreduces, and Restore's broadcasts and
// allgathers that wait for a reader) are bounded by the storage deadline
// plus the collective timeout (GORUN_TIMEOUT), so the rank that waited for
// its store says why before the others give up on it. A rank uploading a
// big shard with retries is slow, not dead. A dead or frozen peer still
// ends those collectives at once (broken links, heartbeats). Every rank
// must give the same value.
//
// # Asynchronous save
//
// SaveAsync runs steps 1 and 2, copies the bytes this rank writes (its
// shard, the replicas it keeps and the blob files) into a staging buffer
// reused from save to save, starts writing them in the background and
// returns: the training loop may change the state at once, and is blocked
// only for the agreement and the copy (SaveStats.Stall). The writes issue
// no collective. Poll, called once per training step, is a no-op with no
// save in flight and otherwise one small allreduce of "my part is done".
// A save in flight goes through two phases:
//
//   - writing: once every rank's writes are done, Poll runs step 4 (one
//     small allgather of the files' sizes and sha256, which also detects
//     replicas that differ) and starts the commit: each domain's lowest
//     rank writes the manifest (step 5) in the background;
//   - committing: once that is done on every rank, Poll ends the save
//     (LastSave then describes it), or fails it on every rank. Once it is
//     committed everywhere, each domain's lowest rank applies retention
//     (step 7) in the background, as after Save.
//
// So the training loop never waits for the manifest's fsyncs or the
// deletion of old checkpoints. The Polls of a phase issue the allreduce at
// their 1st, 2nd, 4th and 8th call, then every 8th (every rank counts the
// same calls), so that a phase that lasts many steps costs a few
// collectives and ends at most 7 steps late. Wait waits for this rank's
// part of each phase (at most the storage deadline) and polls until the
// save is over, then for retention; call it at the end of training. Save,
// SaveAsync and Restore end the save in flight first themselves (without
// its retention: the next save's covers it). InFlight says which step is
// in flight, if any:
//
//	for step := start; step < steps; step++ {
//		train(step)
//		if err := ckpt.Poll(ctx); err != nil { log.Fatal(err) }
//		if (step+1)%K == 0 {
//			if err := ckpt.SaveAsync(ctx, step+1, st); err != nil { log.Fatal(err) }
//		}
//	}
//	if err := ckpt.Wait(ctx); err != nil { log.Fatal(err) }
//
// At most one save is in flight (until its commit is over): a SaveAsync
// while one is in flight first commits it, or with WithSkipIfBusy skips
// the new save on every rank (logging why) while any rank is still writing
// or committing it (one small allgather decides; ranks that disagree on
// WithSkipIfBusy fail, named). Background work hashes, copies and writes
// in pieces of at most 1 MiB and yields between them, so that it never
// holds a CPU for long while the training loop's Polls wait. A background error (a write, or a lead rank's
// manifest) is logged at once and returned by the Poll that finds the
// phase done everywhere (or Wait, SaveAsync, Save), on every rank, as
// "checkpoint: async save of step S: <what, naming the location or file
// once>; previous checkpoint kept"; a rank other than the one that failed
// says which rank did and that its log has the cause. A synchronous save
// fails as "checkpoint: step S: <what> (previous checkpoint kept)". Save
// itself writes straight from the state, without the copy, and commits in
// the foreground.
//
// In an elastic job (collective.Comm.Elastic) the membership may change
// between SaveAsync and its commit: the survivors then hold a save planned
// for the old ranks, and a joiner holds none. The plan records the Comm's
// membership epoch; Poll, Wait, SaveAsync, Save and Restore first compare
// it with the current one, and when the job re-formed they abandon the
// save without any collective (every member sees the same epoch at the
// same call), logging once "checkpoint: async save of step S abandoned:
// the job re-formed (epoch E→E', N→M ranks) before it was committed; the
// previous checkpoint is kept". The abandoned save's background work is
// left to finish; the next save (or restore) waits for it before it
// reuses the staging buffer or touches the store.
//
// # On disk
//
//	DIR/step-000000000120/
//	    shard-00000-of-00004.bin   bytes [0, T/4) of the concatenated tensors
//	    shard-00001-of-00004.bin   bytes [T/4, 2T/4) ...
//	    rank-00000.state           rank 0's blobs: per blob, a uint32 name length,
//	    rank-00001.state           the name, a uint64 length and the bytes
//	    manifest.json              written last: the commit
//
// Numbers are stored in the machine's byte order, recorded in the manifest
// as "little" (every platform gorun runs on).
//
// DIR may be visible to every rank at the same path (a local directory
// when the job runs on one host, a shared filesystem such as NFS or Lustre
// when it spans hosts), or be each host's own local disk (below).
//
// # Replicated local disks
//
// Without a shared filesystem, give each host its own directory: in a
// location "{host}" is replaced by $GORUN_HOST (set by gorun to the host a
// rank runs on; else the host name), so "/scratch/ckpt/{host}" names a local
// directory everywhere (ExpandHost: New, OpenStore, Scan, List and Remove
// all expand it). On its first Save or Restore (and again after the
// job changes size) a Manager finds out which ranks share a directory: each
// rank creates a file with a random name in DIR/.gorun-tokens/, the names
// are allgathered, and each rank says which it sees, looking each name up
// (on NFS a lookup is revalidated with the server, where a directory
// listing may be served from a stale cache). Ranks that see each
// other's files form a storage domain; domains are numbered by their
// lowest rank.
//
// With one domain the layout is the one above. With H > 1 domains, the
// files of rank r (its shard and its blob file) are kept by r's domain and
// the next k domains, cyclically, where k is WithReplicas, else
// $GORUN_CHECKPOINT_REPLICAS (EnvReplicas, set by --checkpoint-replicas),
// else 2, and at most H-1. In a replica domain the file is written by the
// domain's member number r mod its size. Nothing crosses the network for
// the tensors: they are replicated, so the writer writes shard r from its
// own memory; the blobs are allgathered. The written barrier (step 4)
// compares every copy's sha256, and if two ranks wrote different bytes for
// a shard the save fails on every rank, naming them: the registered
// tensors must hold the same values on every rank. Every domain gets its
// own manifest, written by its lowest rank, and applies retention itself
// (once every domain committed). The number of replicas must be the same
// on every rank: ranks that disagree fail the save, named.
// A checkpoint survives the loss of up to k hosts' directories.
//
// Each domain's manifest records the placement (optional JSON fields, so
// older manifests still read): "hosts" (the number of domains),
// "replicas" (k), "host" (the domain whose directory holds this copy) and,
// per file, "hosts" (the domains that keep it). A manifest without them
// means that every file is in its directory. `gorun checkpoint inspect`,
// verify and ls (Scan, List) on one host's directory therefore check and
// count the files that directory should hold. Given the location with
// "{host}", Scan also checks, in the other hosts' directories beside it,
// the copies a restore would read: one of this directory's files missing
// or damaged here while another host's copy verifies makes the checkpoint
// DEGRADED (Entry.Degraded), not corrupted: the next restore reads the
// file from there and writes it back (a damaged copy of the right size is
// seen only when read: remove it to have it rewritten); a file of which
// no copy verifies makes it corrupted, and the restore falls back past
// it. The copies Scan cannot reach are said to be unchecked
// (Entry.Unchecked), never taken as good from the manifest. The log line
// of a re-replication names the directories written (with their host
// when the path does not say it).
//
// # Object storage
//
// A location s3://bucket/prefix keeps the same layout in an S3-compatible
// service (Store, OpenStore): prefix/step-<N>/<file>. Every rank puts its
// own objects (in parallel with the other ranks); a PutObject is atomic
// and durable once it returns, so rank 0 putting manifest.json after the
// barrier of step 4 is the commit, as with a directory. An s3:// location is one
// storage domain. There is no free-space check. The client is configured like every AWS SDK program:
// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION
// (default us-east-1), AWS_PROFILE and the shared config files,
// AWS_ENDPOINT_URL for a service other than AWS, which then gets
// path-style addressing and no EC2 metadata lookup (AWS_S3_FORCE_PATH_STYLE
// or a ?path-style=true|false suffix on the location decide otherwise).
// New checks the bucket (HeadBucket), so a missing bucket or
// refused credentials fail there with an error naming the location. Each
// request has a deadline, and 5xx answers, throttling, time-outs and
// refused connections are retried with backoff (5 attempts).
// An object above 64 MiB is a multipart upload; one that is cut off (a
// rank dies, or loses the store, in the middle) and cannot be aborted
// leaves its parts, which S3 keeps and bills but no listing of objects
// shows: List and Scan report them (Entry.Uploads), Remove aborts a
// step's, and retention aborts those of the steps up to the saved one and
// of later steps older than WithStaleUploadAge (default an hour).
//
// # Failures a restart would meet again
//
// Checkpoint storage that is full (the free-space check, or a write that
// finds no space left), over its quota, read-only, refusing access or the
// S3 credentials, or without its bucket fails a restarted job the same
// way. NoRestart recognises such an error from New, Save, SaveAsync, Poll,
// Wait or Restore, on the ranks that met it, and says why ("checkpoint
// storage at /ckpt is full (no space left on device)"); a rank that prints
// that and exits with ExitNoRestart makes gorun --max-restarts end the job
// instead of restarting it.
//
// # Restore
//
// Restore is collective, and every rank takes part in reading:
//
//  1. every rank lists the committed checkpoints in its own directory, and
//     the lists are allgathered; the candidates are their union, newest
//     first;
//  2. for a candidate, the lowest rank that has it reads manifest.json and
//     broadcasts it; every rank checks the tensors' names, dtypes and
//     shapes against the registered State;
//  3. every rank says which of the checkpoint's files its directory holds
//     (a copy of the wrong size counts as missing, and is rewritten); a
//     checkpoint with a file that no host holds cannot be loaded (the
//     error names the files);
//  4. each file is assigned to one rank that holds it, balancing the bytes
//     each rank reads: restoring a shared directory with the job size that
//     wrote it, rank r reads exactly shard r;
//  5. each rank reads its shards straight into the registered tensors,
//     hashing them as it reads, in the background, while the shards are
//     broadcast in order from their readers straight from and into the
//     tensors (no staging buffer, no copy); one small allgather then says
//     which copies did not verify. The tensors are reassembled from the
//     shards — the job that wrote them may have had another size — so
//     every rank holds identical values. The per-rank blob files, and a
//     shard whose copy did not verify, are broadcast one by one with a
//     status byte. A copy that does not verify is read again from a host
//     that holds another copy; when none is left, the checkpoint is
//     skipped with a warning saying what was wrong (truncated, bit-flipped,
//     shapes that do not fit) and the previous one is tried.
//
// Each rank then loads the blobs of the same rank number (ranks beyond the
// old size keep theirs, with a warning). With several storage domains, the
// files of the restored step that lost copies (a host whose disk was
// replaced) are written again, from memory, to the domains that lack them,
// with their manifest, and one line is logged. No checkpoint at all is a
// fresh start (found=false, nil error); checkpoints of which none can be
// loaded are an error, so that a job never silently starts over.
//
// `gorun checkpoint inspect DIR` lists the checkpoints, verifies them and
// says which one a restore would pick (Scan); with replicated local
// checkpoints it checks the files DIR should hold (see above). It fails when DIR does not
// exist or is not a directory, and when a committed checkpoint is corrupted;
// an existing directory without checkpoints says "no checkpoints" and is not
// an error.
package checkpoint
