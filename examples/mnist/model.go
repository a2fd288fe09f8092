package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"

	"gorgonia.org/tensor"
)

// Linear is one fully connected layer, y = x·W + b, optionally followed by
// a ReLU. With a batch of n rows:
//
//	x: n × in   W: in × out   b: out   y: n × out
//
// Forward keeps x and y for Backward, which, given dL/dy, computes
//
//	dz = dL/dy ⊙ [y > 0]   (the ReLU passes gradient only where it was active)
//	dW = xᵀ · dz           (in × out, summed over the batch)
//	db = Σ_rows dz         (out)
//	dx = dz · Wᵀ           (n × in, handed to the layer below)
type Linear struct {
	Name   string
	ReLU   bool
	W, B   *tensor.Dense // parameters
	DW, DB *tensor.Dense // their gradients, overwritten by every Backward
	x, y   *tensor.Dense // saved by Forward
}

// NewLinear initialises W and b uniformly in ±1/√in, as PyTorch's nn.Linear
// does.
func NewLinear(name string, in, out int, relu bool, rng *rand.Rand) *Linear {
	bound := 1 / math.Sqrt(float64(in))
	uniform := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32((rng.Float64()*2 - 1) * bound)
		}
		return v
	}
	return &Linear{
		Name: name, ReLU: relu,
		W:  tensor.New(tensor.WithShape(in, out), tensor.WithBacking(uniform(in*out))),
		B:  tensor.New(tensor.WithShape(out), tensor.WithBacking(uniform(out))),
		DW: tensor.New(tensor.WithShape(in, out), tensor.Of(tensor.Float32)),
		DB: tensor.New(tensor.WithShape(out), tensor.Of(tensor.Float32)),
	}
}

// Forward computes y = relu(x·W + b) (or without relu on the last layer).
func (l *Linear) Forward(x *tensor.Dense) *tensor.Dense {
	y := must(tensor.MatMul(x, l.W)) // the matrix product goes to BLAS (Sgemm)
	ys, b := f32(y), f32(l.B)
	out := len(b)
	for i := range ys {
		ys[i] += b[i%out]
		if l.ReLU && ys[i] < 0 {
			ys[i] = 0
		}
	}
	l.x, l.y = x, y
	return y
}

// Backward takes dL/dy, fills DW and DB, and returns dL/dx (nil when
// needDx is false: the first layer has nobody to hand it to).
func (l *Linear) Backward(dy *tensor.Dense, needDx bool) *tensor.Dense {
	dz := dy
	if l.ReLU {
		ds, ys := f32(dz), f32(l.y)
		for i := range ds {
			if ys[i] <= 0 {
				ds[i] = 0
			}
		}
	}
	// dW = xᵀ·dz, written straight into DW (the reducer holds on to its
	// memory). transposed gives a view: BLAS reads x as its transpose.
	must(tensor.MatMul(transposed(l.x), dz, tensor.WithReuse(l.DW)))
	db, ds := f32(l.DB), f32(dz)
	clear(db)
	for i, g := range ds {
		db[i%len(db)] += g
	}
	if !needDx {
		return nil
	}
	return must(tensor.MatMul(dz, transposed(l.W)))
}

// Model is what the training loop needs from a network.
type Model interface {
	// Forward returns the logits (n × 10) of a batch x (n × pixels).
	Forward(x *tensor.Dense) *tensor.Dense
	// Backward back-propagates dL/dlogits, calling done with the names of
	// the gradients that are final, last layer first.
	Backward(dlogits *tensor.Dense, done func(names ...string) error) error
	// Params lists parameters and gradients in the order Backward
	// finishes them: the order to register them with the Reducer.
	Params() (names []string, params, grads []*tensor.Dense)
	// Describe names the architecture.
	Describe() string
}

// MLP is a stack of Linear layers, ReLU between them, logits out.
type MLP struct {
	Layers []*Linear
}

