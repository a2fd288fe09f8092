package collective

import (
	"context"
	"slices"
	"time"

	"github.com/gorun/gorun/compress"
	"github.com/gorun/gorun/ring"
)

// Probing one link, and timing this rank's cores (links.go: how the
// measurements are taken and agreed).

const (
	probeRoundTrips = 10
	// probeBulkBytes is large enough that a link's bandwidth, not its
	// latency, sets a transfer's time, and small enough that the
	// transfers cost about a ms at 10 Gbit/s (25 ms at 1 Gbit/s).
	probeBulkBytes     = 1 << 20
	probeBulkTransfers = 3 // the first one not counted
	// probeReduceBytes is the buffer the cores' rates are timed on: 16
	// chunks, out of L1 and L2 as a large collective's buffers are.
	probeReduceBytes = 4 << 20
)

// probePartners returns, for each probe phase, the rank this one probes
// (it is the lower end: it measures) or answers (-1: idle), and whether it
// is the prober.
func probePartners(rank, size int) (partner [3]int, prober [3]bool) {
	partner = [3]int{-1, -1, -1}
	if size < 2 {
		return
	}
	for phase := range 2 {
		switch {
		case rank%2 == phase && rank+1 < size:
			partner[phase], prober[phase] = rank+1, true
		case rank%2 != phase && rank > 0 && (rank-1)%2 == phase:
			partner[phase] = rank - 1
		}
	}
	if size > 2 {
		switch rank {
		case size - 1:
			partner[2], prober[2] = 0, true
		case 0:
			partner[2] = size - 1
		}
	}
	return
}

// timedExchange sends out to peer, receives its answer into ack and
// returns the nanoseconds both took.
func timedExchange(ctx context.Context, mesh ring.Mesh, peer int, out, ack []byte) (int64, error) {
	t0 := time.Now()
	if err := mesh.SendTo(ctx, peer, out); err != nil {
		return 0, err
	}
	if err := mesh.RecvFrom(ctx, peer, ack); err != nil {
		return 0, err
	}
	return time.Since(t0).Nanoseconds(), nil
}

// probeLink measures the link to peer from its lower end: α as half the
// shortest of probeRoundTrips round trips, then the bandwidth of the
// fastest bulk transfer but the first, each acknowledged, and the burst:
// how many bytes of the first transfer, after the link was idle, went
// beyond that rate (a token bucket's).
func probeLink(ctx context.Context, mesh ring.Mesh, peer int) (latency time.Duration, bps, burst int64, err error) {
	ping := make([]byte, 8)
	rtts := make([]int64, probeRoundTrips)
	for i := range rtts {
		if rtts[i], err = timedExchange(ctx, mesh, peer, ping, ping); err != nil {
			return 0, 0, 0, err
		}
	}
	rtt := slices.Min(rtts)
	bulk := make([]byte, probeBulkBytes)
	took := make([]int64, probeBulkTransfers)
	for i := range took {
		ns, err := timedExchange(ctx, mesh, peer, bulk, ping)
		if err != nil {
			return 0, 0, 0, err
		}
		took[i] = max(ns-rtt, 1)
	}
	fastest := slices.Min(took[1:])
	bps = probeBulkBytes * int64(time.Second) / fastest
	burst = max(0, probeBulkBytes-bps*took[0]/int64(time.Second))
	return time.Duration(rtt / 2), bps, burst, nil
}

// answerProbe is the upper end of probeLink.
func answerProbe(ctx context.Context, mesh ring.Mesh, peer int) error {
	ping := make([]byte, 8)
	for range probeRoundTrips {
		if err := mesh.RecvFrom(ctx, peer, ping); err != nil {
			return err
		}
		if err := mesh.SendTo(ctx, peer, ping); err != nil {
			return err
		}
	}
	bulk := make([]byte, probeBulkBytes)
	for range probeBulkTransfers {
		if err := mesh.RecvFrom(ctx, peer, bulk); err != nil {
			return err
		}
		if err := mesh.SendTo(ctx, peer, ping); err != nil {
			return err
		}
	}
	return nil
}

// timeCores times this rank's reduction of float32 bytes (the received
// bytes added into a buffer, as a reduce-scatter does) and, if codec is
// set, the coding of a compressed allreduce (one encode and two decodes
// per value: its shares, then the owners' sums). Each is the best of a few
// runs, so that one preemption does not count as the core's speed.
func timeCores(codec compress.Codec) (reducePerSec, codecPerSec int64) {
	const values = probeReduceBytes / 4
	dst := make([]float32, values)
	src := make([]float32, values)
	for i := range src {
		src[i] = float32(i%97) * 0.5
	}
	raw := make([]byte, probeReduceBytes)
	compress.None().Encode(raw, src)
	adder := compress.None().(compress.AccumulateDecoder)
	best := func(run func()) int64 {
		fastest := int64(0)
		for range 3 {
			t0 := time.Now()
			run()
			if d := time.Since(t0).Nanoseconds(); fastest == 0 || d < fastest {
				fastest = d
			}
		}
		return probeReduceBytes * int64(time.Second) / max(fastest, 1)
	}
	reducePerSec = best(func() { adder.DecodeAdd(dst, raw) })
	if codec == nil || codec.Name() == "none" {
		return reducePerSec, 0
	}
	enc := make([]byte, codec.EncodedLen(values))
	codecPerSec = best(func() {
		codec.Encode(enc, src)
		codec.Decode(dst, enc)
		codec.Decode(dst, enc)
	})
	return reducePerSec, codecPerSec
}
