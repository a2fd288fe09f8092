package doctor

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/gorun/gorun/launcher"
)

// Config is one doctor run.
type Config struct {
	Hosts         []string // as -H or the hostfile name them
	Local         func(host string) bool
	Expect        Expect
	WorkDir       string
	CheckpointDir string // "" = the working directory
	// SSH reaches the remote hosts as a job's ranks are reached: ssh, or
	// srun inside a Slurm allocation (SSH.Srun).
	SSH launcher.SSH
	// AgentDir is where remote hosts keep the agent (this gorun's binary,
	// sent over ssh when missing, named by its hash): "" =
	// ~/.cache/gorun/doctor of the ssh user. It is created mode 0700; one
	// that is not the user's own, or that others may write, is refused,
	// since what is in it runs as the user (see installScript).
	AgentDir    string
	Self        string        // this gorun's executable
	Timeout     time.Duration // the whole run
	DialTimeout time.Duration // one dial between two hosts
	ProbeBytes  int64         // most bytes a bandwidth probe sends
	ProbeTime   time.Duration // longest a bandwidth probe sends
	Logf        func(format string, args ...any)
}

// clockSamples is how many times the launcher reads an agent's clock; the
// sample with the shortest round trip is the most precise.
const clockSamples = 5

// stepTimeout bounds the clock readings and the opening of the probe port
// of one agent.
const stepTimeout = 10 * time.Second

