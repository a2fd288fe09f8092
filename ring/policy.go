package ring

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Allreduce algorithm selection.
//
// An AllreducePolicy maps the byte size of an allreduce to the Algorithm
// that runs it. Every rank must pick the same algorithm for a call: the
// choice is part of the call's fingerprint (Call.Algo), so ranks whose
// policies disagree fail with *MismatchError naming both algorithms instead
// of misreading each other's messages.
//
// The zero policy means the measured defaults (defaultRules). They depend on
// the ring size N and on whether the Transport is a Mesh: over a plain
// Transport (two neighbour streams) only ring-neighbour schedules exist,
// so "direct" runs as an allgather of whole buffers around the ring and the
// Mesh algorithms (recursive doubling, Rabenseifner, scatter-gather) run as
// the pipelined ring. The hierarchical allreduce (hierarchical.go) runs
// where a policy names it, or, with the default policy, where Config.Hosts
// says several ranks share each host and the size is one it wins at; a
// policy that was given is obeyed as it is. Across hosts with measured
// links (Config.Links), the zero policy is the one the links call for
// instead (CrossHostPolicy, policy_links.go).

// AllreduceRule applies Algo to allreduces of at most MaxBytes bytes.
type AllreduceRule struct {
	MaxBytes int // NoLimit: every size
	Algo     Algorithm
}

// NoLimit is the MaxBytes of a rule that applies to every size.
const NoLimit = math.MaxInt

// AllreducePolicy chooses the allreduce algorithm by buffer size. Rules are
// tried in order; the first whose MaxBytes is at least the buffer's size
// wins. ParseAllreducePolicy builds one from a string. The zero value (no
// rules) is the measured default for the ring's size and transport.
type AllreducePolicy struct {
	Rules []AllreduceRule
}

// IsDefault reports whether p is the zero policy (the measured defaults).
func (p AllreducePolicy) IsDefault() bool { return len(p.Rules) == 0 }

// String formats p in the syntax ParseAllreducePolicy reads ("default" for
// the zero policy).
func (p AllreducePolicy) String() string {
	if p.IsDefault() {
		return "default"
	}
	var b strings.Builder
	for i, r := range p.Rules {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(r.Algo.String())
		if r.MaxBytes != NoLimit {
			b.WriteByte(':')
			b.WriteString(formatBytes(r.MaxBytes))
		}
	}
	return b.String()
}

// Pick returns the algorithm of the first rule covering n bytes, and
// false when none does (the zero policy: the ring's defaults decide).
func (p AllreducePolicy) Pick(n int) (Algorithm, bool) { return p.pick(n) }

// pick returns the algorithm of the first rule covering n bytes, and false
// when none does.
func (p AllreducePolicy) pick(n int) (Algorithm, bool) {
	for _, r := range p.Rules {
		if n <= r.MaxBytes {
			return r.Algo, true
		}
	}
	return 0, false
}

func (p AllreducePolicy) validate() error {
	last := -1
	for i, r := range p.Rules {
		switch {
		case !r.Algo.valid():
			return fmt.Errorf("rule %d: invalid algorithm %d", i, r.Algo)
		case r.MaxBytes < 0:
			return fmt.Errorf("rule %d (%s): negative size %d", i, r.Algo, r.MaxBytes)
		case i > 0 && r.MaxBytes <= last:
			return fmt.Errorf("rule %d (%s): size %s is not above the previous rule's %s", i, r.Algo, formatBytes(r.MaxBytes), formatBytes(last))
		}
		last = r.MaxBytes
	}
	return nil
}

// ParseAllreducePolicy reads a policy from a string such as an environment
// variable's (GORUN_ALLREDUCE_ALGORITHMS):
//
//	"direct:4K,scatter-gather:2M,ring"
//
// means up to 4 KiB direct, up to 2 MiB scatter-gather, above that the ring.
// Each comma-separated entry is an algorithm name (see Algorithm.String:
// ring, direct, recursive-doubling, rabenseifner, scatter-gather,
// hierarchical) with the largest size, in bytes, it runs; sizes take an
// optional binary suffix K, M or G (also KB/KiB...), and must increase. The
// last entry has no size: it runs everything larger. A single name forces
// that algorithm for every size; "" or "default" (or "auto") is the
// measured default policy.
func ParseAllreducePolicy(s string) (AllreducePolicy, error) {
	s = strings.TrimSpace(s)
	if s == "" || strings.EqualFold(s, "default") || strings.EqualFold(s, "auto") {
		return AllreducePolicy{}, nil
	}
	bad := func(format string, args ...any) (AllreducePolicy, error) {
		return AllreducePolicy{}, fmt.Errorf("allreduce policy %q: %s (want e.g. \"direct:4K,scatter-gather:2M,ring\", or one algorithm name)", s, fmt.Sprintf(format, args...))
	}
	var p AllreducePolicy
	entries := strings.Split(s, ",")
	for i, e := range entries {
		e = strings.TrimSpace(e)
		name, size, hasSize := strings.Cut(e, ":")
		a, err := ParseAlgorithm(strings.TrimSpace(name))
		if err != nil {
			return bad("entry %d: %v", i+1, err)
		}
		r := AllreduceRule{MaxBytes: NoLimit, Algo: a}
		if hasSize {
			if i == len(entries)-1 {
				return bad("the last entry (%s) must have no size: it runs every larger buffer", e)
			}
			if r.MaxBytes, err = ParseBytes(size); err != nil {
				return bad("entry %d (%s): %v", i+1, e, err)
			}
		} else if i != len(entries)-1 {
			return bad("entry %d (%s) has no size but is not the last one (write name:size, e.g. %s:64K)", i+1, e, name)
		}
		p.Rules = append(p.Rules, r)
	}
	if err := p.validate(); err != nil {
		return bad("%v", err)
	}
	return p, nil
}

