package launcher

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/p2p"
)

// Job describes what to launch.
type Job struct {
	NP      int      // number of ranks
	Program string   // executable path (or a Go package directory, see BuildIfPackage)
	Args    []string // its arguments
	Env     []string // extra NAME=VALUE pairs for every rank

	Timeout      time.Duration // collective timeout handed to ranks (GORUN_TIMEOUT); 0 = their default
	StartTimeout time.Duration // every rank must register within this; 0 = 30 s
	Grace        time.Duration // between SIGTERM and SIGKILL when stopping ranks; 0 = 5 s
	MaxRestarts  int           // relaunch the whole job this many times after a failure

	Stdout, Stderr io.Writer // where prefixed rank output goes; nil = os.Stdout, os.Stderr
	// Line, if set, receives every complete output line instead of the
	// default "[rank] line" writer.
	Line    func(rank int, stderr bool, line []byte)
	Verbose bool
	Logf    func(format string, args ...any) // gorun's own messages; nil = to Stderr
}

// RankError says which rank failed a job and how.
type RankError struct {
	Rank       int
	PID        int
	Status     string   // "exit status 3", "signal: killed", "did not register within 30s"
	LastStderr []string // its last lines of stderr
}

func (e *RankError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "rank %d (pid %d) failed: %s", e.Rank, e.PID, e.Status)
	if len(e.LastStderr) > 0 {
		fmt.Fprintf(&b, "; its last stderr lines:")
		for _, l := range e.LastStderr {
			fmt.Fprintf(&b, "\n    %s", l)
		}
	}
	return b.String()
}

// Run launches the job and waits for it. It returns nil when every rank
// exited 0, a *RankError when a rank failed (after stopping the others), or
// ctx's cause when ctx ended (after stopping every rank).
func Run(ctx context.Context, job Job) error {
	if job.NP < 1 {
		return fmt.Errorf("-np must be at least 1, got %d", job.NP)
	}
	if job.Program == "" {
		return errors.New("no program to run: write gorun -np N PROGRAM [ARGS...]")
	}
	if job.StartTimeout <= 0 {
		job.StartTimeout = 30 * time.Second
	}
	if job.Grace <= 0 {
		job.Grace = 5 * time.Second
	}
	if job.Stdout == nil {
		job.Stdout = os.Stdout
	}
	if job.Stderr == nil {
		job.Stderr = os.Stderr
	}
	if job.Logf == nil {
		job.Logf = func(format string, args ...any) { fmt.Fprintf(job.Stderr, "gorun: "+format+"\n", args...) }
	}
	if job.Line == nil {
		job.Line = prefixer(job.Stdout, job.Stderr)
	}
	var err error
	for attempt := 0; ; attempt++ {
		err = runOnce(ctx, job, attempt)
		if err == nil || ctx.Err() != nil || attempt >= job.MaxRestarts {
			return err
		}
		job.Logf("restart %d of %d after failure: %v", attempt+1, job.MaxRestarts, err)
	}
}

// prefixer writes each line as "[rank] line", whole lines at a time so that
// ranks never interleave mid-line.
func prefixer(stdout, stderr io.Writer) func(int, bool, []byte) {
	var mu sync.Mutex
	return func(rank int, isErr bool, line []byte) {
		w := stdout
		if isErr {
			w = stderr
		}
		buf := make([]byte, 0, len(line)+8)
		buf = append(buf, '[')
		buf = strconv.AppendInt(buf, int64(rank), 10)
		buf = append(buf, "] "...)
		buf = append(buf, line...)
		buf = append(buf, '\n')
		mu.Lock()
		w.Write(buf)
		mu.Unlock()
	}
}

type rankProc struct {
	rank  int
	cmd   *exec.Cmd
	tail  *tail
	pipes sync.WaitGroup
	err   error // from Wait
	done  chan struct{}
}

