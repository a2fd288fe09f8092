package main

import (
	"fmt"
	"math"
	"math/rand/v2"

	"gorgonia.org/tensor"
)

// CNN is a small convolutional network: a K×K convolution with C output
// channels over the one-channel image, ReLU, 2×2 max-pooling, then an MLP
// head. Activations are stored NHWC: sample, row, column, channel.
type CNN struct {
	Conv *Conv
	Pool *MaxPool2
	Head *MLP
}

// NewCNN builds conv(k×k, c channels) → pool → MLP(hidden…, out).
func NewCNN(h, w, k, c int, hidden []int, out int, rng *rand.Rand) *CNN {
	conv := NewConv("conv1", h, w, k, c, rng)
	ph, pw := conv.OH/2, conv.OW/2
	head := NewMLP(ph*pw*c, hidden, out, rng)
	return &CNN{Conv: conv, Pool: &MaxPool2{H: conv.OH, W: conv.OW, C: c}, Head: head}
}

func (m *CNN) Forward(x *tensor.Dense) *tensor.Dense {
	return m.Head.Forward(m.Pool.Forward(m.Conv.Forward(x)))
}

func (m *CNN) Backward(dlogits *tensor.Dense, done func(names ...string) error) error {
	d, err := m.Head.backward(dlogits, done, true)
	if err != nil {
		return err
	}
	m.Conv.Backward(m.Pool.Backward(d))
	return done(m.Conv.Name+".weight", m.Conv.Name+".bias")
}

func (m *CNN) Params() (names []string, params, grads []*tensor.Dense) {
	names, params, grads = m.Head.Params()
	names = append(names, m.Conv.Name+".weight", m.Conv.Name+".bias")
	params = append(params, m.Conv.W, m.Conv.B)
	grads = append(grads, m.Conv.DW, m.Conv.DB)
	return names, params, grads
}

func (m *CNN) Describe() string {
	return fmt.Sprintf("CNN conv %d×%d×%d, ReLU, maxpool 2×2, %s", m.Conv.K, m.Conv.K, m.Conv.C, m.Head.Describe())
}

// Conv is a valid (no padding, stride 1) K×K convolution of a one-channel
// H×W image into C channels, followed by a ReLU, computed as one matrix
// product with im2col: every K×K patch becomes a row of cols, so
//
//	y = cols · W + b      cols: (n·OH·OW) × K²   W: K² × C   y: (n·OH·OW) × C
//
// and backward is the same as a Linear layer's: dW = colsᵀ·dz, db = Σ dz
// (no dx: it is the first layer).
type Conv struct {
	Name           string
	InH, InW, K, C int
	OH, OW         int
	W, B, DW, DB   *tensor.Dense
	cols, y        *tensor.Dense // saved by Forward
}

// NewConv initialises like nn.Conv2d: uniform in ±1/√(K²).
func NewConv(name string, h, w, k, c int, rng *rand.Rand) *Conv {
	l := NewLinear(name, k*k, c, true, rng)
	return &Conv{Name: name, InH: h, InW: w, K: k, C: c, OH: h - k + 1, OW: w - k + 1, W: l.W, B: l.B, DW: l.DW, DB: l.DB}
}

// Forward maps x (n × H·W) to relu(conv) as (n × OH·OW·C).
func (l *Conv) Forward(x *tensor.Dense) *tensor.Dense {
	n, xs := x.Shape()[0], f32(x)
	kk, positions := l.K*l.K, l.OH*l.OW
	cols := make([]float32, n*positions*kk)
	for i := range n {
		img := xs[i*l.InH*l.InW:]
		for oy := range l.OH {
			for ox := range l.OW {
				row := cols[((i*l.OH+oy)*l.OW+ox)*kk:]
				for ky := range l.K {
					copy(row[ky*l.K:(ky+1)*l.K], img[(oy+ky)*l.InW+ox:])
				}
			}
		}
	}
	l.cols = tensor.New(tensor.WithShape(n*positions, kk), tensor.WithBacking(cols))
	y := must(tensor.MatMul(l.cols, l.W))
	ys, b := f32(y), f32(l.B)
	for j := range ys {
		ys[j] = max(ys[j]+b[j%l.C], 0)
	}
	l.y = y
	return tensor.New(tensor.WithShape(n, positions*l.C), tensor.WithBacking(ys))
}

// Backward takes dL/dy (n × OH·OW·C) and fills DW and DB.
func (l *Conv) Backward(dy *tensor.Dense) {
	ds, ys := f32(dy), f32(l.y)
	for j := range ds {
		if ys[j] <= 0 {
			ds[j] = 0
		}
	}
	dz := tensor.New(tensor.WithShape(l.y.Shape()...), tensor.WithBacking(ds))
	must(tensor.MatMul(transposed(l.cols), dz, tensor.WithReuse(l.DW)))
	db := f32(l.DB)
	clear(db)
	for j, g := range ds {
		db[j%l.C] += g
	}
}

// MaxPool2 keeps the largest of every 2×2 block of each channel (NHWC);
// backward routes each gradient to the input that won.
type MaxPool2 struct {
	H, W, C int
	arg     []int // for each output, the index of its input in the batch
	inLen   int
}

func (p *MaxPool2) Forward(x *tensor.Dense) *tensor.Dense {
	n, xs := x.Shape()[0], f32(x)
	ph, pw := p.H/2, p.W/2
	out := make([]float32, n*ph*pw*p.C)
	p.arg, p.inLen = make([]int, len(out)), len(xs)
	for i := range n {
		for py := range ph {
			for px := range pw {
				for c := range p.C {
					o := ((i*ph+py)*pw+px)*p.C + c
					best, bestV := -1, float32(math.Inf(-1))
					for dy := range 2 {
						for dx := range 2 {
							j := ((i*p.H+2*py+dy)*p.W+2*px+dx)*p.C + c
							if xs[j] > bestV {
								best, bestV = j, xs[j]
							}
						}
					}
					out[o], p.arg[o] = bestV, best
				}
			}
		}
	}
	return tensor.New(tensor.WithShape(n, ph*pw*p.C), tensor.WithBacking(out))
}

func (p *MaxPool2) Backward(dout *tensor.Dense) *tensor.Dense {
	din := make([]float32, p.inLen)
	for o, g := range f32(dout) {
		din[p.arg[o]] += g
	}
	return tensor.New(tensor.WithShape(dout.Shape()[0], p.inLen/dout.Shape()[0]), tensor.WithBacking(din))
}
