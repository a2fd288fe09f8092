package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gorun/gorun/internal/bench"
	"github.com/gorun/gorun/internal/ringsim"
	"github.com/gorun/gorun/ring"
)

// gorun sim: the allreduce simulator's table (internal/ringsim).

func newSimCmd() *cobra.Command {
	var (
		layouts, sizes, gbps, algos string
		latency, localLatency       time.Duration
		localGbps                   float64
		memory, burst               string
		asJSON                      bool
	)
	cmd := &cobra.Command{
		Use:   "sim [--layouts 16/8,4096/1024] [--sizes 1K,1G] [--gbps 10,400] [--algorithms ring,rabenseifner:1G] [--json]",
		Short: "Simulate allreduce at scales no test machine reaches: time and the policy's choice",
		Long: `gorun sim runs ring's real allreduce schedules, every rank a goroutine, over
a simulated network on a virtual clock, and prints for every layout
(RANKS/HOSTS, ranks spread evenly), size and bandwidth between hosts the
algorithm gorun's default policy picks (across hosts, from the links the
network models, as a job measures them), its time, and the time of every
algorithm of --algorithms (each up to its MAXBYTES, if given), with the
fastest. Every result is checked.

The network is an α-β model: every host has a NIC of --gbps each way,
shared by its ranks, and --latency between hosts; ranks of one host have
links of their own (--local-gbps, --local-latency); --burst models links
shaped with tc tbf. Reductions take no time. How the model and the simulation work, and how buffers too large
for this machine run scaled: go doc ./internal/ringsim. The simulation is
deterministic: the same flags print the same table. It runs on one core:
the default table takes about half an hour; at 4096 ranks an algorithm
takes minutes per size and gigabytes of memory (BENCHMARKS.md,
"Simulator").`,
		Example: `  gorun sim
  gorun sim --layouts 4096/1024 --sizes 1M --algorithms rabenseifner
  gorun sim --layouts 64/8 --sizes 1M,64M --gbps 100
  gorun sim --layouts 4/2 --sizes 64M --gbps 1 --latency 50us --json`,
		// A tool for gorun's developers (BENCHMARKS.md, "Simulator"), not
		// for running jobs: it stays out of gorun's one-page help.
		Hidden:        true,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			g := ringsim.Grid{Network: ringsim.Network{
				Latency: latency, LocalLatency: localLatency, LocalBandwidth: localGbps * 1e9,
			}}
			for _, s := range strings.Split(layouts, ",") {
				lay, err := ringsim.ParseLayout(s)
				if err != nil {
					return fmt.Errorf("--layouts: %w", err)
				}
				g.Layouts = append(g.Layouts, lay)
			}
			ns, err := bench.ParseSizes(sizes)
			if err != nil {
				return fmt.Errorf("--sizes: %w", err)
			}
			g.Sizes = ns
			for _, s := range strings.Split(gbps, ",") {
				v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
				if err != nil || v <= 0 {
					return fmt.Errorf("--gbps %q: want bandwidths in Gbit/s, e.g. 10,100,400", s)
				}
				g.Bandwidths = append(g.Bandwidths, v*1e9)
			}
			if algos != "" {
				for _, s := range strings.Split(algos, ",") {
					c, err := ringsim.ParseCandidate(s)
					if err != nil {
						return fmt.Errorf("--algorithms: %w", err)
					}
					g.Algorithms = append(g.Algorithms, c)
				}
			}
			m, err := ring.ParseBytes(memory)
			if err != nil {
				return fmt.Errorf("--memory: %w", err)
			}
			g.Memory = int64(m)
			b, err := ring.ParseBytes(burst)
			if err != nil {
				return fmt.Errorf("--burst: %w", err)
			}
			g.Network.Burst = int64(b)
			out := cmd.OutOrStdout()
			if !asJSON {
				simHeader(out, g)
			}
			return g.Run(cmd.Context(), func(r ringsim.Row) error {
				if asJSON {
					return json.NewEncoder(out).Encode(simJSON(r))
				}
				simRow(out, g, r)
				return nil
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&layouts, "layouts", "16/8,64/8,256/32,1024/128", "`RANKS/HOSTS` pairs, comma-separated")
	fl.StringVar(&sizes, "sizes", "1K,32K,1M,32M,1G", "bytes per rank, comma-separated, K/M/G suffixes allowed")
	fl.StringVar(&gbps, "gbps", "10,100,400", "bandwidths between hosts in Gbit/s, comma-separated")
	fl.StringVar(&algos, "algorithms", "recursive-doubling:1M,rabenseifner,ring,hierarchical", "algorithms to simulate besides the policy's choice, each up to its MAXBYTES if given: `NAME[:MAXBYTES],...`")
	fl.DurationVar(&latency, "latency", 10*time.Microsecond, "one-way latency of a message between hosts (α)")
	fl.DurationVar(&localLatency, "local-latency", time.Microsecond, "latency of a message between ranks of one host")
	fl.Float64Var(&localGbps, "local-gbps", 80, "bandwidth of a link between two ranks of one host, Gbit/s")
	fl.StringVar(&memory, "memory", "256M", "bound on the simulated ranks' buffers together; larger ones run scaled")
	fl.StringVar(&burst, "burst", "0", "token-bucket burst of every NIC, bytes (as tc tbf shapes a link; a NIC has none)")
	fl.BoolVar(&asJSON, "json", false, "print one JSON object per row")
	return cmd
}

func simHeader(w io.Writer, g ringsim.Grid) {
	nw := g.Network
	fmt.Fprintf(w, "Allreduce (float32 Sum) simulated: α %v between hosts, %v and %g Gbit/s within a host; times of the slowest rank\n\n",
		nw.Latency, nw.LocalLatency, nw.LocalBandwidth/1e9)
	fmt.Fprint(w, "| ranks | hosts | bytes | Gbit/s | policy picks | its time | fastest | policy ÷ fastest |")
	for _, c := range g.Algorithms {
		fmt.Fprintf(w, " %s |", c.Algorithm)
	}
	fmt.Fprint(w, "\n|---|---|---|---|---|---|---|---|")
	for range g.Algorithms {
		fmt.Fprint(w, "---|")
	}
	fmt.Fprintln(w)
}

func simRow(w io.Writer, g ringsim.Grid, r ringsim.Row) {
	best, bt := r.Best()
	pt := r.Times[r.Policy]
	fmt.Fprintf(w, "| %d | %d | %s | %g | %s | %s | %s | %.2f |", r.Layout.Size(), r.Layout.Hosts, simBytes(r.Bytes),
		r.Bandwidth/1e9, r.Policy, simTime(pt), best, pt.Seconds()/bt.Seconds())
	for _, c := range g.Algorithms {
		t, ok := r.Times[c.Algorithm]
		if !ok {
			fmt.Fprint(w, " - |")
			continue
		}
		fmt.Fprintf(w, " %s |", simTime(t))
	}
	fmt.Fprintln(w)
}

type simJSONRow struct {
	Ranks     int                `json:"ranks"`
	Hosts     int                `json:"hosts"`
	Bytes     int64              `json:"bytes"`
	Gbps      float64            `json:"gbps"`
	Policy    string             `json:"policy"`
	TimeUS    map[string]float64 `json:"time_us"`
	Scale     int64              `json:"scale"`
	Messages  int64              `json:"messages"`
	CrossHost int64              `json:"cross_host_bytes"`
}

func simJSON(r ringsim.Row) simJSONRow {
	j := simJSONRow{Ranks: r.Layout.Size(), Hosts: r.Layout.Hosts, Bytes: r.Bytes, Gbps: r.Bandwidth / 1e9,
		Policy: r.Policy.String(), TimeUS: map[string]float64{}, Scale: r.Scale, Messages: r.Stats.Messages, CrossHost: r.Stats.CrossHostBytes}
	for a, t := range r.Times {
		j.TimeUS[a.String()] = t.Seconds() * 1e6
	}
	return j
}

// simTime prints a virtual time with three significant digits.
func simTime(t ringsim.Time) string {
	s := t.Seconds()
	switch {
	case s >= 1:
		return strconv.FormatFloat(s, 'f', 3-simDigits(s), 64) + " s"
	case s >= 1e-3:
		return strconv.FormatFloat(s*1e3, 'f', 3-simDigits(s*1e3), 64) + " ms"
	}
	return strconv.FormatFloat(s*1e6, 'f', max(0, 3-simDigits(s*1e6)), 64) + " µs"
}

// simDigits is the number of digits before the point of v >= 1.
func simDigits(v float64) int {
	d := 1
	for v >= 10 {
		v /= 10
		d++
	}
	return min(d, 3)
}

func simBytes(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return strconv.FormatInt(n>>30, 10) + " GiB"
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + " MiB"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + " KiB"
	}
	return strconv.FormatInt(n, 10) + " B"
}
