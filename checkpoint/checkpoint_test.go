package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/gorun/gorun/collective"
)

// newJob starts n ranks in this process and closes them when the test ends.
func newJob(t testing.TB, n int) []*collective.Comm {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	j, err := collective.StartLocal(ctx, n, collective.WithTimeout(10*time.Second), collective.WithLogger(t.Logf))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	return j.Comms
}

func onEach(comms []*collective.Comm, f func(r int, c *collective.Comm) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for i, c := range comms {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = f(i, c) }()
	}
	wg.Wait()
	return errs
}

// readManifest reads the manifest of a step directory.
func readManifest(stepDir string) (*Manifest, error) {
	return storeReadManifest(context.Background(), DirStore(filepath.Dir(stepDir)), stepOf(stepDir))
}

// listSteps returns the checkpoints under dir, newest first (a directory
// that does not exist holds none).
func listSteps(dir string) ([]Entry, error) {
	return storeSteps(context.Background(), DirStore(dir))
}

func stepOf(stepDir string) int64 {
	var step int64
	fmt.Sscanf(filepath.Base(stepDir), "step-%d", &step)
	return step
}

func mustAll(t *testing.T, errs []error) {
	t.Helper()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// rankState is one rank's training state: replicated tensors and per-rank
// blobs.
type rankState struct {
	w   []float32
	m   *tensor.Dense
	rng *rand.PCG
	pos int64
	st  *State
}

func newRankState(rank int) *rankState {
	s := &rankState{w: make([]float32, 1001), m: tensor.New(tensor.WithShape(3, 5), tensor.Of(tensor.Float64)),
		rng: rand.NewPCG(1, uint64(rank))}
	s.st = new(State).Tensor("w", s.w).Tensor("adam.m", s.m).Binary("rng", s.rng).Int64("pos", &s.pos)
	return s
}

// fill sets the replicated tensors from v and the per-rank blobs from rank.
func (s *rankState) fill(v float32, rank int) {
	for i := range s.w {
		s.w[i] = v + float32(i)
	}
	md := s.m.Data().([]float64)
	for i := range md {
		md[i] = float64(v) * float64(i)
	}
	s.pos = int64(rank)*1000 + int64(v)
	s.rng.Seed(uint64(v), uint64(rank))
}

func (s *rankState) check(v float32, rank int) error {
	want := newRankState(rank)
	want.fill(v, rank)
	if !slices.Equal(s.w, want.w) || !slices.Equal(s.m.Data().([]float64), want.m.Data().([]float64)) {
		return fmt.Errorf("rank %d: tensors differ from fill(%v)", rank, v)
	}
	if s.pos != want.pos || s.rng.Uint64() != want.rng.Uint64() {
		return fmt.Errorf("rank %d: per-rank state differs from fill(%v): pos %d want %d", rank, v, s.pos, want.pos)
	}
	return nil
}

type logBuf struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *logBuf) logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(&l.buf, format+"\n", args...)
}

func (l *logBuf) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.buf.String() }

// save runs Save(step) on every rank with fill(v).
func save(t *testing.T, comms []*collective.Comm, dir string, step int64, v float32, opts ...Option) []error {
	t.Helper()
	return saveCtx(t, comms, dir, step, v, func(int) context.Context { return context.Background() }, opts...)
}

// saveCtx is save with rank r's Save under ctxOf(r). It then waits for
// the save's retention (Wait), which runs in the background: the next
// call's Manager would not know of it.
func saveCtx(t *testing.T, comms []*collective.Comm, dir string, step int64, v float32, ctxOf func(r int) context.Context, opts ...Option) []error {
	t.Helper()
	return onEach(comms, func(r int, c *collective.Comm) error {
		m, err := New(c, dir, opts...)
		if err != nil {
			return err
		}
		s := newRankState(r)
		s.fill(v, r)
		if err := m.Save(ctxOf(r), step, s.st); err != nil {
			return err
		}
		return m.Wait(ctxOf(r))
	})
}

// restore runs Restore on every rank and checks each got fill(wantV).
func restore(t *testing.T, comms []*collective.Comm, dir string, wantStep int64, wantV float32, opts ...Option) {
	t.Helper()
	dirs := make([]string, len(comms))
	for r := range dirs {
		dirs[r] = dir
	}
	restoreDirs(t, comms, dirs, wantStep, wantV, opts...)
}