// NewMLP builds in → hidden... → out, deterministically from rng.
func NewMLP(in int, hidden []int, out int, rng *rand.Rand) *MLP {
	m := &MLP{}
	sizes := append(append([]int{in}, hidden...), out)
	for i := 0; i+1 < len(sizes); i++ {
		last := i+2 == len(sizes)
		m.Layers = append(m.Layers, NewLinear(fmt.Sprintf("fc%d", i+1), sizes[i], sizes[i+1], !last, rng))
	}
	return m
}

// Forward returns the logits of a batch x (n × in).
func (m *MLP) Forward(x *tensor.Dense) *tensor.Dense {
	for _, l := range m.Layers {
		x = l.Forward(x)
	}
	return x
}

// Backward back-propagates dL/dlogits from the last layer to the first,
// calling done as soon as a layer's gradients are final, so that their
// allreduce can start while the layers below are still computing.
func (m *MLP) Backward(dlogits *tensor.Dense, done func(names ...string) error) error {
	_, err := m.backward(dlogits, done, false)
	return err
}

// backward also returns dL/dinput when needDx (for a layer below the MLP).
func (m *MLP) backward(d *tensor.Dense, done func(names ...string) error, needDx bool) (*tensor.Dense, error) {
	for i := len(m.Layers) - 1; i >= 0; i-- {
		d = m.Layers[i].Backward(d, i > 0 || needDx)
		if err := done(m.Layers[i].Name+".weight", m.Layers[i].Name+".bias"); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// Describe gives the layer sizes, e.g. "MLP 784-128-10".
func (m *MLP) Describe() string {
	arch := []string{strconv.Itoa(m.Layers[0].W.Shape()[0])}
	for _, l := range m.Layers {
		arch = append(arch, strconv.Itoa(l.W.Shape()[1]))
	}
	return "MLP " + strings.Join(arch, "-")
}

// Params lists parameters and gradients in the order Backward finishes
// them (last layer first): the order to register them with the Reducer.
func (m *MLP) Params() (names []string, params, grads []*tensor.Dense) {
	for i := len(m.Layers) - 1; i >= 0; i-- {
		l := m.Layers[i]
		names = append(names, l.Name+".weight", l.Name+".bias")
		params = append(params, l.W, l.B)
		grads = append(grads, l.DW, l.DB)
	}
	return names, params, grads
}

// SoftmaxCrossEntropy returns the mean loss over the batch, the number of
// correct predictions and dL/dlogits. With p = softmax(logits) and the
// one-hot label t, the loss is -log p[label] and its gradient (p - t)/n.
func SoftmaxCrossEntropy(logits *tensor.Dense, labels []uint8) (loss float64, correct int, dlogits *tensor.Dense) {
	n, k := logits.Shape()[0], logits.Shape()[1]
	z := f32(logits)
	grad := make([]float32, n*k)
	for i := range n {
		row, g := z[i*k:(i+1)*k], grad[i*k:(i+1)*k]
		best := 0
		for j, v := range row { // subtract the max for numerical stability
			if v > row[best] {
				best = j
			}
		}
		if best == int(labels[i]) {
			correct++
		}
		var sum float64
		for j, v := range row {
			e := math.Exp(float64(v - row[best]))
			g[j] = float32(e)
			sum += e
		}
		for j := range g {
			g[j] = float32(float64(g[j]) / sum / float64(n))
		}
		loss -= math.Log(math.Max(float64(g[labels[i]])*float64(n), 1e-30))
		g[labels[i]] -= 1 / float32(n)
	}
	return loss / float64(n), correct, tensor.New(tensor.WithShape(n, k), tensor.WithBacking(grad))
}

// transposed is a transposed view of a 2-d tensor, sharing its memory.
func transposed(t *tensor.Dense) *tensor.Dense {
	v := t.ShallowClone()
	must0(v.T())
	return v
}

func f32(t *tensor.Dense) []float32 { return t.Data().([]float32) }

func must(t tensor.Tensor, err error) *tensor.Dense {
	if err != nil {
		panic(err)
	}
	return t.(*tensor.Dense)
}

func must0(err error) {
	if err != nil {
		panic(err)
	}
}
