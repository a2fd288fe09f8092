package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestSimTable: gorun sim prints one row per layout, size and bandwidth,
// with the policy's choice and every algorithm's time, the same on every
// run.
func TestSimTable(t *testing.T) {
	run := func() string {
		cmd := newSimCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs([]string{"--layouts", "4/2,8/8", "--sizes", "4K,1M", "--gbps", "10"})
		if err := cmd.Execute(); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	first := run()
	rows := 0
	for _, l := range strings.Split(first, "\n") {
		if strings.HasPrefix(l, "| 4 | 2 |") || strings.HasPrefix(l, "| 8 | 8 |") {
			rows++
		}
	}
	if rows != 4 {
		t.Fatalf("%d rows, want 4:\n%s", rows, first)
	}
	for _, want := range []string{"| 4 | 2 | 1 MiB | 10 | rabenseifner |", "| 8 | 8 | 4 KiB | 10 | recursive-doubling |", "| - |"} {
		if !strings.Contains(first, want) {
			t.Errorf("no %q in\n%s", want, first)
		}
	}
	if again := run(); again != first {
		t.Errorf("a second run printed another table:\n%s\nthen\n%s", first, again)
	}
}
