// Package launcher is what the gorun command does: it starts the ranks of a
// job, on this host or on many, gives each its identity and the job's secret
// through the environment contract (see package collective), hosts the
// rendezvous they meet at, prefixes and forwards their output line by line
// ("[rank] " on one host, "[host:rank] " on more; identical lines of several
// ranks once, "[0-3] "; on a terminal, a rank's status line drawn with '\r'
// live below the output, see Console), and fails the job as a whole: when
// one rank fails, every other rank is stopped (SIGTERM and SIGCONT, then
// SIGKILL after a grace period) on every host, and the error names the rank,
// its host, its exit status and its last lines of stderr.
//
// # Environment
//
// Every rank gets, besides the -x variables (Job.Env), GORUN_RANK,
// GORUN_SIZE, GORUN_LOCAL_RANK, GORUN_LOCAL_SIZE, GORUN_RENDEZVOUS,
// GORUN_JOB_KEY, GORUN_RESTART_COUNT, GORUN_TIMEOUT (with Job.Timeout) and
// GORUN_HOST: the name of the host it runs on exactly as the user wrote it
// in -H, the hostfile or the discovery script's output ("localhost" when
// the job names no hosts), not a resolved name. Ranks on one host share
// it, ranks on different hosts differ by it: package checkpoint expands
// "{host}" in a checkpoint directory with it, for replicated local
// checkpoints. gorun's values override the same names in gorun's own
// environment and in Job.Env.
//
// # Restarts
//
// Job.MaxRestarts relaunches the whole job after a failure, the ranks
// seeing GORUN_RESTART_COUNT, unless a rank of the failed attempt exited
// with ExitNoRestart (78): it says that its failure would happen again
// (package checkpoint gives rank programs NoRestart and the same status for
// checkpoint storage that is full, read-only, refuses access or
// credentials, or has no bucket). Run then logs why it does not restart,
// quoting that rank's last line of stderr, and returns a *NoRestartError.
//
// # Remote ranks
//
// Job.Hosts are filled in order. Ranks on the launching host (IsLocalHost)
// are started directly; the others through the system ssh client
// (-T, BatchMode, ConnectTimeout, plus Job.SSH), so ~/.ssh/config applies.
// A rank's session also gets ssh's keepalives (ServerAliveInterval and
// ServerAliveCountMax, after Job.SSH's options, which win), so that it
// ends, with ssh's status 255, when its host has answered nothing for
// about twice the rendezvous' heartbeat bound (Job.Timeout, or
// Elastic.HeartbeatTimeout): gorun never waits for TCP to give up on a
// host that is down or cut off.
// Before anything starts, every remote host is checked at once with
// `ssh host 'echo "$SSH_CONNECTION"'`; any failure is a *HostError naming
// the host with ssh's own message.
//
// A remote rank is `ssh host exec sh -c WRAPPER gorun-rank GRACE RDV-IP DIR
// PROGRAM ARGS...`. Nothing secret is on that command line: gorun writes
// the rank's environment (the -x variables and GORUN_*, job key included)
// to the session's stdin as NAME=VALUE lines ended by an empty line, and
// keeps stdin open. The wrapper exports them, sets GORUN_LISTEN_IP to the
// source address its host uses to reach the rendezvous (`ip route get`,
// else the server address of $SSH_CONNECTION), changes to DIR (gorun's
// working directory: it and PROGRAM must exist at the same path on every
// host), and starts PROGRAM with setsid in a process group of its own. It
// then waits on stdin: a "stop" line, or end of file (gorun stopped, was
// killed, or the connection broke), makes it send SIGTERM and SIGCONT to the
// group and SIGKILL after GRACE. It exits with the program's status, which
// ssh passes back to gorun.
//
// Inside a Slurm allocation (SlurmAllocation; gorun --launcher srun, the
// default there when no hosts are given), SSH.Srun replaces ssh with a job
// step per remote rank: `srun --nodes=1 --ntasks=1 --nodelist=HOST
// --overlap --kill-on-bad-exit=1 ... sh -c PRELUDE WRAPPER ...`, the same
// wrapper, fed the same way on stdin, so that output, stopping and exit
// statuses are as over ssh; ending srun makes Slurm end the step's tasks.
//
// # Elastic jobs
//
// With Job.Elastic (gorun --min-np below -np, --max-np above it, or
// --host-discovery-script) the rendezvous is elastic (p2p.ElasticConfig)
// and every rank gets GORUN_ELASTIC=1 and GORUN_HEARTBEAT_TIMEOUT. Once
// every rank of the start has registered, a rank that exits non-zero or is
// killed does not fail the job: gorun logs it once ("rank 2 (pid 1234) was
// lost: killed by signal 9 (SIGKILL); the job goes on without it ..."),
// the rendezvous forms a new membership epoch with the others, and gorun
// logs each established epoch ("membership epoch 1: 3 ranks (lost rank 2
// on host a: disconnected), reset took 4ms"). A local rank that is stopped
// (SIGSTOP) when the rendezvous loses a member for its silence is ended by
// gorun, which would otherwise wait for it forever; so, once the job is
// finishing, is every process left when they can all be members the
// rendezvous lost (more members lost than processes ended: frozen on
// another host, say). A host cut off from gorun's (down, or a network
// partition: only the rendezvous' side goes on) is one whose ranks the
// rendezvous lost for their silence and whose ssh sessions got no answer
// (see Remote ranks): gorun says so in one line for the host ("host b is
// unreachable: the rendezvous lost its ranks 2 and 3 (...), and ssh got
// no answer from the host either; they were cut off from the job ...;
// check that the host is up and the network between this host and b"),
// counts its ranks as lost, and waits for nothing there.
//
// The host of a lost rank gets a cooldown (see cooldown): no new rank
// there for CooldownBase, doubled with each failure in a row up to
// CooldownMax, forgiven after CooldownMax without a failure. Free slots of
// hosts not cooling down get joiners (GORUN_RANK=-1) until the job has -np
// processes again (a fixed host list), or as many as the discovery script
// lists slots (up to --max-np). A discovery script is run every
// DiscoveryInterval, bounded by DiscoveryTimeout; its new list stops the
// ranks of hosts (or slots) it no longer lists. Once one rank exits 0 the
// job is finishing and gets no more joiners. The job succeeds when every
// process has ended and one exited 0; it fails with an *ElasticError when
// the rendezvous aborts it (below MinNP past Timeout, or a rank aborted)
// or when no rank is left. Processes are numbered, in output prefixes and
// messages, in the order gorun starts them: gorun does not know which rank
// a process has in later epochs.
//
// # Addresses
//
// With remote hosts, the rendezvous and the local ranks listen on the
// address the first remote host sees gorun's ssh connection come from (if
// it is one of ours), else the source address the kernel routes to that
// host with; Job.NetworkInterface (a name or a CIDR) overrides it. Ranks on
// one host talk over unix sockets, ranks on different hosts over TLS.
package launcher
