package collective

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/gorun/gorun/p2p"
	"github.com/gorun/gorun/ring"
)

// The links of an elastic job (links.go: what is measured and agreed).
//
// Links are a property of the fabric and the machines, not of who is in
// the job, so an elastic job measures them once, in its first membership
// epoch that spans hosts, and every later epoch reuses them: a lost rank
// costs the job no new probes. A rank that joined later never measured
// them, so at the start of every epoch that spans hosts the ranks agree on
// them (one exchange through rank 0): rank 0 takes the numbers of the
// lowest rank that holds any, and every rank then holds those. Only when
// no rank holds numbers the new layout can use (the job ran on one host
// so far, or it now has several ranks on a host and never measured a link
// within one) do the ranks measure, all of them, as a fixed-size job does
// at start. The schedules' per-call overheads were timed on the layout of
// the epoch that measured; the refinement of each epoch (links_refine.go)
// times the schedules again on the layout they run on.

// epochLinksBytes is a rank's offer: a flag, the agreed links, the
// schedules' overheads and the codec's.
const epochLinksBytes = 8 + agreedLinksBytes + 8*(len(ring.Links{}.CallOverhead)+1)

func (a AgreedLinks) encodeOffer() []byte {
	b := make([]byte, 8, epochLinksBytes)
	binary.LittleEndian.PutUint64(b, 1)
	b = append(b, a.encode()...)
	over := make([]int64, 0, len(a.CallOverhead)+1)
	for _, d := range a.CallOverhead {
		over = append(over, int64(d))
	}
	return append(b, encodeInts(append(over, int64(a.CodecOverhead)))...)
}

// decodeOffer returns the links of an offer, and false for an empty one.
func decodeOffer(b []byte) (AgreedLinks, bool) {
	if binary.LittleEndian.Uint64(b) == 0 {
		return AgreedLinks{}, false
	}
	a := decodeAgreedLinks(b[8 : 8+agreedLinksBytes])
	over := decodeInts(b[8+agreedLinksBytes:])
	for i := range a.CallOverhead {
		a.CallOverhead[i] = time.Duration(over[i])
	}
	a.CodecOverhead = time.Duration(over[len(a.CallOverhead)])
	return a, true
}

// pickOffer is rank 0's choice among the offers (offers[r] is rank r's):
// the lowest rank's that has links the layout can use, or an empty offer.
func pickOffer(offers [][]byte, size int, hosts []int, chunk int) []byte {
	for _, b := range offers {
		if a, ok := decodeOffer(b); ok {
			if _, ok := ring.CrossHostPolicy(size, hosts, a.Links, chunk); ok {
				return b
			}
		}
	}
	return make([]byte, epochLinksBytes)
}

// epochLinks returns the links of a membership epoch spanning hosts:
// those some rank holds, agreed, or measured now (see above). Every rank
// of the epoch calls it at once, before the epoch's ring is made (its
// policy comes from them).
func (c *Comm) epochLinks(ctx context.Context, mesh ring.Mesh, rank, size int, hosts []int) (AgreedLinks, error) {
	mine := make([]byte, epochLinksBytes)
	if c.links != nil {
		mine = c.links.encodeOffer()
	}
	got, err := agreeOnRank0(ctx, mesh, rank, size, mine, epochLinksBytes, func(all [][]byte) []byte {
		return pickOffer(all, size, hosts, c.chunkBytes)
	})
	if err != nil {
		return AgreedLinks{}, fmt.Errorf("agreeing on the links measured before: %w", err)
	}
	a, ok := decodeOffer(got)
	if !ok {
		if a, err = measureLinks(ctx, mesh, rank, size, hosts, c.chunkBytes, c.compression.cfg.codec); err != nil {
			return AgreedLinks{}, err
		}
	}
	return a, agreeAutotune(ctx, mesh, rank, size, c.autotune)
}

// adoptEpochLinks runs epochLinks for adopt, bounded by the collective
// timeout and by the end of the node's epoch (done).
func (c *Comm) adoptEpochLinks(done <-chan struct{}, mesh ring.Mesh, pv p2p.View, hosts []int) (AgreedLinks, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	stop := context.AfterFunc(c.life, cancel)
	defer stop()
	go func() {
		select {
		case <-done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return c.epochLinks(ctx, mesh, pv.Rank, pv.Size, hosts)
}

// epochEnded waits, at most the heartbeat bound and a little more, for
// the node's epoch (done) or the job to end after an exchange of the epoch
// failed, and reports whether either did: a peer's link breaks before the
// rendezvous hears of its loss.
func (c *Comm) epochEnded(done <-chan struct{}) bool {
	t := time.NewTimer(c.heartbeat + 2*time.Second)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-c.life.Done():
		return true
	case <-t.C:
		return false
	}
}
