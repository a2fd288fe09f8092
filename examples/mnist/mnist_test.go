package main

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
)

// TestGorunTwoRanks trains one epoch on the embedded digits with
// `gorun -np 2` and checks the test accuracy and that both ranks end with
// the same parameters (each prints a checksum with --verbose).
//
// gorun and the example are built WITHOUT -race even when this test runs
// under -race: the race detector slows the training loop down ~10×, and
// the collectives it exercises have their own race-enabled tests.
func TestGorunTwoRanks(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs two processes")
	}
	dir := t.TempDir()
	gorun, mnist := filepath.Join(dir, "gorun"), filepath.Join(dir, "mnist")
	for bin, pkg := range map[string]string{gorun: "../../cmd/gorun", mnist: "."} {
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	cmd := exec.Command(gorun, "-np", "2", mnist, "--epochs", "1", "--verbose", "--progress", "off")
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("gorun: %v", err)
	}
	accs := regexp.MustCompile(`(?m)^\[(\d)\] final: test accuracy ([0-9.]+)%`).FindAllSubmatch(out, -1)
	hashes := regexp.MustCompile(`(?m)^\[(\d)\] final: parameters sha256 ([0-9a-f]+)`).FindAllSubmatch(out, -1)
	if len(accs) != 2 || len(hashes) != 2 {
		t.Fatalf("want a final accuracy and checksum from each of 2 ranks, got %d and %d", len(accs), len(hashes))
	}
	for _, a := range accs {
		if acc, _ := strconv.ParseFloat(string(a[2]), 64); acc <= 85 {
			t.Errorf("rank %s: test accuracy %.2f%% after one epoch, want > 85%%", a[1], acc)
		}
	}
	if string(hashes[0][1]) == string(hashes[1][1]) || string(hashes[0][2]) != string(hashes[1][2]) {
		t.Errorf("ranks end with different parameters: %s %s vs %s %s", hashes[0][1], hashes[0][2], hashes[1][1], hashes[1][2])
	}
}
