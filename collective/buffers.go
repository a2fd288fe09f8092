package collective

import (
	"fmt"
	"unsafe"

	"gorgonia.org/tensor"

	"github.com/gorun/gorun/ring"
)

// view is a user buffer seen as raw bytes plus its element type. The ring
// works on bytes so that one schedule serves every dtype; the kernels cast
// them back.
type view struct {
	dtype ring.DType
	bytes []byte
	count int
}

func (v view) String() string { return fmt.Sprintf("%s[%d]", v.dtype, v.count) }

// bytesOf returns the memory of s without copying.
func bytesOf[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var zero T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(zero)))
}

// viewOf accepts the buffer types the collectives support: []float32,
// []float64, []int32, []int64, []byte (Broadcast and Allgather only) and a
// contiguous *tensor.Dense of one of the numeric dtypes.
func viewOf(buf any) (view, error) {
	switch b := buf.(type) {
	case []float32:
		return view{ring.Float32, bytesOf(b), len(b)}, nil
	case []float64:
		return view{ring.Float64, bytesOf(b), len(b)}, nil
	case []int32:
		return view{ring.Int32, bytesOf(b), len(b)}, nil
	case []int64:
		return view{ring.Int64, bytesOf(b), len(b)}, nil
	case []byte:
		return view{ring.Uint8, b, len(b)}, nil
	case *tensor.Dense:
		if b == nil {
			return view{}, fmt.Errorf("nil *tensor.Dense")
		}
		var dt ring.DType
		switch b.Dtype() {
		case tensor.Float32:
			dt = ring.Float32
		case tensor.Float64:
			dt = ring.Float64
		case tensor.Int32:
			dt = ring.Int32
		case tensor.Int64:
			dt = ring.Int64
		default:
			return view{}, fmt.Errorf("tensor dtype %v is not supported: use float32, float64, int32 or int64", b.Dtype())
		}
		if b.RequiresIterator() {
			return view{}, fmt.Errorf("tensor of shape %v is a non-contiguous view: call Materialize() first", b.Shape())
		}
		raw := b.Header.Raw
		n := b.DataSize()
		if len(raw) < n*dt.Size() {
			return view{}, fmt.Errorf("tensor of shape %v holds %d bytes, want %d", b.Shape(), len(raw), n*dt.Size())
		}
		return view{dt, raw[:n*dt.Size()], n}, nil
	case nil:
		return view{}, fmt.Errorf("nil buffer")
	default:
		return view{}, fmt.Errorf("buffer type %T is not supported: use []float32, []float64, []int32, []int64 or *tensor.Dense", buf)
	}
}
