package doctor

import (
	"bufio"
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"debug/buildinfo"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mathrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/p2p"
)

// Module is gorun's module path, looked up in PROGRAM's build information.
const Module = "github.com/gorun/gorun"

// Version is this gorun's version: its module version when it was built
// from a tagged or stamped module, else the VCS revision it was built from
// ("devel 0123456789ab+dirty"), else "(devel)".
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	return moduleVersion(bi)
}

func moduleVersion(bi *debug.BuildInfo) string {
	if bi.Main.Path == Module {
		return mainVersion(bi)
	}
	for _, d := range bi.Deps {
		if d.Path != Module {
			continue
		}
		if d.Replace != nil {
			if d.Replace.Version != "" {
				return d.Replace.Version
			}
			return "(replaced by " + d.Replace.Path + ")"
		}
		return d.Version
	}
	return ""
}

func mainVersion(bi *debug.BuildInfo) string {
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if rev == "" {
		return "(devel)"
	}
	return "devel " + short(rev) + dirty
}

// AgentOptions is what the launcher tells an agent on its command line
// (nothing secret: the probe token comes on stdin).
type AgentOptions struct {
	Host          string // the host's name as -H gives it, for "{host}"
	Program       string // "" = not checked
	WorkDir       string
	CheckpointDir string        // "" = the working directory
	Lifetime      time.Duration // the agent exits after this, whatever happens
}

// message is one JSON line between the launcher and an agent, either way.
type message struct {
	// launcher -> agent
	Token   string        `json:"token,omitempty"`
	Op      string        `json:"op,omitempty"` // time, listen, probe
	IP      string        `json:"ip,omitempty"`
	RouteTo string        `json:"route_to,omitempty"`
	Peers   []Peer        `json:"peers,omitempty"`
	Dial    time.Duration `json:"dial_timeout,omitempty"`
	Bytes   int64         `json:"probe_bytes,omitempty"`
	For     time.Duration `json:"probe_time,omitempty"`

	// agent -> launcher
	Facts     *Facts      `json:"facts,omitempty"`
	Time      int64       `json:"time,omitempty"`
	Listening []string    `json:"listening,omitempty"`
	Pair      *PairResult `json:"pair,omitempty"`
	Done      bool        `json:"done,omitempty"`
	Error     string      `json:"error,omitempty"`
}

// Peer is another host's agent, for a probe: its ports, one in each half
// of its host's ephemeral port range (see listen).
type Peer struct {
	Name  string   `json:"name"`
	Addrs []string `json:"addrs"`
}

// RunAgent is the doctor agent: it reads the launcher's token and then its
// requests from in, one JSON object per line, and answers on out. It ends
// when in ends (the launcher is done, or gone: its ssh session closed) or
// after o.Lifetime.
func RunAgent(ctx context.Context, in io.Reader, out io.Writer, o AgentOptions) error {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(o.Lifetime, 5*time.Minute))
	defer cancel()
	reqs := make(chan message)
	readErr := make(chan error, 1)
	go func() {
		// The end of stdin (the launcher is done, or gone) ends whatever
		// the agent is doing, a probe included.
		defer cancel()
		defer close(reqs)
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			var m message
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				readErr <- fmt.Errorf("doctor agent: bad request %.80q: %v", sc.Text(), err)
				return
			}
			select {
			case reqs <- m:
			case <-ctx.Done():
				return
			}
		}
		readErr <- sc.Err()
	}()
	enc := json.NewEncoder(out)
	var first message
	select {
	case m, ok := <-reqs:
		if !ok {
			return nil // the launcher went away before it began
		}
		first = m
	case <-ctx.Done():
		return nil
	}
	if len(first.Token) != 32 {
		return errors.New("doctor agent: the first line must carry the launcher's token")
	}
	token := []byte(first.Token)
	if err := enc.Encode(message{Facts: gatherFacts(ctx, o)}); err != nil {
		return err
	}
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for {
		var m message
		ok := false
		select {
		case m, ok = <-reqs:
		case <-ctx.Done():
		}
		if !ok {
			select {
			case err := <-readErr: // a bad request, or a failed read
				return err
			default: // the end of stdin, or of the agent's lifetime
				return nil
			}
		}
		var reply message
		switch m.Op {
		case "time":
			reply.Time = time.Now().UnixNano()
		case "listen":
			if lns == nil {
				var err error
				if lns, err = listen(m); err != nil {
					reply.Error = err.Error()
					break
				}
				for _, ln := range lns {
					go serve(ctx, ln, token)
				}
			}
			for _, ln := range lns {
				reply.Listening = append(reply.Listening, ln.Addr().String())
			}
		case "probe":
			err := probePeers(ctx, m.Peers, token, m.Dial, m.Bytes, m.For, func(r PairResult) error {
				return enc.Encode(message{Pair: &r})
			})
			if err != nil {
				return err
			}
			reply.Done = true
		default:
			reply.Error = fmt.Sprintf("unknown request %q", m.Op)
		}
		if err := enc.Encode(reply); err != nil {
			return err
		}
	}
}

