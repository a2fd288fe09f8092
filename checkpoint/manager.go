package checkpoint

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strconv"
	"time"

	"github.com/gorun/gorun/collective"
)

// EnvReplicas is the environment variable that sets how many other storage
// domains keep a copy of each rank's files when WithReplicas is not given
// (default 2). gorun sets it from --checkpoint-replicas.
const EnvReplicas = "GORUN_CHECKPOINT_REPLICAS"

// Manager saves and restores barrier checkpoints of one job. Every rank
// keeps its checkpoints in a Store: a directory (DirStore) or an s3://
// location. Ranks whose directories are the same directory form a storage
// domain; with several domains every file is replicated (see the package
// documentation).
type Manager struct {
	comm       *collective.Comm
	dir        string
	store      Store
	keep       int
	margin     int64
	replicas   int // -1: EnvReplicas, else 2
	skipIfBusy bool
	ioTimeout  time.Duration
	// staleUploads is the age from which retention aborts the incomplete
	// uploads of steps newer than the saved one (WithStaleUploadAge).
	staleUploads time.Duration
	logf         func(format string, args ...any)

	// restoreRank0 restores the old way: rank 0 reads and verifies every
	// file before broadcasting any. Kept to compare against the parallel
	// restore on the same data.
	restoreRank0 bool

	dom    *domains // the storage domains of domKey
	domKey [2]int   // comm size and membership epoch they were found for

	flight *inflight // the asynchronous save being written or committed, if any
	orphan *inflight // a save abandoned by a re-formed job whose goroutines may still run
	stage  []byte    // SaveAsync's snapshot buffer, reused

	retaining *retention // this lead's retention in the background, if any (retention.go)

	last SaveStats
	// good is the step this Manager restored or committed last (-1: none):
	// a committed checkpoint known to load. Saving it again is skipped;
	// another committed step of the same number (one a restore skipped as
	// unloadable, or another run's) is replaced.
	good int64
}

// Option configures a Manager.
type Option func(*Manager)

// WithKeep keeps the newest k committed checkpoints (default 2, at least 1).
func WithKeep(k int) Option { return func(m *Manager) { m.keep = max(k, 1) } }

// WithDiskMargin is the free space a save wants beyond the checkpoint's own
// size (default: 10% of it, at least 1 MiB).
func WithDiskMargin(bytes int64) Option { return func(m *Manager) { m.margin = bytes } }

// WithLogger receives the warnings (a corrupt checkpoint skipped, a stale
// directory replaced). Default: log.Printf.
func WithLogger(logf func(format string, args ...any)) Option {
	return func(m *Manager) { m.logf = logf }
}

// WithReplicas keeps each rank's files in k storage domains besides its own
// (at most the number of other domains; 0 keeps one copy). It matters only
// when the ranks' checkpoint directories are not all the same directory.
// Default: EnvReplicas, else 2.
func WithReplicas(k int) Option { return func(m *Manager) { m.replicas = max(k, 0) } }

// WithSkipIfBusy makes SaveAsync skip a save, on every rank, while any rank
// is still writing the previous one, instead of waiting for it.
func WithSkipIfBusy() Option { return func(m *Manager) { m.skipIfBusy = true } }

// WithIOTimeout is the storage deadline (default 30 minutes): how long a
// rank waits for its store at one time, and so how long the others wait
// for it. It bounds the storage operations of a save (the agreement's
// look-up, the preparation, the writes and the manifest of Save, the
// retention in the background), the wait of the next save, Restore or
// Wait for the background writes and manifest of a SaveAsync (cut short
// when it passes, with a storage error that names the location), and it
// is added to the collective timeout (collective.WithTimeout,
// GORUN_TIMEOUT) in the collectives of a save or restore that wait on
// another rank's storage I/O: a rank uploading a big shard with retries is
// slow, not dead, and when its store does not answer it fails with a
// storage error before the others give up on it, so a job never ends in a
// collective timeout because of its store. A dead or frozen peer still
// ends those collectives at once (broken links, heartbeats). Every rank
// must give the same value; d <= 0 leaves the collective timeout for both.
func WithIOTimeout(d time.Duration) Option { return func(m *Manager) { m.ioTimeout = d } }

// storageDeadline is the storage deadline (WithIOTimeout; with d <= 0 the
// collective timeout).
func (m *Manager) storageDeadline() time.Duration {
	if m.ioTimeout > 0 {
		return m.ioTimeout
	}
	return m.comm.Timeout()
}

