package ringsim

import (
	"container/heap"
	"math"
)

// How messages move through the modelled network, as events on the
// virtual clock (doc.go, "The model"). Everything here runs on the
// simulator's goroutine, under engine.mu.

// message is one SendTo call: its bytes (the real ones, a copy), the
// bytes it stands for on the wire (wire: the framing plus the payload
// times the run's scale), and when it left the sending host's NIC (or,
// within a host, when it is in).
type message struct {
	link      *link
	data      []byte
	wire      int64
	egressEnd Time
	in        Time
}

// link is the directed stream from rank src to rank dst.
type link struct {
	src, dst int
	local    bool // both ranks on one host

	// Between hosts, the messages waiting for the sending host's NIC;
	// within a host, those on their way, first the one whose delivery is
	// scheduled (one event per link rather than per message keeps the
	// event heap small when a schedule queues a whole buffer at once).
	queue []*message
	free  Time // local: busy until

	// The receiving end: data arrived and not yet read (inbox[0][off:]
	// first), and the one RecvFrom waiting for more (want: what it still
	// lacks, nil when none waits).
	inbox [][]byte
	off   int
	want  []byte
	wake  chan struct{} // cap 1: the waiting RecvFrom got its bytes
}

// host is one host's NIC: messages leave through its egress one at a
// time, round robin among the links that have some waiting, and come in
// through its ingress one at a time, in the order they reach it.
type host struct {
	out     []*link // links with queued messages, in turn order
	outBusy bool
	in      []*message // reached the ingress while it was busy
	inBusy  bool
	// The token buckets of the two directions (Network.Burst).
	outTokens, inTokens bucket
}

// bucket is a token bucket: tokens bytes at time at.
type bucket struct {
	tokens float64
	at     Time
}

// transmit returns how long a message of wire bytes takes through a NIC
// direction whose bucket is b, starting now: wire·β, or with a burst
// (Network.Burst) only the bytes beyond the tokens gathered so far.
func (e *engine) transmit(b *bucket, wire int64) Time {
	if e.net.Burst == 0 {
		return serialize(wire, e.net.Bandwidth)
	}
	b.tokens = min(float64(e.net.Burst), b.tokens+float64(e.now-b.at)*e.net.Bandwidth/8e12)
	b.at = e.now
	if float64(wire) <= b.tokens {
		b.tokens -= float64(wire)
		return 0
	}
	d := Time(math.Ceil((float64(wire) - b.tokens) * 8e12 / e.net.Bandwidth))
	// Every token that comes in while the rest goes out goes with it.
	b.tokens, b.at = 0, e.now+d
	return d
}

// eventKind says what happens at an event.
type eventKind uint8

const (
	evEgressDone  eventKind = iota // host's NIC sent its current message
	evIngressHead                  // msg's first byte reaches its receiving host
	evIngressDone                  // msg is in: host's ingress is free
	evDelivered                    // msg (local) is in the receiver's inbox
)

type event struct {
	at   Time
	seq  uint64 // ties: in the order scheduled, which is deterministic
	kind eventKind
	host *host
	msg  *message
}

type eventHeap []*event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(*event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}

func (e *engine) schedule(at Time, kind eventKind, h *host, m *message) {
	e.seq++
	heap.Push(&e.events, &event{at: at, seq: e.seq, kind: kind, host: h, msg: m})
}

// inject puts a message that was sent at e.now on its way.
func (e *engine) inject(m *message) {
	l := m.link
	e.stats.Messages++
	e.stats.WireBytes += m.wire
	if l.local {
		start := max(e.now, l.free)
		l.free = start + serialize(m.wire, e.net.LocalBandwidth)
		m.in = l.free + e.localLatency
		l.queue = append(l.queue, m)
		if len(l.queue) == 1 {
			e.schedule(m.in, evDelivered, nil, m)
		}
		return
	}
	e.stats.CrossHostBytes += m.wire
	h := e.hosts[e.layout.HostOf(l.src)]
	if len(l.queue) == 0 {
		h.out = append(h.out, l)
	}
	l.queue = append(l.queue, m)
	if !h.outBusy {
		e.startEgress(h)
	}
}

// startEgress sends the next message of the link whose turn it is.
func (e *engine) startEgress(h *host) {
	l := h.out[0]
	m := l.queue[0]
	l.queue[0] = nil
	l.queue = l.queue[1:]
	h.out = h.out[1:]
	if len(l.queue) > 0 {
		h.out = append(h.out, l) // its next message waits for its next turn
	}
	h.outBusy = true
	m.egressEnd = e.now + e.transmit(&h.outTokens, m.wire)
	e.schedule(m.egressEnd, evEgressDone, h, nil)
	e.schedule(e.now+e.latency, evIngressHead, e.hosts[e.layout.HostOf(l.dst)], m)
}

// startIngress takes m in through h: its last byte is in when the ingress
// has moved all of it, and not before it left the sender plus the latency.
func (e *engine) startIngress(h *host, m *message) {
	h.inBusy = true
	done := max(e.now+e.transmit(&h.inTokens, m.wire), m.egressEnd+e.latency)
	e.schedule(done, evIngressDone, h, m)
}

// process carries out one event at e.now.
func (e *engine) process(ev *event) {
	switch ev.kind {
	case evEgressDone:
		ev.host.outBusy = false
		if len(ev.host.out) > 0 {
			e.startEgress(ev.host)
		}
	case evIngressHead:
		if ev.host.inBusy {
			ev.host.in = append(ev.host.in, ev.msg)
		} else {
			e.startIngress(ev.host, ev.msg)
		}
	case evIngressDone:
		e.deliver(ev.msg)
		ev.host.inBusy = false
		if h := ev.host; len(h.in) > 0 {
			m := h.in[0]
			h.in[0] = nil
			h.in = h.in[1:]
			e.startIngress(h, m)
		}
	case evDelivered:
		l := ev.msg.link
		l.queue[0] = nil
		l.queue = l.queue[1:]
		e.deliver(ev.msg)
		if len(l.queue) > 0 {
			e.schedule(l.queue[0].in, evDelivered, nil, l.queue[0])
		}
	}
}

// deliver puts m's bytes in its receiver's inbox and hands them to a
// waiting RecvFrom.
func (e *engine) deliver(m *message) {
	l := m.link
	if len(m.data) > 0 {
		l.inbox = append(l.inbox, m.data)
	}
	if l.want != nil && l.fill() {
		l.want = nil
		l.wake <- struct{}{}
	}
}

// fill copies what the inbox holds into l.want and reports whether it
// is complete.
func (l *link) fill() bool {
	for len(l.want) > 0 && len(l.inbox) > 0 {
		k := copy(l.want, l.inbox[0][l.off:])
		l.want = l.want[k:]
		l.off += k
		if l.off == len(l.inbox[0]) {
			l.inbox[0] = nil
			l.inbox = l.inbox[1:]
			l.off = 0
		}
	}
	return len(l.want) == 0
}