// Run starts an agent on every host, lets them probe each other, and
// returns what was found, host by host and pair by pair.
func Run(ctx context.Context, cfg Config) ([]HostResult, []PairResult, error) {
	logf := cfg.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	ctx, cancel := context.WithTimeoutCause(ctx, cfg.Timeout, fmt.Errorf("gorun doctor did not finish within --timeout %s", cfg.Timeout))
	defer cancel()
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return nil, nil, err
	}
	token := hex.EncodeToString(tok)
	selfSHA, _, err := fileSHA256(cfg.Self)
	if err != nil {
		return nil, nil, fmt.Errorf("reading this gorun's executable to send it as the agent: %w", err)
	}
	cfg.Expect.AgentSHA256 = selfSHA
	agentName := "gorun-doctor-agent-" + selfSHA[:16]

	n := len(cfg.Hosts)
	res := make([]HostResult, n)
	agents := make([]*agentConn, n)
	start := time.Now()
	// A host that takes ssh but whose agent hangs must not hold up the
	// others: every host has half the run to report, the probes the rest.
	half := cfg.Timeout / 2
	helloCtx, helloCancel := context.WithTimeoutCause(ctx, half, fmt.Errorf("no answer within %s (half of --timeout)", half))
	defer helloCancel()
	parallel(n, func(i int) {
		h := cfg.Hosts[i]
		res[i].Name, res[i].Local = h, cfg.Local(h)
		a, err := startAgent(ctx, helloCtx, cfg, &res[i], agentName, selfSHA)
		if err != nil {
			if res[i].SSHErr == "" && res[i].AgentDirErr == "" {
				res[i].AgentErr = err.Error()
			}
			return
		}
		agents[i] = a
		if err := a.send(message{Token: token}); err != nil {
			res[i].AgentErr = a.failure(err)
			return
		}
		m, err := a.recv(helloCtx)
		if err != nil || m.Facts == nil {
			if msg, ok := a.unsafeDirRefusal(); ok {
				res[i].AgentDirErr = msg // runScript found the directory made unsafe since the install
				a.kill()
				return
			}
			res[i].AgentErr = a.failure(cmpErr(err, m))
			a.kill()
			return
		}
		res[i].Facts = m.Facts
	})
	logf("agents started on %d host(s) in %v", n, time.Since(start).Round(time.Millisecond))
	defer func() {
		// Closing stdin ends an agent (and, for a remote one, its ssh
		// session); what does not end soon is killed with ctx.
		for _, a := range agents {
			if a != nil {
				a.stdin.Close()
			}
		}
		for _, a := range agents {
			if a != nil {
				a.wait(3 * time.Second)
			}
		}
	}()

	launcherIP := chooseLauncherIP(res, cfg.SSH.Via())
	logf("agents on this host listen on %s", launcherIP)
	parallel(n, func(i int) {
		a := agents[i]
		if a == nil || res[i].Facts == nil {
			return
		}
		// Reading the clock and opening the port take milliseconds; an
		// agent that stalls here is killed after stepTimeout.
		stepCtx, cancel := context.WithTimeoutCause(ctx, stepTimeout, fmt.Errorf("no answer within %s", stepTimeout))
		defer cancel()
		defer func() {
			if stepCtx.Err() != nil {
				a.kill()
			}
		}()
		best := time.Duration(-1)
		for range clockSamples {
			t0 := time.Now()
			if err := a.send(message{Op: "time"}); err != nil {
				res[i].ClockErr = a.failure(err)
				return
			}
			m, err := a.recv(stepCtx)
			if err != nil || m.Time == 0 {
				res[i].ClockErr = a.failure(cmpErr(err, m))
				return
			}
			rtt := time.Since(t0)
			if best < 0 || rtt < best {
				best = rtt
				res[i].Skew = time.Duration(m.Time - (t0.UnixNano() + int64(rtt/2)))
				res[i].SkewErr = rtt / 2
			}
		}
		req := message{Op: "listen", RouteTo: launcherIP}
		if res[i].Local {
			req = message{Op: "listen", IP: launcherIP}
		}
		if err := a.send(req); err != nil {
			res[i].ListenErr = a.failure(err)
			return
		}
		m, err := a.recv(stepCtx)
		if err != nil || len(m.Listening) == 0 {
			res[i].ListenErr = a.failure(cmpErr(err, m))
			return
		}
		res[i].Addrs = m.Listening
	})

	// Every agent first dials every other's ports, a few at once (see
	// probePeers), then measures them one at a time, starting with the host
	// after its own: host i's k-th peer is host i+k, so at the start each
	// host sends one stream and receives one. The agents are not kept in
	// step (a probe to a nearby host ends sooner than one to a far one),
	// so later a host may receive two streams at once: a bandwidth figure
	// is one stream's on a link that is mostly, not always, its own, and
	// only a link far below the median (a tenth) is called slow.
	var probing []int
	for i := range n {
		if len(res[i].Addrs) > 0 {
			probing = append(probing, i)
		}
	}
	var mu sync.Mutex
	var pairs []PairResult
	start = time.Now()
	parallel(len(probing), func(k int) {
		i := probing[k]
		var peers []Peer
		for s := 1; s < len(probing); s++ {
			j := probing[(k+s)%len(probing)]
			peers = append(peers, Peer{Name: res[j].Name, Addrs: res[j].Addrs})
		}
		got := map[string]bool{}
		record := func(p PairResult) {
			mu.Lock()
			defer mu.Unlock()
			p.From = res[i].Name
			pairs = append(pairs, p)
			got[p.To] = true
		}
		defer func() {
			for _, p := range peers {
				if !got[p.Name] {
					why := "the probe did not finish"
					if ctx.Err() != nil {
						why += ": " + context.Cause(ctx).Error()
					}
					record(PairResult{To: p.Name, Err: why})
				}
			}
		}()
		if len(peers) == 0 {
			return
		}
		a := agents[i]
		err := a.send(message{Op: "probe", Peers: peers, Dial: cfg.DialTimeout, Bytes: cfg.ProbeBytes, For: cfg.ProbeTime})
		for err == nil {
			var m message
			m, err = a.recv(ctx)
			switch {
			case err != nil:
			case m.Pair != nil:
				record(*m.Pair)
			case m.Done:
				return
			case m.Error != "":
				err = errors.New(m.Error)
			}
		}
		logf("host %s: probing stopped: %s", res[i].Name, a.failure(err))
	})
	logf("%d pairs probed in %v", len(pairs), time.Since(start).Round(time.Millisecond))
	return res, pairs, nil
}

