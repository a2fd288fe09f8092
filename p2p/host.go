package p2p

// The libp2p side of a rank and of the rendezvous: job keys and the
// rendezvous identity derived from them, addresses, the restricted host,
// the gater that admits only the job's peers, and host identity.

import (
	"context"
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/connmgr"
	"github.com/libp2p/go-libp2p/core/control"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"
)

// NewJobKey returns 32 random bytes to use as Config.JobKey.
func NewJobKey() []byte {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		panic("p2p: crypto/rand failed: " + err.Error())
	}
	return k
}

const minKeyLen = 16

// rendezvousIdentity derives the rendezvous' libp2p key from the job key, so
// that knowing the key is enough to know (and, through TLS, verify) the
// rendezvous peer ID. The label makes the derived key useless for anything
// else.
func rendezvousIdentity(jobKey []byte) (crypto.PrivKey, peer.ID, error) {
	seed, err := hkdf.Key(sha256.New, jobKey, nil, "gorun rendezvous ed25519 identity v1", ed25519.SeedSize)
	if err != nil {
		return nil, "", err
	}
	sk, err := crypto.UnmarshalEd25519PrivateKey(ed25519.NewKeyFromSeed(seed))
	if err != nil {
		return nil, "", err
	}
	id, err := peer.IDFromPrivateKey(sk)
	return sk, id, err
}

// RendezvousPeerID returns the peer ID the rendezvous for jobKey has.
func RendezvousPeerID(jobKey []byte) (peer.ID, error) {
	_, id, err := rendezvousIdentity(jobKey)
	return id, err
}

// ipMultiaddr builds /ip4|ip6/IP/tcp/PORT.
func ipMultiaddr(ip net.IP, port int) (ma.Multiaddr, error) {
	if ip4 := ip.To4(); ip4 != nil {
		return ma.NewMultiaddr(fmt.Sprintf("/ip4/%s/tcp/%d", ip4, port))
	}
	return ma.NewMultiaddr(fmt.Sprintf("/ip6/%s/tcp/%d", ip, port))
}

// resolveHostPort turns "host:port" into multiaddrs, resolving DNS names.
func resolveHostPort(ctx context.Context, hp string) ([]ma.Multiaddr, error) {
	h, p, err := net.SplitHostPort(hp)
	if err != nil {
		return nil, fmt.Errorf("bad address %q: %w", hp, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port <= 0 || port > 65535 {
		return nil, fmt.Errorf("bad port in %q", hp)
	}
	ips, err := LookupIP(ctx, h)
	if err != nil {
		return nil, err
	}
	var out []ma.Multiaddr
	for _, ip := range ips {
		a, err := ipMultiaddr(ip, port)
		if err == nil {
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no usable address for %q", hp)
	}
	return out, nil
}

// newHost creates a libp2p host restricted to TCP + TLS 1.3 + yamux, with
// no relay, no metrics, no resource limits (a ring link moves gigabytes; the
// default resource manager would throttle it) and no connection trimming.
func newHost(sk crypto.PrivKey, listen ma.Multiaddr, g connmgr.ConnectionGater) (host.Host, error) {
	opts := []libp2p.Option{
		libp2p.Identity(sk),
		libp2p.ListenAddrs(listen),
		// Plain dial sockets: reuseport dials from the listen port make
		// simultaneous connections of one pair collide (go-libp2p#2925).
		libp2p.Transport(tcp.NewTCPTransport, tcp.DisableReuseport()),
		libp2p.Security(libp2ptls.ID, libp2ptls.New),
		libp2p.Muxer(yamux.ID, yamux.DefaultTransport),
		libp2p.DisableRelay(),
		libp2p.Ping(false),
		libp2p.DisableMetrics(),
		libp2p.DisableIdentifyAddressDiscovery(),
		libp2p.ResourceManager(&network.NullResourceManager{}),
		libp2p.ConnectionManager(&connmgr.NullConnMgr{}),
		libp2p.UDPBlackHoleSuccessCounter(nil),
		libp2p.IPv6BlackHoleSuccessCounter(nil),
	}
	if g != nil {
		opts = append(opts, libp2p.ConnectionGater(g))
	}
	return libp2p.New(opts...)
}

// gater admits only the rendezvous and, once the table is known, the job's
// ranks. Refusing at InterceptSecured means the peer ID was proven by TLS.
type gater struct {
	rz      peer.ID
	mu      sync.RWMutex
	allowed map[peer.ID]bool
	logf    func(string, ...any)
}

func newGater(rz peer.ID, logf func(string, ...any)) *gater {
	return &gater{rz: rz, allowed: map[peer.ID]bool{rz: true}, logf: logf}
}

func (g *gater) allow(ids ...peer.ID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, id := range ids {
		g.allowed[id] = true
	}
}

// set replaces the set of allowed peers (the rendezvous always stays).
func (g *gater) set(ids ...peer.ID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for id := range g.allowed {
		if id != g.rz {
			delete(g.allowed, id)
		}
	}
	for _, id := range ids {
		g.allowed[id] = true
	}
}

func (g *gater) ok(p peer.ID) bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.allowed[p]
}

func (g *gater) InterceptPeerDial(p peer.ID) bool                 { return g.ok(p) }
func (g *gater) InterceptAddrDial(p peer.ID, _ ma.Multiaddr) bool { return g.ok(p) }
func (g *gater) InterceptAccept(network.ConnMultiaddrs) bool      { return true }
func (g *gater) InterceptSecured(_ network.Direction, p peer.ID, a network.ConnMultiaddrs) bool {
	if g.ok(p) {
		return true
	}
	g.logf("refused peer %s from %s: not in the job table", p, a.RemoteMultiaddr())
	return false
}
func (g *gater) InterceptUpgraded(network.Conn) (bool, control.DisconnectReason) { return true, 0 }

// detectHostID identifies the network namespace this process runs in:
// hostname, net namespace inode and boot id. Two ranks with equal HostIDs can
// reach each other's abstract unix sockets (they are per network namespace).
func detectHostID() string {
	hn, _ := os.Hostname()
	ns, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		ns = "nons"
	}
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		boot = []byte("noboot")
	}
	return hn + "/" + ns + "/" + strings.TrimSpace(string(boot))
}

