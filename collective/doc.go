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
package collective
