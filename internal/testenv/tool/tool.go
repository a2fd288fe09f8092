// Package tool finds the outside programs the tests run (an S3 server,
// etcd), and skips a test that needs one that is not installed, except in
// CI, where .ci/run installs them and a missing one is a failure.
package tool

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Find returns the path of program name, "" when it is not installed. It
// looks in $(go env GOPATH)/bin and ~/go/bin (where `go install` puts a
// pinned version) and in PATH (where Debian's packages go), GOPATH first
// if gopathFirst.
func Find(name string, gopathFirst bool) string {
	inPath := func() string {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
		return ""
	}
	if !gopathFirst {
		if p := inPath(); p != "" {
			return p
		}
	}
	var cands []string
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		for _, p := range filepath.SplitList(strings.TrimSpace(string(out))) {
			cands = append(cands, filepath.Join(p, "bin", name))
		}
	}
	if home, err := os.UserHomeDir(); err == nil {
		cands = append(cands, filepath.Join(home, "go", "bin", name))
	}
	for _, c := range cands {
		if st, err := os.Stat(c); err == nil && !st.IsDir() {
			return c
		}
	}
	return inPath()
}

// Require returns bin, or, when it is "" (not installed), skips t with
// missing (which says how to install it); with CI=true it fails t instead.
func Require(t testing.TB, bin, missing string) string {
	t.Helper()
	if bin != "" {
		return bin
	}
	if os.Getenv("CI") == "true" {
		t.Fatal(missing + "; CI=true, so this is a failure, not a skip")
	}
	t.Skip(missing)
	return ""
}
