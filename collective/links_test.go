package collective

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/compress"
	"github.com/gorun/gorun/ring"
)

// TestMeasureLinksAgree: ranks that each measure their own links (and
// clocks: every rank's numbers differ) end up holding the same links, and
// so choose the same allreduce policy and compression threshold.
func TestMeasureLinksAgree(t *testing.T) {
	for _, hosts := range [][]int{{0, 0, 1, 1}, {0, 1, 2}, {0, 0, 0, 1, 1, 1}} {
		size := len(hosts)
		ts := ring.NewMemRing(size)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		got := make([]AgreedLinks, size)
		errs := onEveryRank(size, func(r int) (err error) {
			got[r], err = measureLinks(ctx, ts[r].(ring.Mesh), r, size, hosts, 0, compress.Int8())
			return err
		})
		cancel()
		for r, err := range errs {
			if err != nil {
				t.Fatalf("hosts %v: rank %d: %v", hosts, r, err)
			}
		}
		want, ok := ring.CrossHostPolicy(size, hosts, got[0].Links, 0)
		if !ok {
			t.Fatalf("hosts %v: the model does not apply to %v", hosts, got[0])
		}
		for r := range size {
			if got[r] != got[0] {
				t.Errorf("hosts %v: rank %d holds %v, rank 0 %v", hosts, r, got[r], got[0])
			}
			if p, _ := ring.CrossHostPolicy(size, hosts, got[r].Links, 0); p.String() != want.String() {
				t.Errorf("hosts %v: rank %d chose %v, rank 0 %v", hosts, r, p, want)
			}
		}
		if got[0].Probed[1] == 0 || got[0].CodecBytesPerSecond == 0 {
			t.Errorf("hosts %v: %v: no link between hosts or no codec measured", hosts, got[0])
		}
	}
}

// TestAgreeLinksSkewed: however far apart the ranks' own measurements
// are, the agreed numbers are the per-class lower medians (of two links,
// the slower bandwidth and the shorter latency), the same whichever order
// the samples come in, and
// survive the trip to the other ranks.
func TestAgreeLinksSkewed(t *testing.T) {
	samples := []linkSample{
		{class: 0, latencyNanos: 5_000, bytesPerSec: 4e9, reducePerSec: 3e9, codecPerSec: 1e9},
		{class: 1, latencyNanos: 900_000, bytesPerSec: 1e8, reducePerSec: 1e9, codecPerSec: 2e8, burst: 300_000},
		{class: 0, latencyNanos: 50_000, bytesPerSec: 1e9, reducePerSec: 5e9, codecPerSec: 3e9},
		{class: 1, latencyNanos: 40_000, bytesPerSec: 2e9, reducePerSec: 2e9, codecPerSec: 1e9, probeDuration: 7e6, burst: 200_000},
	}
	a := agreeLinks(samples)
	want := ring.Links{
		Local:                ring.LinkCost{Latency: 5 * time.Microsecond, BytesPerSecond: 1e9},
		Cross:                ring.LinkCost{Latency: 40 * time.Microsecond, BytesPerSecond: 1e8, Burst: 200_000},
		ReduceBytesPerSecond: 2e9,
	}
	if a.Links != want || a.CodecBytesPerSecond != 1e9 || a.Probed != [2]int{2, 2} || a.Took != 7*time.Millisecond {
		t.Errorf("agreed %+v, want %+v, codec 1e9, 2 links of each class, 7ms", a, want)
	}
	reversed := []linkSample{samples[3], samples[2], samples[1], samples[0]}
	if b := agreeLinks(reversed); b != a {
		t.Errorf("samples in another order agree on %v, want %v", b, a)
	}
	if b := decodeAgreedLinks(a.encode()); b != a {
		t.Errorf("decoded %v, sent %v", b, a)
	}
	for _, s := range samples {
		if d := decodeLinkSample(s.encode()); d != s {
			t.Errorf("sample decoded %+v, sent %+v", d, s)
		}
	}
	// A rank without the codec: none is agreed, rather than the others'.
	samples[2].codecPerSec = 0
	if b := agreeLinks(samples); b.CodecBytesPerSecond != 0 {
		t.Errorf("one rank without the codec: agreed codec rate %d, want 0", b.CodecBytesPerSecond)
	}
}

// TestProbePartners: in every phase the probes pair ranks up (each rank's
// partner names it back), a rank takes part in one probe at a time, and
// every ring neighbour pair is probed once.
func TestProbePartners(t *testing.T) {
	for size := 2; size <= 9; size++ {
		probed := map[[2]int]int{}
		for phase := range 3 {
			for r := range size {
				p, prober := probePartners(r, size)
				if p[phase] < 0 {
					continue
				}
				q, qProber := probePartners(p[phase], size)
				if q[phase] != r || prober[phase] == qProber[phase] {
					t.Errorf("size %d phase %d: rank %d pairs with %d, which pairs with %d", size, phase, r, p[phase], q[phase])
				}
				if prober[phase] {
					probed[[2]int{r, p[phase]}]++
				}
			}
		}
		for r := range size {
			next := (r + 1) % size
			if size == 2 && r == 1 {
				continue // one pair only
			}
			if probed[[2]int{r, next}] != 1 {
				t.Errorf("size %d: link %d -> %d probed %d times", size, r, next, probed[[2]int{r, next}])
			}
		}
	}
}

// onEveryRank runs f for every rank of size, each on a goroutine of its
// own as ranks run, and returns their errors (errs[r] is rank r's).
func onEveryRank(size int, f func(r int) error) []error {
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(r)
		}()
	}
	wg.Wait()
	return errs
}
