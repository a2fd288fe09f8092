package collective

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorun/gorun/p2p"
)

// Where a rank is on the network: the address it listens on and
// advertises (defaultListenIP, or every interface when it hosts the
// rendezvous under a host name), and which ranks share a host
// (hostIndices, for ring.Config.Hosts).

// hostingListenAddr is the address a rank that hosts the rendezvous at addr
// listens on. An IP address is kept. A host name becomes every interface,
// at the same port: the name may resolve, on the hosting node itself, to
// a loopback address (Debian's "127.0.1.1 hostname" line in /etc/hosts) or
// not at all yet (a pod's own headless-Service name before it is published),
// while the other ranks reach the node by that name.
func hostingListenAddr(ctx context.Context, addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("rendezvous address %q: %w (write HOST:PORT)", addr, err)
	}
	if host == "" || net.ParseIP(host) != nil {
		return addr, nil
	}
	if ips, err := net.DefaultResolver.LookupIP(ctx, "ip", host); err == nil && len(ips) > 0 && !slices.ContainsFunc(ips, func(ip net.IP) bool { return ip.To4() != nil }) {
		return net.JoinHostPort("::", port), nil // an IPv6-only name
	}
	return net.JoinHostPort("", port), nil // 0.0.0.0
}

// defaultListenIP is the IP a rank listens on and advertises to its peers
// when GORUN_LISTEN_IP does not say: the address this host reaches the
// rendezvous from (the source address of the route to it; a connected UDP
// socket sends nothing), as gorun chooses for its remote ranks. A host name
// that leads to loopback when the job spans hosts (multiHost: the source
// said fewer ranks share this host than the job has) is this host's own
// name in /etc/hosts: the default route's address is taken instead, or,
// without one, it is an error, since ranks on other hosts could not reach
// a loopback address.
//
// A list of a rendezvous group's replicas ("host:port,4@host:port,...")
// takes the first entry whose name resolves: a replica's pod or node may
// be gone with its name.
func defaultListenIP(ctx context.Context, rendezvous string, multiHost bool) (string, error) {
	entries := strings.Split(rendezvous, ",")
	if len(entries) == 1 {
		return listenIPToward(ctx, rendezvous, multiHost)
	}
	var errs []error
	for round := 0; ; round++ {
		for _, e := range entries {
			if _, addr, ok := strings.Cut(e, "@"); ok {
				e = addr
			}
			ectx, cancel := context.WithTimeout(ctx, time.Second<<min(round, 3))
			ip, err := listenIPToward(ectx, strings.TrimSpace(e), multiHost)
			cancel()
			if err == nil {
				return ip, nil
			}
			if ctx.Err() != nil {
				return "", errors.Join(append(errs, err)...)
			}
			if round == 0 {
				errs = append(errs, err)
			}
		}
	}
}

// listenIPToward is defaultListenIP for one rendezvous address.
func listenIPToward(ctx context.Context, rendezvous string, multiHost bool) (string, error) {
	host, port, err := net.SplitHostPort(rendezvous)
	if err != nil {
		return "", fmt.Errorf("rendezvous address %q: %w (write HOST:PORT)", rendezvous, err)
	}
	if _, err := strconv.Atoi(port); err != nil {
		return "", fmt.Errorf("rendezvous address %q: port %q is not a number", rendezvous, port)
	}
	ips, err := p2p.LookupIP(ctx, host) // retried until ctx ends: pod 0's name may come later
	if err != nil {
		return "", fmt.Errorf("resolving the rendezvous host %q to choose this rank's address: %w (set %s to this host's address)", host, err, EnvListenIP)
	}
	var errs []error
	for _, ip := range ips {
		src, err := p2p.RouteSource(ip.String())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		local := net.ParseIP(src)
		// A name that resolves to loopback (Debian's "127.0.1.1 node1" in
		// /etc/hosts) on a job that spans hosts; a loopback IP written as
		// such says the job runs on this host alone.
		// This host's own name then, for which Debian's /etc/hosts says
		// 127.0.1.1 while the other hosts' DNS knows its real address:
		// take the address of the default route, as a host would to reach
		// the others.
		if local.IsLoopback() && multiHost && net.ParseIP(host) == nil {
			if out := defaultRouteSource(); out != nil {
				return out.String(), nil
			}
			return "", fmt.Errorf("the rendezvous host %q is %v, a loopback address on this host, and this host has no default route, so ranks on other hosts could not reach this one: set %s to this host's address on the job's network (or fix %q in /etc/hosts)", host, ip, EnvListenIP, host)
		}
		return local.String(), nil
	}
	return "", fmt.Errorf("no route to the rendezvous host %q (%v): %w; set %s to this host's address", host, ips, errors.Join(errs...), EnvListenIP)
}

// defaultRouteSource is the address this host sends from toward a host
// that no more specific route covers (a connected UDP socket sends
// nothing), or nil without a default route.
func defaultRouteSource() net.IP {
	src, err := p2p.RouteSource("198.51.100.1") // TEST-NET-2
	if ip := net.ParseIP(src); err == nil && !ip.IsLoopback() {
		return ip
	}
	return nil
}

// hostIndices returns, for every rank of peers (in rank order), the index
// of its host: ranks with equal HostIDs get equal indices, numbered in the
// order of their first rank (ring.Config.Hosts). It returns nil for fewer
// than two ranks, or when a HostID is unknown.
func hostIndices(peers []p2p.Peer) []int {
	if len(peers) < 2 {
		return nil
	}
	out := make([]int, len(peers))
	ids := make(map[string]int, len(peers))
	for i, p := range peers {
		if p.Rank != i || p.HostID == "" {
			return nil
		}
		idx, ok := ids[p.HostID]
		if !ok {
			idx = len(ids)
			ids[p.HostID] = idx
		}
		out[i] = idx
	}
	return out
}