// ParseBytes reads a byte count of the environment: "4096", "4K", "4KiB",
// "4KB", "2M", "1G" (binary units).
func ParseBytes(s string) (int, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "I")
	mult := 1
	switch {
	case strings.HasSuffix(t, "K"):
		mult = 1 << 10
	case strings.HasSuffix(t, "M"):
		mult = 1 << 20
	case strings.HasSuffix(t, "G"):
		mult = 1 << 30
	}
	if mult > 1 {
		t = t[:len(t)-1]
	}
	v, err := strconv.Atoi(strings.TrimSpace(t))
	if err != nil || v < 0 {
		return 0, fmt.Errorf("size %q is not a byte count (write 4096, 4K, 2M or 1G)", s)
	}
	if v > math.MaxInt/mult {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return v * mult, nil
}

func formatBytes(n int) string {
	switch {
	case n == NoLimit:
		return "unlimited"
	case n >= 1<<30 && n%(1<<30) == 0:
		return strconv.Itoa(n>>30) + "G"
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.Itoa(n>>20) + "M"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.Itoa(n>>10) + "K"
	}
	return strconv.Itoa(n)
}

// needsMesh reports whether a runs only over a Mesh.
func (a Algorithm) needsMesh() bool {
	switch a {
	case AlgoRecursiveDoubling, AlgoRabenseifner, AlgoScatterGather:
		return true
	}
	return false
}

// defaultRules is the policy of a zero AllreducePolicy for a ring of size
// ranks; mesh says whether the transport is a Mesh, oneHost whether
// Config.Hosts puts every rank on one host. In the string syntax:
//
//	plain Transport:  direct:4K,ring
//	Mesh, N = 2:      recursive-doubling:16K,ring (one host: recursive-doubling:512K,ring)
//	Mesh, N = 3:      direct:4K,rabenseifner:4M,ring
//	Mesh, N >= 4:     recursive-doubling:16K,rabenseifner:4M,ring
//
// Why these thresholds (every algorithm was timed end to end with gorun
// bench at N = 2, 3 and 4; the figures, and how to reproduce them, are in
// BENCHMARKS.md, "Allreduce algorithms"):
//
//   - Below 16 KiB a call is bound by latency, and one exchange wins:
//     direct or recursive doubling (at N = 2 they are the same exchange).
//     At N = 4 recursive doubling's two rounds match direct's three-way
//     fan-out and, unlike it, scale as log2 N. At N = 3, not a power of
//     two, recursive doubling adds a fold before and after its round, and
//     direct's single hop does at least as well to 4 KiB.
//   - Above 16 KiB at N = 2, the ring: recursive doubling is level with it
//     at best, and from 64 KiB its whole-buffer exchange, too large to send
//     before receiving (SmallBytes), needs a sender goroutine, whose
//     hand-offs cost more than the exchange saves, while the ring's 32 KiB
//     halves still go without one.
//   - From 16 KiB (4 KiB at N = 3) to 4 MiB, Rabenseifner (2 log2 N hops,
//     bandwidth-optimal) is as fast as the ring or faster, clearly so over
//     unix sockets; above 4 MiB the pipelined ring is as good and steadier.
//   - Scatter-gather is no default: with more ranks than cores its 2(N-1)
//     concurrent transfers per rank cost more wake-ups than its two hops
//     save, and above 64 KiB it is the slowest. It stays available
//     (GORUN_ALLREDUCE_ALGORITHMS) for hosts with a core per rank.
//   - N > 4 was not measured (it means more ranks than cores on the
//     machine the defaults come from) and uses the N = 4 rules, whose
//     latency terms scale as log2 N.
//   - A plain Transport keeps the thresholds measured before the Mesh
//     algorithms existed: direct, i.e. a ring allgather of whole buffers,
//     to 4 KiB.
//
// Two ranks on one host (Config.Hosts says so) run recursive doubling to
// 512 KiB: their shared-memory link takes a whole exchange of that size
// before it is read (LinkBuffers: half of its 2 MiB), so the one exchange
// goes without a sender goroutine and beats the ring's two steps; at
// 1 MiB the exchange no longer fits half the link and needs the sender
// goroutine, and the ring wins. Over unix sockets, where every such
// exchange needs the sender goroutine, recursive doubling still won up to
// 512 KiB. Between hosts a large exchange is not promised to fit the
// socket, and the limit stays 16 KiB. The host layout is the same on
// every rank, so they choose alike.
func defaultRules(size int, mesh, oneHost bool) []AllreduceRule {
	switch {
	case !mesh:
		return []AllreduceRule{{TinyAllreduceBytes, AlgoDirect}, {NoLimit, AlgoRing}}
	case size <= 2 && oneHost:
		return []AllreduceRule{{512 << 10, AlgoRecursiveDoubling}, {NoLimit, AlgoRing}}
	case size <= 2:
		return []AllreduceRule{{16 << 10, AlgoRecursiveDoubling}, {NoLimit, AlgoRing}}
	case size == 3:
		return []AllreduceRule{{4 << 10, AlgoDirect}, {4 << 20, AlgoRabenseifner}, {NoLimit, AlgoRing}}
	}
	return []AllreduceRule{{16 << 10, AlgoRecursiveDoubling}, {4 << 20, AlgoRabenseifner}, {NoLimit, AlgoRing}}
}

