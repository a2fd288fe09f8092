// Package collective is what a Go training loop calls to train data-parallel
// across processes and hosts: Allreduce, Broadcast, Allgather, ReduceScatter
// and Barrier, each synchronous or async, on []float32, []float64, []int32,
// []int64 and gorgonia *tensor.Dense buffers.
//
// A program launched with `gorun -np 4 ./train` calls Init, which reads the
// rank environment gorun sets (GORUN_RANK, GORUN_SIZE, GORUN_RENDEZVOUS,
// GORUN_JOB_KEY, ...), registers with the job's rendezvous over libp2p,
// proves it holds the job key, and connects to its ring neighbours:
//
//	comm, err := collective.Init(ctx)
//	if err != nil { log.Fatal(err) }
//	defer comm.Close()
//	grads := make([]float32, n)
//	// ... compute local gradients ...
//	if err := comm.Allreduce(ctx, grads, collective.Avg, collective.Name("grads")); err != nil {
//		log.Fatal(err) // names the rank and the cause; the whole job has been told
//	}
//
// The same binary runs under mpirun, Slurm or torchrun: Init reads their
// variables, and rank 0 then hosts the rendezvous at MASTER_ADDR:MASTER_PORT
// (or GORUN_RENDEZVOUS_ADDR) with the key from GORUN_JOB_KEY. Run alone, with
// none of these, Init returns a one-rank Comm. StartLocal runs a job of n
// ranks inside one process, for tests and examples.
//
// # Ordering and agreement
//
// Every rank must call the same collectives in the same order, as with MPI
// and NCCL. Each call gets a sequence number; the call's fingerprint
// (sequence, kind, op, dtype, length, root) travels in every message, so a
// rank that called something else fails the collective on every rank with an
// error naming both calls, instead of corrupting data or hanging.
//
// # Failures
//
// Every collective is bounded by the Comm's timeout (WithTimeout,
// GORUN_TIMEOUT; 60 s by default). When a peer dies, freezes, or disagrees,
// the rank that notices aborts the job through the rendezvous, and every
// rank's pending and later calls return an error naming the rank and cause.
// A Comm is not usable after a failure: exit, and let gorun's restarts and a
// checkpoint bring the job back.
//
// Close tells the other ranks this rank's last call. A rank still in, or
// later entering, a call after it fails at once with a *PeerLeftError
// ("rank 1 closed its communicator after call #3 while rank 0 was in call
// #4"), and the closing rank's Close returns an *EarlyCloseError naming the
// ranks it left behind. When every rank closes after the same call, Close
// is quiet and quick.
//
// Bad arguments (an unsupported buffer, mismatched lengths, a root
// out of range, an invalid op, an unknown codec) are refused on the calling
// rank before the call is numbered: nothing is sent and the Comm stays
// usable.
//
// # Elastic training
//
// In an elastic job (gorun --min-np/--max-np sets GORUN_ELASTIC=1 and
// GORUN_HEARTBEAT_TIMEOUT; WithElastic; StartLocal with WithElastic) a lost
// member costs one step, not the job, and new members join at a commit:
//
//	st := collective.NewElasticState(comm)
//	sampler := collective.NewElasticSampler(len(data), seed)
//	st.Register("w", w, "moments", m, "step", &step, "sampler", sampler)
//	st.RegisterUnique("rng", rng) // SaveUnique/RestoreUnique
//	st.OnReset(func(ctx context.Context, ev collective.ElasticEvent) error {
//		log.Print(ev) // rescale the learning rate, re-shard ...
//		return nil
//	})
//	err := collective.RunElastic(ctx, comm, st, func(ctx context.Context) error {
//		for sampler.Epoch() < epochs {
//			for !sampler.EpochDone() {
//				idx := sampler.Next(globalBatch, comm.Rank(), comm.Size())
//				// ... gradients of idx, comm.Allreduce, update: return errors
//				if err := st.Commit(ctx); err != nil {
//					return err
//				}
//			}
//			sampler.NextEpoch()
//		}
//		return nil
//	})
//
// The job moves through membership epochs (Comm.Epoch). When a member is
// killed, freezes past the heartbeat bound or is cut off, every survivor's
// current and queued collectives fail at once with an error that errors.As
// matches to *MembershipChangeError; a rank whose link broke first waits
// (at most the heartbeat bound and two seconds) for the rendezvous' verdict
// instead of aborting the job. Ranks that called different things still
// abort the job, as in a fixed-size one. RunElastic then re-forms the ring
// with the survivors (Rank and Size change, call numbers restart at 1, and
// the epoch travels in every message header, so nothing of the old ring
// is mixed in), and resets the state: the ranks agree on the newest commit
// every one of them holds (a commit's last message can complete on one
// rank and fail on another, and the ranks that took it keep the one
// before), restore their own copy and, when they differ or joiners are
// present, take the replicated state from the lowest rank holding that
// commit, by broadcast over the ring. Unique state is restored from each
// rank's own copy of that commit; a rank whose ring predecessor was lost
// also gets that rank's bytes of it, which Commit copied to it (its buddy).
// Compression residuals are unique state too, handled by the Comm. Then
// the OnReset callbacks run and the loop is called again: the interrupted
// step is run again by the survivors, and the sampler, committed with the
// model, splits its samples among them, so every sample of an epoch is used
// exactly once.
//
// Commit also agrees, with one tiny allreduce, on whether joiners wait: if
// so every member admits them and they receive the state before Commit
// returns. A Reducer with GlobalBatch follows every change by itself,
// splitting the global batch unevenly when it must (MicroBatches); a rank
// whose share of a batch is empty (fewer samples than ranks) still hands
// its gradients over, and they count as zeros. Comm.Stats counts over
// every membership epoch.
//
// The start belongs to the elastic path too: RunElastic's first reset
// copies the replicated state from rank 0 to every rank (no separate
// BroadcastParameters), and a joiner (Comm.Joiner; not Epoch, which is
// above 0 on an initial member when a rank was lost during Init) gets it
// there. State read from disk at the start, such as a checkpoint, is read
// by every initial member alike before RunElastic; to survive a loss while
// reading it, read it in a RunElastic of its own (with an empty
// ElasticState), which re-forms the job and calls it again. A
// *CutOffError (this rank lost the rendezvous) and an abort of the job
// (fewer members than --min-np for too long) are final. On a Comm that is
// not elastic, RunElastic runs the loop once and Commit does nothing, so
// one program serves both.
//
// # Unequal ranks and slow links
//
// A Reducer with ReducerOptions.Balance sizes each rank's share of the
// global batch by its measured compute speed, so that a slower or busier
// rank no longer sets the pace of every step: the ranks agree on their
// rates every few steps and each computes the same split (PlanShares).
// The loop reads the split every step (Reducer.Shares, MicroBatches) and
// takes its samples with ElasticSampler.NextSplit; each micro-batch's
// gradient is weighted by its sample count, so a step is still the exact
// mean over the global batch. A membership change goes back to the even
// split until the next agreement.
//
// Across slow links, LocalSGD replaces the every-step gradient allreduce:
// each rank steps on its own gradients and the ranks average their models
// every Every steps, optionally with DiLoCo's outer Nesterov step and
// 8-bit deltas under error feedback. In an elastic job (RegisterElastic) a
// reset re-syncs every rank from the last average.
package collective
