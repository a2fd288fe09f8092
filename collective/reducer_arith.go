package collective

import (
	"unsafe"

	"github.com/gorun/gorun/ring"
)

// Element arithmetic of a Reducer's fusion buffers, on float32 or float64
// data viewed as bytes: accumulating micro-batches (addBytes, axpyBytes)
// and scaling the sum back into the gradients (scaleInto).

func f32s(b []byte) []float32 {
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

func f64s(b []byte) []float64 {
	return unsafe.Slice((*float64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
}

// addBytes adds src into dst, elementwise.
func addBytes(dt ring.DType, dst, src []byte) {
	if len(dst) == 0 {
		return
	}
	if dt == ring.Float32 {
		d, s := f32s(dst), f32s(src)
		for i := range d {
			d[i] += s[i]
		}
		return
	}
	d, s := f64s(dst), f64s(src)
	for i := range d {
		d[i] += s[i]
	}
}

// axpyBytes computes dst = a*src (first) or dst += a*src.
func axpyBytes(dt ring.DType, dst, src []byte, a float64, first bool) {
	if len(dst) == 0 {
		return
	}
	if dt == ring.Float32 {
		d, s, f := f32s(dst), f32s(src), float32(a)
		for i := range d {
			if first {
				d[i] = s[i] * f
			} else {
				d[i] += s[i] * f
			}
		}
		return
	}
	d, s := f64s(dst), f64s(src)
	for i := range d {
		if first {
			d[i] = s[i] * a
		} else {
			d[i] += s[i] * a
		}
	}
}

// scaleInto writes src*scale into dst.
func scaleInto(dt ring.DType, dst, src []byte, scale float64) {
	if len(dst) == 0 {
		return
	}
	if dt == ring.Float32 {
		d, s, f := f32s(dst), f32s(src), float32(scale)
		for i := range d {
			d[i] = s[i] * f
		}
		return
	}
	d, s := f64s(dst), f64s(src)
	for i := range d {
		d[i] = s[i] * scale
	}
}
