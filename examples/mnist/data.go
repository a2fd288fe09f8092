package main

import (
	"embed"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
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

// Sharder splits every global batch of an epoch between the ranks. All
// ranks draw the same permutation of the training set from (seed, epoch);
// optimizer step s uses samples perm[s·G : (s+1)·G] of the global batch G,
// and within it micro-batch j of rank r is the slice of local batch size b
// at offset (j·size + r)·b. The union over ranks and micro-batches is the
// global batch whatever the world size, so a 1-rank run with the same G
// sees exactly the same samples per step. Samples left over after the last
// whole global batch are skipped for that epoch (a new permutation next
// epoch gives them their turn).
type Sharder struct {
	N, Global, Local, Rank, Size int
	Seed                         uint64
	perm                         []int
}

// Steps is the number of optimizer steps per epoch.
func (s *Sharder) Steps() int { return s.N / s.Global }

// Epoch draws the permutation of epoch e.
func (s *Sharder) Epoch(e int) {
	rng := rand.New(rand.NewPCG(s.Seed, uint64(e)))
	s.perm = rng.Perm(s.N)
}

// Batch returns the sample indices of this rank's micro-batch j of step.
func (s *Sharder) Batch(step, micro int) []int {
	off := step*s.Global + (micro*s.Size+s.Rank)*s.Local
	return s.perm[off : off+s.Local]
}
