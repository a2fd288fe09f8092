package checkpoint

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gorun/gorun/collective"
)

// hostDirs gives rank r the directory of host hostOf[r]: ranks on one host
// share a directory, as ranks on one machine share its local disk.
func hostDirs(t *testing.T, hostOf ...int) (dirs, hosts []string) {
	t.Helper()
	base := t.TempDir()
	for h := range slices.Max(hostOf) + 1 {
		hosts = append(hosts, filepath.Join(base, fmt.Sprintf("host%d", h)))
	}
	for _, h := range hostOf {
		dirs = append(dirs, hosts[h])
	}
	return dirs, hosts
}

// saveDirs runs Save(step) on every rank with fill(v), rank r in dirs[r].
func saveDirs(comms []*collective.Comm, dirs []string, step int64, v func(r int) float32, opts ...Option) []error {
	return onEach(comms, func(r int, c *collective.Comm) error {
		m, err := New(c, dirs[r], opts...)
		if err != nil {
			return err
		}
		s := newRankState(r)
		s.fill(v(r), r)
		if err := m.Save(context.Background(), step, s.st); err != nil {
			return err
		}
		return m.Wait(context.Background()) // retention, in the background
	})
}

func same(v float32) func(int) float32 { return func(int) float32 { return v } }

// restoreDirs runs Restore on every rank and checks each got fill(wantV).
func restoreDirs(t *testing.T, comms []*collective.Comm, dirs []string, wantStep int64, wantV float32, opts ...Option) {
	t.Helper()
	mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
		m, err := New(c, dirs[r], opts...)
		if err != nil {
			return err
		}
		s := newRankState(r)
		step, found, err := m.Restore(context.Background(), s.st)
		if err != nil {
			return err
		}
		if !found || step != wantStep {
			return fmt.Errorf("rank %d: restored step %d found=%v, want step %d", r, step, found, wantStep)
		}
		return s.check(wantV, r)
	}))
}

// files lists the files of a step directory.
func files(t *testing.T, dir string, step int64) []string {
	t.Helper()
	des, err := os.ReadDir(StepDir(dir, step))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, de := range des {
		out = append(out, de.Name())
	}
	return out
}

// checkHolds verifies that dir holds the files of the given ranks of step,
// intact, and the manifest.
func checkHolds(t *testing.T, dir string, step int64, ranks ...int) {
	t.Helper()
	ctx := context.Background()
	man, err := storeReadManifest(ctx, DirStore(dir), step)
	if err != nil {
		t.Fatalf("%s: %v", dir, err)
	}
	for _, r := range ranks {
		for _, f := range []FileInfo{man.Shards[r], man.Blobs[r]} {
			if err := storeCheckFile(ctx, DirStore(dir), step, f, io.Discard); err != nil {
				t.Errorf("%s: %v", dir, err)
			}
		}
	}
}

// Four ranks on two hosts: every file is kept on both; a host that loses
// its directory gets it back on restore, bit for bit.
func TestReplicatedTwoDomains(t *testing.T) {
	dirs, hosts := hostDirs(t, 0, 0, 1, 1)
	comms := newJob(t, 4)
	mustAll(t, saveDirs(comms, dirs, 1, same(1)))
	mustAll(t, saveDirs(comms, dirs, 2, same(2)))
	for _, h := range hosts {
		if got := files(t, h, 2); len(got) != 9 {
			t.Fatalf("%s holds %v, want the 4 shards, 4 blob files and the manifest", h, got)
		}
		if r, err := Scan(h); err != nil || r.Pick != 2 {
			t.Fatalf("Scan(%s): %+v %v", h, r, err)
		}
	}
	if err := os.RemoveAll(hosts[1]); err != nil {
		t.Fatal(err)
	}
	var lb logBuf
	restoreDirs(t, comms, dirs, 2, 2, WithLogger(lb.logf))
	if !strings.Contains(lb.String(), "step 2: re-replicated 8 file(s) to the checkpoint directory "+dirLabel(hosts[1])+"\n") {
		t.Errorf("log:\n%s", lb.String())
	}
	if r, err := Scan(hosts[1]); err != nil || r.Pick != 2 || r.Entries[0].Problem != "" {
		t.Fatalf("Scan of the repopulated %s: %+v %v", hosts[1], r, err)
	}
	checkHolds(t, hosts[1], 2, 0, 1, 2, 3)
	// A host that lost only the manifest gets it back.
	if err := os.Remove(filepath.Join(StepDir(hosts[0], 2), ManifestName)); err != nil {
		t.Fatal(err)
	}
	lb = logBuf{}
	restoreDirs(t, comms, dirs, 2, 2, WithLogger(lb.logf))
	if !strings.Contains(lb.String(), "step 2: re-replicated 0 file(s) to the checkpoint directory "+dirLabel(hosts[0])+"\n") {
		t.Errorf("log:\n%s", lb.String())
	}
	checkHolds(t, hosts[0], 2, 0, 1, 2, 3)
	// The job goes on saving in both directories.
	mustAll(t, saveDirs(comms, dirs, 3, same(3)))
	restoreDirs(t, comms, dirs, 3, 3)
}

