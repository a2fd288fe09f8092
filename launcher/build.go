// Building the program when it is a Go package directory, into a cache
// of binaries kept between runs.

package launcher

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// BuildIfPackage turns a Go package directory such as ./examples/mnist (or
// ".") into a binary, so every rank runs the same build; any other program
// is returned unchanged. A directory counts as a package when it holds .go
// files.
//
// The package is built in its own directory (go build -o BIN .), so it
// builds whether it belongs to the module gorun runs in or has a go.mod of
// its own. The binary goes to a cache keyed by the package's absolute path,
// BuildCacheDir/NAME-HASH/NAME, reused from run to run (go build leaves an
// up-to-date binary alone) and replaced atomically (built under a temporary
// name in the same directory, then renamed), so concurrent runs of the same
// package and ranks still running the previous binary are safe. go build's
// work directory goes next to the cache too (GOTMPDIR, unless set), so
// nothing is left in the temporary directory whatever happens to gorun.
//
// It says what it does on con (nil: a Console on os.Stdout, os.Stderr): a
// line before and after, and on a terminal a live elapsed time; go build's
// own output passes through.
func BuildIfPackage(ctx context.Context, program string, con *Console) (string, error) {
	if !isDir(program) {
		return program, nil
	}
	if !IsPackage(program) {
		return "", fmt.Errorf("%s is a directory without Go files: give an executable or a Go package directory", program)
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("%s is a Go package, but the go command is not on PATH to build it: build it yourself (go build -o BIN %s) and pass the binary", program, program)
	}
	if con == nil {
		con = NewConsole(os.Stdout, os.Stderr)
	}
	dir, err := filepath.Abs(program)
	if err != nil {
		return "", err
	}
	out := cachedBinary(dir)
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return "", fmt.Errorf("building %s: cannot create the build cache: %w", program, err)
	}
	removeStale(out + ".tmp-*")

	hint := "go build; the first build fetches modules and compiles, about a minute"
	tmp := out + ".tmp-" + randomHex(6)
	// A hard link to the last binary lets go build see it is up to date and
	// leave it alone (a new build replaces the link, never writes into the
	// file the link shares with running ranks).
	if os.Link(out, tmp) == nil {
		hint = "go build; quick when nothing changed"
	}
	defer os.Remove(tmp) // unless renamed

	name := program
	if b := filepath.Base(filepath.Clean(program)); b == "." || b == ".." {
		name = dir // "building ." says little
	}
	start := time.Now()
	stopTimer := showBuilding(con, name, hint, start)
	cmd := exec.CommandContext(ctx, gobin, "build", "-o", tmp, ".")
	cmd.Dir = dir
	// go build dies on SIGINT without removing its work directory, so that
	// goes to the cache too, where the next build removes what is stale.
	if os.Getenv("GOTMPDIR") == "" {
		work := filepath.Join(filepath.Dir(BuildCacheDir()), "tmp")
		if err := os.MkdirAll(work, 0o755); err == nil {
			removeStale(filepath.Join(work, "go-build*"))
			cmd.Env = append(os.Environ(), "GOTMPDIR="+work)
		}
	}
	// Stopped (Ctrl-C), go build and the compilers it runs stop at once.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGINT) }
	cmd.WaitDelay = 10 * time.Second
	goOut := &lineWriter{con: con, toErr: true}
	cmd.Stdout, cmd.Stderr = goOut, goOut
	err = cmd.Run()
	goOut.Flush()
	stopTimer()
	took := time.Since(start).Round(100 * time.Millisecond)
	if err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("building %s: %w", name, context.Cause(ctx))
		}
		return "", fmt.Errorf("building %s (go build in %s) failed after %v: %w; its errors are above", name, dir, took, err)
	}
	if old, err1 := os.Stat(out); err1 == nil {
		if now, err2 := os.Stat(tmp); err2 == nil && os.SameFile(old, now) {
			con.Logf("built %s in %v (it was up to date)", name, took)
			return out, nil
		}
	}
	if err := os.Rename(tmp, out); err != nil {
		return "", fmt.Errorf("building %s: %w", name, err)
	}
	con.Logf("built %s in %v", name, took)
	return out, nil
}

// IsPackage says whether program is a Go package directory (a directory
// holding .go files), which BuildIfPackage builds. BuildIfPackage refuses
// other directories.
func IsPackage(program string) bool {
	gofiles, _ := filepath.Glob(filepath.Join(program, "*.go"))
	return isDir(program) && len(gofiles) > 0
}

func isDir(program string) bool {
	st, err := os.Stat(program)
	return err == nil && st.IsDir()
}

// BuildCacheDir is where BuildIfPackage keeps binaries: the user's cache
// directory (os.UserCacheDir, e.g. ~/.cache/gorun/build), or, without one,
// a directory of this user's under the temporary directory.
func BuildCacheDir() string {
	base, err := os.UserCacheDir()
	if err != nil {
		base = filepath.Join(os.TempDir(), "gorun-cache-"+strconv.Itoa(os.Getuid()))
	}
	return filepath.Join(base, "gorun", "build")
}

// cachedBinary is the binary's path for the package in dir.
func cachedBinary(dir string) string {
	name := filepath.Base(dir)
	if name == string(filepath.Separator) || name == "." {
		name = "main"
	}
	sum := sha256.Sum256([]byte(dir))
	return filepath.Join(BuildCacheDir(), name+"-"+hex.EncodeToString(sum[:6]), name)
}

// removeStale removes what matches pattern and is an hour old or more:
// what builds that did not finish (gorun killed, go build interrupted) left.
func removeStale(pattern string) {
	paths, _ := filepath.Glob(pattern)
	for _, p := range paths {
		if st, err := os.Stat(p); err == nil && time.Since(st.ModTime()) > time.Hour {
			os.RemoveAll(p)
		}
	}
}

// showBuilding says that the build started: on a terminal as a status line
// with the elapsed time, updated every second until the returned function is
// called; elsewhere as one line.
func showBuilding(con *Console, program, hint string, start time.Time) (stop func()) {
	if !con.Terminal() {
		con.Logf("building %s (%s)", program, hint)
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			// The time first: a narrow terminal cuts the end of the line.
			con.setStatus("build", fmt.Sprintf("gorun: building %s %v (%s)", program, time.Since(start).Round(time.Second), hint))
			select {
			case <-done:
				con.setStatus("build", "")
				return
			case <-tick.C:
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
