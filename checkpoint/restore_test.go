package checkpoint

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/collective"
)

// With the size that wrote the checkpoint, rank r reads rank r's files;
// with another size the bytes are still balanced.
func TestRestoreAssign(t *testing.T) {
	m := &Manager{}
	mk := func(n int, size int64) []FileInfo {
		var fs []FileInfo
		for r := range n {
			fs = append(fs, FileInfo{Rank: r, Size: size})
		}
		for r := range n {
			fs = append(fs, FileInfo{Rank: r, Size: 10})
		}
		return fs
	}
	everyone := func(nf, n int) [][]int {
		h := make([][]int, nf)
		for i := range h {
			for r := range n {
				h[i] = append(h[i], r)
			}
		}
		return h
	}
	files := mk(4, 1000)
	if got := m.assign(files, everyone(8, 4), 4, 4); !slices.Equal(got, []int{0, 1, 2, 3, 0, 1, 2, 3}) {
		t.Errorf("same size: %v", got)
	}
	// 4 shards read by 3 ranks: no rank reads more than two.
	got := m.assign(files, everyone(8, 3), 4, 3)
	load := make([]int64, 3)
	for i, r := range got {
		load[r] += files[i].Size
	}
	if slices.Max(load) > 2020 || slices.Min(load) < 1000 {
		t.Errorf("4 shards over 3 ranks: %v, loads %v", got, load)
	}
	// Only holders read.
	h := everyone(8, 4)
	h[1] = []int{2, 3}
	if got := m.assign(files, h, 4, 4); got[1] != 2 && got[1] != 3 {
		t.Errorf("shard 1 held by [2 3] read by %d", got[1])
	}
	m.restoreRank0 = true
	if got := m.assign(files, h, 4, 4); !slices.Equal(got, []int{0, 2, 0, 0, 0, 0, 0, 0}) {
		t.Errorf("rank-0 mode: %v", got)
	}
}

// The rank-0 mode (the old restore) and the parallel restore load the same
// bytes, also into a job of another size.
func TestRestoreRank0ModeMatches(t *testing.T) {
	dir := t.TempDir()
	mustAll(t, save(t, newJob(t, 4), dir, 3, 7))
	for _, n := range []int{4, 3} {
		for _, rank0 := range []bool{false, true} {
			comms := newJob(t, n)
			mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
				m, err := New(c, dir, WithLogger(t.Logf))
				if err != nil {
					return err
				}
				m.restoreRank0 = rank0
				s := newRankState(r)
				step, found, err := m.Restore(context.Background(), s.st)
				if err != nil || !found || step != 3 {
					return fmt.Errorf("rank %d: step %d found %v err %v", r, step, found, err)
				}
				return s.check(7, r)
			}))
		}
	}
}

// A copy that is corrupt on one host is read from the other host, without
// falling back to an older step, and is then rewritten.
func TestRestoreCorruptCopyReadFromOtherHost(t *testing.T) {
	dirs, hosts := hostDirs(t, 0, 0, 1, 1)
	comms := newJob(t, 4)
	mustAll(t, saveDirs(comms, dirs, 1, same(1)))
	mustAll(t, saveDirs(comms, dirs, 2, same(2)))
	corruptShard(t, hosts[0], 2, 1, "flip")
	var lb logBuf
	restoreDirs(t, comms, dirs, 2, 2, WithLogger(lb.logf))
	if !strings.Contains(lb.String(), "rank 1's copy of shard-00001-of-00004.bin cannot be used") || strings.Contains(lb.String(), "skipping") {
		t.Errorf("log:\n%s", lb.String())
	}
	if r, err := Scan(hosts[0]); err != nil || r.Pick != 2 || r.Entries[0].Problem != "" {
		t.Errorf("Scan of %s after the restore: %+v %v", hosts[0], r, err)
	}
	// Corrupt on both hosts: fall back to step 1, naming the file.
	corruptShard(t, hosts[0], 2, 3, "truncate")
	corruptShard(t, hosts[1], 2, 3, "truncate")
	lb = logBuf{}
	restoreDirs(t, comms, dirs, 1, 1, WithLogger(lb.logf))
	if !strings.Contains(lb.String(), "skipping the checkpoint of step 2") || !strings.Contains(lb.String(), "shard-00003-of-00004.bin is") {
		t.Errorf("log:\n%s", lb.String())
	}
	// A job of two ranks, one per host, restores what four wrote.
	two := newJob(t, 2)
	restoreDirs(t, two, []string{hosts[0], hosts[1]}, 1, 1)
}