// listen opens the agent's probe ports where a rank of this host would
// listen: on the address given, or the source address of the route to the
// launcher (what gorun's remote wrapper gives ranks as GORUN_LISTEN_IP),
// else the address the ssh session came in on. Ranks and the rendezvous
// listen on port 0, anywhere in net.ipv4.ip_local_port_range; a firewall
// that allows only part of that range would pass or fail one probe port at
// random, so there are two, a random one in each half of the range.
func listen(m message) ([]net.Listener, error) {
	ip := m.IP
	if ip == "" && m.RouteTo != "" {
		ip, _ = p2p.RouteSource(m.RouteTo)
	}
	if ip == "" {
		if f := strings.Fields(os.Getenv("SSH_CONNECTION")); len(f) == 4 {
			ip = f[2]
		}
	}
	if ip == "" {
		return nil, errors.New("no address to listen on: no route to the launcher and no $SSH_CONNECTION")
	}
	lo, hi := portRange()
	mid := lo + (hi-lo)/2
	var lns []net.Listener
	for _, half := range [][2]int{{lo, mid}, {mid + 1, hi}} {
		ln, err := listenIn(ip, half[0], half[1])
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return nil, err
		}
		lns = append(lns, ln)
	}
	return lns, nil
}

// portRange is net.ipv4.ip_local_port_range, or Linux's default.
func portRange() (lo, hi int) {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			l, err1 := strconv.Atoi(f[0])
			h, err2 := strconv.Atoi(f[1])
			if err1 == nil && err2 == nil && 0 < l && l < h && h <= 65535 {
				return l, h
			}
		}
	}
	return linuxPortLo, linuxPortHi
}

// listenIn listens on a random free port in [lo, hi].
func listenIn(ip string, lo, hi int) (net.Listener, error) {
	var err error
	for range 64 {
		var ln net.Listener
		if ln, err = net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(lo+mathrand.IntN(hi-lo+1)))); err == nil {
			return ln, nil
		}
		if !errors.Is(err, unix.EADDRINUSE) {
			break
		}
	}
	return nil, fmt.Errorf("listen on %s, ports %d-%d: %v", ip, lo, hi, err)
}

// Probe connections start with the 32-character token and one op byte.
const (
	opPing = 'P'
	opBulk = 'B'
)

// serve answers probes: echoes pings, and counts bulk bytes until the
// sender closes its side, then tells it how many arrived.
func serve(ctx context.Context, ln net.Listener, token []byte) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			stop := context.AfterFunc(ctx, func() { c.Close() })
			defer stop()
			c.SetDeadline(time.Now().Add(60 * time.Second))
			head := make([]byte, len(token)+1)
			if _, err := io.ReadFull(c, head); err != nil || subtle.ConstantTimeCompare(head[:len(token)], token) != 1 {
				return // not a probe of this run
			}
			switch head[len(token)] {
			case opPing:
				buf := make([]byte, 8)
				for {
					if _, err := io.ReadFull(c, buf); err != nil {
						return
					}
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			case opBulk:
				n, err := io.Copy(io.Discard, c)
				if err != nil {
					return
				}
				binary.Write(c, binary.BigEndian, n)
			}
		}()
	}
}

// dialParallel is how many probe ports an agent dials at once: a dial
// that a firewall drops costs the whole dial timeout, which one peer after
// another would multiply by the number of hosts.
const dialParallel = 16

