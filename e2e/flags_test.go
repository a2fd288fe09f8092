package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The binary prints gorun's help as cmd/gorun's tests see it in process:
// main hands its arguments on (through horovodArgs), and gorun --help, -h
// and help print one page, gorun help TOPIC the topic, each with exit 0
// and nothing on stderr.
func TestGorunHelpFromTheBinary(t *testing.T) {
	out, errOut, code := run(t, nil, gorunBin, "--help")
	if code != 0 || errOut != "" || !strings.Contains(out, "Usage:\n  gorun -np N") {
		t.Fatalf("gorun --help: exit %d, stderr %q, stdout:\n%s", code, errOut, out)
	}
	for _, args := range [][]string{{"-h"}, {"help"}} {
		if o, e, code := run(t, nil, gorunBin, args...); code != 0 || e != "" || o != out {
			t.Errorf("gorun %v: exit %d, stderr %q, and not what gorun --help prints:\n%s", args, code, e, o)
		}
	}
	if out, errOut, code := run(t, nil, gorunBin, "help", "hosts"); code != 0 || errOut != "" || !strings.HasPrefix(out, "-H node1:4,node2:4 (--hosts) gives the hosts") {
		t.Errorf("gorun help hosts: exit %d, stderr %q, stdout:\n%s", code, errOut, out)
	}
}

func TestGorunBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-np", "0", "true"}, "-np must be at least 1"},
		{[]string{"-np", "2", "-H", "a:b", "true"}, "write host:slots"},
		{[]string{"-np", "4", "-H", "localhost:2", "true"}, "needs 4 slots"},
		{[]string{"-np", "2"}, "gorun: no program to run: write gorun -np N PROGRAM [ARGS...], e.g. gorun -np 4 ./examples/mnist; gorun --help lists gorun's flags"},
		{nil, "gorun: no program to run: write gorun -np N PROGRAM [ARGS...]"},
		{[]string{"-np", "4", "--epochs", "3", "./examples/mnist"}, "gorun: unknown flag --epochs: gorun's own flags come before PROGRAM, the program's after it: gorun -np 4 ./examples/mnist --epochs 3"},
		{[]string{"-np", "2", "-x", "A=1", "--lr=0.1", "--", "./train", "-v"}, "gorun: unknown flag --lr: gorun's own flags come before PROGRAM, the program's after it: gorun -np 2 -x A=1 -- ./train --lr=0.1 -v"},
		{[]string{"--epochs", "3"}, "gorun: unknown flag --epochs: gorun's own flags come before PROGRAM, the program's after it: gorun PROGRAM --epochs 3"},
		{[]string{"-np", "4", "-e", "3", "./x"}, "gorun: unknown flag -e: gorun's own flags come before PROGRAM, the program's after it: gorun -np 4 ./x -e 3"},
		{[]string{"bench", "--op", "alltoall"}, "use allreduce, broadcast"},
		{[]string{"bench", "--sizes", "big"}, "not a positive byte count"},
	} {
		_, errOut, code := run(t, nil, gorunBin, tc.args...)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("gorun %v: exit %d, stderr %q; want an error containing %q", tc.args, code, errOut, tc.want)
		}
	}
}

func TestGorunMultiHostBadFlags(t *testing.T) {
	dir := t.TempDir()
	hf := filepath.Join(dir, "hosts")
	os.WriteFile(hf, []byte("node1 slots=2\nnode2 slotz=2\n"), 0o644)
	cfg := filepath.Join(dir, "bad.yaml")
	os.WriteFile(cfg, []byte("nodes: 3\n"), 0o644)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-H", "node1:2,node2:x", "true"}, `"x" is not a slot count (a positive integer): write host:slots[,host:slots...], e.g. -H node1:4,node2:4`},
		{[]string{"-H", "node1:2,,node2", "true"}, "empty host"},
		{[]string{"--hostfile", hf, "true"}, `line 2 "node2 slotz=2": unknown field "slotz=2": write one host per line as "host slots=N"`},
		{[]string{"-H", "a:1", "--hostfile", hf, "true"}, "use one of them"},
		{[]string{"-np", "5", "-H", "localhost:2,127.0.0.1:2", "true"}, "-np 5 needs 5 slots but -H localhost:2,127.0.0.1:2 has 4"},
		{[]string{"--ssh-port", "70000", "-H", "a", "true"}, "not a port number"},
		{[]string{"--config", cfg, "true"}, `unknown key "nodes"`},
	} {
		if tc.want == "" {
			continue
		}
		_, errOut, code := run(t, nil, gorunBin, tc.args...)
		if code == 0 || !strings.Contains(errOut, tc.want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("gorun %v: exit %d, stderr %q; want one line containing %q", tc.args, code, errOut, tc.want)
		}
	}
}

func TestGorunConfigFlagsWin(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "job.yaml")
	os.WriteFile(cfg, []byte("np: 3\nhosts: [localhost:4]\nenv:\n  - TESTPROG_MODE=ok\n  - TESTPROG_SOURCE=config\nstart-timeout: 20\n"), 0o644)
	out, errOut, code := run(t, nil, gorunBin, "--config", cfg, "-np", "2", testprogBin)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "[1] rank 1 of 2 ok (source config)") || strings.Contains(out, "rank 2") {
		t.Errorf("want 2 ranks (-np wins over the file) with the file's env:\n%s", out)
	}
}

func TestGorunOutputDir(t *testing.T) {
	dir := t.TempDir()
	out, errOut, code := run(t, []string{"TESTPROG_MODE=fail", "TESTPROG_VICTIM=1"}, gorunBin, "-np", "2", "--output-dir", dir, testprogBin)
	if code == 0 {
		t.Fatalf("exit 0\n%s\n%s", out, errOut)
	}
	b, err := os.ReadFile(filepath.Join(dir, "rank.1", "stderr"))
	if err != nil || string(b) != "testprog: failing on purpose\n" {
		t.Errorf("rank.1/stderr: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "rank.0", "stdout")); err != nil {
		t.Error(err)
	}
}

func TestGorunStartTimeoutNamesRank(t *testing.T) {
	out, errOut, code := run(t, []string{"TESTPROG_MODE=noinit", "TESTPROG_VICTIM=1"}, gorunBin, "-np", "3", "--start-timeout", "2s", "--grace", "1s", testprogBin)
	want := "gorun: rank 1 did not register with the rendezvous within --start-timeout 2s"
	if code == 0 || !strings.Contains(errOut, want) {
		t.Errorf("exit %d, stderr lacks %q\nstdout:\n%s\nstderr:\n%s", code, want, out, errOut)
	}
}