// A missing file in a shared directory is named.
func TestRestoreMissingFileNamed(t *testing.T) {
	dir := t.TempDir()
	comms := newJob(t, 3)
	mustAll(t, save(t, comms, dir, 1, 1))
	if err := os.Remove(filepath.Join(StepDir(dir, 1), blobName(2))); err != nil {
		t.Fatal(err)
	}
	errs := onEach(comms, func(r int, c *collective.Comm) error {
		m, _ := New(c, dir, WithLogger(t.Logf))
		_, _, err := m.Restore(context.Background(), newRankState(r).st)
		return err
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "none of the 1 committed checkpoints can be loaded: step 1: rank-00002.state is missing from "+StepDir(dir, 1)+" (deleted?)") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// BenchmarkRestore16MiB compares the parallel restore with the rank-0 one
// on the same checkpoint of 4 ranks.
func BenchmarkRestore16MiB(b *testing.B) {
	const n, size = 4, 16 << 20
	comms := newJob(b, n)
	dir := b.TempDir()
	states := make([]*State, n)
	for r := range n {
		w := make([]float32, size/4)
		for i := range w {
			w[i] = float32(i)
		}
		states[r] = new(State).Tensor("w", w)
	}
	errs := onEach(comms, func(r int, c *collective.Comm) error {
		m, err := New(c, dir)
		if err != nil {
			return err
		}
		return m.Save(context.Background(), 1, states[r])
	})
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	for _, rank0 := range []bool{false, true} {
		b.Run(map[bool]string{false: "parallel", true: "rank0"}[rank0], func(b *testing.B) {
			mgrs := make([]*Manager, n)
			for r := range n {
				mgrs[r], _ = New(comms[r], dir)
				mgrs[r].restoreRank0 = rank0
			}
			b.SetBytes(size)
			b.ResetTimer()
			cpu0 := cpuTime()
			for range b.N {
				errs := onEach(comms, func(r int, c *collective.Comm) error {
					_, _, err := mgrs[r].Restore(context.Background(), states[r])
					return err
				})
				for _, err := range errs {
					if err != nil {
						b.Fatal(err)
					}
				}
			}
			// The CPU time of every rank (they are in this process): the
			// work a restore takes, which the wall time on a loaded
			// machine with few cores hides.
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
		})
	}
}

// The in-place parallel restore gives back every bit (NaN payloads
// included) with 1, 3, 4 and 5 ranks: with an empty tensor between two
// others and shards that span tensors (broadcasts), and with one tensor
// in equal shards (one allgather). A corrupt shard in the newest step
// leaves garbage in the tensors that the fallback to the older step
// overwrites entirely.
func TestRestoreInPlaceBitForBit(t *testing.T) {
	gen := func(seed uint64, n int) ([]float32, []float64) {
		a := make([]float32, n)
		b := make([]float64, 3)
		x := seed*0x9e3779b97f4a7c15 + 1
		next := func() uint64 { x ^= x << 13; x ^= x >> 7; x ^= x << 17; return x }
		for i := range a {
			a[i] = math.Float32frombits(uint32(next()))
		}
		for i := range b {
			b[i] = math.Float64frombits(next())
		}
		return a, b
	}
	for _, tc := range []struct {
		n   int
		one bool // a single tensor of 15 float32: equal shards for 1, 3, 5 ranks
	}{{1, false}, {3, false}, {5, false}, {1, true}, {3, true}, {5, true}, {4, false}} {
		t.Run(fmt.Sprintf("np%d/one=%v", tc.n, tc.one), func(t *testing.T) {
			n := tc.n
			state := func(seed uint64) (*State, []float32, []float64) {
				if tc.one {
					a, _ := gen(seed, 15)
					return new(State).Tensor("a", a), a, nil
				}
				a, b := gen(seed, 7)
				return new(State).Tensor("a", a).Tensor("empty", []int32{}).Tensor("b", b), a, b
			}
			dir := t.TempDir()
			comms := newJob(t, n)
			for _, step := range []int64{1, 2} {
				mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
					m, err := New(c, dir, WithLogger(t.Logf))
					if err != nil {
						return err
					}
					st, _, _ := state(uint64(step))
					return m.Save(context.Background(), step, st)
				}))
			}
			check := func(wantStep int64) {
				t.Helper()
				before := allgatherRestores.Load()
				mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
					m, err := New(c, dir, WithLogger(t.Logf))
					if err != nil {
						return err
					}
					st, a, b := state(99) // not what was saved
					step, found, err := m.Restore(context.Background(), st)
					if err != nil || !found || step != wantStep {
						return fmt.Errorf("rank %d: step %d found %v err %v", r, step, found, err)
					}
					_, wa, wb := state(uint64(wantStep))
					for i := range a {
						if math.Float32bits(a[i]) != math.Float32bits(wa[i]) {
							return fmt.Errorf("rank %d: a[%d] = %#x, want %#x", r, i, math.Float32bits(a[i]), math.Float32bits(wa[i]))
						}
					}
					for i := range b {
						if math.Float64bits(b[i]) != math.Float64bits(wb[i]) {
							return fmt.Errorf("rank %d: b[%d] = %#x, want %#x", r, i, math.Float64bits(b[i]), math.Float64bits(wb[i]))
						}
					}
					return nil
				}))
				if got, want := allgatherRestores.Load()-before > 0, tc.one && n > 1; got != want {
					t.Errorf("restored by one allgather: %v, want %v", got, want)
				}
			}
			check(2)
			corruptShard(t, dir, 2, n/2, "flip") // with two tensors, shard n/2 spans both
			check(1)
		})
	}
}