// Three hosts, one rank each, one replica: host d keeps the files of ranks
// d and d-1.
func TestReplicatedThreeDomainsOneReplica(t *testing.T) {
	dirs, hosts := hostDirs(t, 0, 1, 2)
	comms := newJob(t, 3)
	mustAll(t, saveDirs(comms, dirs, 40, same(4), WithReplicas(1)))
	for d, h := range hosts {
		checkHolds(t, h, 40, d, (d+2)%3)
		if got := files(t, h, 40); len(got) != 5 {
			t.Fatalf("%s holds %v", h, got)
		}
	}
	os.RemoveAll(hosts[1])
	var lb logBuf
	restoreDirs(t, comms, dirs, 40, 4, WithReplicas(1), WithLogger(lb.logf))
	checkHolds(t, hosts[1], 40, 1, 0)
	if !strings.Contains(lb.String(), "re-replicated 4 file(s) to the checkpoint directory "+dirLabel(hosts[1])+"\n") {
		t.Errorf("log:\n%s", lb.String())
	}
	// Two of three hosts lost: rank 1's files were on hosts 1 and 2 only.
	os.RemoveAll(hosts[1])
	os.RemoveAll(hosts[2])
	errs := onEach(comms, func(r int, c *collective.Comm) error {
		m, err := New(c, dirs[r], WithReplicas(1), WithLogger(t.Logf))
		if err != nil {
			return err
		}
		_, _, err = m.Restore(context.Background(), newRankState(r).st)
		return err
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "step 40: no copy of shard-00001-of-00003.bin, rank-00001.state is left on any host (the checkpoint kept each file on 2 of its 3 hosts, --checkpoint-replicas 1; every copy of these files is missing or damaged: directories lost, or files deleted)") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	t.Log(errs[0])
}

// A rank whose "replicated" tensors differ writes a shard replica that
// differs from the owner's: the save fails, naming both, and commits
// nowhere.
func TestReplicasDifferFails(t *testing.T) {
	dirs, hosts := hostDirs(t, 0, 0, 1, 1)
	comms := newJob(t, 4)
	errs := saveDirs(comms, dirs, 5, func(r int) float32 {
		if r == 3 {
			return 6
		}
		return 5
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "wrote different bytes for shard-") ||
			!strings.Contains(err.Error(), "the registered tensors must hold the same values on every rank") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	t.Log(errs[0])
	for _, h := range hosts {
		if _, err := os.Stat(filepath.Join(StepDir(h, 5), ManifestName)); err == nil {
			t.Errorf("%s: the failed save committed", h)
		}
	}
}

// One rank per host with odd counts and a tensor shorter than the rank
// count: most shards are empty files, and still replicated and restored.
func TestReplicatedTinyStateOddRanks(t *testing.T) {
	for _, n := range []int{1, 5} {
		t.Run(fmt.Sprint("np", n), func(t *testing.T) {
			hostOf := make([]int, n)
			for r := range n {
				hostOf[r] = r
			}
			dirs, hosts := hostDirs(t, hostOf...)
			comms := newJob(t, n)
			run := func(f func(m *Manager, w []float32, pos *int64, r int) error) {
				mustAll(t, onEach(comms, func(r int, c *collective.Comm) error {
					m, err := New(c, dirs[r], WithReplicas(1))
					if err != nil {
						return err
					}
					w := []float32{0}
					var pos int64
					if err := f(m, w, &pos, r); err != nil {
						return fmt.Errorf("rank %d: %w", r, err)
					}
					return nil
				}))
			}
			run(func(m *Manager, w []float32, pos *int64, r int) error {
				w[0], *pos = 3.5, int64(r)+10
				return m.Save(context.Background(), 7, new(State).Tensor("w", w).Int64("pos", pos))
			})
			if n > 1 {
				os.RemoveAll(hosts[n-1]) // its files are on host n-2 too
			}
			run(func(m *Manager, w []float32, pos *int64, r int) error {
				step, found, err := m.Restore(context.Background(), new(State).Tensor("w", w).Int64("pos", pos))
				if err != nil || !found || step != 7 || w[0] != 3.5 || *pos != int64(r)+10 {
					return fmt.Errorf("step %d found %v err %v w %v pos %d", step, found, err, w, *pos)
				}
				return nil
			})
			if n > 1 {
				checkHolds(t, hosts[n-1], 7, n-1, n-2)
			}
		})
	}
}

// {host} in a directory location becomes $GORUN_HOST.
func TestHostTemplate(t *testing.T) {
	base := t.TempDir()
	t.Setenv(EnvHost, "node7")
	comms := newJob(t, 1)
	m, err := New(comms[0], filepath.Join(base, "{host}", "ckpt"))
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(base, "node7", "ckpt"); m.Dir() != want {
		t.Fatalf("Dir() = %s, want %s", m.Dir(), want)
	}
	if st, err := os.Stat(m.Dir()); err != nil || !st.IsDir() {
		t.Fatalf("not created: %v", err)
	}
}

// EnvReplicas sets the replica count when WithReplicas is not given.
func TestReplicasFromEnv(t *testing.T) {
	t.Setenv(EnvReplicas, "1")
	dirs, hosts := hostDirs(t, 0, 1, 2)
	comms := newJob(t, 3)
	mustAll(t, saveDirs(comms, dirs, 1, same(1)))
	if got := files(t, hosts[0], 1); len(got) != 5 {
		t.Fatalf("with %s=1, host 0 holds %v", EnvReplicas, got)
	}
	t.Setenv(EnvReplicas, "")
	mustAll(t, saveDirs(comms, dirs, 2, same(2)))
	if got := files(t, hosts[0], 2); len(got) != 7 {
		t.Fatalf("by default (2 replicas), host 0 holds %v", got)
	}
}
