// Reaching remote hosts over ssh: its arguments, the reachability check,
// the address the rendezvous listens on, and the wrapper that runs a rank
// there.

package launcher

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorun/gorun/p2p"
)

// SSH says how gorun reaches remote hosts. It runs the system ssh client, so
// the user's ~/.ssh/config (aliases, users, jump hosts, keys) applies.
type SSH struct {
	Command        string        // "" = "ssh"
	Port           int           // -p; 0 = ssh's default (or ~/.ssh/config)
	IdentityFile   string        // -i; "" = ssh's default
	ConnectTimeout time.Duration // -o ConnectTimeout; 0 = 10 s
	Options        []string      // more ssh arguments, e.g. from GORUN_SSH_OPTS

	// Srun, if set, reaches the remote hosts with srun inside a Slurm
	// allocation instead of ssh; of the fields above, only ConnectTimeout
	// is used: it bounds the wait for the reachability check's job step.
	Srun *Srun
}

// checkArgs are args for the reachability check (under srun, they differ).
func (s SSH) checkArgs(host string) []string {
	if s.Srun != nil {
		return s.Srun.checkArgs(host, cmpDur(s.ConnectTimeout, 10*time.Second))
	}
	return s.args(host)
}

// via names how remote hosts are reached, for messages.
func (s SSH) via() string {
	if s.Srun != nil {
		return "srun"
	}
	return "ssh"
}

// args are the arguments that run a shell command line, given as one more
// argument, on host.
func (s SSH) args(host string) []string {
	if s.Srun != nil {
		return s.Srun.args(host)
	}
	return append(s.options(), "--", host)
}

// sessionArgs are args for a rank's session on host, which gives up on a
// host that answers nothing for about silence (twice the rendezvous'
// heartbeat bound): ssh's keepalives, after the user's own options, which
// win (ssh takes the first value it is given). Without them a session to
// a host cut off by the network waits for TCP to give up (minutes), and
// with it gorun. ssh then exits with status 255; the rank there, cut off
// from the rendezvous too, stops by itself. (srun has its own bounds.)
func (s SSH) sessionArgs(host string, silence time.Duration) []string {
	if s.Srun != nil {
		return s.Srun.args(host)
	}
	return append(append(s.options(), keepAlive(silence)...), "--", host)
}

// keepAlive are the ssh options that end a session whose host answered
// nothing for about silence, at least 2 s: once the session is quiet, ssh
// asks the host for an answer every interval, and gives up when count
// requests in a row went unanswered, (count+1) intervals after the host's
// last word. Four intervals or so make the bound without a request a
// second on a long one.
func keepAlive(silence time.Duration) []string {
	secs := max(2, int((silence+time.Second-1)/time.Second))
	interval := (secs + 3) / 4
	count := max(1, secs/interval-1)
	return []string{"-o", "ServerAliveInterval=" + strconv.Itoa(interval), "-o", "ServerAliveCountMax=" + strconv.Itoa(count)}
}

// options are ssh's options before the host: gorun's own, then the user's.
func (s SSH) options() []string {
	a := []string{"-T", "-o", "BatchMode=yes",
		"-o", "ConnectTimeout=" + strconv.Itoa(max(1, int((cmpDur(s.ConnectTimeout, 10*time.Second)+time.Second-1)/time.Second)))}
	if s.Port > 0 {
		a = append(a, "-p", strconv.Itoa(s.Port))
	}
	if s.IdentityFile != "" {
		a = append(a, "-i", s.IdentityFile)
	}
	return append(a, s.Options...)
}

func (s SSH) command() string {
	if s.Srun != nil {
		return s.Srun.command()
	}
	if s.Command == "" {
		return "ssh"
	}
	return s.Command
}

func cmpDur(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// HostError says which hosts could not be reached before the job started.
type HostError struct {
	Hosts  []string
	Errors []string // ssh's (or srun's) own words, per host
	Via    string   // "ssh" or "srun"; "" = "ssh"
}

func (e *HostError) Error() string {
	var b strings.Builder
	for i, h := range e.Hosts {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "cannot reach host %s over %s: %s", h, cmp.Or(e.Via, "ssh"), e.Errors[i])
	}
	b.WriteString(" (nothing was started)")
	return b.String()
}

