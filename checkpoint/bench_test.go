package checkpoint

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/internal/testenv/s3test"
)

// BenchmarkSave64MiB times a barrier checkpoint of 64 MiB of replicated
// float32 state by 4 in-process ranks (each writes a 16 MiB shard, fsyncs,
// and rank 0 commits the manifest and deletes the checkpoint beyond the
// newest 2). b.SetBytes counts the whole state, so MB/s is the job's
// checkpoint bandwidth.
func BenchmarkSave64MiB(b *testing.B) {
	const n, size = 4, 64 << 20
	comms := newJob(b, n)
	dir := b.TempDir()
	states := make([]*State, n)
	mgrs := make([]*Manager, n)
	for r := range n {
		w := make([]float32, size/4)
		for i := range w {
			w[i] = float32(i)
		}
		states[r] = new(State).Tensor("w", w)
		mgrs[r], _ = New(comms[r], dir)
	}
	b.SetBytes(size)
	b.ResetTimer()
	for i := range b.N {
		errs := onEach(comms, func(r int, c *collective.Comm) error {
			return mgrs[r].Save(context.Background(), int64(i+1), states[r])
		})
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
}

// The benchmarks below give the figures of the README (issue 13):
//
//	go test -count=1 -run '^$' -bench 'SaveStall|RestoreParallel|Throughput' -benchtime 3x ./checkpoint/
//
// Every one checkpoints benchSize bytes of replicated float32 state (plus a
// per-rank int64 blob) by in-process ranks over collective's local
// transport, and sets b.SetBytes(benchSize), so MB/s is the checkpoint's
// bytes per second (10^6 bytes). Back ends: "dir", one directory shared by
// every rank; "s3", a versitygw server on loopback (internal/testenv/s3test; the
// s3 cases skip when versitygw is not installed); "repl", replicated local
// directories, the first half of the ranks in one directory and the second
// half in another (two storage domains), WithReplicas(1).

// benchSize is the state the benchmarks checkpoint: 256 MiB.
const benchSize = 256 << 20

// benchNP is the number of in-process ranks, unless a case says otherwise.
const benchNP = 4

// trainStep is the training step BenchmarkSaveStall simulates between two
// Polls: the caller sleeps, leaving the cores to the background writes.
// Change it with -trainstep (go test ... -args -trainstep 100ms).
var trainStep = flag.Duration("trainstep", 10*time.Millisecond, "the training step BenchmarkSaveStall simulates between two Polls")

// benchJob is n in-process ranks, each with its own copy of the state.
type benchJob struct {
	comms  []*collective.Comm
	w      [][]float32
	pos    []int64
	states []*State
}

func newBenchJob(b *testing.B, n int) *benchJob {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Generous timeouts: a rank-0 restore from a cold cache or S3 keeps
	// the other ranks in their first broadcast for a while.
	lj, err := collective.StartLocal(ctx, n, collective.WithTimeout(5*time.Minute))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { lj.Close() })
	j := &benchJob{comms: lj.Comms, w: make([][]float32, n), pos: make([]int64, n), states: make([]*State, n)}
	for r := range n {
		j.w[r] = make([]float32, benchSize/4)
		if r == 0 {
			for i := range j.w[r] {
				j.w[r][i] = float32(i)
			}
		} else {
			copy(j.w[r], j.w[0])
		}
		j.pos[r] = int64(r)
		j.states[r] = new(State).Tensor("w", j.w[r]).Int64("pos", &j.pos[r])
	}
	return j
}

// each runs f on every rank and fails b with the ranks' errors.
func (j *benchJob) each(b *testing.B, f func(r int) error) {
	b.Helper()
	if err := errors.Join(onEach(j.comms, func(r int, _ *collective.Comm) error { return f(r) })...); err != nil {
		b.Fatal(err)
	}
}

// managers returns a Manager per rank, rank r's in locs[r].
func (j *benchJob) managers(b *testing.B, locs []string, opts ...Option) []*Manager {
	b.Helper()
	mgrs := make([]*Manager, len(j.comms))
	for r := range mgrs {
		m, err := New(j.comms[r], locs[r], opts...)
		if err != nil {
			b.Fatal(err)
		}
		mgrs[r] = m
	}
	return mgrs
}

// save runs Save(step) on every rank.
func (j *benchJob) save(b *testing.B, mgrs []*Manager, step int64) {
	b.Helper()
	j.each(b, func(r int) error { return mgrs[r].Save(context.Background(), step, j.states[r]) })
}

