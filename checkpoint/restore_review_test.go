package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/gorun/gorun/collective"
)

// flakyStore is a Store whose reads of chosen files fail with an I/O error
// a given number of times: Get itself fails (a refused request), or, with
// midBody, the body breaks off halfway (a connection reset in the middle
// of a large object). Puts of the files in failPut fail. It is safe for
// the ranks of one job to share.
type flakyStore struct {
	Store
	midBody bool
	mu      sync.Mutex
	fail    map[string]int // file name -> reads left to fail
	gets    map[string]int // file name -> Gets so far
	failPut func(key string) bool
}

func newFlaky(s Store, midBody bool, fail map[string]int) *flakyStore {
	return &flakyStore{Store: s, midBody: midBody, fail: fail, gets: map[string]int{}}
}

func (s *flakyStore) Get(ctx context.Context, key string) (io.ReadCloser, int64, error) {
	name := path.Base(key)
	s.mu.Lock()
	left := s.fail[name]
	if left > 0 {
		s.fail[name] = left - 1
	}
	s.gets[name]++
	s.mu.Unlock()
	if left == 0 {
		return s.Store.Get(ctx, key)
	}
	reset := &os.SyscallError{Syscall: "read", Err: syscall.ECONNRESET}
	if !s.midBody {
		return nil, 0, fmt.Errorf("GET %s: %w", key, reset)
	}
	rc, size, err := s.Store.Get(ctx, key)
	if err != nil {
		return rc, size, err
	}
	return &breakingBody{rc, size / 2, reset}, size, nil
}

func (s *flakyStore) Put(ctx context.Context, key string, data ...[]byte) error {
	if s.failPut != nil && s.failPut(key) {
		return &os.PathError{Op: "write", Path: key, Err: syscall.EIO}
	}
	return s.Store.Put(ctx, key, data...)
}

func (s *flakyStore) getsOf(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gets[name]
}

// breakingBody returns the first left bytes of its body, then err.
type breakingBody struct {
	io.ReadCloser
	left int64
	err  error
}

func (b *breakingBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, b.err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}

// restoreEach runs Restore on every rank with rank r's Manager in dirs[r]
// (one directory for all when len(dirs) == 1), its store passed through
// wrap when wrap is not nil, and its domains preset when hostOf is not
// nil (a wrapped store is no perHostStore, so the domains cannot be
// found from token files). It returns each rank's state, step and error.
func restoreEach(t *testing.T, comms []*collective.Comm, dirs []string, wrap func(r int, s Store) Store, hostOf []int, mkState func(r int) *rankState, opts ...Option) ([]*rankState, []int64, []error) {
	t.Helper()
	n := len(comms)
	states := make([]*rankState, n)
	steps := make([]int64, n)
	errs := onEach(comms, func(r int, c *collective.Comm) error {
		dir := dirs[0]
		if len(dirs) > 1 {
			dir = dirs[r]
		}
		m, err := New(c, dir, opts...)
		if err != nil {
			return err
		}
		if wrap != nil {
			m.store = wrap(r, m.store)
		}
		if hostOf != nil {
			d, err := domainsOf(n, func(a, b int) bool { return hostOf[a] == hostOf[b] })
			if err != nil {
				return err
			}
			m.dom, m.domKey = d, [2]int{n, c.Epoch()}
		}
		states[r] = mkState(r)
		s, found, err := m.Restore(context.Background(), states[r].st)
		if err == nil && !found {
			err = errors.New("no checkpoint found")
		}
		steps[r] = s
		return err
	})
	return states, steps, errs
}

// checkBits compares a restored state with fill(v, r), bit for bit.
func checkBits(s *rankState, v float32, r int) error {
	want := newRankState(r)
	want.fill(v, r)
	for i := range s.w {
		if math.Float32bits(s.w[i]) != math.Float32bits(want.w[i]) {
			return fmt.Errorf("rank %d: w[%d] = %#x, want %#x", r, i, math.Float32bits(s.w[i]), math.Float32bits(want.w[i]))
		}
	}
	got, wm := s.m.Data().([]float64), want.m.Data().([]float64)
	for i := range got {
		if math.Float64bits(got[i]) != math.Float64bits(wm[i]) {
			return fmt.Errorf("rank %d: adam.m[%d] = %#x, want %#x", r, i, math.Float64bits(got[i]), math.Float64bits(wm[i]))
		}
	}
	if s.pos != want.pos || s.rng.Uint64() != want.rng.Uint64() {
		return fmt.Errorf("rank %d: per-rank state differs from fill(%v): pos %d want %d", r, v, s.pos, want.pos)
	}
	return nil
}