// sshInfo is what the reachability check learns about a remote host: the
// addresses of the ssh connection as the remote side sees them (under srun,
// of srun's host and the remote host's address towards it).
type sshInfo struct {
	clientIP, serverIP string
	via                string // "ssh" or "srun"
}

// checkHosts runs "ssh host" (or srun, see Srun) on every remote host at
// once and returns what each one says about the connection, or a *HostError
// naming every host that could not be reached.
func checkHosts(ctx context.Context, s SSH, hosts []string) (map[string]sshInfo, error) {
	type result struct {
		info sshInfo
		err  string
	}
	res := make([]result, len(hosts))
	var wg sync.WaitGroup
	for i, h := range hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.CommandContext(ctx, s.command(), append(s.checkArgs(h), `echo "gorun-check $SSH_CONNECTION"`)...)
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			err := cmd.Run()
			for _, l := range strings.Split(out.String(), "\n") {
				if f := strings.Fields(l); len(f) == 5 && f[0] == "gorun-check" {
					res[i].info = sshInfo{clientIP: f[1], serverIP: f[3], via: s.via()}
				}
			}
			if err != nil || res[i].info.serverIP == "" {
				msg := lastLine(errb.String())
				if msg == "" && err != nil {
					msg = err.Error()
				} else if msg == "" {
					msg = "the remote shell did not report SSH_CONNECTION"
				}
				res[i].err = msg
			}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	infos := map[string]sshInfo{}
	he := HostError{Via: s.via()}
	for i, h := range hosts {
		if res[i].err != "" {
			he.Hosts, he.Errors = append(he.Hosts, h), append(he.Errors, res[i].err)
			continue
		}
		infos[h] = res[i].info
	}
	if len(he.Hosts) > 0 {
		return nil, &he
	}
	return infos, nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" {
			return l
		}
	}
	return ""
}

// interfaceIP resolves --network-interface: an interface name (its first
// IPv4 address, else its first global address) or a CIDR that one of this
// host's addresses lies in.
func interfaceIP(spec string) (string, error) {
	if _, cidr, err := net.ParseCIDR(spec); err == nil {
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			return "", err
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && cidr.Contains(n.IP) {
				return n.IP.String(), nil
			}
		}
		return "", fmt.Errorf("--network-interface %s: no address of this host is in that network; pass an interface name (see `ip addr`) or a CIDR such as 10.0.0.0/24", spec)
	}
	ifc, err := net.InterfaceByName(spec)
	if err != nil {
		var names []string
		ifs, _ := net.Interfaces()
		for _, i := range ifs {
			names = append(names, i.Name)
		}
		return "", fmt.Errorf("--network-interface %s: no such interface (this host has %s); pass an interface name or a CIDR such as 10.0.0.0/24", spec, strings.Join(names, ", "))
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return "", err
	}
	var v6 string
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		if n.IP.To4() != nil {
			return n.IP.String(), nil
		}
		if v6 == "" && n.IP.IsGlobalUnicast() {
			v6 = n.IP.String()
		}
	}
	if v6 != "" {
		return v6, nil
	}
	return "", fmt.Errorf("--network-interface %s: the interface has no usable address", spec)
}

// chooseLauncherIP picks the address the rendezvous (and the ranks on this
// host) listen on, so that remote hosts can reach it: the address the first
// remote host saw our ssh connection come from, if it is ours; else the
// source address the kernel routes to that host with.
func chooseLauncherIP(infos map[string]sshInfo, order []string) (string, string, error) {
	local := map[string]bool{}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			local[n.IP.String()] = true
		}
	}
	for _, h := range order {
		in, ok := infos[h]
		if !ok {
			continue
		}
		if ip := net.ParseIP(in.clientIP); ip != nil && local[ip.String()] && !ip.IsLoopback() {
			return ip.String(), fmt.Sprintf("the address host %s sees our %s connection come from", h, cmp.Or(in.via, "ssh")), nil
		}
		if ip, err := p2p.RouteSource(in.serverIP); err == nil {
			return ip, fmt.Sprintf("the source address this host routes to %s (%s) with", h, in.serverIP), nil
		}
	}
	return "", "", fmt.Errorf("cannot tell which address of this host the remote hosts reach it at; pass --network-interface NAME or CIDR")
}

