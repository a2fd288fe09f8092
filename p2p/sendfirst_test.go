package p2p

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorun/gorun/ring"
)

// sendFirstShmBytes is the shm ring of the send-first tests: half of it
// (128 KiB) is above ring.SmallBytes, so a step of between 64 and 128 KiB
// runs send-first only because the link says it holds that much, and
// steps on both sides of the bound cost little.
const sendFirstShmBytes = 256 << 10

// pipelineCounter is a p2p transport that counts the collectives that
// started goroutines of their own (ring.Concurrency): a call that ran every
// step or exchange round send-then-receive on the caller's goroutine never
// says so. Every other method, LinkBuffer, RecvFromView and the Mesh ones
// included, is the transport's own.
type pipelineCounter struct {
	*transport
	pipelined atomic.Int32
}

func (c *pipelineCounter) Concurrent(on bool) {
	if on {
		c.pipelined.Add(1)
	}
	c.transport.Concurrent(on)
}

// sendFirstAlgo describes, for one algorithm, the largest message a rank
// sends to one peer in a round where it also receives (msgElems, in
// elements of an allreduce of count elements over n ranks) and the bound
// up to which the ring sends such a round before it receives.
type sendFirstAlgo struct {
	name     string
	msgElems func(count, n int) int
	bound    int
}

// largestHalf is Rabenseifner's largest message: its first halving step
// (and the last doubling step) sends half of the P blocks, P the largest
// power of two <= n, split as ring.Segment splits them.
func largestHalf(count, n int) int {
	p := 1
	for p*2 <= n {
		p *= 2
	}
	lower := 0
	for j := range p / 2 {
		_, k := ring.Segment(count, p, j)
		lower += k
	}
	return max(lower, count-lower)
}

var sendFirstAlgos = []sendFirstAlgo{
	{"ring", func(count, n int) int { _, k := ring.Segment(count, n, 0); return k }, sendFirstShmBytes / 2},
	{"rabenseifner", largestHalf, sendFirstShmBytes / 2},
	{"recursive-doubling", func(count, _ int) int { return count }, sendFirstShmBytes / 2},
	// The direct allreduce (scatter-gather's engine) does not ask the
	// links: it runs on one goroutine up to ring.SmallBytes per link.
	{"direct", func(count, _ int) int { return count }, ring.SmallBytes},
}

// msgBytes is what a message of elems elements costs on a link: payload
// and one header per chunk (the default chunk size).
func msgBytes(elems, esz int) int {
	perChunk := ring.DefaultChunkBytes / esz
	return elems*esz + (elems+perChunk-1)/perChunk*ring.HeaderSize
}

