package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/ringsim"
	"github.com/gorun/gorun/internal/testenv/netns"
	"github.com/gorun/gorun/ring"
)

// BenchmarkSimulatorValidation compares the allreduce simulator
// (internal/ringsim, gorun sim) with gorun itself on network-namespace
// hosts whose links are shaped with tc tbf (both ends of each host's veth,
// as BenchmarkHierarchicalSlowLink does), for layouts of up to 16 ranks.
//
// Method: the links' token-bucket burst is tbf's (hierShape). The model's
// two other figures between hosts are fitted on the smallest
// layout, 2 hosts of one rank: α is the time of a 4-byte allreduce there
// (one exchange), the bandwidth the one at which the simulated ring
// allreduce of the largest size takes as long as the measured one. With
// them (and the model's default figures within a host) the simulator
// predicts every other layout, algorithm and size, which gorun -H ...
// bench-worker measures: the median over interleaved rounds of bench's
// median time per op. The table gives both and their ratio.
//
// Run as root (it skips without network namespaces), on a quiet machine:
//
//	go test -run '^$' -bench SimulatorValidation -benchtime 1x -timeout 60m ./e2e/
//
// The links are slow (200 Mbit/s) because the model has no CPU, and the
// namespace hosts share this machine's 2 cores: at 1 Gbit/s, jobs of 4 to
// 16 ranks were bound by the cores, 20–30 % slower than their links
// allowed, while the 2-rank fit was not (BENCHMARKS.md, "Simulator").
//
// GORUN_SIMVAL_LAYOUTS (RANKS/HOSTS, default 4/2,8/4,8/2,16/4),
// GORUN_SIMVAL_SIZES (default 1M,4M,16M), GORUN_SIMVAL_ALGOS (default
// ring,rabenseifner,hierarchical), GORUN_SIMVAL_RATE (default 200mbit),
// GORUN_SIMVAL_QUEUE (tbf's latency, default 50ms), GORUN_SIMVAL_ROUNDS
// (default 3) and GORUN_SIMVAL_ITERS (default 5) change the run.
func BenchmarkSimulatorValidation(b *testing.B) {
	if why := netns.Unavailable(); why != "" {
		b.Skip(why)
	}
	var layouts []ringsim.Layout
	for _, s := range strings.Split(envOr("GORUN_SIMVAL_LAYOUTS", "4/2,8/4,8/2,16/4"), ",") {
		lay, err := ringsim.ParseLayout(s)
		if err != nil || lay.Size() > 16 {
			b.Fatalf("GORUN_SIMVAL_LAYOUTS: %q: %v (at most 16 ranks)", s, err)
		}
		layouts = append(layouts, lay)
	}
	sizes := envOr("GORUN_SIMVAL_SIZES", "1M,4M,16M")
	algos := strings.Split(envOr("GORUN_SIMVAL_ALGOS", "ring,rabenseifner,hierarchical"), ",")
	rate := envOr("GORUN_SIMVAL_RATE", "200mbit")
	queue := envOr("GORUN_SIMVAL_QUEUE", "50ms")
	rounds, _ := strconv.Atoi(envOr("GORUN_SIMVAL_ROUNDS", "3"))
	iters := envOr("GORUN_SIMVAL_ITERS", "5")
	var largest int64
	for _, s := range strings.Split(sizes, ",") {
		n, err := parseSize(s)
		if err != nil {
			b.Fatal(err)
		}
		largest = max(largest, n)
	}
	hosts := 2
	for _, l := range layouts {
		hosts = max(hosts, l.Hosts)
	}
	nominal, err := tbfRate(rate)
	if err != nil {
		b.Fatal(err)
	}

	cl := netns.New(b, hosts)
	simvalShape(b, cl, rate, queue)
	b.ResetTimer()

	// Fit α and the bandwidth on 2 hosts × 1 rank.
	calib := ringsim.Layout{Hosts: 2, RanksPerHost: 1}
	var lat, ringLarge []float64
	for range rounds {
		for _, r := range simvalRun(b, cl, calib, "", "4", iters) {
			lat = append(lat, r.TimeUS/1e6)
		}
		for _, r := range simvalRun(b, cl, calib, "ring", strconv.FormatInt(largest, 10), iters) {
			ringLarge = append(ringLarge, r.TimeUS/1e6)
		}
	}
	nw := ringsim.DefaultNetwork(nominal)
	nw.Latency = time.Duration(hierMedian(lat) * 1e9)
	nw.Burst = simvalBurst
	measuredLarge := hierMedian(ringLarge)
	for range 3 { // the time is α plus bytes over the bandwidth: converges at once
		sim := simvalSimulate(b, calib, nw, ring.AlgoRing, largest).Seconds()
		nw.Bandwidth *= (sim - nw.Latency.Seconds()) / (measuredLarge - nw.Latency.Seconds())
	}

	// Measure every layout, in interleaved rounds.
	type key struct {
		lay   ringsim.Layout
		algo  string
		bytes int64
	}
	times := map[key][]float64{}
	for round := range rounds {
		for _, lay := range layouts {
			order := slices.Clone(algos)
			if round%2 == 1 {
				slices.Reverse(order)
			}
			for _, a := range order {
				if a == "hierarchical" && lay.RanksPerHost == 1 {
					continue
				}
				for _, r := range simvalRun(b, cl, lay, a, sizes, iters) {
					k := key{lay, a, r.Bytes}
					times[k] = append(times[k], r.TimeUS/1e6)
				}
			}
		}
	}
	b.StopTimer()

	var t strings.Builder
	fmt.Fprintf(&t, "\nSimulator against gorun on namespace hosts, links shaped to %s (tc tbf, queue %s), float32 Sum allreduce, median of %d rounds of bench's median of %s iterations\n", rate, queue, rounds, iters)
	fmt.Fprintf(&t, "Fitted on 2 hosts × 1 rank: α = %v (4-byte allreduce), bandwidth %.3g Gbit/s (ring allreduce of %s: %.1f ms); nominal %.3g Gbit/s, burst %d KiB\n\n",
		nw.Latency.Round(time.Microsecond), nw.Bandwidth/1e9, hierHuman(largest), measuredLarge*1e3, nominal/1e9, nw.Burst>>10)
	fmt.Fprintf(&t, "| ranks | hosts | algorithm | bytes | measured ms | simulated ms | simulated ÷ measured |\n|---|---|---|---|---|---|---|\n")
	var worst float64
	keys := make([]key, 0, len(times))
	for k := range times {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b key) int {
		switch {
		case a.lay.Size() != b.lay.Size():
			return a.lay.Size() - b.lay.Size()
		case a.lay.Hosts != b.lay.Hosts:
			return a.lay.Hosts - b.lay.Hosts
		case a.algo != b.algo:
			return strings.Compare(a.algo, b.algo)
		}
		return int(a.bytes - b.bytes)
	})
	for _, k := range keys {
		a, err := ring.ParseAlgorithm(k.algo)
		if err != nil {
			b.Fatal(err)
		}
		meas := hierMedian(times[k])
		sim := simvalSimulate(b, k.lay, nw, a, k.bytes).Seconds()
		ratio := sim / meas
		worst = max(worst, max(ratio, 1/ratio))
		fmt.Fprintf(&t, "| %d | %d | %s | %s | %.2f | %.2f | %.2f |\n", k.lay.Size(), k.lay.Hosts, k.algo, hierHuman(k.bytes), meas*1e3, sim*1e3, ratio)
	}
	fmt.Fprintf(&t, "\nLargest deviation: %.0f %%\n", (worst-1)*100)
	fmt.Print(t.String())
	b.ReportMetric((worst-1)*100, "worst-%")
}

