package main

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"slices"
	"strings"
	"testing"
)

func idxBytes(magic uint32, dims []uint32, payload []byte) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.BigEndian, magic)
	for _, d := range dims {
		binary.Write(&b, binary.BigEndian, d)
	}
	b.Write(payload)
	return b.Bytes()
}

func gz(b []byte) []byte {
	var out bytes.Buffer
	w := gzip.NewWriter(&out)
	w.Write(b)
	w.Close()
	return out.Bytes()
}

func TestReadIDX(t *testing.T) {
	good := idxBytes(0x00000803, []uint32{2, 2, 3}, []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	for name, in := range map[string][]byte{"raw": good, "gzip": gz(good)} {
		x, err := ReadIDX(bytes.NewReader(in))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !slices.Equal(x.Dims, []int{2, 2, 3}) || len(x.Data) != 12 || x.Data[11] != 12 {
			t.Errorf("%s: got dims %v data %v", name, x.Dims, x.Data)
		}
	}
	bad := map[string]struct {
		in   []byte
		want string
	}{
		"wrong magic":       {idxBytes(0x12345678, []uint32{1}, []byte{0}), "bad magic 0x12345678"},
		"float type":        {idxBytes(0x00000D01, []uint32{1}, []byte{0, 0, 0, 0}), "element type 0x0d not supported"},
		"no dims":           {idxBytes(0x00000800, nil, nil), "zero dimensions"},
		"short header":      {good[:6], "truncated header (dimension 1 of 3)"},
		"truncated payload": {good[:len(good)-2], "header [2 2 3] promises 12 bytes of data, file has 10"},
		"truncated gzip":    {gz(good)[:30], "idx: truncated"},
		"trailing data":     {append(slices.Clone(good), 0), "1 bytes of trailing data"},
		"empty":             {nil, "truncated header (magic)"},
		"huge dims":         {idxBytes(0x00000803, []uint32{1 << 20, 1 << 20, 28}, nil), "exceed"},
	}
	for name, c := range bad {
		_, err := ReadIDX(bytes.NewReader(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got error %v, want one containing %q", name, err, c.want)
		}
	}
}

// The embedded digits load with the sizes and class counts data/README.md gives.
func TestEmbeddedData(t *testing.T) {
	train, test, err := LoadSplits("")
	if err != nil {
		t.Fatal(err)
	}
	if train.Len() != 8000 || test.Len() != 2000 || train.Pixels != 784 {
		t.Fatalf("got %d train, %d test, %d pixels", train.Len(), test.Len(), train.Pixels)
	}
	var counts [10]int
	for _, l := range test.Labels {
		counts[l]++
	}
	if counts != [10]int{200, 225, 198, 206, 196, 173, 203, 214, 189, 196} {
		t.Errorf("test class counts %v", counts)
	}
}

// Whatever the world size, the ranks' micro-batches of a step together are
// the same global batch, each sample once, also when the ranks do not
// divide it (64 over 3 or 5 ranks), and the epoch order depends only on
// seed and epoch.
func TestSharder(t *testing.T) {
	const n, global = 1000, 64
	ref := &Sharder{N: n, Plan: BatchPlan{Global: global, K: 1, Size: 1}, Rank: 0, Seed: 7}
	ref.Epoch(3)
	for _, size := range []int{1, 2, 3, 4, 5} {
		for _, k := range []int{1, 2, 3} {
			plan := BatchPlan{Global: global, K: k, Size: size}
			var steps [][]int
			for rank := range size {
				s := &Sharder{N: n, Plan: plan, Rank: rank, Seed: 7}
				s.Epoch(3)
				if s.Steps() != n/global {
					t.Fatalf("steps %d", s.Steps())
				}
				for step := range s.Steps() {
					if rank == 0 {
						steps = append(steps, nil)
					}
					for micro := range k {
						b := s.Batch(step, micro)
						if len(b) < global/(size*k) || len(b) > plan.MaxLocal() {
							t.Fatalf("size %d k %d: micro-batch of %d samples, want %d or %d", size, k, len(b), global/(size*k), plan.MaxLocal())
						}
						if plan.Even() {
							// The layout of equal micro-batches: slot
							// (micro·size + rank) of the step.
							local := global / (size * k)
							off := step*global + (micro*size+rank)*local
							if want := ref.perm[off : off+local]; !slices.Equal(b, want) {
								t.Fatalf("size %d k %d rank %d step %d micro %d: %v, want %v", size, k, rank, step, micro, b, want)
							}
						}
						steps[step] = append(steps[step], b...)
					}
				}
			}
			for step, got := range steps {
				want := slices.Clone(ref.Batch(step, 0))
				slices.Sort(got)
				slices.Sort(want)
				if !slices.Equal(got, want) {
					t.Fatalf("size %d k %d step %d: ranks cover %v, want %v", size, k, step, got, want)
				}
			}
		}
	}
	other := &Sharder{N: n, Plan: BatchPlan{Global: global, K: 1, Size: 1}, Seed: 7}
	other.Epoch(4)
	if slices.Equal(other.Batch(0, 0), ref.Batch(0, 0)) {
		t.Error("epochs 3 and 4 start with the same batch")
	}
}
