package main

import (
	"embed"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"

	"github.com/gorun/gorun/collective"
)

// The default dataset: 10,000 real MNIST digits (8,000 train, 2,000 test),
// CC BY-SA 3.0, see data/README.md. Embedded so that the example runs on a
// fresh machine with no download.
//
//go:embed data/*.gz
var embedded embed.FS

// Dataset holds images as normalised float32 rows of Pixels values and their
// labels 0..9.
type Dataset struct {
	Images []float32 // N × Pixels, row-major
	Labels []uint8
	Pixels int
}

// Len is the number of samples.
func (d *Dataset) Len() int { return len(d.Labels) }

// The usual MNIST normalisation (mean and standard deviation of the pixels
// on a 0..1 scale); it suits Fashion-MNIST well enough too.
const pixelMean, pixelStd = 0.1307, 0.3081

// LoadSplits reads train and test sets from dir, or from the embedded
// digits when dir is "". The files have the standard MNIST names, with or
// without .gz.
func LoadSplits(dir string) (train, test *Dataset, err error) {
	var fsys fs.FS
	where := "embedded data"
	if dir == "" {
		fsys, _ = fs.Sub(embedded, "data")
	} else {
		fsys, where = os.DirFS(dir), "--data "+dir
	}
	if train, err = loadSplit(fsys, "train"); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", where, err)
	}
	if test, err = loadSplit(fsys, "t10k"); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", where, err)
	}
	return train, test, nil
}

func loadSplit(fsys fs.FS, prefix string) (*Dataset, error) {
	imgs, err := readIDXFile(fsys, prefix+"-images-idx3-ubyte")
	if err != nil {
		return nil, err
	}
	labels, err := readIDXFile(fsys, prefix+"-labels-idx1-ubyte")
	if err != nil {
		return nil, err
	}
	if len(imgs.Dims) != 3 || len(labels.Dims) != 1 {
		return nil, fmt.Errorf("%s: want images N×H×W and labels N, got %v and %v", prefix, imgs.Dims, labels.Dims)
	}
	if imgs.Dims[0] != labels.Dims[0] {
		return nil, fmt.Errorf("%s: %d images but %d labels", prefix, imgs.Dims[0], labels.Dims[0])
	}
	for i, l := range labels.Data {
		if l > 9 {
			return nil, fmt.Errorf("%s: label %d of sample %d is not a digit 0..9", prefix, l, i)
		}
	}
	d := &Dataset{Images: make([]float32, len(imgs.Data)), Labels: labels.Data, Pixels: imgs.Dims[1] * imgs.Dims[2]}
	for i, p := range imgs.Data {
		d.Images[i] = (float32(p)/255 - pixelMean) / pixelStd
	}
	return d, nil
}

// BatchPlan says how the samples of one optimizer step are split between
// the ranks and their micro-batches. The Global samples of a step are cut
// into K·Size consecutive slots, as evenly as the numbers allow: slot
// j·Size + r is micro-batch j of rank r. When K·Size divides Global every
// slot has Global/(K·Size) samples; otherwise (64 over 3 ranks) the slots
// differ by one sample (21, 21, 22), and Weight corrects each micro-batch's
// gradient for its size, so a step still averages over exactly Global
// samples.
type BatchPlan struct {
	Global int // samples per optimizer step, over all ranks and micro-batches
	K      int // micro-batches per step on every rank (backward passes per step)
	Size   int // ranks
}

// defaultGlobalBatch is the global batch when neither --batch nor
// --global-batch is given: fixed, so that any number of ranks trains the
// same model as one rank does.
const defaultGlobalBatch = 64

