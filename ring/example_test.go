package ring_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"sync"

	"github.com/gorun/gorun/ring"
)

// Three ranks, each contributing [rank+1, 10*(rank+1)], sum to [6, 60].
func Example() {
	const n = 3
	transports := ring.NewMemRing(n)
	results := make([][]float32, n)
	var wg sync.WaitGroup
	for rank := 0; rank < n; rank++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := ring.New(ring.Config{Rank: rank, Size: n}, transports[rank])
			if err != nil {
				panic(err)
			}
			buf := make([]byte, 2*4)
			binary.LittleEndian.PutUint32(buf[0:], math.Float32bits(float32(rank+1)))
			binary.LittleEndian.PutUint32(buf[4:], math.Float32bits(float32(10*(rank+1))))
			c := ring.Call{Kind: ring.Allreduce, Seq: 1, Op: ring.Sum, DType: ring.Float32, Count: 2}
			if err := r.Allreduce(context.Background(), c, buf); err != nil {
				panic(err)
			}
			results[rank] = []float32{
				math.Float32frombits(binary.LittleEndian.Uint32(buf[0:])),
				math.Float32frombits(binary.LittleEndian.Uint32(buf[4:])),
			}
		}()
	}
	wg.Wait()
	for rank, res := range results {
		fmt.Printf("rank %d: %v\n", rank, res)
	}
	// Output:
	// rank 0: [6 60]
	// rank 1: [6 60]
	// rank 2: [6 60]
}