// spoil changes a few values of every rank's state (outside the timer), so
// that check after a restore shows the restore put them back.
func (j *benchJob) spoil() {
	for r := range j.w {
		for _, i := range j.probes() {
			j.w[r][i] = -1
		}
		j.pos[r] = -1
	}
}

func (j *benchJob) probes() []int {
	n := len(j.w[0])
	return []int{0, n/4 - 1, n / 4, n / 2, 3 * n / 4, n - 1}
}

// restore runs Restore on every rank and checks it found step and put the
// probed values back.
func (j *benchJob) restore(b *testing.B, mgrs []*Manager, step int64) {
	b.Helper()
	j.each(b, func(r int) error {
		got, found, err := mgrs[r].Restore(context.Background(), j.states[r])
		if err != nil {
			return err
		}
		if !found || got != step {
			return fmt.Errorf("rank %d: restored step %d (found %v), want %d", r, got, found, step)
		}
		for _, i := range j.probes() {
			if j.w[r][i] != float32(i) {
				return fmt.Errorf("rank %d: w[%d] = %v after the restore, want %v", r, i, j.w[r][i], float32(i))
			}
		}
		if j.pos[r] != int64(r) {
			return fmt.Errorf("rank %d: pos = %d after the restore", r, j.pos[r])
		}
		return nil
	})
}

// benchS3 starts a versitygw server for b (skipping when it is not
// installed), points the AWS environment at it and creates a bucket;
// it returns the bucket's s3:// location.
func benchS3(b *testing.B) string {
	b.Helper()
	srv := s3test.Start(b)
	srv.Setenv(b)
	srv.MakeBucket("bench")
	return "s3://bench"
}

// benchLocs gives every rank of an n-rank job its location for back end
// kind ("dir", "s3", "repl"), under a new prefix; s3loc is benchS3's.
func benchLocs(b *testing.B, kind string, n int, s3loc string) ([]string, []Option) {
	b.Helper()
	locs := make([]string, n)
	var opts []Option
	switch kind {
	case "dir":
		dir := b.TempDir()
		for r := range locs {
			locs[r] = dir
		}
	case "s3":
		prefix := fmt.Sprintf("%s/%s-%d", s3loc, strings.ReplaceAll(b.Name(), "/", "-"), time.Now().UnixNano())
		for r := range locs {
			locs[r] = prefix
		}
	case "repl":
		base := b.TempDir()
		for r := range locs {
			locs[r] = filepath.Join(base, fmt.Sprintf("host%d", 2*r/n))
		}
		opts = append(opts, WithReplicas(1))
	default:
		b.Fatalf("unknown back end %q", kind)
	}
	return locs, opts
}

// dropCaches writes back dirty pages and empties the page cache, so that
// the next read comes from the disk. It needs root.
func dropCaches() error {
	syscall.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0)
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// asyncSave is one asynchronous save as the slowest rank saw it.
type asyncSave struct {
	stall   time.Duration // in SaveAsync and the Polls until the commit
	persist time.Duration // from SaveAsync to the Poll that committed
	stats   time.Duration // SaveStats.Stall: SaveAsync only
	last    time.Duration // the Poll that ended the save
	longest time.Duration // the longest Poll
	man     time.Duration // SaveStats.Manifest: manifest commit and retention
	polls   int           // Polls until the save ended, the last one included
	// minPoll sums, over the Polls before the last one, the shortest
	// time a rank spent in each: the Poll itself, without the wait for
	// the last rank to arrive (scheduling jitter of the ranks' wake-ups
	// on a loaded machine).
	minPoll time.Duration
	each    []time.Duration // this rank's Polls
	colls   int             // the collectives the Polls issued (on every rank alike)
}

