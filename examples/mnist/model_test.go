package main

import (
	"math"
	"math/rand/v2"
	"testing"

	"gorgonia.org/tensor"
)

// Backward agrees with finite differences of the loss on a small MLP and
// a small CNN.
func TestGradients(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	checkGradients(t, NewMLP(6, []int{5, 4}, 3, rng), 6, rng)
	checkGradients(t, NewCNN(8, 8, 3, 2, []int{4}, 3, rng), 64, rng)
}

func checkGradients(t *testing.T, m Model, pixels int, rng *rand.Rand) {
	const n = 4
	xs := make([]float32, n*pixels)
	for i := range xs {
		xs[i] = float32(rng.NormFloat64())
	}
	labels := []uint8{0, 2, 1, 2}
	lossAt := func() float64 {
		x := tensor.New(tensor.WithShape(n, pixels), tensor.WithBacking(append([]float32(nil), xs...)))
		l, _, _ := SoftmaxCrossEntropy(m.Forward(x), labels)
		return l
	}
	x := tensor.New(tensor.WithShape(n, pixels), tensor.WithBacking(append([]float32(nil), xs...)))
	_, _, d := SoftmaxCrossEntropy(m.Forward(x), labels)
	if err := m.Backward(d, func(...string) error { return nil }); err != nil {
		t.Fatal(err)
	}
	names, params, grads := m.Params()
	for i, p := range params {
		ps, gs := f32(p), f32(grads[i])
		for j := range ps {
			const h = 1e-3
			old := ps[j]
			ps[j] = old + h
			up := lossAt()
			ps[j] = old - h
			down := lossAt()
			ps[j] = old
			num := (up - down) / (2 * h)
			if math.Abs(num-float64(gs[j])) > 2e-3+0.02*math.Abs(num) {
				t.Errorf("%s: %s[%d]: backward %.5f, finite difference %.5f", m.Describe(), names[i], j, gs[j], num)
			}
		}
	}
}
