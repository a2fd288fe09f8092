package main

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestPlanBatches(t *testing.T) {
	for _, tc := range []struct {
		batch, global, accumulate, size int
		want                            BatchPlan
		describe                        string // per-rank micro-batch sizes
	}{
		// The default: 64 samples per step, whatever the number of ranks.
		{0, 0, 0, 1, BatchPlan{64, 1, 1}, "64"},
		{0, 0, 0, 4, BatchPlan{64, 1, 4}, "16, 16, 16, 16"},
		{0, 0, 0, 3, BatchPlan{64, 1, 3}, "21, 21, 22"},
		{0, 0, 2, 3, BatchPlan{64, 2, 3}, "10+10, 11+11, 11+11"},
		{0, 256, 0, 4, BatchPlan{256, 1, 4}, "64, 64, 64, 64"},
		// --batch alone keeps its old meaning: per rank.
		{64, 0, 0, 4, BatchPlan{256, 1, 4}, "64, 64, 64, 64"},
		{16, 0, 2, 2, BatchPlan{64, 2, 2}, "16+16, 16+16"},
		// Both: k follows.
		{16, 128, 0, 2, BatchPlan{128, 4, 2}, "16+16+16+16, 16+16+16+16"},
	} {
		got, err := planBatches(tc.batch, tc.global, tc.accumulate, tc.size)
		if err != nil || got != tc.want || got.Describe() != tc.describe {
			t.Errorf("planBatches(batch %d, global %d, accumulate %d, %d ranks) = %+v (%s), %v; want %+v (%s)",
				tc.batch, tc.global, tc.accumulate, tc.size, got, got.Describe(), err, tc.want, tc.describe)
		}
	}
	for _, tc := range []struct {
		batch, global, accumulate, size int
		want                            string
	}{
		{16, 100, 0, 2, "not divisible"},
		{16, 128, 3, 2, "--accumulate 3 contradicts"},
		{0, 4, 0, 8, "smaller than 8 ranks"},
	} {
		if _, err := planBatches(tc.batch, tc.global, tc.accumulate, tc.size); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("planBatches(batch %d, global %d, accumulate %d, %d ranks): error %v, want one containing %q",
				tc.batch, tc.global, tc.accumulate, tc.size, err, tc.want)
		}
	}
}

// With 64 samples over 3 ranks × 2 micro-batches (slots of 10 and 11), the
// weighted micro-batch gradients, averaged as the Reducer does (equal
// weights over ranks and micro-batches), are the gradient of the mean loss
// over all 64 samples — what one rank computes with one batch of 64.
func TestUnevenSplitAveragesOverTheGlobalBatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const pixels, n = 12, 64
	d := &Dataset{Images: make([]float32, n*pixels), Labels: make([]uint8, n), Pixels: pixels}
	for i := range d.Images {
		d.Images[i] = float32(rng.NormFloat64())
	}
	for i := range d.Labels {
		d.Labels[i] = uint8(rng.IntN(10))
	}
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	model := NewMLP(pixels, []int{7}, 10, rng)
	_, _, grads := model.Params()
	none := func(...string) error { return nil }
	gradsOf := func() [][]float32 {
		var out [][]float32
		for _, g := range grads {
			out = append(out, append([]float32(nil), f32(g)...))
		}
		return out
	}

	one := BatchPlan{Global: n, K: 1, Size: 1}
	if _, _, err := trainMicroBatch(model, d, idx, one.Weight(n), make([]float32, n*pixels), make([]uint8, n), none); err != nil {
		t.Fatal(err)
	}
	want := gradsOf()

	plan := BatchPlan{Global: n, K: 2, Size: 3}
	if plan.Even() {
		t.Fatal("the plan splits evenly; the test wants uneven micro-batches")
	}
	var sum [][]float64
	for rank := range plan.Size {
		for micro := range plan.K {
			lo, hi := plan.Slot(micro, rank)
			xbuf, labels := make([]float32, plan.MaxLocal()*pixels), make([]uint8, plan.MaxLocal())
			if _, _, err := trainMicroBatch(model, d, idx[lo:hi], plan.Weight(hi-lo), xbuf, labels, none); err != nil {
				t.Fatal(err)
			}
			for i, g := range gradsOf() {
				if sum == nil || len(sum) <= i {
					sum = append(sum, make([]float64, len(g)))
				}
				for j, v := range g {
					sum[i][j] += float64(v)
				}
			}
		}
	}
	for i := range want {
		for j, w := range want[i] {
			got := sum[i][j] / float64(plan.K*plan.Size)
			if math.Abs(got-float64(w)) > 1e-6+1e-5*math.Abs(float64(w)) {
				t.Fatalf("gradient %d[%d]: %g from 6 weighted micro-batches, %g from one batch of 64", i, j, got, w)
			}
		}
	}
}