// saveAsync runs SaveAsync(step) on every rank, then one Poll per
// simulated training step (trainStep) until the save is committed.
func (j *benchJob) saveAsync(b *testing.B, mgrs []*Manager, step int64) asyncSave {
	b.Helper()
	ctx := context.Background()
	per := make([]asyncSave, len(j.comms))
	j.each(b, func(r int) error {
		m := mgrs[r]
		t0 := time.Now()
		if err := m.SaveAsync(ctx, step, j.states[r]); err != nil {
			return err
		}
		a := &per[r]
		a.stall = time.Since(t0)
		before := j.comms[r].Stats().Collectives
		// Every rank ends the save in the same Poll.
		for m.flight != nil {
			time.Sleep(*trainStep)
			t1 := time.Now()
			if err := m.Poll(ctx); err != nil {
				return err
			}
			a.last = time.Since(t1)
			a.longest = max(a.longest, a.last)
			a.stall += a.last
			a.each = append(a.each, a.last)
			a.polls++
		}
		a.colls = int(j.comms[r].Stats().Collectives - before)
		a.persist, a.stats, a.man = time.Since(t0), m.LastSave().Stall, m.LastSave().Manifest
		if got := m.LastSave(); got.Bytes < benchSize {
			return fmt.Errorf("rank %d: LastSave %+v after committing step %d", r, got, step)
		}
		return nil
	})
	var s asyncSave
	for _, a := range per {
		s.stall, s.persist = max(s.stall, a.stall), max(s.persist, a.persist)
		s.stats, s.last, s.longest = max(s.stats, a.stats), max(s.last, a.last), max(s.longest, a.longest)
		s.polls, s.man, s.colls = max(s.polls, a.polls), max(s.man, a.man), max(s.colls, a.colls)
	}
	for i := range s.polls - 1 {
		least := time.Duration(-1)
		for _, a := range per {
			if i < len(a.each) && (least < 0 || a.each[i] < least) {
				least = a.each[i]
			}
		}
		s.minPoll += max(least, 0)
	}
	return s
}

// copyFloor times the part of an asynchronous save's stall that no code
// can remove on this machine: the snapshot copy at memory bandwidth. Every
// rank copies at once, as SaveAsync does (copyPieces), as many bytes as
// its SaveAsync copies (its shard: benchSize over the ranks) from its
// state into a buffer of that size written before, so already in memory;
// it returns the slowest rank's time.
func (j *benchJob) copyFloor(b *testing.B, bufs [][]byte) time.Duration {
	b.Helper()
	took := make([]time.Duration, len(j.comms))
	j.each(b, func(r int) error {
		src := unsafe.Slice((*byte)(unsafe.Pointer(&j.w[r][0])), 4*len(j.w[r]))[:len(bufs[r])]
		t0 := time.Now()
		copyPieces(bufs[r], src)
		took[r] = time.Since(t0)
		return nil
	})
	return slices.Max(took)
}

// snapshotBufs are the buffers copyFloor copies into, one per rank, each
// written once so that its pages are in memory, as SaveAsync's reused
// staging buffer's are.
func (j *benchJob) snapshotBufs() [][]byte {
	bufs := make([][]byte, len(j.comms))
	for r := range bufs {
		bufs[r] = make([]byte, benchSize/len(j.comms))
		clear(bufs[r])
	}
	return bufs
}

// jitter times what the collectives of a save's Polls cost on this
// machine whatever they do: every rank sleeps a simulated training step
// (trainStep) and issues a small allreduce, colls times, with no save in
// flight, or (busy) while the background writes of an asynchronous save
// of step run; it returns the slowest rank's total time in the
// allreduces. That is the wait for the last rank to wake and get a CPU,
// which the background writes make longer on a machine with fewer cores
// than ranks (a training loop's gradient allreduce pays it too).
func (j *benchJob) jitter(b *testing.B, mgrs []*Manager, colls int, busy bool, step int64) time.Duration {
	b.Helper()
	ctx := context.Background()
	took := make([]time.Duration, len(j.comms))
	j.each(b, func(r int) error {
		if busy {
			if err := mgrs[r].SaveAsync(ctx, step, j.states[r]); err != nil {
				return err
			}
		}
		for range colls {
			time.Sleep(*trainStep)
			flags := []int64{0, 0, 0}
			t0 := time.Now()
			if err := j.comms[r].Allreduce(ctx, flags, collective.Sum); err != nil {
				return err
			}
			took[r] += time.Since(t0)
		}
		return mgrs[r].Wait(ctx)
	})
	return slices.Max(took)
}

// report gives the means of n asynchronous saves summed in sum.
func (s asyncSave) report(b *testing.B, n int) {
	N := time.Duration(n)
	b.ReportMetric(msOf(s.stall/N), "stall-ms/op")
	b.ReportMetric(msOf(s.persist/N), "persist-ms/op")
	b.ReportMetric(msOf(s.stats/N), "statsstall-ms/op")
	b.ReportMetric(msOf(s.last/N), "lastpoll-ms/op")
	b.ReportMetric(msOf(s.longest/N), "maxpoll-ms/op")
	b.ReportMetric(float64(s.polls)/float64(n), "polls/op")
	b.ReportMetric(float64(s.colls)/float64(n), "pollcolls/op")
	b.ReportMetric(msOf(s.man/N), "manifest-ms/op")
	b.ReportMetric(msOf(s.minPoll/N), "minpolls-ms/op")
}

