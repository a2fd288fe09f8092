// How gorun words the rendezvous' membership changes and names its hosts.

package launcher

import (
	"cmp"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/gorun/gorun/p2p"
)

// ChangeLine is how gorun reports a membership change of an elastic job:
// "membership epoch 1: 3 ranks (lost rank 2 on host a (proc 2, pid 7895):
// disconnected), reset took 21ms". Ranks are those of the epoch before for
// the lost, of the new epoch for the joined; proc, if not nil, names a
// member's process as gorun's other lines do ("proc 2, pid 7895"; "" for
// none of gorun's).
func ChangeLine(c p2p.Change, proc func(p2p.Member) string) string {
	var parts []string
	who := func(m p2p.Member) string {
		s := fmt.Sprintf("rank %d on host %s", m.Rank, hostOfID(m.Host))
		if proc != nil {
			if p := proc(m); p != "" {
				s += " (" + p + ")"
			}
		}
		return s
	}
	for _, l := range c.Lost {
		if l.Left {
			parts = append(parts, fmt.Sprintf("%s %s", who(l.Member), l.Cause))
			continue
		}
		parts = append(parts, fmt.Sprintf("lost %s: %s", who(l.Member), l.Cause))
	}
	for _, j := range c.Joined {
		parts = append(parts, "joined "+who(j))
	}
	if len(parts) == 0 {
		parts = []string{"same members, links set up again"}
	}
	return fmt.Sprintf("membership epoch %d: %d rank%s (%s), reset took %v",
		c.Epoch, c.Size, plural(c.Size), strings.Join(parts, "; "), roundTook(c.Took))
}

// roundTook rounds a reset time to what is worth reading: 0.8ms, 12ms,
// 1.23s.
func roundTook(d time.Duration) time.Duration {
	switch {
	case d < time.Millisecond:
		return d.Round(100 * time.Microsecond)
	case d < time.Second:
		return d.Round(time.Millisecond)
	}
	return d.Round(10 * time.Millisecond)
}

// hostIDRE matches a p2p host ID ("name/net:[4026531833]/boot-id", see
// p2p.Config.HostID) in the rendezvous' messages: the name is what the user
// knows the host by.
var hostIDRE = regexp.MustCompile(`([^\s/(),]+)/net:\[\d+\]/[0-9a-f-]{36}`)

// hostOfID is the host name in a p2p host ID ("name/netns/boot").
func hostOfID(id string) string {
	name, _, _ := strings.Cut(id, "/")
	return cmp.Or(name, "?")
}
