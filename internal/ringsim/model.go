package ringsim

import (
	"fmt"
	"math"
	"time"
)

// The cluster a simulation runs on: its layout (hosts and ranks) and the
// α-β model of its links (see doc.go for how messages move through it).

// Time is virtual time, in picoseconds: at 400 Gbit/s a byte takes 20 ps,
// so whole picoseconds keep every transfer exact enough, and an int64
// holds 106 days of them.
type Time int64

// Seconds returns t in seconds.
func (t Time) Seconds() float64 { return float64(t) / 1e12 }

// Duration returns t rounded to the nearest nanosecond.
func (t Time) Duration() time.Duration { return time.Duration((t + 500) / 1000) }

func (t Time) String() string { return t.Duration().String() }

// timeOf converts a wall-clock duration of the model to virtual time.
func timeOf(d time.Duration) Time { return Time(d) * 1000 }

// Layout is where the ranks run: Hosts hosts with RanksPerHost ranks
// each, rank r on host r / RanksPerHost, as gorun -H places them (the
// ranks of a host are consecutive).
type Layout struct {
	Hosts, RanksPerHost int
}

// Size is the number of ranks.
func (l Layout) Size() int { return l.Hosts * l.RanksPerHost }

// HostOf returns the host rank r runs on.
func (l Layout) HostOf(r int) int { return r / l.RanksPerHost }

// ringHosts is the layout as ring.Config.Hosts wants it.
func (l Layout) ringHosts() []int {
	h := make([]int, l.Size())
	for r := range h {
		h[r] = l.HostOf(r)
	}
	return h
}

func (l Layout) validate() error {
	if l.Hosts < 1 || l.RanksPerHost < 1 {
		return fmt.Errorf("ringsim: layout of %d hosts × %d ranks: want at least one of each", l.Hosts, l.RanksPerHost)
	}
	if l.Size() > maxRanks {
		return fmt.Errorf("ringsim: %d ranks: at most %d", l.Size(), maxRanks)
	}
	return nil
}

// maxRanks bounds a simulation: every rank is a goroutine running the real
// schedule, and the tables go to 4096.
const maxRanks = 1 << 16

func (l Layout) String() string {
	return fmt.Sprintf("%d hosts × %d ranks", l.Hosts, l.RanksPerHost)
}

// Network is the α-β model of the links: what a message of b bytes costs
// between two hosts and between two ranks of one host.
type Network struct {
	// Latency (α) is the one-way time of a message between hosts on top
	// of its bytes: the network stacks, the wire and the switch.
	Latency time.Duration
	// Bandwidth is every host's NIC rate, in bits per second, in each
	// direction (β = 8/Bandwidth seconds per byte). Every byte a host's
	// ranks send to another host leaves through its NIC, every byte they
	// receive from one comes in through it: the ranks of a host share it.
	Bandwidth float64
	// Burst, if set, makes each direction of every NIC a token bucket,
	// as tc's tbf shapes a link: Burst bytes of tokens, refilled at
	// Bandwidth; a message takes as many tokens as it has bytes, goes
	// at once as far as they last and at Bandwidth for the rest. A NIC
	// has none (0); shaped test links do (BENCHMARKS.md, "Simulator").
	Burst int64
	// LocalLatency and LocalBandwidth are α and the rate of a link
	// between two ranks of one host (shared memory); each such link has
	// them to itself.
	LocalLatency   time.Duration
	LocalBandwidth float64
}

// DefaultNetwork is the model the tables use unless told otherwise, at
// bandwidth bits per second between hosts. The figures are assumptions
// for a cluster, not measurements of one: 10 µs between hosts is a TCP
// message through a switch of one data-centre rack row; a shared-memory
// link moves 10 GB/s, one core's copy, after 1 µs.
func DefaultNetwork(bandwidth float64) Network {
	return Network{
		Latency:        10 * time.Microsecond,
		Bandwidth:      bandwidth,
		LocalLatency:   time.Microsecond,
		LocalBandwidth: 80e9,
	}
}

func (n Network) validate() error {
	switch {
	case n.Burst < 0:
		return fmt.Errorf("ringsim: negative burst %d", n.Burst)
	case n.Latency < 0 || n.LocalLatency < 0:
		return fmt.Errorf("ringsim: negative latency (%v between hosts, %v within)", n.Latency, n.LocalLatency)
	case !(n.Bandwidth > 0) || !(n.LocalBandwidth > 0) || math.IsInf(n.Bandwidth, 0) || math.IsInf(n.LocalBandwidth, 0):
		return fmt.Errorf("ringsim: bandwidths must be positive and finite (%g bit/s between hosts, %g within)", n.Bandwidth, n.LocalBandwidth)
	}
	return nil
}

// serialize is how long b bytes take at bitsPerSecond.
func serialize(b int64, bitsPerSecond float64) Time {
	return Time(math.Ceil(float64(b) * 8e12 / bitsPerSecond))
}