// simvalBurst is the token bucket of the shaped links, in bytes.
const simvalBurst = 256 << 10

// simvalShape shapes both ends of every host's veth to rate, as
// hierShape does, with a queue of latency (tbf drops what would wait
// longer).
func simvalShape(b *testing.B, cl *netns.Cluster, rate, latency string) {
	b.Helper()
	id := strings.TrimSuffix(cl.Hosts[0].NS, "h0")
	tbf := []string{"root", "tbf", "rate", rate, "burst", strconv.Itoa(simvalBurst), "latency", latency}
	for i, h := range cl.Hosts {
		for _, args := range [][]string{
			append([]string{"-n", h.NS, "qdisc", "add", "dev", "eth0"}, tbf...),
			append([]string{"-n", id + "sw", "qdisc", "add", "dev", id + "b" + strconv.Itoa(i)}, tbf...),
		} {
			if out, err := exec.Command("tc", args...).CombinedOutput(); err != nil {
				b.Fatalf("tc %s: %v: %s", strings.Join(args, " "), err, out)
			}
		}
	}
}

// simvalRun runs bench-worker on lay's hosts of cl with policy algo (""
// for the default) and returns its results, each checked.
func simvalRun(b *testing.B, cl *netns.Cluster, lay ringsim.Layout, algo, sizes, iters string) []benchRow {
	b.Helper()
	var hs []string
	for _, h := range cl.Hosts[:lay.Hosts] {
		hs = append(hs, fmt.Sprintf("%s:%d", h.IP, lay.RanksPerHost))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := cl.CommandContext(ctx, cl.Hosts[0], gorunBin, "--ssh-identity-file", cl.Key, "-H", strings.Join(hs, ","),
		"-x", "GORUN_ALLREDUCE_ALGORITHMS="+algo,
		gorunBin, "bench-worker", "--sizes", sizes, "--iters", iters, "--warmup", "1", "--json")
	cmd.Env = append(os.Environ(), "GORUN_SSH_OPTS="+cl.SSHOpts())
	var o, e syncBuf
	cmd.Stdout, cmd.Stderr = &o, &e
	if err := cmd.Run(); err != nil {
		b.Fatalf("gorun on %v (%s, %s): %v\nstdout:\n%s\nstderr:\n%s", lay, algo, sizes, err, o.String(), e.String())
	}
	return benchRows(b, o.String(), fmt.Sprintf("%v, %s", lay, algo), algo)
}

func simvalSimulate(b *testing.B, lay ringsim.Layout, nw ringsim.Network, a ring.Algorithm, bytes int64) ringsim.Time {
	b.Helper()
	res, err := ringsim.Simulate(context.Background(), ringsim.Allreduce{Layout: lay, Network: nw, Bytes: bytes, Algorithm: a, Memory: 2 << 30})
	if err != nil {
		b.Fatal(err)
	}
	return res.Time
}

// tbfRate reads a tc rate such as 1gbit, 500mbit or 10gbit, in bits/s.
func tbfRate(s string) (float64, error) {
	for _, u := range []struct {
		suffix string
		mult   float64
	}{{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}} {
		if v, ok := strings.CutSuffix(strings.ToLower(s), u.suffix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil && f > 0 {
				return f * u.mult, nil
			}
		}
	}
	return 0, fmt.Errorf("rate %q: want e.g. 1gbit or 500mbit", s)
}