// A. A rank that registered other state fails the restore on every rank,
// at once, naming the ranks that differ, and nothing is written into the
// tensors.
func TestRestoreLayoutMismatchFailsEveryRank(t *testing.T) {
	for _, tc := range []struct {
		name  string
		other func(s *rankState) *State
	}{
		{"blob", func(s *rankState) *State { // the tensors fit: only the blobs differ
			return new(State).Tensor("w", s.w).Tensor("adam.m", s.m).Binary("rng", s.rng).Int64("position", &s.pos)
		}},
		{"shape", func(s *rankState) *State {
			s.w = make([]float32, 1000)
			return new(State).Tensor("w", s.w).Tensor("adam.m", s.m).Binary("rng", s.rng).Int64("pos", &s.pos)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			comms := newJob(t, 3)
			mustAll(t, save(t, comms, dir, 1, 1))
			states, _, errs := restoreEach(t, comms, []string{dir}, nil, nil, func(r int) *rankState {
				s := newRankState(r)
				if r == 1 {
					s.st = tc.other(s)
				}
				return s
			}, WithLogger(t.Logf))
			want := map[int]string{0: "ranks [1] registered", 1: "ranks [0 2] registered", 2: "ranks [1] registered"}
			for r, err := range errs {
				if err == nil || !strings.Contains(err.Error(), want[r]+" different tensors or blobs than this rank "+fmt.Sprint(r)) ||
					strings.Contains(err.Error(), "overwritten") {
					t.Errorf("rank %d: %v", r, err)
				}
				if slices.ContainsFunc(states[r].w, func(v float32) bool { return v != 0 }) {
					t.Errorf("rank %d: the tensors were written", r)
				}
			}
			t.Log(errs[1])
		})
	}
}