// probePeers probes the peers for their PairResults, each given to report:
// first it dials every port of every peer, dialParallel at once; a peer
// with a port that does not open is reported at once. Then it measures the
// others one at a time, in the order given (see Run), so that a bandwidth
// probe has the link mostly to itself.
func probePeers(ctx context.Context, peers []Peer, token []byte, dial time.Duration, maxBytes int64, dur time.Duration, report func(PairResult) error) error {
	dial = cmp.Or(dial, 3*time.Second)
	dials := make([][]PortDial, len(peers))
	sem := make(chan struct{}, dialParallel)
	var wg sync.WaitGroup
	for i, p := range peers {
		dials[i] = make([]PortDial, len(p.Addrs))
		for k, addr := range p.Addrs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				dials[i][k] = PortDial{Addr: addr}
				d := net.Dialer{Timeout: dial}
				c, err := d.DialContext(ctx, "tcp", addr)
				if err != nil {
					dials[i][k].Err = dialErr(err, dial)
					return
				}
				c.Close() // the peer reads no token, and drops it
			}()
		}
	}
	wg.Wait()
	var reachable []int
	for i, p := range peers {
		if (PairResult{Ports: dials[i]}).Dialed() {
			reachable = append(reachable, i)
			continue
		}
		if err := report(PairResult{To: p.Name, Ports: dials[i]}); err != nil {
			return err
		}
	}
	for _, i := range reachable {
		r := probe(ctx, peers[i].Addrs[0], token, dial, maxBytes, dur)
		r.To, r.Ports = peers[i].Name, dials[i]
		if err := report(r); err != nil {
			return err
		}
	}
	return nil
}

// pings is how many round trips the latency probe makes.
const pings = 20

// probe dials addr (bounded by dial), measures the median round trip of
// small messages, then sends up to maxBytes, or for at most dur, and
// times it to the receiver's count. Its result has no Ports: the caller
// dialed them.
func probe(ctx context.Context, addr string, token []byte, dial time.Duration, maxBytes int64, dur time.Duration) PairResult {
	var r PairResult
	dur = cmp.Or(dur, 300*time.Millisecond)
	d := net.Dialer{Timeout: cmp.Or(dial, 3*time.Second)}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		r.Err = "ping: " + dialErr(err, d.Timeout)
		return r
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(append(slices.Clone(token), opPing)); err != nil {
		r.Err = "ping: " + err.Error()
		return r
	}
	rtts := make([]time.Duration, 0, pings)
	buf := make([]byte, 8)
	for i := range pings {
		binary.BigEndian.PutUint64(buf, uint64(i))
		t0 := time.Now()
		if _, err := c.Write(buf); err != nil {
			r.Err = "ping: " + err.Error()
			return r
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			r.Err = "ping: " + err.Error()
			return r
		}
		if binary.BigEndian.Uint64(buf) != uint64(i) {
			r.Err = "ping: the echo does not match what was sent"
			return r
		}
		rtts = append(rtts, time.Since(t0))
	}
	slices.Sort(rtts)
	r.RTT = rtts[len(rtts)/2]
	c.Close()

	b, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		r.Err = "bandwidth: " + dialErr(err, d.Timeout)
		return r
	}
	defer b.Close()
	stopB := context.AfterFunc(ctx, func() { b.Close() })
	defer stopB()
	b.SetDeadline(time.Now().Add(dur + 10*time.Second))
	if _, err := b.Write(append(slices.Clone(token), opBulk)); err != nil {
		r.Err = "bandwidth: " + err.Error()
		return r
	}
	chunk := make([]byte, 256<<10)
	start := time.Now()
	var sent int64
	for sent < cmp.Or(maxBytes, 16<<20) && time.Since(start) < dur {
		n, err := b.Write(chunk)
		sent += int64(n)
		if err != nil {
			r.Err = "bandwidth: " + err.Error()
			return r
		}
	}
	if err := b.(*net.TCPConn).CloseWrite(); err != nil {
		r.Err = "bandwidth: " + err.Error()
		return r
	}
	var got int64
	if err := binary.Read(b, binary.BigEndian, &got); err != nil {
		r.Err = "bandwidth: no count from the receiver: " + err.Error()
		return r
	}
	took := time.Since(start)
	if got != sent {
		r.Err = fmt.Sprintf("bandwidth: sent %d bytes, %d arrived", sent, got)
		return r
	}
	r.Bytes = got
	r.Bandwidth = float64(got) / took.Seconds()
	return r
}

func dialErr(err error, timeout time.Duration) string {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Sprintf("no answer within %s (packets dropped: a firewall?)", timeout)
	}
	if errors.Is(err, unix.ECONNREFUSED) {
		return "connection refused (a firewall rejecting it, or nothing listening)"
	}
	if errors.Is(err, unix.EHOSTUNREACH) || errors.Is(err, unix.ENETUNREACH) {
		return "no route to the host (" + err.Error() + ")"
	}
	return err.Error()
}

