package p2p

// The rendezvous a rank registers with may be a list of a replicated
// group's replicas (Config.Rendezvous "a:p,4@b:p,5@c:p"): a process that
// joins a running job whose first replica may be gone (a pod that was
// replaced, an srun step started later in the allocation) tries each in
// turn, and a replica that does not lead sends it to the one that does.

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// rendezvousList parses Config.Rendezvous: comma-separated entries
// "host:port" (replica 1, the one a group starts from, or a lone
// rendezvous) or "ID@host:port" (replica ID, as ReplicaID gives it). The
// ID tells which identity the replica must prove: each replica's is
// derived from the job key and its ID.
func rendezvousList(s string) ([]groupItem, error) {
	var out []groupItem
	seen := map[uint64]bool{}
	for _, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			return nil, fmt.Errorf("rendezvous %q: an empty entry (write host:port or ID@host:port, comma-separated)", s)
		}
		it := groupItem{ID: 1, Addr: e}
		if id, addr, ok := strings.Cut(e, "@"); ok {
			n, err := strconv.ParseUint(id, 10, 64)
			if err != nil || n == 0 {
				return nil, fmt.Errorf("rendezvous entry %q: %q is not a replica id (a positive number, as in 3@host:port)", e, id)
			}
			it = groupItem{ID: n, Addr: addr}
		}
		h, p, err := net.SplitHostPort(it.Addr)
		if err != nil || h == "" {
			return nil, fmt.Errorf("rendezvous entry %q: want host:port or ID@host:port", e)
		}
		if port, err := strconv.Atoi(p); err != nil || port <= 0 || port > 65535 {
			return nil, fmt.Errorf("rendezvous entry %q: bad port %q", e, p)
		}
		if seen[it.ID] {
			return nil, fmt.Errorf("rendezvous %q: replica %d is listed twice", s, it.ID)
		}
		seen[it.ID] = true
		out = append(out, it)
	}
	return out, nil
}
