package e2e

import (
	"cmp"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/testenv/netns"
)

// BenchmarkHierarchicalSlowLink compares the flat ring allreduce with the
// hierarchical one (ring/hierarchical.go) on 2 namespace hosts x 2 ranks
// whose links are shaped to 1 Gbit/s with tc tbf (both ends of each host's
// veth, as scripts/slowlink.sh does), so that intra-host traffic (loopback)
// is fast and cross-host traffic is slow, as on a real cluster.
//
// It runs gorun -H h0:2,h1:2 <gorun> bench-worker (what gorun bench runs on
// every rank) with GORUN_ALLREDUCE_ALGORITHMS=ring, then =hierarchical, in
// interleaved rounds, and reports the median over the rounds of bench's
// median time per op at each size. It then measures the bytes that left
// the hosts per op (tx_bytes of both hosts' eth0, over a run of a few ops
// at one size, minus a run of the same shape with 4-byte ops: what ssh and
// the rendezvous cost), next to the payload the schedule should move.
//
// Run as root (it skips without network namespaces), on a quiet machine:
//
//	go test -run '^$' -bench HierarchicalSlowLink -benchtime 1x ./e2e/
//
// GORUN_HIER_SIZES (default 64K,256K,512K,1M,4M,16M,64M), GORUN_HIER_BYTES_SIZES
// (default 1M,16M,64M), GORUN_HIER_ROUNDS (default 3), GORUN_HIER_ITERS
// (default 5), GORUN_HIER_RATE (default 1gbit; none: no shaping) and
// GORUN_HIER_ALGOS (default ring,hierarchical; e.g. add scatter-gather)
// change the run.
func BenchmarkHierarchicalSlowLink(b *testing.B) {
	if why := netns.Unavailable(); why != "" {
		b.Skip(why)
	}
	sizes := envOr("GORUN_HIER_SIZES", "64K,256K,512K,1M,4M,16M,64M")
	byteSizes := strings.FieldsFunc(envOr("GORUN_HIER_BYTES_SIZES", "1M,16M,64M"), func(r rune) bool { return r == ',' })
	rounds, _ := strconv.Atoi(envOr("GORUN_HIER_ROUNDS", "3"))
	iters := envOr("GORUN_HIER_ITERS", "5")
	rate := envOr("GORUN_HIER_RATE", "1gbit")
	algos := strings.Split(envOr("GORUN_HIER_ALGOS", "ring,hierarchical"), ",")
	if !slices.Contains(algos, "ring") || !slices.Contains(algos, "hierarchical") {
		b.Fatalf("GORUN_HIER_ALGOS=%s: want ring and hierarchical among them", strings.Join(algos, ","))
	}

	cl := netns.New(b, 2)
	if rate != "none" {
		hierShape(b, cl, rate)
	}
	b.ResetTimer()

	// times[algo][bytes] = per-round medians (seconds)
	times := map[string]map[int64][]float64{}
	chosen := map[int64]string{}
	for _, a := range algos {
		times[a] = map[int64][]float64{}
	}
	for round := range rounds {
		for _, a := range algos {
			if round%2 == 1 { // alternate which goes first
				a = algos[len(algos)-1-slices.Index(algos, a)]
			}
			for _, r := range hierBenchRun(b, cl, a, sizes, iters) {
				times[a][r.Bytes] = append(times[a][r.Bytes], r.TimeUS/1e6)
			}
		}
	}
	// What the default policy picks on this layout (Config.Hosts wired
	// from the peers' host ids), and that it runs.
	for _, r := range hierBenchRun(b, cl, "", sizes, "1") {
		chosen[r.Bytes] = r.Algorithm
	}

	// Bytes that left the hosts per op (an empty GORUN_HIER_BYTES_SIZES
	// skips this).
	const byteIters = 3
	ops := byteIters + 1 // + one warmup
	base := map[string]int64{}
	byteAlgos := []string{"ring", "hierarchical"}
	for _, a := range byteAlgos {
		if len(byteSizes) > 0 {
			base[a] = hierTxRun(b, cl, a, "4", strconv.Itoa(byteIters))
		}
	}
	crossed := map[string]map[int64]float64{}
	for _, a := range byteAlgos {
		crossed[a] = map[int64]float64{}
		for _, s := range byteSizes {
			tx := hierTxRun(b, cl, a, s, strconv.Itoa(byteIters))
			n, err := parseSize(s)
			if err != nil {
				b.Fatal(err)
			}
			crossed[a][n] = float64(tx-base[a]) / float64(ops)
		}
	}
	b.StopTimer()

	var all []int64
	for n := range times["ring"] {
		all = append(all, n)
	}
	slices.Sort(all)
	var t strings.Builder
	fmt.Fprintf(&t, "\nAllreduce on 2 hosts x 2 ranks, links shaped to %s (tc tbf), float32 Sum, median of %d rounds of bench's median of %s iterations\n", rate, rounds, iters)
	fmt.Fprintf(&t, "%10s", "bytes")
	for _, a := range algos {
		fmt.Fprintf(&t, " %16s", a+" ms")
	}
	fmt.Fprintf(&t, " %13s %s\n", "ring/hier.", "default picks")
	for _, n := range all {
		fmt.Fprintf(&t, "%10s", hierHuman(n))
		for _, a := range algos {
			fmt.Fprintf(&t, " %16.2f", hierMedian(times[a][n])*1e3)
		}
		rg, hi := hierMedian(times["ring"][n]), hierMedian(times["hierarchical"][n])
		fmt.Fprintf(&t, " %12.2fx %s\n", rg/hi, chosen[n])
	}
	if len(byteSizes) > 0 {
		hierBytesTable(&t, byteSizes, crossed)
	}
	fmt.Print(t.String())
	for _, n := range all {
		b.ReportMetric(hierMedian(times["ring"][n])/hierMedian(times["hierarchical"][n]), "speedup-"+hierHuman(n))
	}
}

