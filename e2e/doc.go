// Package e2e holds gorun's end-to-end tests: they build the gorun binary
// and the rank programs of internal/testenv/progs, run real jobs of real
// processes and check what gorun prints, how it exits and what it leaves
// behind. The package has no code of its own; the tests of the command
// line's own functions (flag rewriting, help text) are cmd/gorun's.
//
// What the tests cover, by the prefix that selects them with -run:
//
//	Gorun           a job on this host: its output, failures, stops and
//	                signals, building a Go package, bad flags
//	Torchrun, RankExitsMidAllreduce, FrozenRankProcess
//	                ranks started without gorun, from torchrun's variables
//	Leave, AllClose a rank that closes its communicator early
//	Hang            the hang diagnosis, with gorun and without
//	Bench           gorun bench
//	Checkpoint      gorun checkpoint ls, inspect, verify and rm, and jobs
//	                that resume from checkpoints (CheckpointS3: in S3)
//	Elastic         elastic jobs (ElasticTrain: the training program
//	                internal/testenv/progs/elastictrain)
//	MultiHost       gorun -H across network-namespace hosts
//	Doctor          gorun doctor
//	Slurm           srun and gorun in a Slurm allocation
//
// The whole package, as the README runs every package:
//
//	go test -race -count=1 -timeout 40m ./e2e/
//
// and a subset, e.g. every test that uses Slurm, or the elastic and the
// multi-host ones:
//
//	go test -race -count=1 -run Slurm ./e2e/
//	go test -race -count=1 -run 'Elastic|MultiHost' ./e2e/
//
// Some tests need more of the machine and skip without it (under CI=true,
// where the machine must provide it, they fail instead): the
// network-namespace hosts with sshd need root (internal/testenv/netns); the
// Slurm tests also munge and Slurm's daemons (internal/testenv/slurmtest);
// the S3 tests versitygw (internal/testenv/s3test); the firewall cases of
// TestDoctorNamespaceHosts nft.
//
// Four benchmarks measure what only whole jobs show; each says how to run
// it: BenchmarkElasticRecovery (what a lost rank costs a running job),
// BenchmarkHierarchicalSlowLink (the hierarchical allreduce on slow links
// between hosts), BenchmarkSimulatorValidation (the allreduce simulator,
// internal/ringsim, against gorun on shaped links) and
// BenchmarkManyRanksStart (how long jobs of up to 256 ranks on one host
// take to start).
package e2e
