package main

import (
	"fmt"
	"math"

	"gorgonia.org/tensor"
)

// Optimizer updates parameters in place from their (averaged) gradients.
type Optimizer interface {
	Step(params, grads []*tensor.Dense)
	// State lists the optimizer's buffers, for checkpoints: they are
	// replicated (the same on every rank) like the parameters.
	State() (names []string, bufs []any)
}

// NewOptimizer returns "sgd" (with momentum, as torch.optim.SGD) or "adam"
// for params.
func NewOptimizer(name string, lr, momentum float64, params []*tensor.Dense) (Optimizer, error) {
	switch name {
	case "sgd":
		return &SGD{LR: float32(lr), Momentum: float32(momentum), velocity: zerosLike(params)}, nil
	case "adam":
		return &Adam{LR: lr, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, m: zerosLike(params), v: zerosLike(params), t: []int64{0}}, nil
	}
	return nil, fmt.Errorf("--optimizer %q: want sgd or adam", name)
}

// SGD with momentum: v ← μ·v + g; p ← p − lr·v.
type SGD struct {
	LR, Momentum float32
	velocity     [][]float32
}

func (o *SGD) State() (names []string, bufs []any) {
	for i, v := range o.velocity {
		names = append(names, fmt.Sprintf("sgd.velocity%d", i))
		bufs = append(bufs, v)
	}
	return names, bufs
}

func (o *SGD) Step(params, grads []*tensor.Dense) {
	for i, p := range params {
		ps, gs, vs := f32(p), f32(grads[i]), o.velocity[i]
		for j, g := range gs {
			vs[j] = o.Momentum*vs[j] + g
			ps[j] -= o.LR * vs[j]
		}
	}
}

// Adam: m ← β₁m + (1−β₁)g; v ← β₂v + (1−β₂)g²;
// p ← p − lr·m̂/(√v̂ + ε) with the bias-corrected m̂ = m/(1−β₁ᵗ), v̂ = v/(1−β₂ᵗ).
type Adam struct {
	LR, Beta1, Beta2, Eps float64
	m, v                  [][]float32
	t                     []int64 // steps taken (a slice: checkpoints restore it in place)
}

func (o *Adam) State() (names []string, bufs []any) {
	names, bufs = []string{"adam.t"}, []any{o.t}
	for i := range o.m {
		names = append(names, fmt.Sprintf("adam.m%d", i), fmt.Sprintf("adam.v%d", i))
		bufs = append(bufs, o.m[i], o.v[i])
	}
	return names, bufs
}

func (o *Adam) Step(params, grads []*tensor.Dense) {
	o.t[0]++
	c1 := 1 - math.Pow(o.Beta1, float64(o.t[0]))
	c2 := 1 - math.Pow(o.Beta2, float64(o.t[0]))
	b1, b2 := float32(o.Beta1), float32(o.Beta2)
	for i, p := range params {
		ps, gs, ms, vs := f32(p), f32(grads[i]), o.m[i], o.v[i]
		for j, g := range gs {
			ms[j] = b1*ms[j] + (1-b1)*g
			vs[j] = b2*vs[j] + (1-b2)*g*g
			mh := float64(ms[j]) / c1
			vh := float64(vs[j]) / c2
			ps[j] -= float32(o.LR * mh / (math.Sqrt(vh) + o.Eps))
		}
	}
}

func zerosLike(ts []*tensor.Dense) [][]float32 {
	out := make([][]float32, len(ts))
	for i, t := range ts {
		out[i] = make([]float32, t.Len())
	}
	return out
}
