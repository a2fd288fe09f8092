package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkManyRanksStart starts jobs of many ranks on this host and times
// them: from gorun's launch until every rank's first allreduce (4 MiB of
// float32, Sum, its result checked by every rank) returned, and until gorun
// exited after a second one. Every rank links to every other, over shared
// memory, so the setup grows as the square of the ranks: 256 ranks set up
// 65280 links.
//
// It is a benchmark, not a test: 256 ranks on a machine of 2 cores take
// about a minute and 8 GiB of shared memory (p2p's shmRingBytes), too much
// to run beside the other tests. As one, on a quiet machine:
//
//	go test -run '^$' -bench ManyRanksStart -benchtime 1x -timeout 30m ./e2e/
//
// GORUN_MANY_RANKS (default 8,32,64,128,256) and GORUN_MANY_RANKS_ROUNDS
// (default 1) change the run.
func BenchmarkManyRanksStart(b *testing.B) {
	nps := os.Getenv("GORUN_MANY_RANKS")
	if nps == "" {
		nps = "8,32,64,128,256"
	}
	rounds, _ := strconv.Atoi(os.Getenv("GORUN_MANY_RANKS_ROUNDS"))
	rounds = max(rounds, 1)
	type timing struct{ start, total []float64 }
	var order []int
	times := map[int]*timing{}
	for _, s := range strings.Split(nps, ",") {
		np, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || np < 1 {
			b.Fatalf("GORUN_MANY_RANKS: %q is not a number of ranks", s)
		}
		order = append(order, np)
		times[np] = &timing{}
	}
	b.ResetTimer()
	for range rounds {
		for _, np := range order {
			start, total := manyRanksRun(b, np)
			times[np].start = append(times[np].start, start)
			times[np].total = append(times[np].total, total)
		}
	}
	b.StopTimer()
	var t strings.Builder
	fmt.Fprintf(&t, "\nJobs of N ranks on this host (%d round(s), median): gorun's launch until every rank's first 4 MiB allreduce returned, and until gorun exited after a second one\n\n", rounds)
	fmt.Fprintf(&t, "| ranks | links | start s | whole job s |\n|---|---|---|---|\n")
	for _, np := range order {
		fmt.Fprintf(&t, "| %d | %d | %.1f | %.1f |\n", np, np*(np-1), hierMedian(times[np].start), hierMedian(times[np].total))
		b.ReportMetric(hierMedian(times[np].start), fmt.Sprintf("start-s-np%d", np))
	}
	fmt.Print(t.String())
}

var firstAllreduceDone = regexp.MustCompile(`rank (\d+) first allreduce done at (\d+)`)

// manyRanksRun runs one job of np testprog ranks on this host making two
// allreduces and returns, in seconds, when the last rank's first allreduce
// returned and when gorun exited, both from its launch.
func manyRanksRun(b *testing.B, np int) (start, total float64) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gorunBin, "-np", strconv.Itoa(np), testprogBin)
	cmd.Env = append(os.Environ(), "TESTPROG_MODE=ok", "TESTPROG_ITERS=2", "TESTPROG_STAMP=1")
	return manyRanksTimes(b, np, cmd)
}

// manyRanksTimes runs cmd, gorun with np testprog ranks making two
// allreduces, checks that each was ok, and returns, in seconds, when the
// last rank's first allreduce returned and when gorun exited, both from
// its launch.
func manyRanksTimes(b *testing.B, np int, cmd *exec.Cmd) (start, total float64) {
	b.Helper()
	var o, e syncBuf
	cmd.Stdout, cmd.Stderr = &o, &e
	launch := time.Now()
	if err := cmd.Run(); err != nil {
		b.Fatalf("gorun with %d ranks: %v\nstderr:\n%s", np, err, tail(e.String(), 40))
	}
	total = time.Since(launch).Seconds()
	ms := firstAllreduceDone.FindAllStringSubmatch(o.String(), -1)
	seen := map[string]bool{}
	var last int64
	for _, m := range ms {
		seen[m[1]] = true
		at, _ := strconv.ParseInt(m[2], 10, 64)
		last = max(last, at)
	}
	if len(seen) != np || strings.Count(o.String(), " ok") != np {
		b.Fatalf("gorun with %d ranks: %d ranks reported their first allreduce, %d were ok; want %d\nstdout:\n%s", np, len(seen), strings.Count(o.String(), " ok"), np, tail(o.String(), 40))
	}
	return time.Unix(0, last).Sub(launch).Seconds(), total
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