// wrapper is the POSIX sh program that runs a rank on a remote host. Its
// arguments: grace (tenths of a second), the rendezvous IP, the working
// directory, then the program and its arguments. It reads the rank's
// environment from stdin as NAME=VALUE lines up to an empty line (so the
// job key never appears on a command line), finds the address this host
// reaches the rendezvous from (GORUN_LISTEN_IP), starts the program in a
// session of its own, and then watches stdin: a "stop" line, or stdin's end
// (gorun stopped, died, or the ssh connection broke), sends SIGTERM to the
// program's process group, and SIGCONT (a stopped process keeps SIGTERM
// pending until it runs again), and SIGKILL after the grace period. The
// wrapper exits with the program's status.
const wrapper = `g=$1; rip=$2; d=$3; shift 3
while IFS= read -r l; do
  [ -z "$l" ] && break
  export "$l" || exit 126
done
if [ -z "${GORUN_LISTEN_IP:-}" ]; then
  GORUN_LISTEN_IP=$(ip -o route get "$rip" 2>/dev/null | sed -n 's/.* src \([^ ]*\).*/\1/p')
  if [ -z "$GORUN_LISTEN_IP" ]; then set -- $SSH_CONNECTION "$@"; GORUN_LISTEN_IP=$3; shift 4; fi
  export GORUN_LISTEN_IP
fi
cd "$d" || exit 127
exec 3<&0 4>&2 2>/dev/null
setsid "$@" </dev/null 2>&4 3<&- 4>&- &
p=$!
( read -r x <&3; kill -TERM -$p 2>/dev/null; kill -CONT -$p 2>/dev/null; i=0
  while [ $i -lt $g ] && kill -0 -$p 2>/dev/null; do sleep 0.1; i=$((i+1)); done
  kill -KILL -$p 2>/dev/null ) &
w=$!
exec 3<&- 4>&-
wait $p; s=$?
kill -KILL -$p 2>/dev/null
kill $w 2>/dev/null
exit $s
`

// remoteCommand is the command line ssh runs on a remote host: sh with the
// wrapper, everything quoted for the remote login shell. It holds no secret.
func remoteCommand(grace time.Duration, rdvIP, dir, program string, args []string) string {
	parts := []string{"exec", "sh", "-c", shquote(wrapper), "gorun-rank",
		strconv.Itoa(max(1, int(grace/(100*time.Millisecond)))), shquote(rdvIP), shquote(dir), shquote(program)}
	for _, a := range args {
		parts = append(parts, shquote(a))
	}
	return strings.Join(parts, " ")
}

func shquote(s string) string {
	if s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=@%+,", r))
	}) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// envBlock is what gorun writes to a remote rank's stdin: its environment,
// one NAME=VALUE per line, then an empty line.
func envBlock(env []string) ([]byte, error) {
	var b bytes.Buffer
	seen := map[string]int{}
	var lines []string
	for _, e := range env {
		name, _, _ := strings.Cut(e, "=")
		if !validEnvName(name) {
			return nil, fmt.Errorf("environment variable %q: the name must be letters, digits and _", e)
		}
		if strings.ContainsAny(e, "\n\x00") {
			return nil, fmt.Errorf("environment variable %s: a value with a newline cannot be sent to remote hosts", name)
		}
		if i, ok := seen[name]; ok {
			lines[i] = e // the last one wins, as in exec
			continue
		}
		seen[name] = len(lines)
		lines = append(lines, e)
	}
	for _, l := range slices.Clip(lines) {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	if b.Len() > 60<<10 {
		return nil, fmt.Errorf("the environment for remote ranks is %d bytes; at most 60 KiB can be sent", b.Len())
	}
	return b.Bytes(), nil
}

func validEnvName(n string) bool {
	if n == "" || n[0] >= '0' && n[0] <= '9' {
		return false
	}
	for _, r := range n {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}
