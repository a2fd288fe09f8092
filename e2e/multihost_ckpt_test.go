package e2e

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv/netns"
)

// readStepFiles returns the files of one checkpoint step in dir, by name.
func readStepFiles(t *testing.T, dir string, step int) map[string]string {
	t.Helper()
	sdir := filepath.Join(dir, fmt.Sprintf("step-%012d", step))
	des, err := os.ReadDir(sdir)
	if err != nil {
		t.Fatalf("reading the checkpoint of step %d: %v", step, err)
	}
	files := map[string]string{}
	for _, de := range des {
		b, err := os.ReadFile(filepath.Join(sdir, de.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[de.Name()] = string(b)
	}
	return files
}

// Replicated local checkpoints across 3 "hosts" that each have their own
// checkpoint directory (CKPTPROG_DIR=.../{host}) and --checkpoint-replicas
// 1: after one host loses its whole directory, a longer rerun resumes from
// the newest checkpoint, read from the other hosts' copies, ends bit for
// bit where an uninterrupted run of the full length ends, and writes the
// lost files back to that host's directory, saying so. With two hosts'
// directories lost, some files have no copy left, and the rerun fails
// naming them rather than starting over.
func TestMultiHostCheckpointReplicas(t *testing.T) {
	c := netns.New(t, 3) // or skip
	prog := ckptprog(t)
	h0, h1, h2 := c.Hosts[0], c.Hosts[1], c.Hosts[2]
	hosts := fmt.Sprintf("%s:2,%s:1,%s:1", h0.IP, h1.IP, h2.IP) // 4 ranks
	tmp := t.TempDir()
	const s1, s2, every = 20, 40, 5
	job := func(dir string, steps int, extra ...string) (stdout, stderr string, code int) {
		t.Helper()
		env := append([]string{"GORUN_FOLD_WINDOW=0", "CKPTPROG_DIR=" + filepath.Join(tmp, dir, "{host}"), "CKPTPROG_OUT=" + filepath.Join(tmp, dir+".hex"),
			fmt.Sprintf("CKPTPROG_STEPS=%d", steps), fmt.Sprintf("CKPTPROG_EVERY=%d", every), "CKPTPROG_SEED=5", "CKPTPROG_KEEP=100"}, extra...)
		os.Remove(filepath.Join(tmp, dir+".hex"))
		stdout, stderr, code, took := gorunIn(t, c, h0, env, 2*time.Minute, "-H", hosts, "--checkpoint-replicas", "1", prog)
		t.Logf("%s, %d steps: exit %d after %v", dir, steps, code, took.Round(time.Millisecond))
		return stdout, stderr, code
	}
	params := func(dir string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(tmp, dir+".hex"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	hostDir := func(dir string, h *netns.Host) string { return filepath.Join(tmp, dir, h.IP) }

	stdout, stderr, code := job("ref", s2)
	if code != 0 || !strings.Contains(stdout, "fresh start") {
		t.Fatalf("uninterrupted run: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	want := params("ref")

	// The first run ends at step s1, its newest checkpoint.
	stdout, stderr, code = job("job", s1)
	if code != 0 || !strings.Contains(stdout, "fresh start") {
		t.Fatalf("first run: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	// Every host's directory holds its own ranks' files and the next
	// host's (k=1), and a manifest: each has the step, none has every file.
	lost := readStepFiles(t, hostDir("job", h0), s1)
	for _, h := range c.Hosts {
		files := slices.Sorted(maps.Keys(readStepFiles(t, hostDir("job", h), s1)))
		t.Logf("%s holds %v", h.IP, files)
		if !slices.Contains(files, "manifest.json") || len(files) >= 4+4+1 {
			t.Errorf("%s holds %v of step %d: want a manifest and some of the 8 files", h.IP, files, s1)
		}
	}
	// h0's ranks 0 and 1, and rank 3's copy (h2's next host is h0).
	for _, f := range []string{"shard-00000-of-00004.bin", "shard-00001-of-00004.bin", "shard-00003-of-00004.bin",
		"rank-00000.state", "rank-00001.state", "rank-00003.state", "manifest.json"} {
		if _, ok := lost[f]; !ok {
			t.Errorf("%s lacks %s of step %d", h0.IP, f, s1)
		}
	}

	// h0 (rank 0's host, where gorun runs) loses its whole directory.
	if err := os.RemoveAll(hostDir("job", h0)); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code = job("job", s2)
	if code != 0 || !strings.Contains(stdout, fmt.Sprintf("resumed from the checkpoint of step %d\n", s1)) {
		t.Fatalf("rerun after %s lost its directory: exit %d, want a resume from step %d\nstdout:\n%s\nstderr:\n%s", h0.IP, code, s1, stdout, stderr)
	}
	reRE := regexp.MustCompile(fmt.Sprintf(`checkpoint: step %d: re-replicated (\d+) file\(s\) to the checkpoint directory %s\n`, s1, regexp.QuoteMeta(hostDir("job", h0))))
	m := reRE.FindStringSubmatch(stderr)
	if m == nil {
		t.Errorf("stderr lacks the re-replication of step %d to %s:\n%s", s1, hostDir("job", h0), stderr)
	} else {
		t.Logf("gorun said: %s", m[0])
		if m[1] != fmt.Sprint(len(lost)-1) {
			t.Errorf("re-replicated %s files, want %d (%v)", m[1], len(lost)-1, slices.Sorted(maps.Keys(lost)))
		}
	}
	if got := params("job"); got != want {
		t.Fatalf("parameters after the resume from replicas differ from an uninterrupted run:\n got %s\nwant %s\nstdout:\n%s\nstderr:\n%s", got, want, stdout, stderr)
	}
	// The restored step is back in h0's directory, byte for byte as the
	// first run wrote it; and the steps the rerun saved are there too.
	back := readStepFiles(t, hostDir("job", h0), s1)
	if !maps.Equal(back, lost) {
		t.Errorf("%s's checkpoint of step %d after the rerun has %v, want %v as the first run wrote them",
			h0.IP, s1, slices.Sorted(maps.Keys(back)), slices.Sorted(maps.Keys(lost)))
	}
	if got := readStepFiles(t, hostDir("job", h0), s2); !maps.Equal(got, readStepFiles(t, hostDir("ref", h0), s2)) {
		t.Errorf("%s's checkpoint of step %d differs from the uninterrupted run's", h0.IP, s2)
	}
	// What h0's directory holds now verifies, as h0 sees it.
	stdout, stderr, code = run(t, []string{"GORUN_HOST=" + h0.IP}, gorunBin, "checkpoint", "verify", filepath.Join(tmp, "job", "{host}"))
	t.Logf("gorun checkpoint verify of %s's directory:\n%s", h0.IP, stdout)
	for _, w := range []string{fmt.Sprintf("step %d  ok", s1), fmt.Sprintf("step %d  ok", s2),
		fmt.Sprintf("restore would pick step %d: step %d is the newest committed checkpoint and its checksums verify", s2, s2)} {
		if code != 0 || !strings.Contains(stdout, w) {
			t.Errorf("verify of %s's directory: exit %d, stdout lacks %q\nstdout:\n%s\nstderr:\n%s", h0.IP, code, w, stdout, stderr)
		}
	}
	if strings.Contains(stdout, "missing") {
		t.Errorf("verify of %s's directory finds files missing:\n%s", h0.IP, stdout)
	}
	noneLeft(t, c)

	// Two of the three hosts lose their directories: rank 0's and 1's files
	// were kept on h0 and h1 only.
	for _, h := range []*netns.Host{h0, h1} {
		if err := os.RemoveAll(hostDir("job", h)); err != nil {
			t.Fatal(err)
		}
	}
	stdout, stderr, code = job("job", s2+2*every)
	t.Logf("rerun with two directories lost: stderr:\n%s", stderr)
	if code == 0 || strings.Contains(stdout, "fresh start") || strings.Contains(stdout, "resumed") {
		t.Fatalf("rerun with two of three directories lost and --checkpoint-replicas 1: exit %d, want a failure\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for _, w := range []string{
		"none of the 8 committed checkpoints can be loaded",
		fmt.Sprintf("step %d: no copy of shard-00000-of-00004.bin, shard-00001-of-00004.bin, rank-00000.state, rank-00001.state is left on any host", s2),
		"every copy of these files is missing or damaged: directories lost, or files deleted",
		"gorun: job failed",
	} {
		if !strings.Contains(stderr, w) {
			t.Errorf("stderr lacks %q", w)
		}
	}
	noneLeft(t, c)
}
