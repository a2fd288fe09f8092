package compress_test

import (
	"fmt"

	"github.com/gorun/gorun/compress"
)

func Example() {
	grad := []float32{0.5, -1.25, 3e-5, 70000, 0.1}

	// fp16 clamps 70000 to 65504; int8 keeps it, but one outlier sets the
	// scale of its whole block (70000/127 = 551), so the small values round
	// to 0 -- error feedback (below) carries them to later steps instead.
	for _, name := range []string{"fp16", "int8"} {
		c, err := compress.ByName(name)
		if err != nil {
			panic(err)
		}
		wire := make([]byte, c.EncodedLen(len(grad)))
		info := c.Encode(wire, grad)

		got := make([]float32, len(grad))
		if err := c.Decode(got, wire); err != nil {
			panic(err)
		}
		fmt.Printf("%s: %d bytes, clamped %d: %.4g\n", name, len(wire), info.Clamped, got)
	}

	// Error feedback: what int8 lost this step is added to the next one.
	res := compress.NewResiduals()
	c := compress.Int8()
	sent := make([]float32, len(grad))
	var buf []byte
	for step := 0; step < 2; step++ {
		g := []float32{0.5, -1.25, 3e-5, 0.1, 0}
		res.Apply("layer1.weight", g)
		_, buf, _ = compress.RoundTrip(c, sent, g, buf)
		res.Update("layer1.weight", g, sent)
	}
	fmt.Printf("int8 wire ratio for 1M values: %.3f\n", float64(c.EncodedLen(1<<20))/float64(4<<20))

	// Output:
	// fp16: 10 bytes, clamped 1: [0.5 -1.25 2.998e-05 6.55e+04 0.09998]
	// int8: 9 bytes, clamped 0: [0 0 0 7e+04 0]
	// int8 wire ratio for 1M values: 0.266
}
