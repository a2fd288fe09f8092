package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv/netns"
)

// BenchmarkManyRanksHosts starts jobs of many ranks across network
// namespace hosts (internal/testenv/netns: veth to one switch, gorun
// starting each host's ranks over ssh) and times them as
// BenchmarkManyRanksStart does: from gorun's launch until every rank's
// first allreduce (4 MiB of float32, Sum, its result checked by every
// rank) returned, and until gorun exited after a second one. The ranks of
// a host link over shared memory, those of different hosts over TCP with
// TLS. All the hosts share this machine's cores, so the figures say how
// the setup grows with the job, not how fast a real cluster starts.
//
//	go test -run '^$' -bench ManyRanksHosts -benchtime 1x -timeout 30m ./e2e/
//
// GORUN_MANY_HOSTS (default 2x8,4x8,8x8: hosts x ranks per host) and
// GORUN_MANY_RANKS_ROUNDS (default 1) change the run.
func BenchmarkManyRanksHosts(b *testing.B) {
	spec := os.Getenv("GORUN_MANY_HOSTS")
	if spec == "" {
		spec = "2x8,4x8,8x8"
	}
	rounds, _ := strconv.Atoi(os.Getenv("GORUN_MANY_RANKS_ROUNDS"))
	rounds = max(rounds, 1)
	type layout struct{ hosts, perHost int }
	var order []layout
	most := 0
	for _, s := range strings.Split(spec, ",") {
		h, p, ok := strings.Cut(strings.TrimSpace(s), "x")
		hosts, err1 := strconv.Atoi(h)
		perHost, err2 := strconv.Atoi(p)
		if !ok || err1 != nil || err2 != nil || hosts < 1 || perHost < 1 {
			b.Fatalf("GORUN_MANY_HOSTS: %q is not HOSTSxRANKS (e.g. 8x8)", s)
		}
		order = append(order, layout{hosts, perHost})
		most = max(most, hosts)
	}
	cl := netns.New(b, most)
	starts, totals := map[layout][]float64{}, map[layout][]float64{}
	b.ResetTimer()
	for range rounds {
		for _, l := range order {
			start, total := manyHostsRun(b, cl, l.hosts, l.perHost)
			starts[l] = append(starts[l], start)
			totals[l] = append(totals[l], total)
		}
	}
	b.StopTimer()
	var t strings.Builder
	fmt.Fprintf(&t, "\nJobs across namespace hosts (%d round(s), median): gorun's launch until every rank's first 4 MiB allreduce returned, and until gorun exited after a second one\n\n", rounds)
	fmt.Fprintf(&t, "| hosts | ranks per host | ranks | start s | whole job s |\n|---|---|---|---|---|\n")
	for _, l := range order {
		np := l.hosts * l.perHost
		fmt.Fprintf(&t, "| %d | %d | %d | %.1f | %.1f |\n", l.hosts, l.perHost, np, hierMedian(starts[l]), hierMedian(totals[l]))
		b.ReportMetric(hierMedian(starts[l]), fmt.Sprintf("start-s-%dx%d", l.hosts, l.perHost))
	}
	fmt.Print(t.String())
}

// manyHostsRun runs one job of perHost testprog ranks on each of the first
// hosts hosts of cl, started by gorun on the first, and returns its times
// (manyRanksTimes).
func manyHostsRun(b *testing.B, cl *netns.Cluster, hosts, perHost int) (start, total float64) {
	b.Helper()
	var hs []string
	for _, h := range cl.Hosts[:hosts] {
		hs = append(hs, fmt.Sprintf("%s:%d", h.IP, perHost))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := cl.CommandContext(ctx, cl.Hosts[0], gorunBin, "--ssh-identity-file", cl.Key, "-H", strings.Join(hs, ","),
		"-x", "TESTPROG_MODE=ok", "-x", "TESTPROG_ITERS=2", "-x", "TESTPROG_STAMP=1", testprogBin)
	cmd.Env = append(os.Environ(), "GORUN_SSH_OPTS="+cl.SSHOpts())
	return manyRanksTimes(b, hosts*perHost, cmd)
}