func (s *asyncSave) add(o asyncSave) {
	s.stall += o.stall
	s.persist += o.persist
	s.stats += o.stats
	s.last += o.last
	s.longest += o.longest
	s.polls += o.polls
	s.man += o.man
	s.minPoll += o.minPoll
	s.colls += o.colls
}

// BenchmarkSaveStall measures how long a training loop is blocked by a
// checkpoint of 256 MiB at np=4. sync is the whole Save. async is the time
// the slowest rank spends in SaveAsync plus in the Polls, one per
// simulated training step (trainStep), until the save is committed
// (stall-ms/op); its ns/op is persist-ms/op, SaveAsync to the commit.
// Where the stall goes: statsstall-ms/op is SaveStats.Stall (SaveAsync
// alone), lastpoll-ms/op the Poll that ended the save, maxpoll-ms/op the
// longest Poll, minpolls-ms/op the Polls but the last without the wait for
// the last rank to arrive (see asyncSave.minPoll), pollcolls/op the
// collectives the Polls issued; manifest-ms/op is SaveStats.Manifest
// (writing the manifest; old checkpoints are deleted in the background).
// paired alternates a Save and an asynchronous save in every iteration,
// so that the ratios stall/sync-% and persist/sync-x compare figures
// measured at the same time on a noisy machine; its ns/op is the pair.
// It also shows where the stall's floor is, outside the timer: copy-ms/op
// is the snapshot copy alone at memory bandwidth (copyFloor),
// jitter-ms/op and busyjitter-ms/op what as many plain allreduces as the
// Polls issued cost after the same simulated steps, with no save in
// flight and while a save's background writes run (jitter); floor/sync-%
// is copy plus busyjitter over the sync save, and stall/floor-x the stall
// over that floor.
func BenchmarkSaveStall(b *testing.B) {
	j := newBenchJob(b, benchNP)
	for _, kind := range []string{"dir", "s3"} {
		b.Run(kind, func(b *testing.B) {
			var s3loc string
			if kind == "s3" {
				s3loc = benchS3(b)
			}
			locs, opts := benchLocs(b, kind, benchNP, s3loc)
			mgrs := j.managers(b, locs, opts...)
			var step int64
			b.Run("sync", func(b *testing.B) {
				b.SetBytes(benchSize)
				b.ResetTimer()
				for range b.N {
					step++
					j.save(b, mgrs, step)
				}
				b.StopTimer()
				b.ReportMetric(msOf(b.Elapsed()/time.Duration(b.N)), "stall-ms/op")
			})
			b.Run("async", func(b *testing.B) {
				var sum asyncSave
				b.SetBytes(benchSize)
				b.ResetTimer()
				for range b.N {
					step++
					sum.add(j.saveAsync(b, mgrs, step))
				}
				b.StopTimer()
				sum.report(b, b.N)
			})
			b.Run("paired", func(b *testing.B) {
				var sum asyncSave
				var sync, floor, jit, busyJit time.Duration
				bufs := j.snapshotBufs()
				b.SetBytes(2 * benchSize)
				b.ResetTimer()
				for i := range b.N {
					for k := range 2 {
						step++
						if (i+k)%2 == 0 {
							t0 := time.Now()
							j.save(b, mgrs, step)
							sync += time.Since(t0)
						} else {
							a := j.saveAsync(b, mgrs, step)
							sum.add(a)
							b.StopTimer()
							floor += j.copyFloor(b, bufs)
							jit += j.jitter(b, mgrs, a.colls, false, 0)
							step++
							busyJit += j.jitter(b, mgrs, a.colls, true, step)
							b.StartTimer()
						}
					}
				}
				b.StopTimer()
				sum.report(b, b.N)
				b.ReportMetric(msOf(sync/time.Duration(b.N)), "sync-ms/op")
				b.ReportMetric(100*float64(sum.stall)/float64(sync), "stall/sync-%")
				b.ReportMetric(float64(sum.persist)/float64(sync), "persist/sync-x")
				// Where the stall's floor is: the snapshot copy at memory
				// bandwidth (copy), and the wait of as many collectives as
				// the Polls issued for the last rank to wake, with no save
				// in flight (jitter) and while a save's writes run
				// (busyjitter), which any collective of the training loop
				// pays too.
				N := time.Duration(b.N)
				b.ReportMetric(msOf(floor/N), "copy-ms/op")
				b.ReportMetric(msOf(jit/N), "jitter-ms/op")
				b.ReportMetric(msOf(busyJit/N), "busyjitter-ms/op")
				b.ReportMetric(100*float64(floor)/float64(sync), "copy/sync-%")
				b.ReportMetric(100*float64(floor+busyJit)/float64(sync), "floor/sync-%")
				b.ReportMetric(float64(sum.stall)/float64(floor+busyJit), "stall/floor-x")
			})
		})
	}
}