// sameMachine reports whether host identities a and b (detectHostID's)
// are of one kernel, equal boot ids: their ranks share its CPUs though
// their network namespaces, and so their links, differ. Identities set by
// hand (Config.HostID) compare as they are.
func sameMachine(a, b string) bool {
	if a == b {
		return true
	}
	const bootIDLen = 36 // a UUID
	i, j := strings.LastIndexByte(a, '/'), strings.LastIndexByte(b, '/')
	return i >= 0 && j >= 0 && len(a)-i-1 == bootIDLen && a[i+1:] == b[j+1:]
}

func peerIDOf(it tableItem) (peer.ID, error) {
	id, err := peer.Decode(it.ID)
	if err != nil {
		return "", fmt.Errorf("rank %d: bad peer ID: %w", it.Rank, err)
	}
	return id, nil
}

// LookupIP resolves host (an IP is returned as it is), and, while the name
// does not resolve yet, asks again until ctx ends: a scheduler starts every
// rank at once, and the DNS name of the pod or node that hosts the
// rendezvous (a Kubernetes headless Service's record of pod 0, say) may
// appear only after the others ask. The error names the host and how long
// it was tried.
func LookupIP(ctx context.Context, host string) ([]net.IP, error) {
	if ip := net.ParseIP(host); ip != nil {
		return []net.IP{ip}, nil
	}
	start := time.Now()
	wait := 50 * time.Millisecond
	for {
		ips, err := net.DefaultResolver.LookupIP(ctx, "ip", host)
		if err == nil {
			return ips, nil
		}
		var dnsErr *net.DNSError
		retry := errors.As(err, &dnsErr) && (dnsErr.IsNotFound || dnsErr.IsTemporary || dnsErr.IsTimeout)
		if !retry {
			return nil, fmt.Errorf("resolve %q: %w", host, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("resolve %q: %w (still failing after %v)", host, err, time.Since(start).Round(time.Millisecond))
		case <-t.C:
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// RouteSource is the address of this host that the kernel's route to ip
// starts from: the address a host at ip reaches this one at. No packet is
// sent (a UDP socket is only connected).
func RouteSource(ip string) (string, error) {
	c, err := net.Dial("udp", net.JoinHostPort(ip, "9"))
	if err != nil {
		return "", fmt.Errorf("no route to %s: %v", ip, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String(), nil
}
