package collective

import (
	"fmt"
	"math/rand/v2"
)

// ElasticSampler hands out the samples of a dataset so that, in every
// epoch, each sample is used exactly once by the job as a whole, however
// many ranks there are and however often that number changes.
//
// Every rank holds the same sampler state: an epoch number and a global
// cursor into that epoch's permutation of the dataset, which every rank
// draws the same way from (seed, epoch). A step takes the next global batch
// perm[cursor : cursor+B] (shorter at the end of an epoch), of which rank r
// of N uses its share [r·B/N, (r+1)·B/N) (Share), and every rank advances
// the cursor by the whole batch. Register the sampler in the ElasticState:
// its epoch and cursor are then committed with the model, and after a
// membership change the survivors resume from the committed cursor and
// split the interrupted step's batch, and every later one, among
// themselves. The Reducer splits a global batch with the same rule; a
// load-balancing one (ReducerOptions.Balance) splits it by its Shares,
// which NextSplit takes.
//
// A loop over epochs:
//
//	for s.Epoch() < epochs {
//		for !s.EpochDone() {
//			idx := s.Next(globalBatch, comm.Rank(), comm.Size())
//			// ... forward/backward on idx, allreduce, update ...
//			st.Commit(ctx)
//		}
//		s.NextEpoch()
//	}
//
// It is not safe for concurrent use.
type ElasticSampler struct {
	n      int
	seed   uint64
	epoch  int64
	cursor int64
	perm   []int
	permOf int64 // the epoch perm was drawn for; -1: none
}

// NewElasticSampler returns a sampler over datasetLen samples (indices
// 0..datasetLen-1), at epoch 0, cursor 0. seed must be the same on every
// rank.
func NewElasticSampler(datasetLen int, seed uint64) *ElasticSampler {
	return &ElasticSampler{n: max(datasetLen, 0), seed: seed, permOf: -1}
}

// Share returns the part [lo, hi) of a global batch of n samples that rank
// takes among size ranks: [rank·n/size, (rank+1)·n/size). The parts are
// contiguous, cover the batch exactly once, and differ in length by at most
// one; a rank's part is empty when n < size.
func Share(n, rank, size int) (lo, hi int) {
	if size < 1 || rank < 0 || rank >= size {
		return 0, 0
	}
	return int(int64(rank) * int64(n) / int64(size)), int(int64(rank+1) * int64(n) / int64(size))
}

// Len is the number of samples in the dataset.
func (s *ElasticSampler) Len() int { return s.n }

// Epoch is the current epoch, from 0.
func (s *ElasticSampler) Epoch() int { return int(s.epoch) }

// Cursor is how many samples of the current epoch the job has taken.
func (s *ElasticSampler) Cursor() int { return int(s.cursor) }

// EpochDone reports whether every sample of the current epoch was taken;
// call NextEpoch to go on.
func (s *ElasticSampler) EpochDone() bool { return s.cursor >= int64(s.n) }

// NextEpoch starts the next epoch at cursor 0, with its own permutation.
func (s *ElasticSampler) NextEpoch() {
	s.epoch++
	s.cursor = 0
}

// BatchLen is the length of the next global batch of at most globalBatch
// samples: globalBatch, or what is left of the epoch.
func (s *ElasticSampler) BatchLen(globalBatch int) int {
	return int(min(int64(max(globalBatch, 0)), max(int64(s.n)-s.cursor, 0)))
}

// Next returns this rank's share of the next global batch of globalBatch
// samples (dataset indices; possibly none) and advances the cursor by the
// whole batch, on every rank alike. At the end of an epoch the batch is
// shorter; once the epoch is done Next returns nil and does not move.
func (s *ElasticSampler) Next(globalBatch, rank, size int) []int {
	b := s.BatchLen(globalBatch)
	if b == 0 {
		return nil
	}
	s.draw()
	lo, hi := Share(b, rank, size)
	out := make([]int, hi-lo)
	copy(out, s.perm[s.cursor+int64(lo):s.cursor+int64(hi)])
	s.cursor += int64(b)
	return out
}

// NextSplit is Next for a batch split unevenly, as a load-balancing
// Reducer splits it (Reducer.Shares): the next global batch has the
// shares' sum of samples, and rank takes shares[rank] of them, after the
// shares of the ranks before it. Every rank must pass the same shares;
// the cursor advances by the whole batch, so every sample of an epoch is
// still used once. At the end of an epoch the batch is shorter and the
// parts past its end are cut off: re-plan for the shorter batch first
// (Reducer.SetGlobalBatch with BatchLen), so that the parts fit it.
func (s *ElasticSampler) NextSplit(shares []int, rank int) []int {
	total, lo := 0, 0
	for r, n := range shares {
		if r == rank {
			lo = total
		}
		total += max(n, 0)
	}
	b := s.BatchLen(total)
	if b == 0 {
		return nil
	}
	s.draw()
	var out []int
	if rank >= 0 && rank < len(shares) {
		hi := min(lo+max(shares[rank], 0), b)
		lo = min(lo, b)
		out = make([]int, hi-lo)
		copy(out, s.perm[s.cursor+int64(lo):s.cursor+int64(hi)])
	}
	s.cursor += int64(b)
	return out
}

// draw makes perm the current epoch's permutation: the same on every
// rank, from (seed, epoch) only.
func (s *ElasticSampler) draw() {
	if s.permOf != s.epoch {
		r := rand.New(rand.NewPCG(s.seed, uint64(s.epoch)))
		s.perm = r.Perm(s.n)
		s.permOf = s.epoch
	}
}

func (s *ElasticSampler) String() string {
	return fmt.Sprintf("sampler(epoch %d, %d/%d)", s.epoch, s.cursor, s.n)
}
