// Package doctor is what `gorun doctor` runs: it checks, on every host of a
// job, what a job needs from the hosts before one is started, and says what
// to fix. An agent (gorun itself, hidden command doctor-agent) runs on each
// host, started directly on this host and over ssh on the others, as the
// ranks of a job are. Each agent reports its host's facts (the program at
// its path, the working directory, free space where checkpoints go, the
// open-file limit, its clock), listens on two ephemeral TCP ports (one in
// each half of the range) on the address a rank of that host would listen
// on, and dials every other host's agent: real connections on the kind of
// ports ranks and the rendezvous use, then a short ping-pong (latency) and
// a short transfer (bandwidth). Evaluate turns what the agents found into one table with a
// verdict and a fix per row.
package doctor

import (
	"cmp"
	"fmt"
	"io"
	"net"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Status is a row's verdict. Only FAIL makes gorun doctor exit non-zero.
type Status string

const (
	OK   Status = "ok"
	Warn Status = "WARN"
	Fail Status = "FAIL"
)

// Row is one line of the table: where (a host, or "a -> b" for a pair),
// which check, its verdict, what was found, and for a failure what to do.
type Row struct {
	Where  string
	Check  string
	Status Status
	Result string
	Fix    string
}

// Facts is what an agent reports about its host.
type Facts struct {
	Hostname    string `json:"hostname"`
	OS          string `json:"os"`
	Arch        string `json:"arch"`
	AgentSHA256 string `json:"agent_sha256"` // of the agent's own executable
	Version     string `json:"version"`      // gorun's version, see Version

	SSHClientIP string `json:"ssh_client_ip,omitempty"` // this host's view of the launcher (from $SSH_CONNECTION)
	SSHServerIP string `json:"ssh_server_ip,omitempty"`

	WorkDir    string `json:"workdir"`
	WorkDirErr string `json:"workdir_err,omitempty"`

	Program *ProgramFacts `json:"program,omitempty"`

	// Checkpoint location: the directory checked (with {host} expanded),
	// the free bytes there, and why it cannot be written, if it cannot.
	CheckpointDir string `json:"checkpoint_dir"`
	// CheckpointParent is set when CheckpointDir does not exist yet: its
	// nearest existing parent, where it would be created.
	CheckpointParent string `json:"checkpoint_parent,omitempty"`
	CheckpointFree   uint64 `json:"checkpoint_free"`
	CheckpointErr    string `json:"checkpoint_err,omitempty"`
	CheckpointS3     bool   `json:"checkpoint_s3,omitempty"`

	NoFileSoft uint64 `json:"nofile_soft"`
	NoFileHard uint64 `json:"nofile_hard"`
	// PortRange is net.ipv4.ip_local_port_range: where ranks and the
	// rendezvous (which listen on port 0) get their ports.
	PortRange string `json:"port_range"`
}

// ProgramFacts is what an agent found at the job's PROGRAM path.
type ProgramFacts struct {
	Path     string `json:"path"`     // as given
	Resolved string `json:"resolved"` // after the working directory and $PATH
	Err      string `json:"err,omitempty"`
	Size     int64  `json:"size"`
	SHA256   string `json:"sha256"`
	// Gorun is the version of github.com/gorun/gorun that PROGRAM links,
	// "" when it is not a Go program or does not link gorun.
	Gorun string `json:"gorun,omitempty"`
}

// HostResult is everything learnt about one host.
type HostResult struct {
	Name     string // as in -H or the hostfile
	Local    bool   // this host: no ssh
	SSHErr   string // ssh could not reach it
	SSHTime  time.Duration
	AgentErr string // the agent did not start or did not answer
	// AgentDirErr: the agent directory there is not the user's own, or
	// others may write it, so no agent was run from it.
	AgentDirErr string
	Facts       *Facts
	// Clock: the agent's clock minus this host's, and the uncertainty
	// (half the round trip of the best sample).
	Skew, SkewErr time.Duration
	ClockErr      string
	Addrs         []string // where its agent listened: a port in each half of the range
	ListenErr     string
}

// PairResult is one host's dial and probe of another's agent.
type PairResult struct {
	From  string     `json:"from"`
	To    string     `json:"to"`
	Ports []PortDial `json:"ports"` // a dial to each of To's agent's ports
	// Err is the latency or bandwidth probe failing after every port
	// opened.
	Err       string        `json:"err,omitempty"`
	RTT       time.Duration `json:"rtt"`       // median round trip of small messages
	Bandwidth float64       `json:"bandwidth"` // bytes per second, one stream
	Bytes     int64         `json:"bytes"`
}

// PortDial is a dial to one port of a peer's agent.
type PortDial struct {
	Addr string `json:"addr"`
	Err  string `json:"err,omitempty"` // "" = the connection was made
}

// Linux's default net.ipv4.ip_local_port_range, where a host's is unknown.
const linuxPortLo, linuxPortHi = 32768, 60999

// Dialed says whether every port of the peer took a connection.
func (p PairResult) Dialed() bool {
	return len(p.Ports) > 0 && !slices.ContainsFunc(p.Ports, func(d PortDial) bool { return d.Err != "" })
}

// Expect is what the hosts are checked against.
type Expect struct {
	Program      string // "" = not checked
	Version      string // this gorun's
	AgentSHA256  string // this gorun's executable
	Slots        int    // ranks the hosts take in all (sizes the open-file need)
	MinFree      uint64 // bytes at the checkpoint location
	MaxSkew      time.Duration
	SSHFlagsHelp string // how to pass ssh settings, for the fixes
	Via          string // how remote hosts are reached: "ssh" (or ""), "srun"
}

// NoFileNeed is the hard open-file limit a rank should have in a job of
// slots ranks: Go raises a process's soft limit to its hard one at start,
// so the hard limit is what a rank gets. A rank keeps a few descriptors
// per peer (its connections and streams) on top of a base for the runtime,
// its files and checkpoints.
func NoFileNeed(slots int) uint64 { return 1024 + 8*uint64(max(slots, 1)) }

// Evaluate turns what was learnt into the table's rows: the checks of every
// host in the order given, then every pair.
func Evaluate(hosts []HostResult, pairs []PairResult, want Expect) []Row {
	var rows []Row
	add := func(where, check string, st Status, result, fix string) {
		rows = append(rows, Row{where, check, st, result, fix})
	}
	refSHA, refHost := majoritySHA(hosts)
	via := cmp.Or(want.Via, "ssh")
	ipOf := map[string]string{}
	portsOf := map[string]string{}
	for _, h := range hosts {
		if len(h.Addrs) > 0 {
			if ip, _, err := net.SplitHostPort(h.Addrs[0]); err == nil {
				ipOf[h.Name] = ip
			}
		}
		if h.Facts != nil {
			portsOf[h.Name] = h.Facts.PortRange
		}
	}
	for _, h := range hosts {
		w := h.Name
		switch {
		case h.Local:
			add(w, via, OK, "this host: runs without "+via, "")
		case h.SSHErr != "" && via == "srun":
			add(w, via, Fail, h.SSHErr,
				fmt.Sprintf("srun could not start a job step on %s: check that the node is in the allocation and up (scontrol show node %s), or pass -H to reach the hosts over ssh", h.Name, h.Name))
			continue
		case h.SSHErr != "":
			add(w, via, Fail, h.SSHErr,
				fmt.Sprintf("make `ssh %s true` work without a password prompt (BatchMode: a key or an agent)%s", h.Name, want.SSHFlagsHelp))
			continue
		default:
			add(w, via, OK, "reached in "+round(h.SSHTime).String(), "")
		}
		if h.AgentDirErr != "" {
			add(w, "gorun", Fail, "the agent directory is unsafe, no agent was run from it: "+h.AgentDirErr,
				fmt.Sprintf("another user could put a program there that gorun doctor would run as you: on %s, make it yours and private (chown $USER DIR; chmod 700 DIR), or pass --agent-dir a directory only you can write (default ~/.cache/gorun/doctor)", h.Name))
			continue
		}
		if h.AgentErr != "" || h.Facts == nil {
			add(w, "gorun", Fail, "the doctor agent failed: "+cmp.Or(h.AgentErr, "no report"),
				agentFix(h))
			continue
		}
		f := h.Facts
		if want.AgentSHA256 != "" && f.AgentSHA256 != want.AgentSHA256 {
			add(w, "gorun", Fail, fmt.Sprintf("the agent there is not this gorun (sha256 %s, want %s)", short(f.AgentSHA256), short(want.AgentSHA256)),
				"remove the agent cache on "+h.Name+" (rm ~/.cache/gorun/doctor/gorun-doctor-agent-*, or in the --agent-dir given) and run gorun doctor again")
		} else {
			add(w, "gorun", OK, fmt.Sprintf("agent %s on %s/%s (%s)", f.Version, f.OS, f.Arch, f.Hostname), "")
		}
		if f.WorkDirErr != "" {
			add(w, "workdir", Fail, f.WorkDirErr,
				fmt.Sprintf("create %s on %s, or run gorun from a directory every host has: remote ranks start in gorun's working directory", f.WorkDir, h.Name))
		} else {
			add(w, "workdir", OK, f.WorkDir, "")
		}
		if want.Program != "" {
			rows = append(rows, programRows(h, want, refSHA, refHost)...)
		}
		switch {
		case h.ClockErr != "":
			add(w, "clock", Fail, "could not read its clock: "+h.ClockErr, agentFix(h))
		case abs(h.Skew)-h.SkewErr > want.MaxSkew:
			add(w, "clock", Fail, fmt.Sprintf("%s off this host's clock (±%s), more than %s", signed(h.Skew), round(h.SkewErr), want.MaxSkew),
				fmt.Sprintf("synchronise the clocks: run an NTP client on %s and on this host (timedatectl set-ntp true, or chronyd)", h.Name))
		default:
			add(w, "clock", OK, fmt.Sprintf("%s off this host's (±%s)", signed(h.Skew), round(h.SkewErr)), "")
		}
		where := f.CheckpointDir
		if f.CheckpointParent != "" {
			where += " (not yet created; " + f.CheckpointParent + " exists)"
		}
		switch {
		case f.CheckpointS3:
			add(w, "checkpoint space", OK, f.CheckpointDir+": an s3:// location, not a disk of this host", "")
		case f.CheckpointErr != "":
			add(w, "checkpoint space", Fail, where+": "+f.CheckpointErr,
				fmt.Sprintf("create %s on %s, writable by the ssh user, or pass another --checkpoint-dir", f.CheckpointDir, h.Name))
		case f.CheckpointFree < want.MinFree:
			add(w, "checkpoint space", Fail, fmt.Sprintf("%s: %s free, below --min-free %s", where, bytesStr(float64(f.CheckpointFree)), bytesStr(float64(want.MinFree))),
				fmt.Sprintf("free space on %s's file system for %s, or pass a --checkpoint-dir on a larger disk", h.Name, f.CheckpointDir))
		default:
			add(w, "checkpoint space", OK, fmt.Sprintf("%s: %s free", where, bytesStr(float64(f.CheckpointFree))), "")
		}
		if need := NoFileNeed(want.Slots); f.NoFileHard < need {
			add(w, "open files", Fail, fmt.Sprintf("hard limit %d (soft %d), below the %d a job of %d ranks needs", f.NoFileHard, f.NoFileSoft, need, want.Slots),
				fmt.Sprintf("raise the hard open-file limit on %s to %d or more: \"* hard nofile 65536\" in /etc/security/limits.conf (with UsePAM yes in sshd_config), or LimitNOFILE= for a systemd sshd; Go ranks raise their soft limit to the hard one", h.Name, need))
		} else {
			add(w, "open files", OK, fmt.Sprintf("hard limit %d, soft %d (Go ranks raise theirs to the hard one)", f.NoFileHard, f.NoFileSoft), "")
		}
		if h.ListenErr != "" {
			add(w, "listen", Fail, h.ListenErr,
				fmt.Sprintf("check the addresses of %s (ip addr): a rank there must listen on the address it reaches this host from", h.Name))
		}
	}
	sorted := slices.Clone(pairs)
	order := map[string]int{}
	for i, h := range hosts {
		order[h.Name] = i
	}
	sort.SliceStable(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if order[a.From] != order[b.From] {
			return order[a.From] < order[b.From]
		}
		return order[a.To] < order[b.To]
	})
	median := medianBandwidth(sorted)
	for _, p := range sorted {
		w := p.From + " -> " + p.To
		ports := cmp.Or(portsOf[p.To], fmt.Sprintf("%d %d", linuxPortLo, linuxPortHi))
		lo, hi, _ := strings.Cut(strings.Join(strings.Fields(ports), " "), " ")
		var closed, open []string
		why := ""
		for _, d := range p.Ports {
			if d.Err != "" {
				closed = append(closed, portOf(d.Addr))
				why = cmp.Or(why, d.Err)
			} else {
				open = append(open, portOf(d.Addr))
			}
		}
		switch {
		case len(p.Ports) == 0:
			add(w, "tcp", Fail, "no result: "+cmp.Or(p.Err, "the agent did not report this pair"),
				"give gorun doctor a longer --timeout (its default grows with the hosts), or see with --verbose which step is slow")
		case !p.Dialed():
			from := p.From
			if ip := ipOf[p.From]; ip != "" && ip != p.From {
				from += " (" + ip + ")"
			}
			result := fmt.Sprintf("cannot open a connection to %s's %s: %s", p.To, portsStr(closed), cmp.Or(why, p.Err, "no port to dial"))
			if len(open) > 0 {
				result += fmt.Sprintf(" (its %s opened: only part of the ephemeral range is allowed)", portsStr(open))
			}
			add(w, "tcp", Fail, result,
				fmt.Sprintf("allow TCP from %s into %s on ports %s-%s: ranks and the rendezvous listen on ephemeral ports (its net.ipv4.ip_local_port_range), anywhere in it; e.g. on %s: nft insert rule inet filter input ip saddr %s tcp dport %s-%s accept, or open the security group", from, p.To, lo, hi, p.To, cmp.Or(ipOf[p.From], p.From), lo, hi))
		case p.Err != "":
			add(w, "tcp", Fail, "connected, then the probe failed: "+p.Err,
				fmt.Sprintf("something between %s and %s cuts connections (a firewall with connection tracking, an MTU mismatch: ping -M do -s 1472 %s)", p.From, p.To, ipOf[p.To]))
		case median > 0 && p.Bandwidth < median/10:
			add(w, "tcp", Warn, fmt.Sprintf("rtt %s, %s/s, a tenth or less of the median link (%s/s)", round(p.RTT), bytesStr(p.Bandwidth), bytesStr(median)),
				fmt.Sprintf("this link slows every collective: check the route and interface from %s to %s (ip route get %s, ethtool)", p.From, p.To, ipOf[p.To]))
		default:
			add(w, "tcp", OK, fmt.Sprintf("rtt %s, %s/s; %s open", round(p.RTT), bytesStr(p.Bandwidth), portsStr(open)), "")
		}
	}
	return rows
}

