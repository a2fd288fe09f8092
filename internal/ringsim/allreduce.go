package ringsim

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/gorun/gorun/ring"
)

// Allreduce is one simulated allreduce: every rank reduces a float32
// buffer of Bytes bytes with Sum, all starting at virtual time 0 (as
// after a barrier, which is how gorun bench times an op).
type Allreduce struct {
	Layout  Layout
	Network Network
	Bytes   int64
	// Policy runs the algorithm ring's default policy picks for this
	// layout and size (Algorithm is then ignored); otherwise Algorithm
	// runs.
	Policy    bool
	Algorithm ring.Algorithm
	// ChunkBytes is ring.Config.ChunkBytes (0: ring.DefaultChunkBytes).
	ChunkBytes int
	// Memory bounds the ranks' buffers together (0: DefaultMemory). A
	// larger allreduce runs scaled (doc.go, "Large buffers").
	Memory int64
}

// DefaultMemory is the default Allreduce.Memory: 4096 ranks of 64 KiB.
const DefaultMemory = 256 << 20

// Result is what a simulated allreduce took.
type Result struct {
	Algorithm ring.Algorithm
	// Time is when the last rank's allreduce returned.
	Time Time
	// Scale is how many bytes of the modelled buffer each byte of the
	// run's buffers stands for (1: the run moved every byte).
	Scale int64
	Stats Stats
}

// PolicyChoice returns the algorithm ring's default policy runs for an
// allreduce of bytes on this layout (over a Mesh, with Config.Hosts from
// the layout, as gorun's ranks configure their rings) over network nw: a
// job across hosts measures its links at start and chooses from them
// (ring.Config.Links, ring.CrossHostPolicy), so the choice is the one
// those links, as nw models them, call for (NetworkLinks); on one host,
// the fixed rules.
func PolicyChoice(lay Layout, nw Network, bytes int64) (ring.Algorithm, error) {
	if err := lay.validate(); err != nil {
		return 0, err
	}
	if lay.Size() == 1 {
		return ring.AlgoRing, nil
	}
	e := newEngine(lay, Network{}, 1)
	links := NetworkLinks(nw)
	r, err := ring.New(ring.Config{Rank: 0, Size: lay.Size(), Hosts: lay.ringHosts(), Links: &links}, &transport{e: e})
	if err != nil {
		return 0, err
	}
	return r.AllreduceAlgorithm(int(bytes)), nil
}

// NetworkLinks is what a job's link measurement would agree on over nw:
// its latencies and rates, the burst of a shaped link, and no cost of
// reducing (the simulator gives reductions no time) nor per call.
func NetworkLinks(nw Network) ring.Links {
	const noCost = 1 << 50 // bytes per second: reductions take no time
	l := ring.Links{ReduceBytesPerSecond: noCost}
	if nw.Bandwidth > 0 {
		l.Cross = ring.LinkCost{Latency: nw.Latency, BytesPerSecond: int64(nw.Bandwidth / 8), Burst: nw.Burst}
	}
	l.Local = ring.LinkCost{Latency: nw.LocalLatency, BytesPerSecond: noCost}
	if nw.LocalBandwidth > 0 {
		l.Local.BytesPerSecond = int64(nw.LocalBandwidth / 8)
	}
	return l
}

const esz = 4 // float32

// Simulate runs a.
func Simulate(ctx context.Context, a Allreduce) (Result, error) {
	if err := a.Layout.validate(); err != nil {
		return Result{}, err
	}
	if err := a.Network.validate(); err != nil {
		return Result{}, err
	}
	if a.Bytes < 0 || a.Bytes%esz != 0 {
		return Result{}, fmt.Errorf("ringsim: %d bytes is not a float32 buffer", a.Bytes)
	}
	res := Result{Algorithm: a.Algorithm}
	if a.Policy {
		var err error
		if res.Algorithm, err = PolicyChoice(a.Layout, a.Network, a.Bytes); err != nil {
			return Result{}, err
		}
	}
	chunk := a.ChunkBytes
	if chunk == 0 {
		chunk = ring.DefaultChunkBytes
	}
	if chunk < esz {
		return Result{}, fmt.Errorf("ringsim: chunks of %d bytes hold no float32", chunk)
	}
	memory := a.Memory
	if memory == 0 {
		memory = DefaultMemory
	}
	size := a.Layout.Size()
	count := a.Bytes / esz
	res.Scale = scaleFor(int64(size), count, int64(chunk/esz), memory)
	count /= res.Scale

	e := newEngine(a.Layout, a.Network, res.Scale)
	cfg := ring.Config{
		Size: size, Hosts: a.Layout.ringHosts(), ChunkBytes: chunk / int(res.Scale),
		Allreduce: ring.AllreducePolicy{Rules: []ring.AllreduceRule{{MaxBytes: ring.NoLimit, Algo: res.Algorithm}}},
	}
	rings := make([]*ring.Ring, size)
	bufs := make([][]byte, size)
	for r := range size {
		cfg.Rank = r
		var err error
		if rings[r], err = ring.New(cfg, &transport{e: e, rank: r}); err != nil {
			return Result{}, err
		}
		bufs[r] = input(r, int(count))
	}
	call := ring.Call{Kind: ring.Allreduce, Seq: 1, Op: ring.Sum, DType: ring.Float32, Count: int(count)}
	err := exclusive(func() error {
		return e.run(ctx, func(ctx context.Context, r int) error {
			return rings[r].Allreduce(ctx, call, bufs[r])
		})
	})
	if err != nil {
		return Result{}, fmt.Errorf("ringsim: %s allreduce of %d bytes on %s: %w", res.Algorithm, a.Bytes, a.Layout, err)
	}
	if err := check(bufs); err != nil {
		return Result{}, fmt.Errorf("ringsim: %s allreduce of %d bytes on %s: %w", res.Algorithm, a.Bytes, a.Layout, err)
	}
	res.Time, res.Stats = e.elapsed(), e.stats
	return res, nil
}

// scaleFor returns by how much to shrink an allreduce of count elements
// on size ranks so that their buffers fit memory: the largest power of
// two, as far as needed, that keeps every segment of the schedules (a
// size-th of the buffer) and every chunk (chunkElems) a whole number of
// elements after shrinking, so that the scaled run sends the same
// messages as the full one, each shorter by the scale (doc.go, "Large
// buffers").
func scaleFor(size, count, chunkElems, memory int64) int64 {
	k := int64(1)
	for size*count*esz/k > memory {
		next := 2 * k
		if count%(next*size) != 0 || chunkElems%next != 0 {
			break
		}
		k = next
	}
	return k
}

// input is rank r's buffer: small integers, so that every sum is exact in
// float32 whatever the order of the additions, and every element and
// rank contribute differently.
func input(r, count int) []byte {
	b := make([]byte, count*esz)
	for i := range count {
		binary.LittleEndian.PutUint32(b[i*esz:], math.Float32bits(inputValue(r, i)))
	}
	return b
}

func inputValue(r, i int) float32 { return float32((i*7 + r) % 13) }

// check verifies that every rank holds the sum of every rank's input.
func check(bufs [][]byte) error {
	count := len(bufs[0]) / esz
	for i := range count {
		var want float32
		for r := range bufs {
			want += inputValue(r, i)
		}
		for r, b := range bufs {
			if got := math.Float32frombits(binary.LittleEndian.Uint32(b[i*esz:])); got != want {
				return fmt.Errorf("rank %d holds %g at element %d, want %g", r, got, i, want)
			}
		}
	}
	return nil
}
