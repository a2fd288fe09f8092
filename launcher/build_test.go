package launcher

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// buildEnv points the build cache (os.UserCacheDir) and the temporary
// directory into the test's own directory, keeping Go's compile cache, and
// returns the cache and temporary directories.
func buildEnv(t *testing.T) (cache, tmp string) {
	t.Helper()
	gocache, err := exec.Command("go", "env", "GOCACHE").Output()
	if err != nil {
		t.Skipf("no go command: %v", err)
	}
	root := t.TempDir()
	cache, tmp = filepath.Join(root, "cache"), filepath.Join(root, "tmp")
	os.Mkdir(tmp, 0o755)
	t.Setenv("GOCACHE", strings.TrimSpace(string(gocache)))
	t.Setenv("XDG_CACHE_HOME", cache)
	t.Setenv("TMPDIR", tmp)
	t.Setenv("GOWORK", "off")
	return cache, tmp
}

// writeVersionPackage writes a main package with a go.mod of its own that
// prints version, after a line on stdin when WAIT is set.
func writeVersionPackage(t *testing.T, dir, version string) {
	t.Helper()
	os.MkdirAll(dir, 0o755)
	src := `package main

import (
	"bufio"
	"fmt"
	"os"
)

func main() {
	if os.Getenv("WAIT") != "" {
		fmt.Println("waiting")
		bufio.NewReader(os.Stdin).ReadString('\n')
	}
	fmt.Println("` + version + `")
}
`
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.com/tiny\n\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
}

func runBinary(t *testing.T, bin string) string {
	t.Helper()
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("%s: %v", bin, err)
	}
	return strings.TrimSpace(string(out))
}

// entries lists what is under dir, relative to it.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if p != dir {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	return out
}

// A package with a go.mod of its own, given as ".", outside any module:
// built in its own directory into the cache, reused when nothing changed,
// replaced atomically when something did (a rank still running the old
// binary keeps running it), and nothing left in the temporary directory.
func TestBuildIfPackageCachesAndReplacesAtomically(t *testing.T) {
	cache, tmp := buildEnv(t)
	pkg := filepath.Join(t.TempDir(), "tiny")
	writeVersionPackage(t, pkg, "v1")
	t.Chdir(pkg)
	var log bytes.Buffer
	con := NewConsole(&log, &log)
	ctx := context.Background()

	bin, err := BuildIfPackage(ctx, ".", con)
	if err != nil {
		t.Fatalf("%v\n%s", err, &log)
	}
	if filepath.Base(bin) != "tiny" || !strings.HasPrefix(bin, filepath.Join(cache, "gorun", "build")+string(filepath.Separator)) {
		t.Errorf("binary at %s, want .../gorun/build/tiny-HASH/tiny under %s", bin, cache)
	}
	if got := runBinary(t, bin); got != "v1" {
		t.Fatalf("built binary says %q", got)
	}
	first, _ := os.Stat(bin)

	again, err := BuildIfPackage(ctx, pkg, con)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(again); again != bin || !os.SameFile(first, st) {
		t.Errorf("an unchanged package was rebuilt: %s", again)
	}
	if !strings.Contains(log.String(), "(it was up to date)") {
		t.Errorf("log lacks the up-to-date note:\n%s", &log)
	}

	// A rank still running v1 while v2 is built.
	running := exec.Command(bin)
	running.Env = append(os.Environ(), "WAIT=1")
	in, _ := running.StdinPipe()
	out, _ := running.StdoutPipe()
	if err := running.Start(); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(out)
	if l, _ := rd.ReadString('\n'); l != "waiting\n" {
		t.Fatalf("the running binary said %q", l)
	}
	writeVersionPackage(t, pkg, "v2")
	if _, err := BuildIfPackage(ctx, ".", con); err != nil {
		t.Fatalf("rebuilding while the old binary runs: %v\n%s", err, &log)
	}
	if got := runBinary(t, bin); got != "v2" {
		t.Errorf("after the change the binary says %q, want v2", got)
	}
	in.Write([]byte("\n"))
	if l, _ := rd.ReadString('\n'); l != "v1\n" {
		t.Errorf("the rank started before the rebuild said %q, want v1", l)
	}
	running.Wait()

	if left := entries(t, tmp); len(left) > 0 {
		t.Errorf("left in TMPDIR: %v", left)
	}
	if got := entries(t, filepath.Dir(bin)); len(got) != 1 {
		t.Errorf("the cache directory holds %v, want only the binary", got)
	}
}

// Two gorun runs building the same package at once both get a whole binary.
func TestBuildIfPackageConcurrently(t *testing.T) {
	_, tmp := buildEnv(t)
	pkg := filepath.Join(t.TempDir(), "tiny")
	writeVersionPackage(t, pkg, "v1")
	var wg sync.WaitGroup
	bins, errs := make([]string, 2), make([]error, 2)
	for i := range bins {
		wg.Go(func() {
			bins[i], errs[i] = BuildIfPackage(context.Background(), pkg, NewConsole(&bytes.Buffer{}, &bytes.Buffer{}))
		})
	}
	wg.Wait()
	for i := range bins {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if got := runBinary(t, bins[i]); got != "v1" {
			t.Errorf("build %d: %q", i, got)
		}
	}
	if bins[0] != bins[1] {
		t.Errorf("two paths for one package: %v", bins)
	}
	if got := entries(t, filepath.Dir(bins[0])); len(got) != 1 {
		t.Errorf("the cache directory holds %v, want only the binary", got)
	}
	if left := entries(t, tmp); len(left) > 0 {
		t.Errorf("left in TMPDIR: %v", left)
	}
}

func TestBuildIfPackageLeavesBinariesAlone(t *testing.T) {
	_, tmp := buildEnv(t)
	for _, prog := range []string{"/bin/true", "no-such-program"} {
		if got, err := BuildIfPackage(context.Background(), prog, nil); got != prog || err != nil {
			t.Errorf("BuildIfPackage(%q) = %q, %v", prog, got, err)
		}
	}
	if _, err := BuildIfPackage(context.Background(), t.TempDir(), nil); err == nil || !strings.Contains(err.Error(), "without Go files") {
		t.Errorf("a directory without Go files: %v", err)
	}
	if left := entries(t, tmp); len(left) > 0 {
		t.Errorf("left in TMPDIR: %v", left)
	}
}
