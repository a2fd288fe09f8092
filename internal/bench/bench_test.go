package bench

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/compress"
)

func TestParseSizes(t *testing.T) {
	got, err := ParseSizes("4, 1K,1M,64M,2G")
	if err != nil {
		t.Fatal(err)
	}
	want := []int64{4, 1 << 10, 1 << 20, 64 << 20, 2 << 30}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("ParseSizes: %v, want %v", got, want)
		}
	}
	for _, bad := range []string{"", "x", "-4", "0", "1T"} {
		if _, err := ParseSizes(bad); err == nil {
			t.Errorf("ParseSizes(%q) accepted", bad)
		}
	}
}

// The check must catch a wrong element, including in warm-up iterations
// (negative iteration numbers).
func TestCheckCatchesWrongResults(t *testing.T) {
	for _, op := range []string{"allreduce", "broadcast", "allgather", "reducescatter"} {
		for _, it := range []int{-7, 0, 5} {
			// A one-rank job: every op's answer is computable locally.
			c := newCase(op, 40, 1, 0)
			c.fill(it)
			if c.out != nil {
				copy(c.out, c.in)
			}
			if bad := c.check(it); bad != "" {
				t.Fatalf("%s it=%d: correct result rejected: %s", op, it, bad)
			}
			got := c.in
			if c.out != nil {
				got = c.out
			}
			got[17]++
			if bad := c.check(it); !strings.Contains(bad, "element 17") {
				t.Fatalf("%s it=%d: corrupted element not caught (%q)", op, it, bad)
			}
		}
	}
}

func TestRunOneRank(t *testing.T) {
	ctx := context.Background()
	comm, err := collective.Init(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer comm.Close()
	var out strings.Builder
	if err := Run(ctx, comm, Options{Op: "allreduce", Sizes: []int64{4, 4096}, Iters: 3}, true, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], `"bytes":4096`) || !strings.Contains(lines[1], `"correct":true`) {
		t.Fatalf("report:\n%s", out.String())
	}
}

// A size below the compression threshold (the default, 64 KiB) travels
// uncompressed: the report says "none" and why, with ratio 1, in the table
// and in JSON, where it used to show the codec with a ratio of 0.
func TestRunCompressionBelowThreshold(t *testing.T) {
	ctx := context.Background()
	job, err := collective.StartLocal(ctx, 2, collective.WithCompression(compress.Int8()))
	if err != nil {
		t.Fatal(err)
	}
	defer job.Close()
	o := Options{Op: "allreduce", Sizes: []int64{4, 256 << 10}, Iters: 3, Compression: "int8"}
	for _, asJSON := range []bool{false, true} {
		outs := make([]strings.Builder, 2)
		errs := make(chan error, 2)
		for r, comm := range job.Comms {
			go func() { errs <- Run(ctx, comm, o, asJSON, &outs[r]) }()
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		report := outs[0].String()
		t.Logf("%s", report)
		lines := strings.Split(strings.TrimSpace(report), "\n")
		small, large := lines[len(lines)-2], lines[len(lines)-1]
		if asJSON {
			// Decoded as a map, not a Result: the field names are the
			// interface.
			var rs, rl map[string]any
			if err := json.Unmarshal([]byte(small), &rs); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(large), &rl); err != nil {
				t.Fatal(err)
			}
			if rs["compression"] != "none" || rs["compression_note"] != "below threshold 64 KiB" || rs["wire_ratio"] != 1.0 || rs["wire_bytes"] != 4.0 {
				t.Errorf("4 bytes: %v; want none, below threshold 64 KiB, ratio 1, 4 bytes sent (the ring's 2(N-1)/N of 4)", rs)
			}
			if ratio, _ := rl["wire_ratio"].(float64); rl["compression"] != "int8" || rl["compression_note"] != nil || ratio < 0.2 || ratio > 0.35 {
				t.Errorf("256 KiB: %v; want int8 at a ratio near 0.27", rl)
			}
			continue
		}
		if !strings.HasSuffix(small, " 1.0000   0.00e+00  none (below threshold 64 KiB)") {
			t.Errorf("row of 4 bytes: %q; want ratio 1 and none (below threshold 64 KiB)", small)
		}
		if !strings.HasSuffix(large, "  int8") || strings.Contains(large, "below") {
			t.Errorf("row of 256 KiB: %q; want int8", large)
		}
	}
}
