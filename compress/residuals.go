package compress

import (
	"math"
	"sync"
)

// Residuals holds what compression lost, per tensor, to add back into the
// next call (error feedback): before compressing gradient g of tensor name,
// call Apply(name, g); after learning what was actually sent (the decoded
// value, e.g. from RoundTrip), call Update(name, g, sent). Over many steps
// the sum of what was sent then tracks the sum of the true gradients to
// within one step's quantization error, instead of drifting by it every step.
//
// Residuals is safe for concurrent use; calls for different names do not
// block each other except briefly on the shared map. The zero value is not
// usable; call NewResiduals.
type Residuals struct {
	mu sync.RWMutex
	m  map[string]*residual
}

type residual struct {
	mu sync.Mutex
	v  []float32
}

// NewResiduals returns an empty set of residuals.
func NewResiduals() *Residuals {
	return &Residuals{m: make(map[string]*residual)}
}

func (r *Residuals) get(name string, create bool) *residual {
	r.mu.RLock()
	e := r.m[name]
	r.mu.RUnlock()
	if e != nil || !create {
		return e
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if e = r.m[name]; e == nil {
		e = new(residual)
		r.m[name] = e
	}
	return e
}

// Apply adds the stored residual of name into grad (grad += residual). It
// does nothing if there is none; if the stored residual has a different
// length (the tensor changed shape) it is discarded.
func (r *Residuals) Apply(name string, grad []float32) {
	e := r.get(name, false)
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.v) != len(grad) {
		e.v = e.v[:0]
		return
	}
	v := e.v[:len(grad)]
	for i := range grad {
		grad[i] += v[i]
	}
}

// Update stores residual[name] = meant - sent, where meant is what this
// rank wanted to send (gradient plus applied residual) and sent is what the
// receivers decode. If the lengths differ the residual is discarded. A
// non-finite difference (from a NaN or Inf gradient) is stored as 0 so that
// one bad step does not poison every later one.
func (r *Residuals) Update(name string, meant, sent []float32) {
	e := r.get(name, true)
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(meant) != len(sent) {
		e.v = e.v[:0]
		return
	}
	if cap(e.v) < len(meant) {
		e.v = make([]float32, len(meant))
	}
	v := e.v[:len(meant)]
	sent = sent[:len(meant)]
	for i, m := range meant {
		d := m - sent[i]
		if math.Float32bits(d)&0x7F800000 == 0x7F800000 {
			d = 0
		}
		v[i] = d
	}
	e.v = v
}

// Reset forgets the residual of name.
func (r *Residuals) Reset(name string) {
	r.mu.Lock()
	delete(r.m, name)
	r.mu.Unlock()
}

// ResetAll forgets every residual.
func (r *Residuals) ResetAll() {
	r.mu.Lock()
	clear(r.m)
	r.mu.Unlock()
}

// RoundTrip encodes src with c and decodes it into dst (len(dst) ==
// len(src)), giving exactly what a receiver will see; buf is scratch space
// that is grown if needed and returned for reuse. It is the "sent" argument
// of Residuals.Update.
func RoundTrip(c Codec, dst, src []float32, buf []byte) (Info, []byte, error) {
	need := c.EncodedLen(len(src))
	if cap(buf) < need {
		buf = make([]byte, need)
	}
	buf = buf[:need]
	info := c.Encode(buf, src)
	return info, buf, c.Decode(dst, buf)
}

// RelRMSE returns the relative RMS error sqrt(sum (got-want)^2 / sum
// want^2), accumulated in float64. It returns 0 if both sums are 0, +Inf if
// only the denominator is, and NaN if the lengths differ.
func RelRMSE(got []float32, want []float64) float64 {
	if len(got) != len(want) {
		return math.NaN()
	}
	var num, den float64
	for i, w := range want {
		d := float64(got[i]) - w
		num += d * d
		den += w * w
	}
	if num == 0 {
		return 0
	}
	return math.Sqrt(num / den)
}
