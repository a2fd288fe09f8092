package main

import (
	"slices"
	"strings"
	"testing"
)

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