// programRows checks PROGRAM on one host: there, runnable, the same build
// as on the other hosts, and linking the same gorun as this gorun.
func programRows(h HostResult, want Expect, refSHA, refHost string) []Row {
	p := h.Facts.Program
	w := h.Name
	if p == nil {
		return []Row{{w, "program", Fail, "the agent did not check " + want.Program, agentFix(h)}}
	}
	if p.Err != "" {
		return []Row{{w, "program", Fail, p.Err,
			fmt.Sprintf("install %s on %s (copy it there, or use a file system every host shares): like horovodrun, gorun starts PROGRAM at the same path on every host", cmp.Or(p.Resolved, p.Path), h.Name)}}
	}
	rows := []Row{}
	if refSHA != "" && p.SHA256 != refSHA {
		rows = append(rows, Row{w, "program", Fail,
			fmt.Sprintf("%s differs from %s's (sha256 %s, %s's %s)", p.Resolved, refHost, short(p.SHA256), refHost, short(refSHA)),
			fmt.Sprintf("copy the same build of %s to every host (e.g. rsync it from %s)", p.Path, refHost)})
	} else {
		rows = append(rows, Row{w, "program", OK, fmt.Sprintf("%s: %s, sha256 %s", p.Resolved, bytesStr(float64(p.Size)), short(p.SHA256)), ""})
	}
	switch {
	case p.Gorun == "":
		rows = append(rows, Row{w, "gorun version", OK, "PROGRAM does not link github.com/gorun/gorun (a script, or not a Go program): not compared", ""})
	case p.Gorun != want.Version:
		rows = append(rows, Row{w, "gorun version", Warn, fmt.Sprintf("PROGRAM links gorun %s, this gorun is %s", p.Gorun, want.Version),
			"build PROGRAM and gorun from the same gorun version: the ranks talk to gorun's rendezvous"})
	default:
		rows = append(rows, Row{w, "gorun version", OK, "PROGRAM links gorun " + p.Gorun + ", as this gorun", ""})
	}
	return rows
}

