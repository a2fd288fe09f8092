package checkpoint

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"

	"github.com/gorun/gorun/collective"
)

// domains are the job's storage domains: sets of ranks whose checkpoint
// directories are the same directory (one host's local disk, or a shared
// filesystem that every rank sees, which makes one domain of the job).
type domains struct {
	of      []int   // rank -> its domain
	members [][]int // domain -> its ranks, ascending; domains ordered by their lowest rank
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
	rec := make([]byte, tokLen+1)
	copy(rec, name)
	rec[tokLen] = byte(boolU64(terr == nil))
	all := make([]byte, (tokLen+1)*n)
	// Creating the token is a storage operation: the others may wait for it.
	if err := m.comm.Allgather(m.ioCtx(ctx), rec, all, collective.Name("checkpoint.domains")); err != nil {
		return nil, fmt.Errorf("checkpoint: finding which ranks share a checkpoint directory: %w", err)
	}
	var bad []int
	for r := range n {
		if all[r*(tokLen+1)+tokLen] == 0 {
			bad = append(bad, r)
		}
	}
	if len(bad) > 0 {
		if terr != nil {
			return nil, fmt.Errorf("checkpoint: creating a file in %s: %w", location(m.store, tokenDir), terr)
		}
		return nil, fmt.Errorf("checkpoint: ranks %v could not create a file in their checkpoint directories (see their errors)", bad)
	}
	// Every token is created before the allgather returns anywhere, so a
	// look-up sees every token of the directory.
	sees := make([]byte, n)
	for r := range n {
		if hs.hasToken(string(all[r*(tokLen+1) : r*(tokLen+1)+tokLen])) {
			sees[r] = 1
		}
	}
	matrix := make([]byte, n*n)
	if err := m.comm.Allgather(m.ioCtx(ctx), sees, matrix, collective.Name("checkpoint.domains.seen")); err != nil {
		return nil, fmt.Errorf("checkpoint: finding which ranks share a checkpoint directory: %w", err)
	}
	dom, err := domainsOf(n, func(r, s int) bool { return matrix[r*n+s] != 0 })
	if err != nil {
		return nil, err
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