// B. Reads that fail with I/O errors a few times are retried, each retry
// logged, and the newest step restores bit for bit: with one rank and
// three, the Get failing or the body breaking off, shards (broadcast and
// one-allgather paths), blob files and the manifest.
func TestRestoreRetriesIOErrors(t *testing.T) {
	for _, n := range []int{1, 3} {
		for _, midBody := range []bool{false, true} {
			t.Run(fmt.Sprintf("np%d/midBody=%v", n, midBody), func(t *testing.T) {
				dir := t.TempDir()
				comms := newJob(t, n)
				mustAll(t, save(t, comms, dir, 1, 1))
				mustAll(t, save(t, comms, dir, 2, 2))
				// Per file, how many reads fail; 3 (the last retry
				// succeeds) for the last shard.
				fail := map[string]int{}
				add := func(name string, c int) { fail[name] += c }
				add(shardName(n-1, n), 3)
				add(blobName(n/2), 2)
				add(ManifestName, 1)
				if n > 1 {
					add(shardName(0, n), 2)
					add(shardName(1, n), 1)
				}
				want := 0
				for _, c := range fail {
					want += c
				}
				fs := newFlaky(DirStore(dir), midBody, fail)
				var lb logBuf
				states, steps, errs := restoreEach(t, comms, []string{dir}, func(int, Store) Store { return fs }, nil, newRankState, WithLogger(lb.logf))
				mustAll(t, errs)
				for r, s := range states {
					if steps[r] != 2 {
						t.Fatalf("rank %d restored step %d, want 2", r, steps[r])
					}
					if err := checkBits(s, 2, r); err != nil {
						t.Error(err)
					}
				}
				if got := strings.Count(lb.String(), "reading it again from the start (retry "); got != want {
					t.Errorf("%d retries logged, want %d:\n%s", got, want, lb.String())
				}
				if !strings.Contains(lb.String(), "retry 3 of 3") || !strings.Contains(lb.String(), "connection reset by peer") ||
					!strings.Contains(lb.String(), "reading "+filepath.Join(StepDir(dir, 2), shardName(n-1, n))+": ") {
					t.Errorf("log:\n%s", lb.String())
				}
				if strings.Contains(lb.String(), "skipping") {
					t.Errorf("fell back:\n%s", lb.String())
				}
				if got := fs.getsOf(shardName(n-1, n)); got != 4 {
					t.Errorf("%s read %d times, want 4", shardName(n-1, n), got)
				}
			})
		}
	}
	// One tensor in equal shards: the one-allgather restore retries too.
	t.Run("allgather", func(t *testing.T) {
		const n = 3
		dir := t.TempDir()
		comms := newJob(t, n)
		vals := func(v float32) []float32 {
			w := make([]float32, 3*40)
			for i := range w {
				w[i] = math.Float32frombits(uint32(i)*0x9e3779b9 ^ math.Float32bits(v))
			}
			return w
		}
		mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
			m, err := New(c, dir)
			if err != nil {
				return err
			}
			return m.Save(context.Background(), 1, new(State).Tensor("w", vals(5)))
		}))
		fs := newFlaky(DirStore(dir), true, map[string]int{shardName(1, n): 2})
		before := allgatherRestores.Load()
		var lb logBuf
		mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
			m, err := New(c, dir, WithLogger(lb.logf))
			if err != nil {
				return err
			}
			m.store = fs
			w := make([]float32, 3*40)
			if step, found, err := m.Restore(context.Background(), new(State).Tensor("w", w)); err != nil || !found || step != 1 {
				return fmt.Errorf("rank %d: step %d found %v err %v", r, step, found, err)
			}
			want := vals(5)
			for i := range w {
				if math.Float32bits(w[i]) != math.Float32bits(want[i]) {
					return fmt.Errorf("rank %d: w[%d] = %#x, want %#x", r, i, math.Float32bits(w[i]), math.Float32bits(want[i]))
				}
			}
			return nil
		}))
		if allgatherRestores.Load() == before {
			t.Error("not restored by one allgather")
		}
		if got := strings.Count(lb.String(), "reading it again"); got != 2 {
			t.Errorf("%d retries logged, want 2:\n%s", got, lb.String())
		}
	})
}

// B, D. A file that keeps failing with I/O errors fails the restore on
// every rank with that error (file, location, cause), instead of falling
// back to the older step; the error says that the tensors were partly
// overwritten. A corrupt copy still falls back.
func TestRestoreIOErrorFailsInsteadOfFallingBack(t *testing.T) {
	for _, tc := range []struct {
		n    int
		file func(n int) string
		mode bool // rank-0 restore
	}{
		{1, func(n int) string { return shardName(0, n) }, false},
		{3, func(n int) string { return shardName(1, n) }, false},
		{3, func(n int) string { return blobName(2) }, false},
		{3, func(n int) string { return shardName(2, n) }, true},
		{3, func(int) string { return ManifestName }, false},
	} {
		file := tc.file(tc.n)
		t.Run(fmt.Sprintf("np%d/%s/rank0=%v", tc.n, file, tc.mode), func(t *testing.T) {
			dir := t.TempDir()
			comms := newJob(t, tc.n)
			mustAll(t, save(t, comms, dir, 1, 1))
			mustAll(t, save(t, comms, dir, 2, 2))
			fs := newFlaky(DirStore(dir), true, map[string]int{file: 1 << 30})
			var lb logBuf
			_, _, errs := restoreEach(t, comms, []string{dir}, func(r int, s Store) Store { return fs }, nil, newRankState, WithLogger(lb.logf),
				func(m *Manager) { m.restoreRank0 = tc.mode })
			for r, err := range errs {
				if err == nil {
					t.Fatalf("rank %d: the restore succeeded", r)
				}
				for _, want := range []string{
					"step 2: reading " + filepath.Join(StepDir(dir, 2), file) + ": ",
					"connection reset by peer (4 attempts)",
					"rather than fall back to an older checkpoint",
				} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("rank %d: error lacks %q: %v", r, want, err)
					}
				}
				if got, want := strings.Contains(err.Error(), "the registered tensors were partly overwritten: re-initialize them before starting fresh"), file != ManifestName; got != want {
					t.Errorf("rank %d: says overwritten: %v, want %v: %v", r, got, want, err)
				}
			}
			t.Log(errs[0])
			if strings.Contains(lb.String(), "skipping") {
				t.Errorf("fell back:\n%s", lb.String())
			}
			if got := fs.getsOf(file); got != 4 {
				t.Errorf("%s read %d times, want 4", file, got)
			}
		})
	}
}

