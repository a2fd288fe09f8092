package bench

import (
	"context"
	"strings"
	"testing"

	"github.com/gorun/gorun/collective"
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
