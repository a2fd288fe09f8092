package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// tinyTmpfs mounts a tmpfs of size bytes at a new directory and unmounts
// it when the test ends.
// It needs root: the test skips without it, or fails under CI=true.
func tinyTmpfs(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("mounting a tmpfs needs root, and CI=true")
		}
		t.Skip("mounting a tmpfs needs root")
	}
	dir := filepath.Join(t.TempDir(), "ckpt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount -t tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", dir, err, out)
		}
	})
	return dir
}

// A job whose checkpoint storage is full, or read-only, fails at its first
// save in a way a restart would meet again: the ranks exit with
// checkpoint.ExitNoRestart saying why, and gorun --max-restarts 2 ends the
// job after that one attempt, saying why it does not restart it.
func TestCheckpointFullOrReadOnlyNoRestart(t *testing.T) {
	for _, tc := range []struct {
		name string
		ro   bool
		why  string
	}{
		{"full", false, "is full (not enough free space for a checkpoint)"},
		{"read-only", true, "is read-only (read-only file system)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := tinyTmpfs(t, "2m")
			if !tc.ro {
				// Less free space than a checkpoint's margin (1 MiB).
				if err := os.WriteFile(filepath.Join(dir, "filler"), make([]byte, 1600<<10), 0o644); err != nil {
					t.Fatal(err)
				}
			} else if out, err := exec.Command("mount", "-o", "remount,ro", dir).CombinedOutput(); err != nil {
				t.Fatalf("mount -o remount,ro: %v %s", err, out)
			}
			env := []string{"GORUN_FOLD_WINDOW=0", "CKPTPROG_DIR=" + dir, "CKPTPROG_STEPS=20", "CKPTPROG_EVERY=5"}
			stdout, stderr, code := run(t, env, gorunBin, "-np", "2", "--max-restarts", "2", ckptprog(t))
			t.Logf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
			reason := fmt.Sprintf("ckptprog: checkpoint storage at %s %s; a restart would fail the same way", dir, tc.why)
			want := "gorun: not restarting (--max-restarts 2): rank 0 exited with status 78, which says a restart would fail the same way: " + reason + "\n"
			if code != 1 || !strings.Contains(stderr, want) {
				t.Errorf("exit %d, stderr lacks %q", code, want)
			}
			if n := strings.Count(stdout, "fresh start"); n != 1 || strings.Contains(stderr, "restart 1 of 2") {
				t.Errorf("%d attempts (fresh starts), want 1", n)
			}
			for _, r := range []string{"[0] ", "[1] "} {
				if !strings.Contains(stderr, r+reason+"\n") {
					t.Errorf("rank %s does not say why it fails", r)
				}
			}
		})
	}
}
