package ring

import (
	"fmt"
	"math"
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
// policy that was given is obeyed as it is.

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
// Measured 2026-11-23 on the shared 2-core machine, end to end, with
//
//	go build -o /tmp/gorun-algo ./cmd/gorun
//	GORUN_ALLREDUCE_ALGORITHMS=<algo> /tmp/gorun-algo bench -np <N> --sizes 4M,1M,4,1K,4K,16K,64K,256K
//
// every algorithm in turn, interleaved, two rounds at N = 2, 3 and 4 (the
// 4M and 1M first warm the job up: the first seconds of a job are 2-10x
// slower for every algorithm, which skewed a first sweep that started with
// the small sizes), over p2p's shared-memory links (the default between
// ranks of one host; with N > 2 ranks on 2 cores nothing spins, every wait
// parks). Other jobs kept the load average at 2..12, so single figures vary
// by up to 2x; the 16M column is from that first sweep (--sizes
// 4,1K,16K,64K,256K,1M,4M,16M, three rounds). Median µs per allreduce, per
// round:
//
//	N=2       4         1K        4K        16K       64K       256K      1M        4M          16M (cold)
//	ring      240/318   239/336   172/224   135/200   207/243   324/504   751/1182  2517/4072   12281/10953/14411
//	direct    221/144   216/154   232/146   217/152   330/443   455/589   935/1124  3336/4397   18182/14893/14648
//	scat-gath 189/227   147/184   154/138   149/190   471/449   523/526   928/904   3184/3499   19783/11514/32985
//	rec-doubl 198/4     191/5     183/5     142/10    252/237   319/301   729/604   3008/2717   20616/16700/16702
//	rabenseif 213/247   257/248   5/228     8/196     145/200   444/344   692/784   2722/2836   14910/10517/12477
//
//	N=3       4         1K        4K        16K       64K       256K      1M        4M
//	ring      242/148   298/154   243/178   228/126   157/222   743/736   1490/1522 4210/3316
//	direct    123/128   133/127   157/148   126/156   802/1336  1304/1749 2854/3389 8694/9225
//	scat-gath 67/126    28/169    29/184    38/128    84/198    1704/2616 2324/5580 14954/16221
//	rec-doubl 124/136   137/115   123/139   121/122   254/294   360/489   1186/1241 4423/5716
//	rabenseif 180/122   190/122   124/140   76/88     141/113   467/510   1224/1214 2996/3667
//
//	N=4       4         1K        4K        16K       64K       256K      1M        4M          16M (cold)
//	ring      277/310   224/444   241/394   206/383   153/319   1500/1300 2023/2994 6028/8103   41696/33816/27070
//	direct    179/181   228/224   190/277   292/222   1182/687  1737/1068 5757/3247 27116/25363 81631/70807/71743
//	scat-gath 272/61    205/133   276/58    288/115   507/265   2552/2840 5214/3790 15778/15812 65031/67077/41558
//	rec-doubl 233/164   281/156   478/143   360/95    636/574   1206/854  2986/2743 10438/10141 78562/76005/69224
//	rabenseif 268/312   252/383   272/411   161/247   259/339   1082/1710 1973/2510 5738/6140   52420/34397/39388
//
// Reading: below 16 KiB one exchange wins: direct or recursive doubling
// (at N = 2 they are the same exchange). Above 16 KiB at N = 2 the ring:
// the loaded rounds above show recursive doubling level with it to 1 MiB,
// but on a quiet machine (load 2.7, where shm links spin) a 64 KiB
// exchange, too large to send before receiving (SmallBytes), needs a
// sender goroutine and took 218/226 µs against the ring's 22/25 (whose
// 32 KiB halves still go without one). At N = 4 recursive
// doubling's two rounds match direct's three-way fan-out and scale as
// log2 N. From 16-64 KiB to 4 MiB Rabenseifner (2 log2 N hops,
// bandwidth-optimal) is as fast as the ring or faster (over unix sockets,
// GORUN_SHM=0, clearly: N = 4, 64K..16M: 742/1941/3137/12392/35126 µs vs
// the ring's 1275/2665/4102/14139/44475); above 4 MiB the pipelined ring is
// as good and steadier. Scatter-gather never won on this machine: with N
// ranks on 2 cores its 2(N-1) concurrent transfers per rank cost more
// wake-ups than its two hops save, above 64 KiB it is the slowest; it
// stays available (GORUN_ALLREDUCE_ALGORITHMS) for hosts with a core per
// rank. N > 4 was not measured (more ranks than cores here) and uses the
// N = 4 rules, whose latency terms scale as log2 N. A plain Transport
// keeps the thresholds measured before (direct, i.e. a ring allgather of
// whole buffers, to 4 KiB).
//
// Two ranks on one host (Config.Hosts says so) run recursive doubling to
// 512 KiB: their shared-memory link takes a whole exchange of that size
// before it is read (LinkBuffers: half of its 2 MiB), so the one exchange
// goes without a sender goroutine. First measured to 64 KiB (gorun bench
// -np 2, 3 interleaved rounds on 2 CPUs, recursive doubling / ring /
// Rabenseifner: 16 KiB 9.1/11.0/11.0 us, 32 KiB 12.1/13.2/13.3, 64 KiB
// 20.0/22.8/23.5, 128 KiB 33.7/30.8/33.3); after the REP MOVSB copies
// (p2p/copy.go), medians of 9 interleaved runs, recursive doubling / ring:
// 96 KiB 24.7/26.5 us, 128 KiB 29.0/33.8 (27.3/26.3 in another series),
// 192 KiB 41.9/47.3 (33.5/28.9), 256 KiB 53.0/58.2 (34.6/37.2,
// 40.9/44.1), 384 KiB 73.6/82.7, 400 KiB 54.3/62.1, 512 KiB 76.6/98.7
// (99.2/101.6, 71.1/69.8); 768 KiB level (153/146), and 1 MiB 342/191,
// where the exchange no longer fits half the link and needs the sender
// goroutine. Over unix sockets (GORUN_SHM=0),
// where every such exchange needs the sender goroutine, recursive
// doubling still won (medians of 5: 128 KiB 235/409 us, 256 KiB 273/421,
// 512 KiB 429/571). Between hosts a large exchange is not promised to fit
// the socket, and the limit stays 16 KiB. The host layout is the same on
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
	if r.policy.IsDefault() && r.preferHierarchical(bytes) {
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

// defaultAlgorithm is what the zero policy picks for bytes on this ring.
func (r *Ring) defaultAlgorithm(bytes int) Algorithm {
	a, _ := AllreducePolicy{Rules: r.defaults}.pick(bytes)
	if a.needsMesh() && r.mesh == nil {
		a = AlgoRing
	}
	return a
}
