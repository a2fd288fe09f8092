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
// http:// before each is allowed, as etcdctl writes them).
func ParseEndpoints(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if strings.HasPrefix(f, "https://") {
			return nil, fmt.Errorf("%s: etcd over TLS is not supported; give the plain client addresses (host:port)", f)
		}
		hp := strings.TrimPrefix(f, "http://")
		host, port, err := net.SplitHostPort(hp)
		if p, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || p < 1 || p > 65535 {
			return nil, fmt.Errorf("%q is not host:port", f)
		}
		out = append(out, hp)
	}
	if len(out) == 0 {
		return nil, errors.New("no etcd address")
	}
	return out, nil
}

// CheckJob says what is wrong with a rendezvous id (nil: nothing): its
// keys are under /gorun/<id>/.
func CheckJob(id string) error {
	if id == "" || strings.ContainsAny(id, "/ \t\n") {
		return fmt.Errorf("rendezvous id %q: want a non-empty name without '/' or spaces", id)
	}
	return nil
}
