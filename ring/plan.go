package ring

import (
	"fmt"
	"unsafe"
)

// The plan: a collective as the pipelined engine (engine.go) runs it.
//
// A collective is described by a plan: a segment space of count elements
// split into nseg near-equal segments (the first count%nseg get one extra
// element), and a number of steps. At every step a rank sends at most one
// segment to the next rank and receives at most one segment from the
// previous rank: plan.step asks the collective's step function
// (allreduceStep in allreduce.go, reduceScatterStep, allgatherStep,
// broadcastStep, barrierStep, shiftStep), which says which segments, from
// and into which buffer, and whether the received one is reduced. Each
// segment travels as chunks of at most ce elements, one message (header +
// payload) per chunk; an empty segment travels as one header-only message,
// so every step is checked even when there is nothing to move (Count 0, or
// Count < Size).

type bufID uint8

const (
	bMain bufID = iota // Allreduce/Broadcast buffer, Allgather output
	bIn                // ReduceScatter input
	bWork              // ReduceScatter partial results
	bOut               // ReduceScatter output (holds segment `rank` only)
	nBufs
)

type plan struct {
	call  Call // normalized
	esz   int  // element size (1 for Barrier)
	ce    int  // elements per chunk
	nseg  int
	count int // elements in the segment space
	steps int
	bufs  [nBufs][]byte
	base  [nBufs]int // segment-space byte offset of bufs[i][0]
	// gather: an Allreduce run as an allgather of whole buffers
	// (allreduceTiny); the fingerprint stays the Allreduce call.
	gather bool
}

// step says what a rank does at one step of a plan.
type step struct {
	send, recv int   // segment index, or -1 for none
	dep        bool  // sent chunks wait for matching receive progress
	src        bufID // buffer the sent segment is read from
	dst        bufID // buffer the received segment lands in (copy or reduce result)
	a          bufID // local operand when reducing: dst = a op received
	reduce     bool
	final      bool // apply Avg division after reducing
}

func (p *plan) step(rank, size, t int) step {
	switch p.call.Kind {
	case Allreduce:
		if p.gather {
			return allgatherStep(rank, size, t)
		}
		return allreduceStep(rank, size, t)
	case ReduceScatter:
		return reduceScatterStep(rank, size, t)
	case Allgather:
		return allgatherStep(rank, size, t)
	case Broadcast:
		return broadcastStep(rank, size, p.call.Root)
	case Barrier:
		return barrierStep(t)
	case Shift:
		return shiftStep(rank, size)
	}
	panic("ring: bad kind")
}

// segment returns the element offset and length of segment i.
func (p *plan) segment(i int) (off, n int) {
	q, rem := p.count/p.nseg, p.count%p.nseg
	off = i*q + min(i, rem)
	n = q
	if i < rem {
		n++
	}
	return off, n
}

// bytes returns the bytes of elements [off, off+n) of the segment space in
// buffer id.
func (p *plan) bytes(id bufID, off, n int) []byte {
	s := off*p.esz - p.base[id]
	return p.bufs[id][s : s+n*p.esz]
}

func mod(a, n int) int { return ((a % n) + n) % n }

func numChunks(n, ce int) int {
	if n == 0 {
		return 1 // header-only message
	}
	return (n + ce - 1) / ce
}

// setup fills r.p's common fields and sizes the scratch buffer.
func (r *Ring) setup(c Call, nseg, count, steps int) *plan {
	p := &r.p
	esz := c.DType.Size()
	if esz == 0 {
		esz = 1
	}
	*p = plan{call: c, esz: esz, ce: max(1, r.chunkBytes/esz), nseg: nseg, count: count, steps: steps}
	if c.Kind == Allreduce || c.Kind == ReduceScatter {
		maxSeg := (count + nseg - 1) / nseg
		r.scratch = growAligned(r.scratch, min(p.ce, maxSeg)*esz)
	}
	return p
}

// growAligned returns a buffer of at least n bytes, 8-byte aligned, reusing b
// when it is large enough.
func growAligned(b []byte, n int) []byte {
	if cap(b) >= n {
		return b[:cap(b)]
	}
	w := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), len(w)*8)
}

func (r *Ring) errPrefix(t int) string {
	return fmt.Sprintf("%s #%d step %d", r.p.call.Kind, r.p.call.Seq, t)
}