// B. With two hosts, a copy that keeps failing with I/O errors on one is
// read from the other: no fallback, no error, bit for bit.
func TestRestoreIOErrorReadsOtherHost(t *testing.T) {
	hostOf := []int{0, 1, 1}
	dirs, hosts := hostDirs(t, hostOf...)
	comms := newJob(t, 3)
	mustAll(t, saveDirs(comms, dirs, 1, same(1)))
	mustAll(t, saveDirs(comms, dirs, 2, same(2)))
	bad := newFlaky(DirStore(hosts[0]), false, map[string]int{shardName(0, 3): 1 << 30})
	var lb logBuf
	states, steps, errs := restoreEach(t, comms, dirs, func(r int, s Store) Store {
		if r == 0 {
			return bad
		}
		return s
	}, hostOf, newRankState, WithLogger(lb.logf))
	mustAll(t, errs)
	for r, s := range states {
		if steps[r] != 2 {
			t.Fatalf("rank %d: step %d", r, steps[r])
		}
		if err := checkBits(s, 2, r); err != nil {
			t.Error(err)
		}
	}
	if !strings.Contains(lb.String(), "rank 0's copy of shard-00000-of-00003.bin cannot be used") || strings.Contains(lb.String(), "skipping") {
		t.Errorf("log:\n%s", lb.String())
	}
}

