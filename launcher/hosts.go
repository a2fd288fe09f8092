// Host lists: -H, hostfiles and the discovery script's output parsed, and
// ranks placed on the hosts' slots.

package launcher

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
)

// Host is one entry of -H or --hostfile: a host name (or address, or an
// alias from ~/.ssh/config) and how many ranks it runs.
type Host struct {
	Name  string
	Slots int
}

// ParseHosts parses horovodrun's -H grammar: host1:2,host2:2. A host without
// ":slots" has one slot; IPv6 addresses are written in brackets, [fd00::1]:2.
func ParseHosts(s string) ([]Host, error) {
	var hosts []Host
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, fmt.Errorf("-H %q has an empty host: write host:slots[,host:slots...], e.g. -H node1:4,node2:4", s)
		}
		h, err := parseHostItem(item)
		if err != nil {
			return nil, fmt.Errorf("-H %q: %v: write host:slots[,host:slots...], e.g. -H node1:4,node2:4", s, err)
		}
		hosts = append(hosts, h)
	}
	return mergeHosts(hosts), nil
}

// parseHostItem parses one "host[:slots]" ("[fd00::1]:2" for IPv6).
func parseHostItem(item string) (Host, error) {
	name, slots := item, 1
	if i := strings.LastIndex(item, ":"); i >= 0 && (!strings.Contains(item[:i], ":") || strings.HasSuffix(item[:i], "]")) {
		n, err := strconv.Atoi(item[i+1:])
		if err != nil || n < 1 {
			return Host{}, fmt.Errorf("%q is not a slot count (a positive integer)", item[i+1:])
		}
		name, slots = item[:i], n
	}
	name = strings.TrimSuffix(strings.TrimPrefix(name, "["), "]")
	if err := checkHostName(name); err != nil {
		return Host{}, err
	}
	return Host{Name: name, Slots: slots}, nil
}

// ParseDiscovery reads what a host discovery script printed: one
// "host:slots" (or "host", one slot) per line, as Horovod's scripts print;
// blank lines and '#' comments are skipped, a host listed twice has its
// slots added up. Printing no host at all is an error: a script that
// glitches must not stop every rank of a running job.
func ParseDiscovery(out string) ([]Host, error) {
	var hosts []Host
	for ln, line := range strings.Split(out, "\n") {
		line, _, _ = strings.Cut(line, "#")
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		h, err := parseHostItem(line)
		if err != nil {
			return nil, fmt.Errorf("line %d %q: %v: print one host:slots per line, e.g. node1:4", ln+1, line, err)
		}
		hosts = append(hosts, h)
	}
	if len(hosts) == 0 {
		return nil, errors.New("printed no host: print one host:slots per line, e.g. node1:4")
	}
	return mergeHosts(hosts), nil
}

// FormatHosts writes hosts as -H does: "a:2,b:1".
func FormatHosts(hosts []Host) string {
	parts := make([]string, len(hosts))
	for i, h := range hosts {
		name := h.Name
		if strings.Contains(name, ":") {
			name = "[" + name + "]"
		}
		parts[i] = name + ":" + strconv.Itoa(h.Slots)
	}
	return strings.Join(parts, ",")
}

// ParseHostfile reads horovodrun's (and mpirun's) host file: one host per
// line, "host slots=N" (slots defaults to 1), '#' starts a comment.
func ParseHostfile(name string) ([]Host, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("--hostfile: %w", err)
	}
	defer f.Close()
	return parseHostfile(name, f)
}

func parseHostfile(name string, r io.Reader) ([]Host, error) {
	var hosts []Host
	sc := bufio.NewScanner(r)
	for ln := 1; sc.Scan(); ln++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		bad := func(why string) error {
			return fmt.Errorf("--hostfile %s line %d %q: %s: write one host per line as \"host slots=N\"", name, ln, strings.TrimSpace(line), why)
		}
		h := Host{Name: fields[0], Slots: 1}
		if err := checkHostName(h.Name); err != nil {
			return nil, bad(err.Error())
		}
		for _, f := range fields[1:] {
			k, v, ok := strings.Cut(f, "=")
			if !ok || (k != "slots" && k != "max_slots") {
				return nil, bad(fmt.Sprintf("unknown field %q", f))
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return nil, bad(fmt.Sprintf("%s=%q is not a positive integer", k, v))
			}
			if k == "slots" {
				h.Slots = n
			}
		}
		hosts = append(hosts, h)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--hostfile %s: %w", name, err)
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("--hostfile %s lists no hosts: write one host per line as \"host slots=N\"", name)
	}
	return mergeHosts(hosts), nil
}

func checkHostName(name string) error {
	if name == "" {
		return fmt.Errorf("empty host name")
	}
	if strings.HasPrefix(name, "-") {
		return fmt.Errorf("host %q starts with '-'", name)
	}
	if strings.ContainsAny(name, " \t'\"\\$`;&|<>()*?!{}") {
		return fmt.Errorf("host %q has characters a host name cannot have", name)
	}
	return nil
}

// mergeHosts adds up the slots of a host listed twice, keeping first order.
func mergeHosts(hosts []Host) []Host {
	var out []Host
	idx := map[string]int{}
	for _, h := range hosts {
		if i, ok := idx[h.Name]; ok {
			out[i].Slots += h.Slots
			continue
		}
		idx[h.Name] = len(out)
		out = append(out, h)
	}
	return out
}

// TotalSlots adds up the slots of hosts.
func TotalSlots(hosts []Host) int {
	n := 0
	for _, h := range hosts {
		n += h.Slots
	}
	return n
}

// IsLocalHost says whether name is the launching host: localhost, a loopback
// address, this host's name, or an address of one of its interfaces. Ranks
// there run without ssh.
func IsLocalHost(name string) bool {
	switch name {
	case "localhost", "localhost.localdomain", "127.0.0.1", "::1":
		return true
	}
	if hn, err := os.Hostname(); err == nil {
		short, _, _ := strings.Cut(hn, ".")
		if name == hn || name == short {
			return true
		}
	}
	ip := net.ParseIP(name)
	if ip == nil {
		return false
	}
	if ip.IsLoopback() {
		return true
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}

// placement says where each rank runs: ranks fill the hosts in order.
type placement struct {
	host      []int // rank -> index in hosts
	localRank []int
	localSize []int // per host
}

func place(hosts []Host, np int) (placement, error) {
	if TotalSlots(hosts) < np {
		return placement{}, fmt.Errorf("-np %d needs %d slots but the hosts have %d", np, np, TotalSlots(hosts))
	}
	p := placement{host: make([]int, np), localRank: make([]int, np), localSize: make([]int, len(hosts))}
	h := 0
	for r := range np {
		for p.localSize[h] == hosts[h].Slots {
			h++
		}
		p.host[r], p.localRank[r] = h, p.localSize[h]
		p.localSize[h]++
	}
	return p, nil
}
