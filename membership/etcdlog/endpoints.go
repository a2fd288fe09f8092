package etcdlog

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// What the flags and variables give: the etcd endpoints and the job's
// rendezvous id.

// ParseEndpoints reads etcd client addresses, "h1:2379,h2:2379" (an
// http:// or https:// before each is allowed, as etcdctl writes them),
// and says whether they are https:// (every one or none).
func ParseEndpoints(s string) (addrs []string, https bool, err error) {
	var schemes []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		hp, secure := strings.CutPrefix(f, "https://")
		if !secure {
			hp = strings.TrimPrefix(f, "http://")
		}
		if len(addrs) > 0 && secure != https {
			return nil, false, fmt.Errorf("%s and %s: every address https://, or none", schemes[0], f)
		}
		https = secure
		host, port, err := net.SplitHostPort(hp)
		if p, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || p < 1 || p > 65535 {
			return nil, false, fmt.Errorf("%q is not host:port", f)
		}
		addrs, schemes = append(addrs, hp), append(schemes, f)
	}
	if len(addrs) == 0 {
		return nil, false, errors.New("no etcd address")
	}
	return addrs, https, nil
}

// CheckJob says what is wrong with a rendezvous id (nil: nothing): its
// keys are under /gorun/<id>/.
func CheckJob(id string) error {
	if id == "" || strings.ContainsAny(id, "/ \t\n") {
		return fmt.Errorf("rendezvous id %q: want a non-empty name without '/' or spaces", id)
	}
	return nil
}