func TestSaveRestoreRoundTrip(t *testing.T) {
	dir := t.TempDir()
	comms := newJob(t, 3)
	// A fresh start is not an error.
	mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
		m, _ := New(c, dir)
		_, found, err := m.Restore(context.Background(), newRankState(r).st)
		if err == nil && found {
			err = fmt.Errorf("found a checkpoint in an empty directory")
		}
		return err
	}))
	mustAll(t, save(t, comms, dir, 10, 7))
	restore(t, comms, dir, 10, 7)
	man, err := readManifest(StepDir(dir, 10))
	if err != nil {
		t.Fatal(err)
	}
	if man.WorldSize != 3 || len(man.Tensors) != 2 || !slices.Equal(man.Tensors[1].Shape, []int{3, 5}) || man.Tensors[1].DType != "float64" {
		t.Fatalf("manifest: %+v", man)
	}
	var sizes []int64
	for _, s := range man.Shards {
		sizes = append(sizes, s.Size)
	}
	if total := int64(1001*4 + 15*8); man.TotalBytes != total || sizes[0] != total/3 {
		t.Fatalf("shards %v of %d bytes", sizes, man.TotalBytes)
	}
}

func TestStepMismatchNamesRanks(t *testing.T) {
	dir := t.TempDir()
	comms := newJob(t, 3)
	errs := onEach(comms, func(r int, c *collective.Comm) error {
		m, _ := New(c, dir)
		step := int64(5)
		if r == 2 {
			step = 6
		}
		return m.Save(context.Background(), step, newRankState(r).st)
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "ranks [0 1] at step 5, ranks [2] at step 6") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if entries, _ := listSteps(dir); len(entries) != 0 {
		t.Errorf("a failed agreement left %v", entries)
	}
}

func TestRetentionKeepsNewest(t *testing.T) {
	dir := t.TempDir()
	comms := newJob(t, 2)
	for step := int64(1); step <= 4; step++ {
		mustAll(t, save(t, comms, dir, step, float32(step)))
	}
	entries, _ := listSteps(dir)
	var steps []int64
	for _, e := range entries {
		steps = append(steps, e.Step)
	}
	if !slices.Equal(steps, []int64{4, 3}) {
		t.Fatalf("kept %v, want [4 3]", steps)
	}
	mustAll(t, save(t, comms, dir, 5, 5, WithKeep(3)))
	if entries, _ = listSteps(dir); len(entries) != 3 {
		t.Fatalf("WithKeep(3) kept %d", len(entries))
	}
	restore(t, comms, dir, 5, 5)
}

func TestDiskFullFailsEveryRankAndKeepsPrevious(t *testing.T) {
	dir := t.TempDir()
	comms := newJob(t, 3)
	mustAll(t, save(t, comms, dir, 1, 1))
	old := freeSpace
	t.Cleanup(func() { freeSpace = old })
	freeSpace = func(string) (uint64, error) { return 4096, nil }
	errs := save(t, comms, dir, 2, 2)
	freeSpace = old
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "not enough disk space") || !strings.Contains(err.Error(), "only 4.0 KiB (4096 bytes) free") ||
			!strings.Contains(err.Error(), "needs 4.2 KiB (4298 bytes) plus a margin") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	t.Log(errs[0])
	restore(t, comms, dir, 1, 1)
}

func TestRestoreOnAnotherWorldSize(t *testing.T) {
	dir := t.TempDir()
	mustAll(t, save(t, newJob(t, 4), dir, 3, 9))
	var lb logBuf
	comms := newJob(t, 3)
	mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
		m, _ := New(c, dir, WithLogger(lb.logf))
		s := newRankState(r)
		step, found, err := m.Restore(context.Background(), s.st)
		if err != nil || !found || step != 3 {
			return fmt.Errorf("rank %d: step %d found %v err %v", r, step, found, err)
		}
		return s.check(9, r)
	}))
	// And the other way: 2 ranks write, 3 read; rank 2 keeps its own blobs.
	dir2 := t.TempDir()
	mustAll(t, save(t, newJob(t, 2), dir2, 4, 2))
	mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
		m, _ := New(c, dir2, WithLogger(lb.logf))
		s := newRankState(r)
		step, found, err := m.Restore(context.Background(), s.st)
		if err != nil || !found || step != 4 {
			return fmt.Errorf("rank %d: step %d found %v err %v", r, step, found, err)
		}
		if r == 2 {
			if s.w[5] != 2+5 || s.pos != 0 {
				return fmt.Errorf("rank 2: w[5]=%v pos=%d", s.w[5], s.pos)
			}
			return nil
		}
		return s.check(2, r)
	}))
	if !strings.Contains(lb.String(), "written by 2 ranks") {
		t.Errorf("no warning for the rank beyond the old size:\n%s", lb.String())
	}
}

