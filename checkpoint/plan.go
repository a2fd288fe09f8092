package checkpoint

import (
	"slices"
	"time"
)

// plan is what every rank agreed a save writes, and where.
type plan struct {
	step    int64
	n       int
	epoch   int     // the comm's membership epoch when the save began
	total   int64   // tensor bytes
	blobLen []int64 // per rank
	need    int64   // one copy of every file
	dom     *domains
	k       int      // replicas beyond the first copy
	mine    []int    // the files this rank writes (see name), ascending
	maxMine int      // the most files any rank writes
	blobs   [][]byte // rank r's blob file; only this rank's unless there are several domains
	start   time.Time

	// The manifest's description of the state, taken when the save began
	// (an asynchronous save commits later).
	tensors   []TensorInfo
	blobNames []string
}

// newPlan is the plan of a save of st at step by the ranks of dom, with k
// replicas and rank r's blobs blobLen[r] bytes long, for rank (whose
// files are mine).
func newPlan(step int64, st *State, dom *domains, k int, blobLen []int64, rank int) *plan {
	n := len(blobLen)
	p := &plan{step: step, n: n, total: st.totalBytes(), blobLen: blobLen, dom: dom, k: k, blobs: make([][]byte, n)}
	var off int64
	for _, t := range st.tensors {
		p.tensors = append(p.tensors, TensorInfo{Name: t.name, DType: t.dtype, Shape: slices.Clone(t.shape), Offset: off, Bytes: int64(len(t.bytes))})
		off += int64(len(t.bytes))
	}
	for _, b := range st.blobs {
		p.blobNames = append(p.blobNames, b.name)
	}
	for f := range 2 * n {
		p.need += p.size(f)
	}
	// Which files this rank writes, and the most any rank writes (the
	// size of the "written" records).
	counts := make([]int, n)
	for f := range 2 * n {
		for _, d := range dom.homes(f%n, k) {
			w := dom.writer(f%n, d)
			counts[w]++
			if w == rank {
				p.mine = append(p.mine, f)
			}
		}
	}
	slices.Sort(p.mine)
	p.maxMine = slices.Max(counts)
	return p
}

// name: files 0..n-1 are the shards of ranks 0..n-1, files n..2n-1 their
// blob files.
func (p *plan) name(f int) string {
	if f < p.n {
		return shardName(f, p.n)
	}
	return blobName(f - p.n)
}

func (p *plan) size(f int) int64 {
	if f < p.n {
		lo, hi := p.shardRange(f)
		return hi - lo
	}
	return p.blobLen[f-p.n]
}

func (p *plan) shardRange(r int) (int64, int64) {
	return p.total * int64(r) / int64(p.n), p.total * int64(r+1) / int64(p.n)
}

// domainBytes is, per storage domain, the bytes of every file it keeps.
func (p *plan) domainBytes() []int64 {
	needs := make([]int64, p.dom.h())
	for f := range 2 * p.n {
		for _, d := range p.dom.homes(f%p.n, p.k) {
			needs[d] += p.size(f)
		}
	}
	return needs
}

// chunks are file f's bytes as views of the state and the blobs.
func (p *plan) chunks(st *State, f int) [][]byte {
	if f < p.n {
		return st.slice(p.shardRange(f))
	}
	return [][]byte{p.blobs[f-p.n]}
}
