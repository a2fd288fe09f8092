package e2e

import (
	"bufio"
	"encoding/json"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/bench"
)

// gorun bench --compression int8: a size below the compression threshold
// travels uncompressed, and the report says so instead of "ratio 0.0000".
func TestBenchCompressionBelowThreshold(t *testing.T) {
	stdout, stderr, code := run(t, nil, gorunBin, "bench", "-np", "2", "--sizes", "4,256K", "--iters", "3", "--compression", "int8")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	t.Logf("table:\n%s", stdout)
	// The title, then what the ranks chose ("# ..." lines), the header
	// and the rows.
	var lines []string
	for i, l := range strings.Split(strings.TrimSpace(stdout), "\n") {
		if i == 0 || !strings.HasPrefix(l, "# ") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 4 {
		t.Fatalf("want a title, a header and 2 rows:\n%s", stdout)
	}
	if !strings.Contains(stdout, "\n# int8 compression from 64 KiB\n") {
		t.Errorf("the table does not say from which size int8 compresses:\n%s", stdout)
	}
	small, large := strings.Fields(lines[2]), strings.Fields(lines[3])
	// Columns: bytes size iters time_us algbw busbw correct wire_bytes ratio rel_error codec.
	if small[0] != "4" || small[8] != "1.0000" || !strings.HasSuffix(lines[2], "none (below threshold 64 KiB)") {
		t.Errorf("row of 4 bytes: %q; want it shown uncompressed", lines[2])
	}
	if large[0] != "262144" || large[len(large)-1] != "int8" {
		t.Errorf("row of 256 KiB: %q; want it compressed with int8", lines[3])
	}

	stdout, stderr, code = run(t, nil, gorunBin, "bench", "-np", "2", "--sizes", "4,256K", "--iters", "3", "--compression", "int8", "--json")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	// Decoded as maps, not bench.Results: the field names are the interface.
	var got []map[string]any
	sc := bufio.NewScanner(strings.NewReader(stdout))
	for sc.Scan() {
		var r map[string]any
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("line %q is not JSON: %v", sc.Text(), err)
		}
		got = append(got, r)
	}
	if len(got) != 2 {
		t.Fatalf("want 2 results:\n%s", stdout)
	}
	if r := got[0]; r["compression"] != "none" || r["compression_note"] != "below threshold 64 KiB" || r["wire_ratio"] != 1.0 || r["wire_bytes"] == nil {
		t.Errorf("4 bytes: %v; want compression none, below threshold 64 KiB, ratio 1", r)
	}
	if ratio, _ := got[1]["wire_ratio"].(float64); got[1]["compression"] != "int8" || got[1]["compression_note"] != nil || ratio <= 0.2 || ratio >= 0.35 {
		t.Errorf("256 KiB: %v; want int8 at a ratio of about 0.27", got[1])
	}
}

// gorun bench --json: a JSON line per size, with the algorithm ring's
// policy picks and a bus bandwidth that follows from the algorithm
// bandwidth.
func TestBenchJSON(t *testing.T) {
	out, errOut, code := run(t, nil, gorunBin, "bench", "-np", "3", "--sizes", "4,1K,1M", "--iters", "5", "--json")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	var got []bench.Result
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var r bench.Result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("line %q is not JSON: %v", sc.Text(), err)
		}
		got = append(got, r)
	}
	if len(got) != 3 {
		t.Fatalf("want 3 results, got %d:\n%s", len(got), out)
	}
	// The algorithms are ring's defaults for 3 ranks on shared memory
	// (ring/policy.go): direct up to 4 KiB, Rabenseifner up to 4 MiB.
	algos := []string{"direct", "direct", "rabenseifner"}
	for i, want := range []int64{4, 1024, 1 << 20} {
		r := got[i]
		if r.Bytes != want || !r.Correct || r.NP != 3 || r.Op != "allreduce" || r.Iters != 5 || r.TimeUS <= 0 || r.BusBWGBps <= 0 {
			t.Errorf("result %d: %+v", i, r)
		}
		if r.Algorithm != algos[i] {
			t.Errorf("result %d (%d bytes): algorithm %q, want %q", i, r.Bytes, r.Algorithm, algos[i])
		}
		if bus := r.AlgBWGBps * 4 / 3; r.BusBWGBps < bus*0.99-0.001 || r.BusBWGBps > bus*1.01+0.001 {
			t.Errorf("busbw %v is not algbw %v * 2(N-1)/N", r.BusBWGBps, r.AlgBWGBps)
		}
	}
}
