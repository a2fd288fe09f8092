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
//
// # Save
//
// Save is collective: every rank calls it with the same step. It
//
//  1. allgathers each rank's step, a fingerprint of its registered state and
//     its free disk space (syscall.Statfs); ranks that disagree on the step
//     fail with an error naming them, and if any rank sees less free space
//     than the checkpoint's size plus a margin (10%, at least 1 MiB), every
//     rank fails with the sizes and nothing is written;
//  2. has rank 0 create DIR/step-<N>/ (replacing a stale, uncommitted one);
//  3. has every rank write 1/N of the tensors' bytes (the concatenation of
//     the registered tensors, in order) and its own per-rank blobs, each to a
//     temporary name, fsynced, renamed and followed by an fsync of the
//     directory;
//  4. allgathers every file's size and sha256: the barrier that confirms
//     every shard is durable;
//  5. has rank 0 write manifest.json (step, world size, each tensor's name,
//     dtype, shape and byte range, each file's size and sha256) to a temporary
//     name, fsync it, rename it and fsync the directories. The manifest is
//     written last: a directory without manifest.json is not a checkpoint,
//     and no reader ever loads one;
//  6. has rank 0 delete the checkpoints older than the newest K (WithKeep,
//     default 2), each by removing its manifest first, so that a crash during
//     the deletion leaves an uncommitted directory, never a broken checkpoint;
//  7. broadcasts rank 0's outcome, so every rank returns the same result.
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
// DIR must be visible to every rank at the same path: a local directory
// when the job runs on one host, a shared filesystem (NFS, Lustre, a
// mounted bucket with close-to-open consistency) when it spans hosts. Rank
// 0 reads the shards written by the others.
//
// # Object storage
//
// A location s3://bucket/prefix keeps the same layout in an S3-compatible
// service (Store, OpenStore): prefix/step-<N>/<file>. Every rank puts its
// own objects (in parallel with the other ranks); a PutObject is atomic
// and durable once it returns, so rank 0 putting manifest.json after the
// barrier of step 4 is the commit, as with a directory. There is no
// free-space check. The client is configured like every AWS SDK program:
// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION
// (default us-east-1), AWS_PROFILE and the shared config files,
// AWS_ENDPOINT_URL for a service other than AWS; path-style addressing
// with AWS_S3_FORCE_PATH_STYLE=true or a ?path-style=true suffix on the
// location. New checks the bucket (HeadBucket), so a missing bucket or
// refused credentials fail there with an error naming the location. Each
// request has a deadline, and 5xx answers, throttling, time-outs and
// refused connections are retried with backoff (5 attempts).
//
// # Restore
//
// Restore is collective. Rank 0 takes the newest committed checkpoint,
// checks every file's size and sha256 and the tensors' names, dtypes and
// shapes against the registered State, and falls back to the previous one
// with a warning saying what was wrong (truncated, bit-flipped, shapes that
// do not fit). It reassembles the tensors from all shards — the job that
// wrote them may have had another size — and broadcasts them, so every rank
// holds identical values. Each rank then loads the blobs of the same rank
// number. No checkpoint at all is a fresh start (found=false, nil error);
// checkpoints of which none can be loaded are an error, so that a job never
// silently starts over.
//
// `gorun checkpoint inspect DIR` lists the checkpoints, verifies them and
// says which one a restore would pick (Scan). It fails when DIR does not
// exist or is not a directory, and when a committed checkpoint is corrupted;
// an existing directory without checkpoints says "no checkpoints" and is not
// an error.
package checkpoint