// largestSendFirst is the largest count whose messages fit a's bound: the
// ring runs it send-first, and count+1 with a sender goroutine.
func largestSendFirst(a sendFirstAlgo, n, esz int) int {
	fits := func(count int) bool { return msgBytes(a.msgElems(count, n), esz) <= a.bound }
	lo, hi := 1, 4*a.bound // fits(lo), !fits(hi)
	for hi-lo > 1 {
		if mid := (lo + hi) / 2; fits(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// sendFirstValue is rank r's element i: distinct per element and rank, so
// a segment reduced into the wrong place or twice shows, and small enough
// that the sum of five ranks is exact in int32.
func sendFirstValue(r, i int) int32 { return int32((i*31+r*1000003)%65521) - 32760 }

// TestSendFirstOverShm runs allreduces of 3 to 5 ranks over real shared
// memory with each Mesh algorithm, at the largest length whose rounds fit
// half a link's buffer (send, then receive, on the caller's goroutine), one
// element more (a sender goroutine), small odd lengths and one of three
// ring capacities (messages larger than the ring stream through). Every
// element of every rank is checked against the exact sum, and so is the
// path: no goroutine at or under the bound, goroutines over it. On a host
// with fewer CPUs than ranks (CI's) and GOMAXPROCS 1, LinkBuffer promises
// nothing unless the test says so (linkBufferTest).
func TestSendFirstOverShm(t *testing.T) {
	t.Setenv(envShmBytes, strconv.Itoa(sendFirstShmBytes))
	const esz = 4 // Int32
	for _, n := range []int{3, 4, 5} {
		t.Run(fmt.Sprintf("N=%d", n), func(t *testing.T) {
			j := startJob(t, jobOpts{size: n})
			wantKinds(t, j.nodes, allShm)
			trs := sendFirstTransports(j, func(int) int8 { return 1 })
			t.Logf("pollYield %v (%d ranks on this host)", trs[0].transport.pollYield, n)
			for r, tr := range trs {
				for p := range n {
					if lb := tr.LinkBuffer(p); p != r && lb != sendFirstShmBytes {
						t.Fatalf("rank %d: LinkBuffer(%d) = %d, want the ring's %d", r, p, lb, sendFirstShmBytes)
					}
				}
			}
			for _, a := range sendFirstAlgos {
				rings := sendFirstRings(t, a.name, trs)
				fit := largestSendFirst(a, n, esz)
				for _, count := range []int{1, 7, 1001, fit, fit + 1, 3*sendFirstShmBytes/esz + 3} {
					pipelined := msgBytes(a.msgElems(count, n), esz) > a.bound
					runSendFirstCase(t, a.name, rings, trs, count, pipelined, false)
				}
			}
		})
	}
}

// sendFirstTransports wraps every rank's transport in a pipelineCounter,
// with linkBufferTest set to override(rank).
func sendFirstTransports(j *job, override func(rank int) int8) []*pipelineCounter {
	trs := make([]*pipelineCounter, len(j.nodes))
	for r, node := range j.nodes {
		node.mu.Lock()
		tr := node.links.tr
		node.mu.Unlock()
		tr.linkBufferTest = override(r)
		trs[r] = &pipelineCounter{transport: tr}
	}
	return trs
}

// sendFirstRings builds a Ring per rank over trs that runs algorithm algo.
func sendFirstRings(t *testing.T, algo string, trs []*pipelineCounter) []*ring.Ring {
	t.Helper()
	policy, err := ring.ParseAllreducePolicy(algo)
	if err != nil {
		t.Fatal(err)
	}
	rings := make([]*ring.Ring, len(trs))
	for r := range rings {
		if rings[r], err = ring.New(ring.Config{Rank: r, Size: len(trs), Allreduce: policy}, trs[r]); err != nil {
			t.Fatal(err)
		}
	}
	return rings
}

// runSendFirstCase runs one Int32 Sum allreduce of count elements on every
// rank at once and checks the results and, unless the ranks were told to
// choose differently (mixed), whether any rank ran a sender goroutine
// (pipelined).
func runSendFirstCase(t *testing.T, algo string, rings []*ring.Ring, trs []*pipelineCounter, count int, pipelined, mixed bool) {
	t.Helper()
	n := len(rings)
	for _, tr := range trs {
		tr.pipelined.Store(0)
	}
	bufs := make([][]byte, n)
	for r := range bufs {
		bufs[r] = make([]byte, 4*count)
		for i := range count {
			binary.NativeEndian.PutUint32(bufs[r][4*i:], uint32(sendFirstValue(r, i)))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = rings[r].Allreduce(ctx, ring.Call{Op: ring.Sum, DType: ring.Int32, Count: count}, bufs[r])
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("%s count %d: rank %d: %v", algo, count, r, err)
		}
	}
	for r := range bufs {
		for i := range count {
			var want int32
			for q := range n {
				want += sendFirstValue(q, i)
			}
			if got := int32(binary.NativeEndian.Uint32(bufs[r][4*i:])); got != want {
				t.Fatalf("%s count %d: rank %d element %d = %d, want %d", algo, count, r, i, got, want)
			}
		}
	}
	var calls int32
	for _, tr := range trs {
		calls += tr.pipelined.Load()
	}
	if mixed {
		return // some ranks pipeline whatever the size
	}
	if ran := calls > 0; ran != pipelined {
		t.Errorf("%s N=%d count %d: sender goroutines in %d rounds, want pipelined %v", algo, n, count, calls, pipelined)
	}
}

// TestSendFirstMixed: whether a rank sends a step before it receives is
// its own choice (LinkBuffer depends on its GOMAXPROCS), so ranks of one
// job may choose differently; the half-buffer bound alone keeps that from
// deadlocking. Here even ranks send first wherever a step fits and odd
// ranks always run a sender goroutine, at N = 2 to 5, every Mesh
// algorithm, sizes under, at and over the bound and over the ring's
// capacity, every element checked.
func TestSendFirstMixed(t *testing.T) {
	t.Setenv(envShmBytes, strconv.Itoa(sendFirstShmBytes))
	const esz = 4
	for _, n := range []int{2, 3, 4, 5} {
		t.Run(fmt.Sprintf("N=%d", n), func(t *testing.T) {
			j := startJob(t, jobOpts{size: n})
			wantKinds(t, j.nodes, allShm)
			trs := sendFirstTransports(j, func(r int) int8 { return int8(1 - 2*(r%2)) }) // +1 even, -1 odd
			for _, a := range sendFirstAlgos {
				rings := sendFirstRings(t, a.name, trs)
				fit := largestSendFirst(a, n, esz)
				for _, count := range []int{1, 1001, fit, fit + 1, 3*sendFirstShmBytes/esz + 3} {
					runSendFirstCase(t, a.name, rings, trs, count, false, true)
					// Between SmallBytes and half the ring the ranks
					// really differ: rank 0 sends first, rank 1 not.
					if count == fit && a.bound > ring.SmallBytes && (trs[0].pipelined.Load() != 0 || trs[1].pipelined.Load() == 0) {
						t.Errorf("%s count %d: sender goroutines on rank 0 in %d rounds, on rank 1 in %d; want none on rank 0, some on rank 1",
							a.name, count, trs[0].pipelined.Load(), trs[1].pipelined.Load())
					}
				}
			}
		})
	}
}

// TestGroupedOverShm: ranks told to (GroupedSteps) run ring steps larger than half a link as groups of
// chunks sent then received on one goroutine, over real shared memory,
// alone and mixed with ranks that run the sender goroutine, at N = 2 to 5,
// up to steps of several times the ring's capacity, every element checked.
func TestGroupedOverShm(t *testing.T) {
	t.Setenv(envShmBytes, strconv.Itoa(sendFirstShmBytes))
	policy, err := ring.ParseAllreducePolicy("ring")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{2, 3, 4, 5} {
		for _, mixed := range []bool{false, true} {
			t.Run(fmt.Sprintf("N=%d/mixed=%v", n, mixed), func(t *testing.T) {
				j := startJob(t, jobOpts{size: n})
				wantKinds(t, j.nodes, allShm)
				trs := sendFirstTransports(j, func(int) int8 { return 1 }) // the ring's capacity, on any host
				rings := make([]*ring.Ring, n)
				for r, tr := range trs {
					tr.groupStepsTest = 1
					if mixed && r%2 == 1 {
						tr.groupStepsTest = -1
					}
					if rings[r], err = ring.New(ring.Config{Rank: r, Size: n, ChunkBytes: 16 << 10, Allreduce: policy}, tr); err != nil {
						t.Fatal(err)
					}
				}
				for _, count := range []int{1, 1001, n*sendFirstShmBytes/8 + 1, 3*n*sendFirstShmBytes/4 + 3} {
					// Steps over half the link's 256 KiB hold several
					// groups of 16 KiB chunks: none runs a goroutine
					// unless some ranks were told not to group.
					runSendFirstCase(t, "ring", rings, trs, count, false, mixed)
				}
			})
		}
	}
}