// crash makes the save stop at point on rank victim, as if it died there,
// and closes its communicator; the other ranks must fail, not hang or
// commit.
func crash(t *testing.T, comms []*collective.Comm, dir string, step int64, v float32, point string, victim int, opts ...Option) {
	t.Helper()
	testHook = func(p string, rank int) error {
		if p == point && rank == victim {
			if point == "manifest" && !IsRemote(dir) {
				// A crash during the manifest write leaves half a
				// temporary file.
				half := []byte(`{"format": 1, "step": `)
				if err := os.WriteFile(filepath.Join(StepDir(dir, step), ManifestName+".tmp"), half, 0o644); err != nil {
					return err
				}
			}
			return errors.New("killed")
		}
		return nil
	}
	defer func() { testHook = nil }()
	start := time.Now()
	errs := onEach(comms, func(r int, c *collective.Comm) error {
		m, _ := New(c, dir, opts...)
		s := newRankState(r)
		s.fill(v, r)
		err := m.Save(context.Background(), step, s.st)
		if err == nil {
			err = m.Wait(context.Background()) // retention, in the background
		}
		if errors.Is(err, errHook) {
			c.Close() // the process is gone
		}
		return err
	})
	for r, err := range errs {
		if err == nil && point == "retention" && r != victim {
			continue // retention runs once the step is committed everywhere
		}
		if err == nil {
			t.Errorf("rank %d: save returned nil although rank %d died at %s", r, victim, point)
		}
	}
	t.Logf("crash at %s on rank %d: all ranks failed within %v (rank 0: %v)", point, victim, time.Since(start).Round(time.Millisecond), errs[0])
}

func TestCrashBetweenShardAndManifest(t *testing.T) {
	dir := t.TempDir()
	mustAll(t, save(t, newJob(t, 3), dir, 1, 1))
	crash(t, newJob(t, 3), dir, 2, 2, "after-shard", 1)
	if _, err := os.Stat(filepath.Join(StepDir(dir, 2), ManifestName)); err == nil {
		t.Fatal("the crashed save committed")
	}
	restore(t, newJob(t, 3), dir, 1, 1)
	// The next save of step 2 replaces the stale directory.
	comms := newJob(t, 3)
	mustAll(t, save(t, comms, dir, 2, 2))
	restore(t, comms, dir, 2, 2)
}

func TestCrashDuringManifestWrite(t *testing.T) {
	dir := t.TempDir()
	mustAll(t, save(t, newJob(t, 3), dir, 1, 1))
	crash(t, newJob(t, 3), dir, 2, 2, "manifest", 0)
	if _, err := os.Stat(filepath.Join(StepDir(dir, 2), ManifestName+".tmp")); err != nil {
		t.Fatalf("no half-written manifest to test with: %v", err)
	}
	r, _ := Scan(dir)
	if r.Pick != 1 {
		t.Fatalf("Scan picks %d: %s", r.Pick, r.Reason)
	}
	restore(t, newJob(t, 3), dir, 1, 1)
}