// C. A manifest that is corrupt on the host of the lowest lister is read
// from the next host's copy, and written back; with one host (one rank)
// the step is skipped as before.
func TestRestoreManifestFromNextHost(t *testing.T) {
	hostOf := []int{0, 1, 1}
	dirs, hosts := hostDirs(t, hostOf...)
	comms := newJob(t, 3)
	mustAll(t, saveDirs(comms, dirs, 1, same(1)))
	mustAll(t, saveDirs(comms, dirs, 2, same(2)))
	mp := filepath.Join(StepDir(hosts[0], 2), ManifestName)
	if err := os.WriteFile(mp, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	var lb logBuf
	states, steps, errs := restoreEach(t, comms, dirs, nil, nil, newRankState, WithLogger(lb.logf))
	mustAll(t, errs)
	for r, s := range states {
		if steps[r] != 2 {
			t.Fatalf("rank %d: step %d\n%s", r, steps[r], lb.String())
		}
		if err := checkBits(s, 2, r); err != nil {
			t.Error(err)
		}
	}
	if !strings.Contains(lb.String(), "rank 0's copy of manifest.json cannot be used (manifest.json is not valid JSON") ||
		!strings.Contains(lb.String(), "reading rank 1's") || strings.Contains(lb.String(), "skipping") {
		t.Errorf("log:\n%s", lb.String())
	}
	if r, err := Scan(hosts[0]); err != nil || r.Pick != 2 || r.Entries[0].Problem != "" || r.Entries[0].Degraded != "" {
		t.Errorf("Scan of %s after the restore: %+v %v", hosts[0], r, err)
	}

	// Corrupt on both hosts: the step is skipped, naming both copies.
	for _, h := range hosts {
		if err := os.WriteFile(filepath.Join(StepDir(h, 2), ManifestName), []byte("{not json"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	lb = logBuf{}
	states, steps, errs = restoreEach(t, comms, dirs, nil, nil, newRankState, WithLogger(lb.logf))
	mustAll(t, errs)
	for r, s := range states {
		if steps[r] != 1 {
			t.Fatalf("rank %d: step %d", r, steps[r])
		}
		if err := checkBits(s, 1, r); err != nil {
			t.Error(err)
		}
	}
	if !strings.Contains(lb.String(), "skipping the checkpoint of step 2") || !strings.Contains(lb.String(), "rank 0's copy: manifest.json is not valid JSON") ||
		!strings.Contains(lb.String(), "rank 1's copy: manifest.json is not valid JSON") {
		t.Errorf("log:\n%s", lb.String())
	}

	// One rank, one directory: no other copy, the step is skipped.
	dir := t.TempDir()
	one := newJob(t, 1)
	mustAll(t, save(t, one, dir, 1, 1))
	mustAll(t, save(t, one, dir, 2, 2))
	if err := os.WriteFile(filepath.Join(StepDir(dir, 2), ManifestName), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	lb = logBuf{}
	restore(t, one, dir, 1, 1, WithLogger(lb.logf))
	if !strings.Contains(lb.String(), "skipping the checkpoint of step 2 in "+StepDir(dir, 2)+": manifest.json is not valid JSON") {
		t.Errorf("log:\n%s", lb.String())
	}
}

// D. When no checkpoint can be loaded after bytes were written, the error
// says the tensors were partly overwritten; with 1 and 3 ranks.
func TestRestoreFailureSaysOverwritten(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprint("np", n), func(t *testing.T) {
			dir := t.TempDir()
			comms := newJob(t, n)
			mustAll(t, save(t, comms, dir, 1, 1))
			corruptShard(t, dir, 1, n-1, "flip")
			_, _, errs := restoreEach(t, comms, []string{dir}, nil, nil, newRankState, WithLogger(t.Logf))
			for r, err := range errs {
				if err == nil || !strings.Contains(err.Error(), "none of the 1 committed checkpoints can be loaded") ||
					!strings.HasSuffix(err.Error(), "; the registered tensors were partly overwritten: re-initialize them before starting fresh") {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

// E. A job smaller than the one that wrote the checkpoint: rank 0 logs one
// warning naming the blob files whose per-rank state is dropped; the
// remaining ranks get their own back, bit for bit.
func TestRestoreShrinkWarnsDroppedBlobs(t *testing.T) {
	for _, tc := range []struct {
		from, to int
		files    string
		which    string
	}{
		{5, 3, "rank-00003.state, rank-00004.state", "old ranks 3 to 4"},
		{3, 1, "rank-00001.state, rank-00002.state", "old ranks 1 to 2"},
		{3, 2, "rank-00002.state", "old rank 2"},
	} {
		t.Run(fmt.Sprintf("%dto%d", tc.from, tc.to), func(t *testing.T) {
			dir := t.TempDir()
			mustAll(t, save(t, newJob(t, tc.from), dir, 4, 4))
			comms := newJob(t, tc.to)
			var lb logBuf
			states, _, errs := restoreEach(t, comms, []string{dir}, nil, nil, newRankState, WithLogger(lb.logf))
			mustAll(t, errs)
			for r, s := range states {
				if err := checkBits(s, 4, r); err != nil {
					t.Error(err)
				}
			}
			want := fmt.Sprintf("checkpoint: WARNING: the checkpoint of step 4 was written by %d ranks and this job has %d: the per-rank state of %s (%s: blobs \"pos\", \"rng\") is not restored",
				tc.from, tc.to, tc.which, tc.files)
			if got := strings.Count(lb.String(), "is not restored"); got != 1 || !strings.Contains(lb.String(), want) {
				t.Errorf("log lacks one %q:\n%s", want, lb.String())
			}
		})
	}
	// Growing, or the same size: no such warning.
	dir := t.TempDir()
	mustAll(t, save(t, newJob(t, 3), dir, 4, 4))
	for _, n := range []int{3, 4} {
		var lb logBuf
		_, _, errs := restoreEach(t, newJob(t, n), []string{dir}, nil, nil, newRankState, WithLogger(lb.logf))
		mustAll(t, errs)
		if strings.Contains(lb.String(), "is not restored") {
			t.Errorf("%d ranks: %s", n, lb.String())
		}
	}
}

// F. Re-replication writes the manifests after every domain's file writes
// are known: a domain whose writes failed is not recorded as a holder in
// the manifest another domain writes, and gets no manifest itself.
func TestRereplicateRecordsOnlyVerifiedHolders(t *testing.T) {
	hostOf := []int{0, 1, 2}
	dirs, hosts := hostDirs(t, hostOf...)
	comms := newJob(t, 3)
	mustAll(t, saveDirs(comms, dirs, 1, same(1), WithReplicas(2)))
	os.RemoveAll(hosts[1])
	os.RemoveAll(hosts[2])
	var lb logBuf
	states, _, errs := restoreEach(t, comms, dirs, func(r int, s Store) Store {
		if r != 2 {
			return s
		}
		f := newFlaky(s, false, nil)
		f.failPut = func(key string) bool { return true }
		return f
	}, hostOf, newRankState, WithReplicas(2), WithLogger(lb.logf))
	mustAll(t, errs)
	for r, s := range states {
		if err := checkBits(s, 1, r); err != nil {
			t.Error(err)
		}
	}
	man, err := readManifest(StepDir(hosts[1], 1))
	if err != nil {
		t.Fatalf("%v\n%s", err, lb.String())
	}
	for _, f := range man.Files() {
		if !slices.Equal(f.Hosts, []int{0, 1}) {
			t.Errorf("host 1's manifest: %s is on hosts %v, want [0 1]", f.File, f.Hosts)
		}
	}
	checkHolds(t, hosts[1], 1, 0, 1, 2)
	if _, err := os.Stat(filepath.Join(StepDir(hosts[2], 1), ManifestName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("host 2 got a manifest: %v", err)
	}
	if !strings.Contains(lb.String(), "re-replicated 6 file(s) to the checkpoint directory of host 1\n") ||
		!strings.Contains(lb.String(), "rank 2: step 1: re-replicating: ") {
		t.Errorf("log:\n%s", lb.String())
	}
	// The next restore, with host 2 writable, completes the placement.
	lb = logBuf{}
	_, _, errs = restoreEach(t, comms, dirs, nil, hostOf, newRankState, WithReplicas(2), WithLogger(lb.logf))
	mustAll(t, errs)
	for _, h := range hosts {
		checkHolds(t, h, 1, 0, 1, 2)
	}
}

// G. "No copy left" describes the placement the checkpoint was written
// with, not this job's replica count; a checkpoint written to one
// location says the files are missing from it.
func TestNoCopyLeftUsesManifestPlacement(t *testing.T) {
	// Written with no replicas on 3 hosts, restored asking for 2.
	dirs, hosts := hostDirs(t, 0, 1, 2)
	comms := newJob(t, 3)
	mustAll(t, saveDirs(comms, dirs, 1, same(1), WithReplicas(0)))
	os.RemoveAll(hosts[2])
	_, _, errs := restoreEach(t, comms, dirs, nil, nil, newRankState, WithReplicas(2), WithLogger(t.Logf))
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "step 1: no copy of shard-00002-of-00003.bin, rank-00002.state is left on any host (the checkpoint kept each file on 1 of its 3 hosts, --checkpoint-replicas 0; ") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	// Written by 2 ranks in one directory, restored by 2 ranks on two
	// hosts, the first of which has that directory.
	shared := t.TempDir()
	two := newJob(t, 2)
	mustAll(t, save(t, two, shared, 1, 1))
	if err := os.Remove(filepath.Join(StepDir(shared, 1), blobName(1))); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	_, _, errs = restoreEach(t, two, []string{shared, other}, nil, nil, newRankState, WithLogger(t.Logf))
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "step 1: rank-00001.state is missing from the checkpoint directories of all 2 hosts") ||
			!strings.Contains(err.Error(), "(deleted?)") || strings.Contains(err.Error(), "replicas") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	// One rank.
	one := newJob(t, 1)
	dir := t.TempDir()
	mustAll(t, save(t, one, dir, 1, 1))
	if err := os.Remove(filepath.Join(StepDir(dir, 1), shardName(0, 1))); err != nil {
		t.Fatal(err)
	}
	_, _, errs = restoreEach(t, one, []string{dir}, nil, nil, newRankState, WithLogger(t.Logf))
	if err := errs[0]; err == nil || !strings.Contains(err.Error(), "step 1: shard-00000-of-00001.bin is missing from "+StepDir(dir, 1)+" (deleted?)") {
		t.Errorf("%v", err)
	}
}