func agentFix(h HostResult) string {
	if h.Local {
		return "run gorun doctor --verbose to see the agent's error"
	}
	return fmt.Sprintf("%s must run this gorun's linux binary: the same OS and architecture as this host, sh, and a writable, executable --agent-dir (default ~/.cache/gorun/doctor)", h.Name)
}

// majoritySHA is the PROGRAM build most hosts have, and the first host
// that has it. On a tie, the build of the first of the tied hosts in the
// hosts' order wins (the first host's, if it is among them): the order of
// -H, not of the count, decides.
func majoritySHA(hosts []HostResult) (string, string) {
	shaOf := func(h HostResult) string {
		if h.Facts == nil || h.Facts.Program == nil {
			return ""
		}
		return h.Facts.Program.SHA256
	}
	count := map[string]int{}
	most := 0
	for _, h := range hosts {
		if s := shaOf(h); s != "" {
			count[s]++
			most = max(most, count[s])
		}
	}
	for _, h := range hosts {
		if s := shaOf(h); s != "" && count[s] == most {
			return s, h.Name
		}
	}
	return "", ""
}

func medianBandwidth(pairs []PairResult) float64 {
	var bw []float64
	for _, p := range pairs {
		if p.Dialed() && p.Err == "" && p.Bandwidth > 0 {
			bw = append(bw, p.Bandwidth)
		}
	}
	if len(bw) < 3 { // too few links to call one slow
		return 0
	}
	slices.Sort(bw)
	return bw[len(bw)/2]
}

