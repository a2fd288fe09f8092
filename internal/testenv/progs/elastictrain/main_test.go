package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

var finalRE = regexp.MustCompile(`(?m)^final rank=\S+ (params=\S+ samples=\S+ dup=\d+ miss=\d+ steps=\d+)`)

// capture runs f with say's output captured and returns the final line's
// result part.
func capture(t *testing.T, f func() error) (string, string) {
	t.Helper()
	var buf bytes.Buffer
	old := stdout
	stdout = &buf
	defer func() { stdout = old }()
	if err := f(); err != nil {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	m := finalRE.FindStringSubmatch(buf.String())
	if m == nil {
		t.Fatalf("no final line:\n%s", buf.String())
	}
	return m[1], buf.String()
}

// Without gorun the program is a one-rank job: it must end where
// -reference ends, and so must a run resumed from its own checkpoints.
func TestOneProcessMatchesReference(t *testing.T) {
	o := options{epochs: 2, length: 64, batch: 8, seed: 42, gateStep: -1, ckptEvery: 3}
	ref, _ := capture(t, func() error { return reference(o) })
	if !strings.Contains(ref, "samples=64,64 dup=0 miss=0 steps=16") {
		t.Fatalf("reference: %s", ref)
	}
	got, _ := capture(t, func() error { return train(o) })
	if got != ref {
		t.Errorf("one process: %s\nreference:   %s", got, ref)
	}
	o.ckptDir = t.TempDir()
	if got, _ = capture(t, func() error { return train(o) }); got != ref {
		t.Errorf("with checkpoints: %s\nreference:        %s", got, ref)
	}
	// Resumed from the last checkpoint (step 15): one step to go.
	got, out := capture(t, func() error { return train(o) })
	if got != ref || !strings.Contains(out, "restored step 15") {
		t.Errorf("resumed: %s\nreference: %s\noutput:\n%s", got, ref, out)
	}
}
