package collective

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/gorun/gorun/ring"
)

// A Reducer's bucket layout and the check that goes with it: Seal packs
// the registered gradients into fusion buffers (layout), then compares,
// with small collectives, every rank's registration and options, and on a
// difference says which tensors differ on which ranks (checkTopology).

// describe is this rank's registration, one line per tensor, preceded by
// the options that decide the bucket layout.
func (r *Reducer) describe() []string {
	opts := fmt.Sprintf("options: k=%d fusion=%d", r.k, r.threshold)
	if r.weighted {
		// k differs between ranks; the split rule they share is what counts.
		opts = fmt.Sprintf("options: global=%d local=%d uneven fusion=%d", r.opts.GlobalBatch, r.opts.LocalBatch, r.threshold)
	}
	lines := []string{opts + r.bal.describe()}
	for _, e := range r.entries {
		p := "-"
		if e.param != nil {
			p = e.pv.dtype.String()
		}
		line := fmt.Sprintf("%q grad %s%v param %s", e.name, e.gv.dtype, e.shape, p)
		if e.codec != "" {
			line += " codec " + e.codec
		}
		lines = append(lines, line)
	}
	return lines
}

// Seal ends registration: it lays out the fusion buffers and checks, with
// two small collectives, that every rank registered the same names, shapes
// and dtypes in the same order and uses the same options. Every rank must
// call it (GradReady, Backward, Step, BroadcastParameters and
// CheckConsistency call it the first time).
func (r *Reducer) Seal(ctx context.Context) error {
	r.follow()
	if r.sealed {
		return r.sealErr
	}
	r.sealed = true
	r.layout()
	r.sealErr = r.checkTopology(ctx)
	return r.sealErr
}

func (r *Reducer) layout() {
	var cur *bucket
	for i, e := range r.entries {
		n := len(e.gv.bytes)
		if cur == nil || cur.dtype != e.gv.dtype || cur.codec != e.codec || r.threshold < 0 || cur.bytes+n > r.threshold {
			cur = &bucket{dtype: e.gv.dtype, codec: e.codec}
			r.buckets = append(r.buckets, cur)
		}
		e.bucket, e.off = len(r.buckets)-1, cur.bytes
		cur.entries = append(cur.entries, i)
		cur.bytes += n
	}
	for i, b := range r.buckets {
		b.name = r.entries[b.entries[0]].name
		if len(b.entries) > 1 {
			b.name = fmt.Sprintf("bucket %d (%d tensors, %s..%s)", i, len(b.entries), b.name, r.entries[b.entries[len(b.entries)-1]].name)
		}
		if len(b.entries) == 1 && r.k == 1 && !r.weighted {
			b.direct = true
			b.arg = r.entries[b.entries[0]].grad
			continue
		}
		switch b.dtype {
		case ring.Float32:
			s := make([]float32, b.bytes/4)
			b.buf, b.arg = bytesOf(s), s
		case ring.Float64:
			s := make([]float64, b.bytes/8)
			b.buf, b.arg = bytesOf(s), s
		}
	}
}

func (r *Reducer) checkTopology(ctx context.Context) error {
	c := r.comm
	desc := r.describe()
	sum := sha256.Sum256([]byte(strings.Join(desc, "\n")))
	all := make([]byte, len(sum)*c.Size())
	if err := c.Allgather(ctx, sum[:], all, Name("reducer topology digest")); err != nil {
		return err
	}
	same := true
	for i := 1; i < c.Size(); i++ {
		if string(all[i*len(sum):(i+1)*len(sum)]) != string(all[:len(sum)]) {
			same = false
		}
	}
	if same {
		return nil
	}
	// Exchange the descriptions to say what differs.
	text := []byte(strings.Join(desc, "\n"))
	lens := make([]int64, c.Size())
	if err := c.Allgather(ctx, []int64{int64(len(text))}, lens, Name("reducer topology length")); err != nil {
		return err
	}
	m := int(slices.Max(lens))
	pad := make([]byte, m)
	copy(pad, text)
	texts := make([]byte, m*c.Size())
	if err := c.Allgather(ctx, pad, texts, Name("reducer topology")); err != nil {
		return err
	}
	descs := make([][]string, c.Size())
	for i := range descs {
		descs[i] = strings.Split(string(texts[i*m:i*m+int(lens[i])]), "\n")
	}
	return topologyError(descs)
}

// topologyError lists, for every rank whose registration differs from rank
// 0's, the first few differences.
func topologyError(descs [][]string) error {
	var b strings.Builder
	b.WriteString("gorun: Reducer: ranks registered different tensors (each line compares a rank with rank 0):")
	for r := 1; r < len(descs); r++ {
		a, o := descs[0], descs[r]
		if slices.Equal(a, o) {
			continue
		}
		shown := 0
		for i := 0; i < max(len(a), len(o)) && shown < 5; i++ {
			var x, y string
			if i < len(a) {
				x = a[i]
			}
			if i < len(o) {
				y = o[i]
			}
			if x == y {
				continue
			}
			shown++
			switch {
			case i == 0:
				fmt.Fprintf(&b, "\n  rank %d: %s, rank 0: %s", r, y, x)
			case y == "":
				fmt.Fprintf(&b, "\n  rank %d: has no tensor #%d; rank 0 registered %s", r, i-1, x)
			case x == "":
				fmt.Fprintf(&b, "\n  rank %d: tensor #%d is %s; rank 0 registered only %d", r, i-1, y, len(a)-1)
			default:
				fmt.Fprintf(&b, "\n  rank %d: tensor #%d is %s; rank 0 has %s", r, i-1, y, x)
			}
		}
		if len(a) != len(o) {
			fmt.Fprintf(&b, "\n  rank %d registered %d tensors, rank 0 registered %d", r, len(o)-1, len(a)-1)
		}
	}
	return errors.New(b.String())
}
