package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestGorunHelpDocumentsFlags(t *testing.T) {
	out, _, code := run(t, nil, gorunBin, "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"-np", "-H, --hosts", "--hostfile", "--ssh-port", "--ssh-identity-file", "--network-interface",
		"--start-timeout", "--timeout", "--output-dir", "-x, --env", "--verbose", "--config", "--max-restarts", "--grace",
		"gorun -H node1:4,node2:4"} {
		if !strings.Contains(out, want) {
			t.Errorf("--help lacks %q", want)
		}
	}
	// What hosts need is in the manual's topic on hosts.
	out, _, code = run(t, nil, gorunBin, "help", "hosts")
	out = strings.Join(strings.Fields(out), " ")
	for _, want := range []string{"gorun -np 8 -H node1:4,node2:4", "GORUN_SSH_OPTS", "same path on every host", "--ssh-identity-file",
		"a host without :N has 1 slot", "one \"host slots=N\" per line"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("gorun help hosts: exit %d, lacks %q", code, want)
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

// The tuning variables that every rank must agree on reach every rank
// (remote ones get only what envPairs returns), and -x still overrides them.
func TestTuningEnvForwarded(t *testing.T) {
	t.Setenv("GORUN_ALLREDUCE_ALGORITHMS", "ring")
	t.Setenv("GORUN_SHM", "0")
	got, err := runFlags{env: []string{"GORUN_SHM=1", "FOO=bar"}}.envPairs()
	if err != nil {
		t.Fatal(err)
	}
	got = slices.DeleteFunc(got, func(e string) bool { // tuning the test's own environment may carry
		return !strings.HasPrefix(e, "GORUN_ALLREDUCE_ALGORITHMS=") && !strings.HasPrefix(e, "GORUN_SHM=") && !strings.HasPrefix(e, "FOO=")
	})
	want := []string{"GORUN_ALLREDUCE_ALGORITHMS=ring", "GORUN_SHM=0", "GORUN_SHM=1", "FOO=bar"}
	if !slices.Equal(got, want) {
		t.Fatalf("envPairs = %q, want %q (later entries win)", got, want)
	}
}

func TestBindToFlag(t *testing.T) {
	t.Setenv("GORUN_CPU_BIND", "auto")
	got, err := runFlags{bindTo: "none"}.envPairs()
	if err != nil {
		t.Fatal(err)
	}
	got = slices.DeleteFunc(got, func(e string) bool { return !strings.HasPrefix(e, "GORUN_CPU_BIND=") })
	if want := []string{"GORUN_CPU_BIND=auto", "GORUN_CPU_BIND=none"}; !slices.Equal(got, want) {
		t.Fatalf("envPairs = %q, want %q (the flag after gorun's environment: it wins)", got, want)
	}
	if _, err := (runFlags{bindTo: "socket"}).envPairs(); err == nil || !strings.Contains(err.Error(), `--bind-to "socket": want auto or none`) {
		t.Fatalf("--bind-to socket: err = %v", err)
	}
}