// BenchmarkRestoreParallel compares, at np=4 on the same 256 MiB
// checkpoint, the parallel restore (every rank reads its shard while the
// files are broadcast) with the old one (rank 0 reads and verifies every
// file, then broadcasts): parallel and rank0 time one of them each, and
// paired alternates them in every iteration and reports their ratio
// rank0/parallel-x (the parallel restore's speed-up, from figures measured
// at the same time) with both means; its ns/op is the pair. "dir-cold"
// empties the page cache before every restore, outside the timer (root
// only; skipped otherwise).
func BenchmarkRestoreParallel(b *testing.B) {
	j := newBenchJob(b, benchNP)
	for _, kind := range []string{"dir", "dir-cold", "s3"} {
		b.Run(kind, func(b *testing.B) {
			cold := kind == "dir-cold"
			if cold {
				if err := dropCaches(); err != nil {
					b.Skipf("cannot empty the page cache: %v", err)
				}
			}
			var s3loc string
			if kind == "s3" {
				s3loc = benchS3(b)
			}
			locs, opts := benchLocs(b, strings.TrimSuffix(kind, "-cold"), benchNP, s3loc)
			j.save(b, j.managers(b, locs, opts...), 1)
			mgrsOf := func(b *testing.B, rank0 bool) []*Manager {
				mgrs := j.managers(b, locs, opts...)
				for _, m := range mgrs {
					m.restoreRank0 = rank0
				}
				// Find the storage domains before the timer starts.
				j.each(b, func(r int) error { _, err := mgrs[r].domains(context.Background()); return err })
				return mgrs
			}
			// restore restores with mgrs, timing only the restore.
			restore := func(b *testing.B, mgrs []*Manager) time.Duration {
				b.StopTimer()
				j.spoil()
				if cold {
					if err := dropCaches(); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				t0 := time.Now()
				j.restore(b, mgrs, 1)
				return time.Since(t0)
			}
			for _, mode := range []string{"parallel", "rank0"} {
				b.Run(mode, func(b *testing.B) {
					mgrs := mgrsOf(b, mode == "rank0")
					b.SetBytes(benchSize)
					b.ResetTimer()
					for range b.N {
						restore(b, mgrs)
					}
				})
			}
			b.Run("paired", func(b *testing.B) {
				par, r0 := mgrsOf(b, false), mgrsOf(b, true)
				var tpar, tr0 time.Duration
				b.SetBytes(2 * benchSize)
				b.ResetTimer()
				for i := range b.N {
					if i%2 == 0 {
						tpar += restore(b, par)
						tr0 += restore(b, r0)
					} else {
						tr0 += restore(b, r0)
						tpar += restore(b, par)
					}
				}
				b.StopTimer()
				N := time.Duration(b.N)
				b.ReportMetric(msOf(tpar/N), "parallel-ms/op")
				b.ReportMetric(msOf(tr0/N), "rank0-ms/op")
				b.ReportMetric(float64(tr0)/float64(tpar), "rank0/parallel-x")
			})
		})
	}
}

// BenchmarkThroughput measures Save and (parallel) Restore of 256 MiB on
// each back end: dir and s3 at np=4, and replicated local directories (two
// storage domains, one replica, so every byte is written twice) at np=2
// and np=4. MB/s is the checkpoint's bytes, not the bytes written.
func BenchmarkThroughput(b *testing.B) {
	cases := []struct {
		name, kind string
		np         int
	}{
		{"dir", "dir", benchNP},
		{"s3", "s3", benchNP},
		{"repl-np2", "repl", 2},
		{"repl-np4", "repl", 4},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			j := newBenchJob(b, c.np)
			var s3loc string
			if c.kind == "s3" {
				s3loc = benchS3(b)
			}
			locs, opts := benchLocs(b, c.kind, c.np, s3loc)
			mgrs := j.managers(b, locs, opts...)
			var step int64
			b.Run("save", func(b *testing.B) {
				b.SetBytes(benchSize)
				b.ResetTimer()
				for range b.N {
					step++
					j.save(b, mgrs, step)
				}
			})
			if step == 0 {
				return
			}
			b.Run("restore", func(b *testing.B) {
				b.SetBytes(benchSize)
				b.ResetTimer()
				for range b.N {
					b.StopTimer()
					j.spoil()
					b.StartTimer()
					j.restore(b, mgrs, step)
				}
			})
		})
	}
}