// planBatches derives the plan from the flags (0 = not given) and the
// number of ranks:
//
//   - --batch B and --global-batch G: k = G/(ranks·B), which must be whole;
//   - --batch B alone: G = B·ranks·k, with k = --accumulate or 1;
//   - otherwise: G = --global-batch or 64, k = --accumulate or 1, and each
//     rank's micro-batch is G/(ranks·k), split unevenly when that is not whole.
func planBatches(batch, global, accumulate, size int) (BatchPlan, error) {
	k := max(accumulate, 1)
	switch {
	case batch > 0 && global > 0:
		kk, err := collective.PassesPerStep(global, size, batch)
		if err != nil {
			return BatchPlan{}, fmt.Errorf("--global-batch %d with --batch %d: %w", global, batch, err)
		}
		if accumulate > 0 && accumulate != kk {
			return BatchPlan{}, fmt.Errorf("--accumulate %d contradicts --global-batch %d = %d ranks × --batch %d × %d micro-batches: give two of the three",
				accumulate, global, size, batch, kk)
		}
		return BatchPlan{Global: global, K: kk, Size: size}, nil
	case batch > 0:
		return BatchPlan{Global: batch * size * k, K: k, Size: size}, nil
	}
	if global == 0 {
		global = defaultGlobalBatch
	}
	if global < k*size {
		return BatchPlan{}, fmt.Errorf("global batch %d is smaller than %d ranks × %d micro-batches: every micro-batch needs at least one sample; raise --global-batch or lower --accumulate",
			global, size, k)
	}
	return BatchPlan{Global: global, K: k, Size: size}, nil
}

// Slot returns the range [lo, hi) of a step's Global samples that is
// micro-batch micro of rank.
func (p BatchPlan) Slot(micro, rank int) (lo, hi int) {
	s, n := micro*p.Size+rank, p.K*p.Size
	return p.Global * s / n, p.Global * (s + 1) / n
}

// Even reports whether every micro-batch has the same size.
func (p BatchPlan) Even() bool { return p.Global%(p.K*p.Size) == 0 }

// MaxLocal is the largest micro-batch.
func (p BatchPlan) MaxLocal() int { return (p.Global + p.K*p.Size - 1) / (p.K * p.Size) }

// Weight is the factor for the mean gradient of a micro-batch of n samples.
// The Reducer averages the K·Size micro-batch gradients with equal weights;
// scaling each by n·K·Size/Global turns that average into the mean over the
// Global samples. It is exactly 1 when the plan is even.
func (p BatchPlan) Weight(n int) float32 {
	return float32(float64(n*p.K*p.Size) / float64(p.Global))
}

// Describe lists the micro-batch sizes of each rank, e.g. "21, 21, 22".
func (p BatchPlan) Describe() string {
	var parts []string
	for r := range p.Size {
		var sizes []string
		for j := range p.K {
			lo, hi := p.Slot(j, r)
			sizes = append(sizes, strconv.Itoa(hi-lo))
		}
		parts = append(parts, strings.Join(sizes, "+"))
	}
	return strings.Join(parts, ", ")
}

// Sharder splits every global batch of an epoch between the ranks. All
// ranks draw the same permutation of the training set from (seed, epoch);
// optimizer step s uses samples perm[s·G : (s+1)·G] of the global batch G,
// and within it micro-batch j of rank r is the plan's slot j·size + r. The
// union over ranks and micro-batches is the global batch whatever the world
// size, so a 1-rank run with the same G sees exactly the same samples per
// step. The N mod G samples left over after the last whole global batch
// are skipped for that epoch (the next epoch's permutation gives them their
// turn): with the embedded 8,000 digits and G = 64 there are none.
type Sharder struct {
	N    int
	Plan BatchPlan
	Rank int
	Seed uint64
	perm []int
}

// Steps is the number of optimizer steps per epoch.
func (s *Sharder) Steps() int { return s.N / s.Plan.Global }

// Epoch draws the permutation of epoch e.
func (s *Sharder) Epoch(e int) {
	rng := rand.New(rand.NewPCG(s.Seed, uint64(e)))
	s.perm = rng.Perm(s.N)
}

// Global returns the sample indices of step's whole global batch.
func (s *Sharder) Global(step int) []int {
	off := step * s.Plan.Global
	return s.perm[off : off+s.Plan.Global]
}

// Batch returns the sample indices of this rank's micro-batch j of step.
func (s *Sharder) Batch(step, micro int) []int {
	lo, hi := s.Plan.Slot(micro, s.Rank)
	off := step * s.Plan.Global
	return s.perm[off+lo : off+hi]
}