// chooseLauncherIP is the address this host's agents listen on: the one a
// job's rendezvous would (launcher.LauncherIP), 127.0.0.1 without remote
// hosts or when the job could not choose either.
func chooseLauncherIP(res []HostResult, via string) string {
	var seen []launcher.SeenAddrs
	for _, r := range res {
		if !r.Local && r.Facts != nil && r.Facts.SSHServerIP != "" {
			seen = append(seen, launcher.SeenAddrs{Host: r.Name, ClientIP: r.Facts.SSHClientIP, ServerIP: r.Facts.SSHServerIP})
		}
	}
	if ip, _, err := launcher.LauncherIP(seen, via); err == nil {
		return ip
	}
	return "127.0.0.1"
}

// The agent cache on a remote host runs whatever is in it as the user, so
// neither script trusts a file for its name: installScript creates the
// directory mode 0700 and refuses (gorun-doctor-unsafe, no agent run) one
// that is not the user's or that others may write, and both check the
// agent's sha256 against this gorun's before using it.

// installScript stores the agent on a remote host unless it is there: it
// prints "have", or "send" and then reads the binary from stdin into $1/$2
// (a partial or altered copy is never kept: its sha256 must be $3), and
// removes older agents. Arguments: the directory ("" =
// ~/.cache/gorun/doctor), the name, the sha256. The temporary name has the
// host's name in it: a home directory shared by the hosts gets several
// copies at once.
const installScript = `d=${1:-$HOME/.cache/gorun/doctor}; f=$d/$2; want=$3
command -v sha256sum >/dev/null || { echo "sha256sum (coreutils) is not installed: the agent cannot be checked" >&2; exit 1; }
mkdir -p -m 700 "$d" || exit 1
` + safeDirCheck + `
sum() { s=$(sha256sum <"$1") && echo "${s%% *}"; }
if [ -f "$f" ] && [ -x "$f" ] && [ "$(sum "$f")" = "$want" ]; then echo gorun-doctor-have; exit 0; fi
echo gorun-doctor-send
t=$f.tmp.$(uname -n).$$
if cat >"$t" && [ "$(sum "$t")" = "$want" ] && chmod 700 "$t" && mv -f "$t" "$f"; then
  for o in "$d"/gorun-doctor-agent-*; do case $o in "$f"|*.tmp.*) ;; *) rm -f "$o";; esac; done
  echo gorun-doctor-stored
else
  rm -f "$t"; echo "could not store the agent in $d (or what arrived there is not this gorun: its sha256 differs)" >&2; exit 1
fi`

// safeDirCheck, a piece of both scripts, refuses the directory $d unless
// it is the user's and no one else may write to it (printing
// gorun-doctor-unsafe and why, exit 0, which install turns into an
// unsafeDirError).
const safeDirCheck = `m=$(ls -ldL "$d") || exit 1
if [ ! -O "$d" ]; then echo "gorun-doctor-unsafe $d is not owned by $(id -un): $m"; exit 0; fi
case $m in ?????w*|????????w*) echo "gorun-doctor-unsafe $d is writable by other users: $m"; exit 0;; esac`

// runRefusalSuffix ends runScript's refusal of an unsafe directory.
const runRefusalSuffix = "; the agent there was not run"

// runScript starts the stored agent after checking, in the same session,
// that its directory is still safe (as installScript checked it) and the
// agent still is this gorun: arguments the directory, the name, the
// sha256, then the agent's own. A refusal is printed to stderr here: the
// agent's stdout is its protocol.
const runScript = `d=${1:-$HOME/.cache/gorun/doctor}; f=$d/$2; want=$3; shift 3
r=$( ` + safeDirCheck + `
) || exit 1
if [ -n "$r" ]; then echo "$r` + runRefusalSuffix + `" >&2; exit 1; fi
s=$(sha256sum <"$f") || exit 1
if [ "${s%% *}" != "$want" ]; then echo "$f is not this gorun (sha256 ${s%% *}, want $want): it changed since it was stored; not run" >&2; exit 1; fi
exec "$f" doctor-agent "$@"`

