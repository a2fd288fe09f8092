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
// # Remote ranks
//
// Job.Hosts are filled in order. Ranks on the launching host (IsLocalHost)
// are started directly; the others through the system ssh client
// (-T, BatchMode, ConnectTimeout, plus Job.SSH), so ~/.ssh/config applies.
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
// # Addresses
//
// With remote hosts, the rendezvous and the local ranks listen on the
// address the first remote host sees gorun's ssh connection come from (if
// it is one of ours), else the source address the kernel routes to that
// host with; Job.NetworkInterface (a name or a CIDR) overrides it. Ranks on
// one host talk over unix sockets, ranks on different hosts over TLS.
package launcher
