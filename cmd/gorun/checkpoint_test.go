package main

import (
	"testing"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/launcher"
)

func TestCheckpointHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 5 << 20: "5.0 MiB", 3 << 30: "3.00 GiB"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// A rank and gorun agree on the exit status that means "a restart would
// fail the same way": package checkpoint gives it to rank programs, the
// launcher reads it.
func TestExitNoRestartAgrees(t *testing.T) {
	if checkpoint.ExitNoRestart != launcher.ExitNoRestart {
		t.Fatalf("checkpoint.ExitNoRestart %d, launcher.ExitNoRestart %d", checkpoint.ExitNoRestart, launcher.ExitNoRestart)
	}
}