// AllreduceAlgorithm returns the algorithm an Allreduce of a buffer of
// bytes bytes runs on this ring, given Config.Allreduce, Config.Hosts and
// the transport (see AllreducePolicy). A compressed allreduce
// (AllreduceCompressed) has its own schedule and ignores it.
func (r *Ring) AllreduceAlgorithm(bytes int) Algorithm {
	if r.policy.IsDefault() && !r.linkModel && r.preferHierarchical(bytes) {
		return AlgoHierarchical
	}
	a, ok := r.policy.pick(bytes)
	if !ok {
		return r.defaultAlgorithm(bytes)
	}
	if a.needsMesh() && r.mesh == nil {
		a = AlgoRing
	}
	return a
}

// oneHost reports whether hosts (Config.Hosts) puts every rank on one host.
func oneHost(hosts []int) bool {
	if hosts == nil {
		return false
	}
	for _, h := range hosts {
		if h != hosts[0] {
			return false
		}
	}
	return true
}

// AllreducePolicy returns the ring's policy (Config.Allreduce).
func (r *Ring) AllreducePolicy() AllreducePolicy { return r.policy }

// DefaultAllreducePolicy returns what the zero policy runs on this ring,
// and whether it comes from Config.Links (CrossHostPolicy) rather than
// the measured defaults. Where it does not, the hierarchical schedule
// also runs from HierarchicalMinBytes on a layout that allows it
// (preferHierarchical), which the rules returned do not show.
func (r *Ring) DefaultAllreducePolicy() (AllreducePolicy, bool) {
	return AllreducePolicy{Rules: slices.Clone(*r.defaults.Load())}, r.linkModel
}

// SetDefaultAllreduce replaces the rules of a zero policy that come from
// the links (DefaultAllreducePolicy says so) with p: a caller refining the
// link model's choices from the calls' own timings. Every rank must make
// the same change between the same two calls: the algorithm is part of
// each call's fingerprint, so ranks that disagree fail with
// *MismatchError. It returns false and changes nothing where the defaults
// do not come from the links, or p is not a policy for every size (its
// last rule NoLimit) of algorithms this ring runs (ModelCandidates).
func (r *Ring) SetDefaultAllreduce(p AllreducePolicy) bool {
	if !r.linkModel || p.IsDefault() || p.Rules[len(p.Rules)-1].MaxBytes != NoLimit {
		return false
	}
	for _, rule := range p.Rules {
		if !r.runsModelled(rule.Algo) {
			return false
		}
	}
	rules := slices.Clone(p.Rules)
	r.defaults.Store(&rules)
	return true
}

// runsModelled reports whether a is one of the schedules the cost model
// picks from that this ring runs (ModelCandidates, over a Mesh).
func (r *Ring) runsModelled(a Algorithm) bool {
	return r.mesh != nil && slices.Contains(r.modelled, a)
}

// defaultAlgorithm is what the zero policy picks for bytes on this ring.
func (r *Ring) defaultAlgorithm(bytes int) Algorithm {
	a, _ := AllreducePolicy{Rules: *r.defaults.Load()}.pick(bytes)
	if a.needsMesh() && r.mesh == nil {
		a = AlgoRing
	}
	return a
}
