// Package launcher is what the gorun command does: it starts the ranks of a
// job, gives each its identity and the job's secret through the environment
// contract (see package collective), hosts the rendezvous they meet at,
// prefixes and forwards their output line by line, and fails the job as a
// whole: when one rank fails, every other rank is stopped (SIGTERM, then
// SIGKILL after a grace period) and the error names the rank, its exit
// status and its last lines of stderr.
package launcher
