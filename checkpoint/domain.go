package checkpoint

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"

	"github.com/gorun/gorun/collective"
)

// domains are the job's storage domains: sets of ranks whose checkpoint
// directories are the same directory (one host's local disk, or a shared
// filesystem that every rank sees, which makes one domain of the job).
type domains struct {
	of      []int    // rank -> its domain
	members [][]int  // domain -> its ranks, ascending; domains ordered by their lowest rank
	names   []string // domain -> its directory as its lowest rank names it (dirLabel); nil when unknown
}

func oneDomain(n int) *domains {
	d := &domains{of: make([]int, n), members: [][]int{make([]int, n)}}
	for r := range n {
		d.members[0][r] = r
	}
	return d
}

func (d *domains) h() int { return len(d.members) }

// leads reports whether rank is its domain's lowest rank: the one that
// prepares steps, commits manifests and applies retention there.
func (d *domains) leads(rank int) bool { return d.members[d.of[rank]][0] == rank }

// homes are the domains that keep rank r's files: its own, then the next k
// cyclically.
func (d *domains) homes(r, k int) []int {
	out := make([]int, 0, k+1)
	for i := range k + 1 {
		out = append(out, (d.of[r]+i)%d.h())
	}
	return out
}

// dirList names domains by their directories: "the checkpoint directory
// /x/node2", "the checkpoint directories /x/node1 and /x/node2"; by their
// numbers when the names are not known ("the checkpoint directories of
// hosts 1 and 2").
func (d *domains) dirList(doms []int) string {
	if len(d.names) != d.h() {
		if len(doms) == 1 {
			return "the checkpoint directory of " + hostList(doms)
		}
		return "the checkpoint directories of " + hostList(doms)
	}
	names := make([]string, len(doms))
	for i, dom := range doms {
		names[i] = d.names[dom]
	}
	if len(names) == 1 {
		return "the checkpoint directory " + names[0]
	}
	return "the checkpoint directories " + strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// dirLabel is how this rank's directory dir is named to the user: the
// path after {host} expansion, prefixed with the host ("node2:/local/ckpt")
// when the path does not name it (the same path on every host).
func dirLabel(dir string) string {
	host := os.Getenv(EnvHost)
	if host == "" {
		host, _ = os.Hostname()
	}
	if host == "" || strings.Contains(dir, host) {
		return dir
	}
	return host + ":" + dir
}

// writer is the rank that writes rank r's files in domain dom: r itself in
// its own domain, else the member numbered r mod the domain's size, which
// spreads the replicas over the domain's ranks.
func (d *domains) writer(r, dom int) int {
	if d.of[r] == dom {
		return r
	}
	mem := d.members[dom]
	return mem[r%len(mem)]
}

// domains finds the storage domains, once per comm size and membership
// epoch: every rank creates a token with a random name in its store (a
// perHostStore: a directory), the names are allgathered, every rank says
// which of them it sees, and ranks that see each other's tokens share a
// directory. Any other store (an object store) is one domain: every rank
// sees the same bucket.
func (m *Manager) domains(ctx context.Context) (*domains, error) {
	n := m.comm.Size()
	key := [2]int{n, m.comm.Epoch()}
	if m.dom != nil && m.domKey == key {
		return m.dom, nil
	}
	hs, ok := m.store.(perHostStore)
	if !ok || n == 1 {
		m.dom, m.domKey = oneDomain(n), key
		return m.dom, nil
	}
	const tokLen = 32
	var tok [16]byte
	rand.Read(tok[:])
	name := hex.EncodeToString(tok[:])
	terr := hs.putToken(name)
	defer hs.dropToken(name)
	// The token, whether it was created, and the length of this rank's
	// directory's name, which the second allgather carries.
	label := dirLabel(m.dir)
	const recLen = tokLen + 1 + 2
	rec := make([]byte, recLen)
	copy(rec, name)
	rec[tokLen] = byte(boolU64(terr == nil))
	binary.LittleEndian.PutUint16(rec[tokLen+1:], uint16(min(len(label), math.MaxUint16)))
	all := make([]byte, recLen*n)
	// Creating the token is a storage operation: the others may wait for it.
	if err := m.comm.Allgather(m.ioCtx(ctx), rec, all, collective.Name("checkpoint.domains")); err != nil {
		return nil, fmt.Errorf("checkpoint: finding which ranks share a checkpoint directory: %w", err)
	}
	var bad []int
	maxLabel := 0
	for r := range n {
		if all[r*recLen+tokLen] == 0 {
			bad = append(bad, r)
		}
		maxLabel = max(maxLabel, int(binary.LittleEndian.Uint16(all[r*recLen+tokLen+1:])))
	}
	if len(bad) > 0 {
		if terr != nil {
			return nil, fmt.Errorf("checkpoint: creating a file in %s: %w", location(m.store, tokenDir), terr)
		}
		return nil, fmt.Errorf("checkpoint: ranks %v could not create a file in their checkpoint directories (see their errors)", bad)
	}
	// Every token is created before the allgather returns anywhere, so a
	// look-up sees every token of the directory.
	seenLen := n + maxLabel
	sees := make([]byte, seenLen)
	for r := range n {
		if hs.hasToken(string(all[r*recLen : r*recLen+tokLen])) {
			sees[r] = 1
		}
	}
	copy(sees[n:], label)
	matrix := make([]byte, n*seenLen)
	if err := m.comm.Allgather(m.ioCtx(ctx), sees, matrix, collective.Name("checkpoint.domains.seen")); err != nil {
		return nil, fmt.Errorf("checkpoint: finding which ranks share a checkpoint directory: %w", err)
	}
	dom, err := domainsOf(n, func(r, s int) bool { return matrix[r*seenLen+s] != 0 })
	if err != nil {
		return nil, err
	}
	for _, mem := range dom.members {
		r := mem[0]
		l := int(binary.LittleEndian.Uint16(all[r*recLen+tokLen+1:]))
		dom.names = append(dom.names, string(matrix[r*seenLen+n:r*seenLen+n+l]))
	}
	m.dom, m.domKey = dom, key
	return dom, nil
}

// domainsOf groups the ranks by what they see: rank r's domain is the set
// of ranks whose token r sees. The relation must be an equivalence (it is
// for directories; a directory that is shared one way only is a
// misconfiguration).
func domainsOf(n int, sees func(r, s int) bool) (*domains, error) {
	d := &domains{of: make([]int, n)}
	for r := range n {
		d.of[r] = -1
	}
	for r := range n {
		if d.of[r] >= 0 {
			continue
		}
		var mem []int
		for s := range n {
			if sees(r, s) {
				mem = append(mem, s)
			}
		}
		if !slices.Contains(mem, r) {
			return nil, fmt.Errorf("checkpoint: rank %d does not see the file it created in its checkpoint directory", r)
		}
		for _, s := range mem {
			for t := range n {
				if sees(s, t) != sees(r, t) || d.of[s] >= 0 {
					return nil, errors.New("checkpoint: the ranks' checkpoint directories overlap inconsistently (rank " + fmt.Sprint(s) + " and rank " + fmt.Sprint(r) + " see different sets of ranks): give each host one directory, or one shared directory to all")
				}
			}
		}
		for _, s := range mem {
			d.of[s] = len(d.members)
		}
		d.members = append(d.members, mem)
	}
	return d, nil
}