func TestCrashDuringRetention(t *testing.T) {
	dir := t.TempDir()
	comms := newJob(t, 2)
	mustAll(t, save(t, comms, dir, 1, 1, WithKeep(1)))
	crash(t, comms, dir, 2, 2, "retention", 0, WithKeep(1))
	// Step 2 was committed before the crash; step 1 is half deleted and
	// must not count.
	entries, _ := listSteps(dir)
	if len(entries) != 2 || !entries[0].Committed || entries[1].Committed {
		t.Fatalf("entries after the crash: %+v", entries)
	}
	restore(t, newJob(t, 2), dir, 2, 2)
	// Crash during retention with the newest corrupt: nothing loads, and
	// that is an error, not a fresh start.
	corruptShard(t, dir, 2, 1, "flip")
	errs := onEach(newJob(t, 2), func(r int, c *collective.Comm) error {
		m, _ := New(c, dir, WithLogger(t.Logf))
		_, _, err := m.Restore(context.Background(), newRankState(r).st)
		return err
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "none of the 1 committed checkpoints can be loaded") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

func corruptShard(t *testing.T, dir string, step int64, rank int, how string) {
	t.Helper()
	man, err := readManifest(StepDir(dir, step))
	if err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(StepDir(dir, step), man.Shards[rank].File)
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	switch how {
	case "truncate":
		data = data[:len(data)/2]
	case "flip":
		data[len(data)/3] ^= 0x10
	}
	if err := os.WriteFile(name, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCorruptShardFallsBack(t *testing.T) {
	for _, tc := range []struct{ how, want string }{
		{"truncate", "truncated"},
		{"flip", "sha256"},
	} {
		t.Run(tc.how, func(t *testing.T) {
			dir := t.TempDir()
			comms := newJob(t, 3)
			mustAll(t, save(t, comms, dir, 1, 1))
			mustAll(t, save(t, comms, dir, 2, 2))
			corruptShard(t, dir, 2, 1, tc.how)
			var lb logBuf
			restore(t, comms, dir, 1, 1, WithLogger(lb.logf))
			if !strings.Contains(lb.String(), "skipping the checkpoint of step 2") || !strings.Contains(lb.String(), tc.want) {
				t.Errorf("warning lacks %q:\n%s", tc.want, lb.String())
			}
			t.Log(lb.String())
			r, _ := Scan(dir)
			if r.Pick != 1 || !strings.Contains(r.Entries[0].Problem, "corrupted") {
				t.Errorf("Scan: %+v", r)
			}
		})
	}
}

func TestShapeMismatchFallsBack(t *testing.T) {
	dir := t.TempDir()
	comms := newJob(t, 2)
	mustAll(t, save(t, comms, dir, 1, 1))
	errs := onEach(comms, func(r int, c *collective.Comm) error {
		m, _ := New(c, dir, WithLogger(t.Logf))
		st := new(State).Tensor("w", make([]float32, 10))
		_, _, err := m.Restore(context.Background(), st)
		return err
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "holds 2 tensors, the state registers 1") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

func TestWriteErrorOnOneRankFailsAllAndKeepsPrevious(t *testing.T) {
	dir := t.TempDir()
	comms := newJob(t, 3)
	mustAll(t, save(t, comms, dir, 1, 1))
	testHook = func(p string, rank int) error {
		if p == "write" && rank == 1 {
			return errors.New("no space left on device")
		}
		return nil
	}
	errs := save(t, comms, dir, 2, 2)
	testHook = nil
	for r, err := range errs {
		want := "ranks [1] could not write their shards"
		if r == 1 {
			want = "no space left on device"
		}
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "previous checkpoint kept") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if _, err := os.Stat(filepath.Join(StepDir(dir, 2), ManifestName)); err == nil {
		t.Fatal("a failed save committed")
	}
	restore(t, comms, dir, 1, 1)
}

// An empty directory has no checkpoints, and a restore there starts fresh;
// a path that does not exist, or is a file, is a mistake that Scan names
// (gorun checkpoint inspect used to say "no checkpoints" for a typo).
func TestScanEmptyAndMissingDir(t *testing.T) {
	dir := t.TempDir()
	r, err := Scan(dir)
	if err != nil || r.Pick != -1 || len(r.Entries) != 0 || !strings.Contains(r.Reason, "starts fresh") {
		t.Errorf("Scan(%s) = %+v, %v", dir, r, err)
	}
	missing := filepath.Join(t.TempDir(), "missing")
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{missing: missing + " does not exist", file: file + " is not a directory"} {
		if r, err := Scan(path); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Scan(%s) = %+v, %v; want an error containing %q", path, r, err, want)
		}
	}
}

// TestOwnErrorSurvivesFailedAgreement: a rank whose own step of a save
// fails (preparing the step, writing its shard) and whose agreement on
// the outcome then fails too (here its context ends; in a real job, the
// abort of a rank that already learned of the failure) reports its own
// cause, not only the agreement's. Before, a rank whose S3 prepare was
// refused said only that a peer had disconnected.
func TestOwnErrorSurvivesFailedAgreement(t *testing.T) {
	for _, tc := range []struct {
		point string
		rank  int // the rank whose step fails: rank 0 is the only one that prepares
	}{{"prepare", 0}, {"write", 1}} {
		t.Run(tc.point, func(t *testing.T) {
			dir := t.TempDir()
			comms := newJob(t, 3)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cause := fmt.Sprintf("%s: disk on fire", tc.point)
			testHook = func(p string, rank int) error {
				if p == tc.point && rank == tc.rank {
					cancel()
					return errors.New(cause)
				}
				return nil
			}
			defer func() { testHook = nil }()
			errs := saveCtx(t, comms, dir, 1, 1, func(r int) context.Context {
				if r == tc.rank {
					return ctx
				}
				return context.Background()
			})
			err := errs[tc.rank]
			if err == nil || !strings.Contains(err.Error(), cause) || !strings.Contains(err.Error(), "telling the other ranks failed") {
				t.Errorf("rank %d: %v; want its own cause first, then the failed agreement", tc.rank, err)
			}
			for r, err := range errs {
				if err == nil {
					t.Errorf("rank %d: the save succeeded", r)
				}
			}
			if _, err := os.Stat(filepath.Join(StepDir(dir, 1), ManifestName)); err == nil {
				t.Fatal("a failed save committed")
			}
		})
	}
}
