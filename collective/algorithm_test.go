package collective

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/p2p"
	"github.com/gorun/gorun/ring"
)

func TestAllreducePolicyEnv(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == EnvAllreduceAlgorithms {
				return v
			}
			return ""
		}
	}
	for in, want := range map[string]string{
		"":                                 "default",
		"default":                          "default",
		"ring":                             "ring",
		"direct:4K,scatter-gather:2M,ring": "direct:4K,scatter-gather:2M,ring",
	} {
		p, err := readAllreducePolicy(env(in))
		if err != nil || p.String() != want {
			t.Errorf("%q: got %v, %v; want %s", in, p, err, want)
		}
	}
	_, err := readAllreducePolicy(env("direct:4K,warp-drive"))
	if err == nil || !strings.Contains(err.Error(), EnvAllreduceAlgorithms) || !strings.Contains(err.Error(), "warp-drive") {
		t.Errorf("bad value: %v", err)
	}
}

// A bad GORUN_ALLREDUCE_ALGORITHMS fails Init, naming the variable.
func TestAllreducePolicyEnvFailsInit(t *testing.T) {
	t.Setenv(EnvAllreduceAlgorithms, "direct:4K,ring:1M")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := StartLocal(ctx, 2)
	if err == nil || !strings.Contains(err.Error(), EnvAllreduceAlgorithms) || !strings.Contains(err.Error(), "last entry") {
		t.Fatalf("Init with a bad policy: %v", err)
	}
}

// Comm.AllreduceAlgorithm follows GORUN_ALLREDUCE_ALGORITHMS, and
// allreduces work with every forced algorithm over the real links (shared
// memory between ranks of one host), at 2, 3 and 4 ranks, with the default
// and the smallest shared-memory buffer (the schedules send up to
// ring.SmallBytes before they receive), at lengths around that bound and
// beyond the buffer.
func TestCommAllreduceAlgorithm(t *testing.T) {
	for _, algo := range []string{"direct", "recursive-doubling", "rabenseifner", "scatter-gather", "ring"} {
		for _, n := range []int{2, 3, 4} {
			for _, shmBytes := range []string{"", "1"} { // "1": rounded up to the smallest buffer
				t.Run(fmt.Sprintf("%s/N=%d/shm=%q", algo, n, shmBytes), func(t *testing.T) {
					t.Setenv(EnvAllreduceAlgorithms, algo)
					t.Setenv(EnvShmBytes, shmBytes)
					comms := newJob(t, n)
					for _, c := range comms {
						if got := c.AllreduceAlgorithm(1 << 20); got != algo {
							t.Fatalf("rank %d: AllreduceAlgorithm = %q, want %q", c.Rank(), got, algo)
						}
					}
					mustAllOK(t, onEach(comms, func(c *Comm) error {
						for _, count := range []int{1001, ring.SmallBytes/4 - 1, ring.SmallBytes / 4, ring.SmallBytes/4 + 1500, 100_003} {
							buf := make([]float32, count)
							for i := range buf {
								buf[i] = float32(c.Rank() + i)
							}
							if err := c.Allreduce(context.Background(), buf, Sum); err != nil {
								return err
							}
							for i, v := range buf {
								if want := float32(n*i + n*(n-1)/2); v != want {
									return fmt.Errorf("count %d: [%d] = %v, want %v", count, i, v, want)
								}
							}
						}
						return nil
					}))
				})
			}
		}
	}
	// The defaults: a known algorithm, the same on every rank, the ring
	// for huge buffers.
	t.Setenv(EnvAllreduceAlgorithms, "")
	comms := newJob(t, 2)
	for _, b := range []int{4, 1 << 20, 1 << 30} {
		got := comms[0].AllreduceAlgorithm(b)
		if _, err := ring.ParseAlgorithm(got); err != nil || got != comms[1].AllreduceAlgorithm(b) {
			t.Errorf("default for %d bytes: %q on rank 0, %q on rank 1", b, got, comms[1].AllreduceAlgorithm(b))
		}
	}
	if got := comms[0].AllreduceAlgorithm(1 << 30); got != "ring" {
		t.Errorf("default for 1 GiB: %q, want ring", got)
	}
}

func mustAllOK(t *testing.T, errs []error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", i, err)
		}
	}
}

func TestHostIndices(t *testing.T) {
	peers := func(hosts ...string) []p2p.Peer {
		out := make([]p2p.Peer, len(hosts))
		for i, h := range hosts {
			out[i] = p2p.Peer{Rank: i, HostID: h}
		}
		return out
	}
	if got := hostIndices(peers("b", "a", "b", "c", "a")); !slices.Equal(got, []int{0, 1, 0, 2, 1}) {
		t.Errorf("got %v", got)
	}
	if got := hostIndices(peers("a")); got != nil {
		t.Errorf("one rank: %v", got)
	}
	if got := hostIndices(peers("a", "")); got != nil {
		t.Errorf("unknown host: %v", got)
	}
}
