package e2e

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/internal/testenv/netns"
)

// TestBenchAcrossHostsAgrees runs gorun bench -H on 2 namespace hosts of
// 2 ranks whose links are shaped to 1 Gbit/s, plain (with GORUN_AUTOTUNE=1)
// and with int8 compression: the table shows the links the ranks measured
// and the policy they chose from them, every rank reports the same policy
// (after the timed calls) and compression threshold, and every size runs
// (ranks that chose apart would fail the call's fingerprint check).
func TestBenchAcrossHostsAgrees(t *testing.T) {
	cl := netns.New(t, 2)
	hierShape(t, cl, "1gbit")
	h0, h1 := cl.Hosts[0], cl.Hosts[1]
	for _, codec := range []string{"", "int8"} {
		args := []string{"bench", "-H", fmt.Sprintf("%s:2,%s:2", h0.IP, h1.IP), "--sizes", "4,64K,1M,16M",
			"--iters", "3", "--warmup", "1", "--report-policy"}
		if codec != "" {
			args = append(args, "--compression", codec)
		}
		// The plain run also times the schedules (GORUN_AUTOTUNE=1, in
		// gorun's environment: it hands the tuning variables to every
		// rank): the ranks must still agree on every choice.
		cmd, o, e := startGorunIn(cl, h0, nil, args...)
		if codec == "" {
			cmd.Env = append(cmd.Env, collective.EnvAutotune+"=1")
		}
		start := time.Now()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		stdout, stderr, code, took := waitGorun(t, cmd, o, e, start, 3*time.Minute)
		if code != 0 {
			t.Fatalf("gorun %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, stdout, stderr)
		}
		t.Logf("gorun bench -H (compression %q) in %v:\n%s", codec, took.Round(time.Millisecond), stdout)
		for _, re := range []string{
			`(?m)^# links within hosts: latency \S+, [0-9.]+ [GM]B/s \(2 measured\)$`,
			`(?m)^# links between hosts: latency \S+, [0-9.]+ [GM]B/s(, burst \d+ KB)? \(2 measured\)$`,
			`(?m)^# allreduce policy: \S+ \(from the links\)$`,
		} {
			mustMatch(t, re, stdout)
		}
		if codec != "" {
			mustMatch(t, `(?m)^# int8 compression from .+$`, stdout)
		}
		rows := regexp.MustCompile(`(?m)^\s+\d+\s+\S+\s+\d+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+true\s+.+$`).FindAllString(stdout, -1)
		if len(rows) != 4 {
			t.Errorf("%d correct rows, want 4:\n%s", len(rows), stdout)
		}
		policies := regexp.MustCompile(`rank (\d): allreduce policy (.+)`).FindAllStringSubmatch(stderr, -1)
		seen := map[string]bool{}
		var first string
		for _, m := range policies {
			seen[m[1]] = true
			if first == "" {
				first = m[2]
			}
			if m[2] != first {
				t.Errorf("rank %s chose %q, another rank %q", m[1], m[2], first)
			}
		}
		if len(seen) != 4 {
			t.Errorf("policies of %d ranks reported, want 4:\n%s", len(seen), stderr)
		}
	}
	// gorun --verbose: rank 0 says at start what it measured and chose.
	stdout, stderr, code, _ := gorunIn(t, cl, h0, nil, 2*time.Minute, "--verbose", "-H", fmt.Sprintf("%s:2,%s:2", h0.IP, h1.IP),
		gorunBin, "bench-worker", "--sizes", "4", "--iters", "1")
	if code != 0 {
		t.Fatalf("gorun --verbose: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	mustMatch(t, `gorun: rank 0: links: 2 links within hosts: latency .+; 2 between hosts: latency .+; allreduce policy: \S+`, stdout+stderr)
	noneLeft(t, cl)
}

// BenchmarkLinkPolicy compares, on 2 namespace hosts × 2 ranks, the
// allreduce choices made from the measured links with the fixed ones made
// before (the defaults of one host, the hierarchical schedule from 512
// KiB, int8 from 64 KiB), unshaped and with links shaped to 1 Gbit/s (tc
// tbf, as BenchmarkHierarchicalSlowLink). Each round runs gorun -H ...
// bench-worker with the links' choices, then with the fixed ones (the
// order alternating from round to round), fp32 and int8, and it reports
// the median over the rounds of bench's median time per op. Run as root,
// on a quiet machine:
//
//	go test -run '^$' -bench LinkPolicy -benchtime 1x ./e2e/
//
// GORUN_LINK_SIZES (default 4,64K,1M,64M), GORUN_LINK_ROUNDS (3),
// GORUN_LINK_ITERS (5) and GORUN_LINK_RATES (none,1gbit) change the run;
// GORUN_LINK_BASELINE=model compares the links' model's choices (the
// default) with their refinement by timed calls (GORUN_AUTOTUNE=1)
// instead of the fixed choices with the model's.
func BenchmarkLinkPolicy(b *testing.B) {
	if why := netns.Unavailable(); why != "" {
		b.Skip(why)
	}
	sizes := envOr("GORUN_LINK_SIZES", "4,64K,1M,64M")
	rounds, _ := strconv.Atoi(envOr("GORUN_LINK_ROUNDS", "3"))
	iters := envOr("GORUN_LINK_ITERS", "5")
	// The fixed choices of before, on 2 hosts of 2 ranks: the N >= 4
	// defaults, with the hierarchical schedule from HierarchicalMinBytes
	// (512 KiB), and int8 from the fixed 64 KiB threshold.
	fixed := []string{"GORUN_ALLREDUCE_ALGORITHMS=recursive-doubling:16K,rabenseifner:524287,hierarchical", "GORUN_COMPRESSION_THRESHOLD=65536"}
	baseline := envOr("GORUN_LINK_BASELINE", "fixed")
	switch baseline {
	case "fixed":
	case "model":
		fixed = nil
	default:
		b.Fatalf("GORUN_LINK_BASELINE=%q: want fixed or model", baseline)
	}
	var report strings.Builder
	for _, rate := range strings.Split(envOr("GORUN_LINK_RATES", "none,1gbit"), ",") {
		cl := netns.New(b, 2)
		if rate != "none" {
			hierShape(b, cl, rate)
		}
		type key struct {
			policy, codec string
			bytes         int64
		}
		times := map[key][]float64{}
		algos := map[key]map[string]int{} // what ran, in how many rounds (the links, and so the choice, are measured anew every run)
		header := ""
		for round := range rounds {
			for _, codec := range []string{"", "int8"} {
				policies := []string{"links", "fixed"}
				if round%2 == 1 {
					slices.Reverse(policies)
				}
				for _, policy := range policies {
					var envs []string
					switch {
					case policy == "fixed":
						envs = fixed
					case baseline == "model":
						envs = []string{collective.EnvAutotune + "=1"}
					}
					out, links := linkBenchRun(b, cl, envs, codec, sizes, iters)
					if policy == "links" && header == "" {
						header = links
					}
					for _, r := range out {
						k := key{policy, codec, r.Bytes}
						times[k] = append(times[k], r.TimeUS/1e3)
						if algos[k] == nil {
							algos[k] = map[string]int{}
						}
						algos[k][r.Algorithm]++
					}
				}
			}
		}
		cl.Close()
		fmt.Fprintf(&report, "\n2 hosts x 2 ranks, links %s; median of %d rounds of bench's median of %s iterations (ms); the links of the first round:\n%s", rate, rounds, iters, header)
		arm := "links"
		if baseline == "model" {
			arm = "autotune"
		}
		fmt.Fprintf(&report, "%8s %6s %12s %-28s %12s %-40s %8s\n", "bytes", "codec", baseline+" ms", baseline+" runs", arm+" ms", arm+" run", baseline+"/"+arm)
		var all []int64
		for k := range times {
			if k.policy == "links" && k.codec == "" {
				all = append(all, k.bytes)
			}
		}
		slices.Sort(all)
		for _, codec := range []string{"", "int8"} {
			for _, n := range all {
				f, l := key{"fixed", codec, n}, key{"links", codec, n}
				name := codec
				if name == "" {
					name = "fp32"
				}
				fixedMS, linksMS := hierMedian(times[f]), hierMedian(times[l])
				fmt.Fprintf(&report, "%8s %6s %12.3f %-28s %12.3f %-40s %7.2fx\n", hierHuman(n), name, fixedMS, ranNames(algos[f]), linksMS, ranNames(algos[l]), fixedMS/linksMS)
			}
		}
	}
	fmt.Print(report.String())
}

// ranNames lists what ran and in how many rounds, e.g. "int8 (compressed)
// x3, rabenseifner x2", or the one name if it ran every time.
func ranNames(ran map[string]int) string {
	if len(ran) == 1 {
		for name := range ran {
			return name
		}
	}
	var parts []string
	for name, n := range ran {
		parts = append(parts, fmt.Sprintf("%s x%d", name, n))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// linkBenchRun runs bench-worker on both hosts (2 ranks each) with env
// and codec, and returns its results and the lines about the links and
// the policy that a table run prints (from a second run, of one size).
func linkBenchRun(b *testing.B, cl *netns.Cluster, env []string, codec, sizes, iters string) ([]benchRow, string) {
	b.Helper()
	rs := benchRows(b, linkGorun(b, cl, env, codec, "--sizes", sizes, "--iters", iters, "--warmup", "1", "--json"), fmt.Sprintf("%v %s", env, codec), "")
	var head strings.Builder
	for _, l := range strings.Split(linkGorun(b, cl, env, codec, "--sizes", "4", "--iters", "1", "--warmup", "0"), "\n") {
		if i := strings.Index(l, "# "); i >= 0 && !strings.Contains(l, "gorun bench:") {
			head.WriteString(l[i:] + "\n")
		}
	}
	return rs, head.String()
}

// linkGorun runs gorun -H h0:2,h1:2 gorun bench-worker args, and returns
// its output.
func linkGorun(b *testing.B, cl *netns.Cluster, env []string, codec string, args ...string) string {
	b.Helper()
	h0, h1 := cl.Hosts[0], cl.Hosts[1]
	full := append([]string{"-H", fmt.Sprintf("%s:2,%s:2", h0.IP, h1.IP), gorunBin, "bench-worker"}, args...)
	if codec != "" {
		full = append(full, "--compression", codec)
	}
	cmd, o, e := startGorunIn(cl, h0, env, full...)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			b.Fatalf("gorun %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(full, " "), err, o, e)
		}
	case <-time.After(10 * time.Minute):
		cmd.Process.Kill()
		<-done
		b.Fatalf("gorun %s did not finish\nstdout:\n%s\nstderr:\n%s", strings.Join(full, " "), o, e)
	}
	return o.String()
}

// TestElasticLinksHandedOn: an elastic job across 2 namespace hosts of 2
// ranks measures its links in its first membership epoch and chooses its
// allreduce policy from them; after a rank is killed (kill -9) the next
// epoch chooses from the same links, handed on rather than measured again
// (the same numbers, down to how long measuring took), and the job ends
// with the uninterrupted run's parameters.
func TestElasticLinksHandedOn(t *testing.T) {
	c := netns.New(t, 2)
	h0, h1 := c.Hosts[0], c.Hosts[1]
	j := etStartIn(t, c, h0, etDefault, "--verbose", "-H", fmt.Sprintf("%s:2,%s:2", h0.IP, h1.IP), "--min-np", "2",
		"--blacklist-cooldown", "10m", "--heartbeat-timeout", etHeartbeat.String(), "--grace", "2s")
	pids := j.pids(4)
	j.waitStep("step 3", time.Minute, func(s etStep) bool { return s.steps >= 3 })
	etKill(t, pids[1], syscall.SIGKILL)
	j.waitResets(3, 1, time.Minute)
	j.open()
	j.finish(3)
	noneLeft(t, c)
	reports := regexp.MustCompile(`gorun: rank 0: membership epoch (\d+): links: (.+); allreduce policy: (\S+)`).FindAllStringSubmatch(j.err.String(), -1)
	epochs := map[string]string{}
	for _, m := range reports {
		epochs[m[1]] = m[2]
	}
	if len(epochs) < 2 {
		j.fail("rank 0 reported the links of %d membership epochs, want 2 (before and after the kill)", len(epochs))
	}
	for e, links := range epochs {
		if links != reports[0][2] {
			t.Errorf("membership epoch %s: links %q, want the first epoch's %q", e, links, reports[0][2])
		}
	}
	if !strings.Contains(reports[0][2], "2 links within hosts") || !strings.Contains(reports[0][2], "2 between hosts") {
		t.Errorf("first epoch's links %q: want 2 links of each class measured", reports[0][2])
	}
	t.Logf("rank 0's reports:\n%s", strings.Join(func() []string {
		var s []string
		for _, m := range reports {
			s = append(s, m[0])
		}
		return s
	}(), "\n"))
}