// startAgent starts host r.Name's agent: this gorun itself on this host,
// over ssh on another (first sending the binary if that host lacks it).
// The agent lives until ctx ends; its installation must be done by
// helloCtx.
func startAgent(ctx, helloCtx context.Context, cfg Config, r *HostResult, name, sha string) (*agentConn, error) {
	args := []string{"--host", r.Name, "--workdir", cfg.WorkDir, "--lifetime", (cfg.Timeout + 30*time.Second).String()}
	if cfg.Expect.Program != "" {
		args = append(args, "--program", cfg.Expect.Program)
	}
	if cfg.CheckpointDir != "" {
		args = append(args, "--checkpoint-dir", cfg.CheckpointDir)
	}
	if r.Local {
		return startConn(exec.CommandContext(ctx, cfg.Self, append([]string{"doctor-agent"}, args...)...))
	}
	t0 := time.Now()
	if err := install(helloCtx, cfg, r.Name, name, sha, func() { r.SSHTime = time.Since(t0) }); err != nil {
		var se *sshError
		var ue *unsafeDirError
		switch {
		case errors.As(err, &se):
			r.SSHErr = se.msg
		case errors.As(err, &ue):
			r.AgentDirErr = ue.msg
		}
		return nil, err
	}
	line := []string{"exec", "sh", "-c", launcher.ShellQuote(runScript), "gorun-doctor", launcher.ShellQuote(cfg.AgentDir), name, sha}
	for _, a := range args {
		line = append(line, launcher.ShellQuote(a))
	}
	return startConn(exec.CommandContext(ctx, cfg.SSH.Client(), append(cfg.SSH.Args(r.Name), strings.Join(line, " "))...))
}

// unsafeDirError is an agent directory others could plant a program in.
type unsafeDirError struct{ msg string }

func (e *unsafeDirError) Error() string { return e.msg }

// sshError is ssh (or srun) failing to reach a host, in its words.
type sshError struct{ msg string }

func (e *sshError) Error() string { return e.msg }

// install makes sure host has the agent: one ssh session that answers
// whether it has it, and if not takes it on stdin. reached is called when
// the host first answers.
func install(ctx context.Context, cfg Config, host, name, sha string, reached func()) error {
	line := strings.Join([]string{"exec", "sh", "-c", launcher.ShellQuote(installScript), "gorun-doctor", launcher.ShellQuote(cfg.AgentDir), name, sha}, " ")
	cmd := exec.CommandContext(ctx, cfg.SSH.Client(), append(cfg.SSH.CheckArgs(host), line)...)
	cmd.WaitDelay = 2 * time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr lockedBuf
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	// A login shell's rc files may print before the script does: skip to
	// the script's first line.
	sc := bufio.NewScanner(stdout)
	answered := false
	for !answered && sc.Scan() {
		answered = strings.HasPrefix(sc.Text(), "gorun-doctor-")
	}
	if answered {
		reached()
	}
	var sendErr error
	unsafe, isUnsafe := strings.CutPrefix(sc.Text(), "gorun-doctor-unsafe ")
	if answered && sc.Text() == "gorun-doctor-send" {
		sendErr = sendFile(stdin, cfg.Self)
	}
	stdin.Close()
	for sc.Scan() {
	}
	err = cmd.Wait()
	code := -1
	if cmd.ProcessState != nil {
		code = cmd.ProcessState.ExitCode()
	}
	if !answered && code >= 0 && code != 255 {
		reached() // the remote shell ran, and failed
	}
	via := cfg.SSH.Via()
	switch {
	case !answered && (via == "ssh" && code == 255 || via == "srun" && strings.HasPrefix(lastLine(stderr.String()), "srun:")):
		// ssh exits 255 when it cannot reach the host; srun has no status
		// of its own for that, but its messages start with "srun:".
		return &sshError{cmp.Or(lastLine(stderr.String()), fmt.Sprintf("%s failed with exit status %d", via, code))}
	case !answered && ctx.Err() != nil:
		return &sshError{"no answer: " + context.Cause(ctx).Error()}
	case answered && isUnsafe:
		return &unsafeDirError{unsafe}
	case err != nil || sendErr != nil:
		msg := cmp.Or(lastLine(stderr.String()), fmt.Sprint(cmp.Or(sendErr, err)))
		return fmt.Errorf("could not install the agent (this gorun's binary) on %s: %s", host, msg)
	}
	return nil
}