func hierBytesTable(t *strings.Builder, byteSizes []string, crossed map[string]map[int64]float64) {
	fmt.Fprintf(t, "\nBytes that left the hosts per op (tx of both hosts' eth0: payload + TCP/IP/TLS framing), and the schedule's payload\n")
	fmt.Fprintf(t, "%10s %16s %16s %16s %16s\n", "bytes", "ring measured", "ring payload", "hier. measured", "hier. payload")
	for _, s := range byteSizes {
		n, _ := parseSize(s)
		// Flat ring 0-1-2-3: links 1->2 and 3->0 cross, 2(N-1)/N*S each;
		// hierarchical: each host sends 2(H-1)/H*S = S.
		fmt.Fprintf(t, "%10s %16.0f %16d %16.0f %16d\n", hierHuman(n), crossed["ring"][n], 3*n, crossed["hierarchical"][n], 2*n)
	}
}

// hierGorun runs bench-worker on both hosts (2 ranks each) with policy algo
// ("" for the default) and returns its output.
func hierGorun(b *testing.B, cl *netns.Cluster, algo, sizes, iters string) string {
	b.Helper()
	var env []string
	if algo != "" {
		env = []string{"GORUN_ALLREDUCE_ALGORITHMS=" + algo}
	}
	return linkGorun(b, cl, env, "", "--sizes", sizes, "--iters", iters, "--warmup", "1", "--json")
}

func hierBenchRun(b *testing.B, cl *netns.Cluster, algo, sizes, iters string) []benchRow {
	b.Helper()
	return benchRows(b, hierGorun(b, cl, algo, sizes, iters), cmp.Or(algo, "the default policy"), algo)
}

// hierTxRun runs one size and returns the bytes both hosts sent on eth0.
func hierTxRun(b *testing.B, cl *netns.Cluster, algo, size, iters string) int64 {
	b.Helper()
	before := hierTx(b, cl)
	hierGorun(b, cl, algo, size, iters)
	return hierTx(b, cl) - before
}

func hierTx(b *testing.B, cl *netns.Cluster) int64 {
	b.Helper()
	var sum int64
	for _, h := range cl.Hosts {
		out, err := cl.Command(h, "cat", "/sys/class/net/eth0/statistics/tx_bytes").Output()
		if err != nil {
			b.Fatalf("tx_bytes of %s: %v", h.NS, err)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		sum += n
	}
	return sum
}

// hierShape shapes both ends of every host's veth to rate: eth0 in the host
// (its uplink) and its peer in the switch namespace (its downlink). The
// names follow internal/testenv/netns: host i is <id>h<i> with eth0, its peer
// <id>b<i> in <id>sw. The namespaces go with the cluster, and the qdiscs
// with them.
func hierShape(tb testing.TB, cl *netns.Cluster, rate string) {
	tb.Helper()
	id := strings.TrimSuffix(cl.Hosts[0].NS, "h0")
	tbf := []string{"root", "tbf", "rate", rate, "burst", "256kb", "latency", "50ms"}
	for i, h := range cl.Hosts {
		for _, args := range [][]string{
			append([]string{"-n", h.NS, "qdisc", "add", "dev", "eth0"}, tbf...),
			append([]string{"-n", id + "sw", "qdisc", "add", "dev", id + "b" + strconv.Itoa(i)}, tbf...),
		} {
			if out, err := exec.Command("tc", args...).CombinedOutput(); err != nil {
				tb.Fatalf("tc %s: %v: %s", strings.Join(args, " "), err, out)
			}
		}
	}
}

func hierMedian(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func hierHuman(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dM", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dK", n>>10)
	}
	return strconv.FormatInt(n, 10)
}

// parseSize reads 4, 64K, 16M.
func parseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "K"):
		mult, s = 1<<10, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n * mult, err
}