// Failed counts the rows that failed.
func Failed(rows []Row) int {
	n := 0
	for _, r := range rows {
		if r.Status == Fail {
			n++
		}
	}
	return n
}

// WriteTable prints rows as one aligned table. A row's fix goes on a line
// of its own under its result ("fix: ..."): results and fixes are the long
// cells, and as the last cell of their lines neither widens the others,
// so the table stays readable in a terminal.
func WriteTable(w io.Writer, rows []Row) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tCHECK\tSTATUS\tRESULT")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Where, r.Check, r.Status, oneLine(r.Result))
		if r.Fix != "" {
			fmt.Fprintf(tw, "\t\t\tfix: %s\n", oneLine(r.Fix))
		}
	}
	return tw.Flush()
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\t", " ")), " ")
}

func portOf(addr string) string {
	if _, port, err := net.SplitHostPort(addr); err == nil {
		return port
	}
	return "?"
}

// portsStr writes "port 33012" or "ports 33012 and 58001".
func portsStr(ports []string) string {
	switch len(ports) {
	case 0:
		return "ports"
	case 1:
		return "port " + ports[0]
	}
	return "ports " + strings.Join(ports[:len(ports)-1], ", ") + " and " + ports[len(ports)-1]
}

func short(sha string) string {
	if len(sha) > 12 {
		return sha[:12]
	}
	return cmp.Or(sha, "?")
}

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

func signed(d time.Duration) string {
	if d < 0 {
		return "-" + round(-d).String()
	}
	return "+" + round(d).String()
}

// round keeps three significant digits or so: 1.23ms, 85µs, 2.1s.
func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	case d >= time.Microsecond:
		return d.Round(time.Microsecond)
	}
	return d
}

// bytesStr writes a byte count (or rate) with a binary unit: 1.5 GiB.
func bytesStr(b float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for b >= 1024 && i < len(units)-1 {
		b /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f B", b)
	}
	return fmt.Sprintf("%.1f %s", b, units[i])
}