func runOnce(ctx context.Context, job Job, attempt int) error {
	key := p2p.NewJobKey()
	rdvLog := job.Logf
	if !job.Verbose {
		// A refused stranger is worth saying even when quiet.
		rdvLog = func(format string, args ...any) {
			if strings.Contains(format, "refused") {
				job.Logf(format, args...)
			}
		}
	}
	rdv, err := p2p.StartRendezvous(ctx, p2p.RendezvousConfig{
		ListenAddr: "127.0.0.1:0", Size: job.NP, JobKey: key, Timeout: cmp.Or(job.Timeout, collective.DefaultTimeout), Logf: rdvLog,
	})
	if err != nil {
		return fmt.Errorf("starting the rendezvous: %w", err)
	}
	defer rdv.Close()
	if job.Verbose {
		job.Logf("rendezvous at %s, starting %d ranks of %s", rdv.Addr(), job.NP, job.Program)
	}

	env := append(os.Environ(), job.Env...)
	env = append(env,
		collective.EnvSize+"="+strconv.Itoa(job.NP),
		collective.EnvLocalSize+"="+strconv.Itoa(job.NP),
		collective.EnvRendezvous+"="+rdv.Addr(),
		collective.EnvJobKey+"="+hex.EncodeToString(key),
		collective.EnvRestartCount+"="+strconv.Itoa(attempt),
	)
	if job.Timeout > 0 {
		env = append(env, collective.EnvTimeout+"="+job.Timeout.String())
	}
	if job.Verbose {
		env = append(env, collective.EnvVerbose+"=1")
	}

	procs := make([]*rankProc, job.NP)
	exited := make(chan *rankProc, job.NP)
	for r := range job.NP {
		p, err := startRank(job, r, env, exited)
		if err != nil {
			stopAll(procs[:r], job.Grace)
			return fmt.Errorf("starting rank %d: %w", r, err)
		}
		procs[r] = p
	}

	registered := make(chan error, 1)
	go func() {
		rctx, cancel := context.WithTimeout(ctx, job.StartTimeout)
		defer cancel()
		registered <- rdv.WaitRegistered(rctx)
	}()

	var failure error
	running := job.NP
	for running > 0 && failure == nil {
		select {
		case p := <-exited:
			running--
			if p.err != nil {
				failure = &RankError{Rank: p.rank, PID: p.cmd.Process.Pid, Status: p.err.Error(), LastStderr: p.tail.lines()}
			}
		case err := <-registered:
			if err != nil && ctx.Err() == nil {
				failure = fmt.Errorf("not every rank registered within --start-timeout %v: %w", job.StartTimeout, err)
			}
		case <-ctx.Done():
			failure = fmt.Errorf("stopped: %w", context.Cause(ctx))
		}
	}
	if failure != nil {
		stopAll(procs, job.Grace)
	}
	for _, p := range procs {
		<-p.done
	}
	return failure
}

func startRank(job Job, rank int, env []string, exited chan<- *rankProc) (*rankProc, error) {
	cmd := exec.Command(job.Program, job.Args...)
	cmd.Env = append(env[:len(env):len(env)],
		collective.EnvRank+"="+strconv.Itoa(rank),
		collective.EnvLocalRank+"="+strconv.Itoa(rank),
	)
	// Its own process group, so that stopping a rank also stops what it
	// started; and it dies with gorun even if gorun is killed outright.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// Our own pipes, not cmd.StdoutPipe: a rank's exit is noticed even if
	// something it started still holds the pipe open.
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	p := &rankProc{rank: rank, cmd: cmd, tail: &tail{max: 20}, done: make(chan struct{})}
	err = cmd.Start()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return nil, err
	}
	p.pipes.Add(2)
	go p.forward(outR, false, job.Line)
	go p.forward(errR, true, job.Line)
	go func() {
		p.err = cmd.Wait()
		// Give the reader a moment to drain what the rank wrote before it
		// exited, then close, so a leftover child cannot hold the job open.
		drained := make(chan struct{})
		go func() { p.pipes.Wait(); close(drained) }()
		select {
		case <-drained:
		case <-time.After(2 * time.Second):
			outR.Close()
			errR.Close()
			<-drained
		}
		close(p.done)
		exited <- p
	}()
	return p, nil
}

// forward reads whole lines and hands them on; a last line without a newline
// is still delivered.
func (p *rankProc) forward(r io.Reader, isErr bool, line func(int, bool, []byte)) {
	defer p.pipes.Done()
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		l, err := br.ReadBytes('\n')
		if len(l) > 0 {
			l = bytes.TrimSuffix(l, []byte{'\n'})
			if isErr {
				p.tail.add(string(l))
			}
			line(p.rank, isErr, l)
		}
		if err != nil {
			return
		}
	}
}

// stopAll sends SIGTERM to every running rank's process group, then SIGKILL
// to those still alive after grace.
func stopAll(procs []*rankProc, grace time.Duration) {
	signalAll(procs, syscall.SIGTERM)
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	for _, p := range procs {
		select {
		case <-p.done:
		case <-deadline.C:
			signalAll(procs, syscall.SIGKILL)
			return
		}
	}
}

func signalAll(procs []*rankProc, sig syscall.Signal) {
	for _, p := range procs {
		select {
		case <-p.done:
		default:
			syscall.Kill(-p.cmd.Process.Pid, sig)
		}
	}
}

// tail keeps the last max lines of a stream.
type tail struct {
	mu  sync.Mutex
	max int
	buf []string
}

func (t *tail) add(l string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.buf) == t.max {
		copy(t.buf, t.buf[1:])
		t.buf = t.buf[:t.max-1]
	}
	t.buf = append(t.buf, l)
}

func (t *tail) lines() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.buf...)
}