// storageCtx bounds a storage operation by the storage deadline; one cut
// short by it fails with a deadlineError as its cause.
func (m *Manager) storageCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	d := m.storageDeadline()
	return context.WithTimeoutCause(ctx, d, &deadlineError{d})
}

// deadlineError is the cause of a storage operation, or of a wait for one,
// that the storage deadline cut short.
type deadlineError struct{ d time.Duration }

func (e *deadlineError) Error() string {
	return fmt.Sprintf("not done within the storage deadline (%v, WithIOTimeout)", e.d)
}

// ioCtx is ctx for the collectives that wait on other ranks' storage I/O:
// bounded by the storage deadline plus the collective timeout, so that a
// rank whose store does not answer fails (at the storage deadline) and
// says so before its peers would give up on it.
func (m *Manager) ioCtx(ctx context.Context) context.Context {
	if m.ioTimeout <= 0 {
		return ctx
	}
	return collective.WithCallTimeout(ctx, m.ioTimeout+m.comm.Timeout())
}

// New returns a Manager for the job of comm, keeping its checkpoints under
// dir (created if missing). In a directory location "{host}" is replaced by
// $GORUN_HOST, else the host name (ExpandHost), so that one location names
// a local directory on every host.
func New(comm *collective.Comm, dir string, opts ...Option) (*Manager, error) {
	m := &Manager{comm: comm, good: -1, keep: 2, margin: -1, replicas: -1, ioTimeout: 30 * time.Minute, staleUploads: DefaultStaleUploadAge, logf: log.Printf}
	for _, o := range opts {
		o(m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*s3CallTimeout)
	defer cancel()
	s, err := openForJob(ctx, dir)
	if err != nil {
		loc, _ := ExpandHost(dir)
		return nil, markAt(cmp.Or(loc, dir), err) // for NoRestart
	}
	m.store, m.dir = s, s.String()
	return m, nil
}

// Dir is the checkpoint directory (with {host} replaced), or the s3://
// location.
func (m *Manager) Dir() string { return m.dir }

// StepLocation is where the checkpoint of step is kept: its directory
// (StepDir of Dir), or for an s3:// location its prefix,
// s3://bucket/prefix/step-<N>.
func (m *Manager) StepLocation(step int64) string {
	return location(m.store, stepKey(step))
}

// SaveStats describe this rank's last successful Save or SaveAsync.
type SaveStats struct {
	Step     int64         // the committed step
	Bytes    int64         // the whole checkpoint: every shard and blob file, one copy
	Written  int64         // what this rank wrote
	Write    time.Duration // this rank writing and syncing its files
	Total    time.Duration // the whole save, agreement to commit
	Manifest time.Duration // manifest commit and retention (in the background for SaveAsync)
	// Stall is how long the caller was blocked: the whole Save, or for
	// SaveAsync its agreement and snapshot (not Poll or Wait).
	Stall time.Duration
}

// LastSave returns the statistics of this rank's last successful save.
func (m *Manager) LastSave() SaveStats { return m.last }

// testHook, when set, is called at the named points of a save; an error it
// returns makes the save stop there as if the process had died.
var testHook func(point string, rank int) error

func hook(point string, rank int) error { return callHook(testHook, point, rank) }

// callHook is hook with the testHook h read earlier: background work that
// may outlive its test (retention) reads it when it starts, not while a
// test resets it.
func callHook(h func(string, int) error, point string, rank int) error {
	if h != nil {
		if err := h(point, rank); err != nil {
			return fmt.Errorf("%w at %s: %v", errHook, point, err)
		}
	}
	return nil
}

// errHook wraps errors returned by testHook.
var errHook = errors.New("checkpoint test hook")

// replicaCount is k: how many domains besides a rank's own keep its files.
func (m *Manager) replicaCount(d *domains) int {
	if d.h() == 1 {
		return 0
	}
	k := m.replicas
	if k < 0 {
		k = 2
		if v, err := strconv.Atoi(os.Getenv(EnvReplicas)); err == nil && v >= 0 {
			k = v
		}
	}
	return min(k, d.h()-1)
}

func boolU64(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

func boolI64(b bool) int64 { return int64(boolU64(b)) }

func human(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB (%d bytes)", float64(n)/(1<<30), n)
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB (%d bytes)", float64(n)/(1<<20), n)
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB (%d bytes)", float64(n)/(1<<10), n)
	}
	return fmt.Sprintf("%d bytes", n)
}