func sendFile(w io.Writer, name string) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}

// agentConn is a running agent and its JSON line channel.
type agentConn struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	msgs    chan message
	stderr  *lockedBuf
	done    chan struct{}
	waitErr error
	mu      sync.Mutex // serialises writes to stdin
}

func startConn(cmd *exec.Cmd) (*agentConn, error) {
	cmd.WaitDelay = 2 * time.Second
	a := &agentConn{cmd: cmd, msgs: make(chan message, 16), stderr: &lockedBuf{}, done: make(chan struct{})}
	var err error
	if a.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = a.stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		defer close(a.done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			var m message
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				// Not the agent's: what a login shell's rc files print.
				// Kept with stderr, for the error messages.
				fmt.Fprintf(a.stderr, "%s\n", sc.Bytes())
				continue
			}
			a.msgs <- m
		}
		close(a.msgs)
		a.waitErr = cmd.Wait()
	}()
	return a, nil
}

func (a *agentConn) send(m message) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	_, err = a.stdin.Write(append(b, '\n'))
	return err
}

// recv waits for the agent's next message.
func (a *agentConn) recv(ctx context.Context) (message, error) {
	select {
	case m, ok := <-a.msgs:
		if !ok {
			<-a.done
			return message{}, fmt.Errorf("the agent exited (%v)", a.waitErr)
		}
		return m, nil
	case <-ctx.Done():
		return message{}, context.Cause(ctx)
	}
}

// failure says why talking to the agent failed, with its last words.
func (a *agentConn) failure(err error) string {
	msg := fmt.Sprint(err)
	if l := lastLine(a.stderr.String()); l != "" {
		msg += ": " + l
	}
	return msg
}

// unsafeDirRefusal returns why runScript refused to run the agent from
// its directory, if it did.
func (a *agentConn) unsafeDirRefusal() (string, bool) {
	for _, l := range strings.Split(a.stderr.String(), "\n") {
		if msg, ok := strings.CutPrefix(l, "gorun-doctor-unsafe "); ok {
			return strings.TrimSuffix(msg, runRefusalSuffix), true
		}
	}
	return "", false
}

// kill ends an agent that stopped answering.
func (a *agentConn) kill() {
	if a.cmd.Process != nil {
		a.cmd.Process.Kill()
	}
}

// wait gives the agent d to exit after its stdin closed, then kills it.
func (a *agentConn) wait(d time.Duration) {
	select {
	case <-a.done:
		return
	case <-time.After(d):
	}
	if a.cmd.Process != nil {
		a.cmd.Process.Kill()
	}
	for range a.msgs {
	}
	<-a.done
}

// lockedBuf is a bytes.Buffer a process writes while others read it.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func parallel(n int, f func(i int)) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(i)
		}()
	}
	wg.Wait()
}

func cmpErr(err error, m message) error {
	if err != nil {
		return err
	}
	if m.Error != "" {
		return errors.New(m.Error)
	}
	return errors.New("unexpected answer from the agent")
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