// One tensor in equal shards on two hosts (one allgather): a shard that
// does not verify on one host is read from the other, and rewritten.
func TestRestoreAllgatherCorruptCopy(t *testing.T) {
	dirs, hosts := hostDirs(t, 0, 0, 1, 1)
	comms := newJob(t, 4)
	vals := func(v float32) []float32 {
		w := make([]float32, 64)
		for i := range w {
			w[i] = v * float32(i+1)
		}
		return w
	}
	mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
		m, err := New(c, dirs[r])
		if err != nil {
			return err
		}
		return m.Save(context.Background(), 1, new(State).Tensor("w", vals(3)))
	}))
	corruptShard(t, hosts[0], 1, 1, "flip")
	before := allgatherRestores.Load()
	var lb logBuf
	mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
		m, err := New(c, dirs[r], WithLogger(lb.logf))
		if err != nil {
			return err
		}
		w := make([]float32, 64)
		if step, found, err := m.Restore(context.Background(), new(State).Tensor("w", w)); err != nil || !found || step != 1 {
			return fmt.Errorf("rank %d: step %d found %v err %v", r, step, found, err)
		}
		if !slices.Equal(w, vals(3)) {
			return fmt.Errorf("rank %d: %v", r, w)
		}
		return nil
	}))
	if allgatherRestores.Load() == before {
		t.Error("not restored by one allgather")
	}
	if !strings.Contains(lb.String(), "rank 1's copy of shard-00001-of-00004.bin cannot be used") {
		t.Errorf("log:\n%s", lb.String())
	}
	if r, err := Scan(hosts[0]); err != nil || r.Entries[0].Degraded != "" || r.Entries[0].Problem != "" {
		t.Errorf("Scan after the restore: %+v %v", r, err)
	}
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// In a shared directory each rank reads its own blob file without a
// broadcast; a damaged one still makes every rank skip the step, naming
// the file.
func TestRestoreOwnBlobCorrupt(t *testing.T) {
	dir := t.TempDir()
	comms := newJob(t, 3)
	mustAll(t, save(t, comms, dir, 1, 1))
	mustAll(t, save(t, comms, dir, 2, 2))
	restore(t, comms, dir, 2, 2)
	p := filepath.Join(StepDir(dir, 2), blobName(1))
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)-1] ^= 1
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	var lb logBuf
	restore(t, comms, dir, 1, 1, WithLogger(lb.logf))
	if !strings.Contains(lb.String(), "skipping the checkpoint of step 2") || !strings.Contains(lb.String(), "rank-00001.state has sha256") {
		t.Errorf("log:\n%s", lb.String())
	}
}