// gatherFacts collects what the launcher checks on this host.
func gatherFacts(ctx context.Context, o AgentOptions) *Facts {
	f := &Facts{OS: runtime.GOOS, Arch: runtime.GOARCH, Version: Version(), WorkDir: o.WorkDir}
	f.Hostname, _ = os.Hostname()
	if self, err := os.Executable(); err == nil {
		f.AgentSHA256, _, _ = fileSHA256(self)
	}
	if s := strings.Fields(os.Getenv("SSH_CONNECTION")); len(s) == 4 {
		f.SSHClientIP, f.SSHServerIP = s[0], s[2]
	}
	if f.WorkDir != "" {
		if err := os.Chdir(f.WorkDir); err != nil {
			f.WorkDirErr = "cannot enter the working directory: " + pathErr(err)
		}
	} else {
		f.WorkDir, _ = os.Getwd()
	}
	if o.Program != "" {
		f.Program = programFacts(o.Program)
	}
	checkpointFacts(f, o)
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err == nil {
		f.NoFileSoft, f.NoFileHard = lim.Cur, lim.Max
	}
	// The Go runtime raised this process's soft limit to the hard one; a
	// child gets the limit the login session set, which is what a program
	// that is not Go would run with.
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(sctx, "sh", "-c", "ulimit -n").Output(); err == nil {
		if n, err := strconv.ParseUint(strings.TrimSpace(string(out)), 10, 64); err == nil {
			f.NoFileSoft = n
		} else if strings.TrimSpace(string(out)) == "unlimited" {
			f.NoFileSoft = lim.Max
		}
	}
	lo, hi := portRange()
	f.PortRange = fmt.Sprintf("%d %d", lo, hi)
	return f
}

// programFacts looks at PROGRAM as a remote rank's `setsid PROGRAM` would
// find it: relative to the working directory, or on $PATH without a slash.
func programFacts(prog string) *ProgramFacts {
	p := &ProgramFacts{Path: prog, Resolved: prog}
	if !strings.Contains(prog, "/") {
		found, err := exec.LookPath(prog)
		if err != nil {
			p.Err = fmt.Sprintf("%s is not on $PATH (%s)", prog, os.Getenv("PATH"))
			return p
		}
		p.Resolved = found
	} else if abs, err := filepath.Abs(prog); err == nil {
		p.Resolved = abs
	}
	st, err := os.Stat(p.Resolved)
	switch {
	case err != nil:
		p.Err = pathErr(err)
		return p
	case st.IsDir():
		p.Err = p.Resolved + " is a directory, not a program (build it: go build -o /shared/bin/NAME " + prog + ")"
		return p
	case unix.Access(p.Resolved, unix.X_OK) != nil:
		p.Err = p.Resolved + " is not executable (chmod +x it)"
		return p
	}
	p.Size = st.Size()
	sum, _, err := fileSHA256(p.Resolved)
	if err != nil {
		p.Err = pathErr(err)
		return p
	}
	p.SHA256 = sum
	if bi, err := buildinfo.ReadFile(p.Resolved); err == nil {
		p.Gorun = moduleVersion(bi)
	}
	return p
}

// checkpointFacts measures the free space where the job's checkpoints go,
// and whether they can be written there: in the directory, or, if it does
// not exist yet, in its nearest existing parent (checkpoint.New creates it).
func checkpointFacts(f *Facts, o AgentOptions) {
	dir := o.CheckpointDir
	if dir == "" {
		dir = f.WorkDir
	}
	dir = strings.ReplaceAll(dir, "{host}", o.Host)
	f.CheckpointDir = dir
	if checkpoint.IsRemote(dir) {
		f.CheckpointS3 = true
		return
	}
	at := dir
	for {
		st, err := os.Stat(at)
		if err == nil {
			if !st.IsDir() {
				f.CheckpointErr = at + " is a file, not a directory"
				return
			}
			break
		}
		parent := filepath.Dir(at)
		if parent == at {
			f.CheckpointErr = pathErr(err)
			return
		}
		at = parent
	}
	if at != dir {
		f.CheckpointParent = at
	}
	var st unix.Statfs_t
	if err := unix.Statfs(at, &st); err != nil {
		f.CheckpointErr = "statfs: " + err.Error()
		return
	}
	f.CheckpointFree = st.Bavail * uint64(st.Bsize)
	tmp, err := os.CreateTemp(at, ".gorun-doctor-*")
	if err != nil {
		f.CheckpointErr = "not writable: " + pathErr(err)
		return
	}
	tmp.Close()
	os.Remove(tmp.Name())
}

// fileSHA256 hashes a file.
func fileSHA256(name string) (string, int64, error) {
	fh, err := os.Open(name)
	if err != nil {
		return "", 0, err
	}
	defer fh.Close()
	h := sha256.New()
	n, err := io.Copy(h, fh)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// pathErr is an *os.PathError as "PATH: no such file or directory".
func pathErr(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Path + ": " + pe.Err.Error()
	}
	return err.Error()
}
