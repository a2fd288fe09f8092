// A rank's process: starting it here or on a remote host, forwarding its
// output, and stopping it (SIGTERM, then SIGKILL after the grace period).

package launcher

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

type rankProc struct {
	rank   int    // in an elastic job, the process's number (see elasticRun.label)
	host   string // "" on a single-host job
	remote bool
	via    string // how a remote rank was started: "ssh" or "srun"
	// Elastic jobs: where it runs (also on one host), whether it started
	// as a joiner, its GORUN_LOCAL_RANK, and whether gorun stopped it on
	// purpose (its host left the discovery list).
	hostName  string
	joiner    bool
	localRank int
	stopReq   atomic.Bool
	frozen    atomic.Bool // ended by gorun: stopped by a signal and lost, or a straggler
	// unanswered: a remote rank whose session gorun killed because its
	// stop went unanswered (see stopAll).
	unanswered atomic.Bool
	// What the rendezvous said of it (elastic jobs; by GORUN_PROC_ID;
	// used by runElastic's goroutine only).
	rdvLost        bool   // lost as a member
	rdvLostCause   string // why
	lostAfterLeave bool   // lost after a member had left cleanly
	sentAway       bool   // a joiner refused, or sent away before admission
	sentAwayWhy    string
	admitted       bool   // a joiner admitted to an established epoch
	left           bool   // left the job cleanly (its Close): it ends on its own
	departed       string // left the job gracefully at a commit (SIGTERM): why; the others went on
	// exitHandled: the elastic run's goroutine has handled its exit
	// (which may come well after done is closed: exits queue in exited).
	exitHandled bool
	cmd         *exec.Cmd
	stdin       *os.File // remote ranks: the ssh session's stdin
	tail        *tail
	out         *rankSink
	pipes       sync.WaitGroup
	err         error // from Wait
	done        chan struct{}
}

func startLocal(job Job, p *rankProc, env []string, ownSession bool, exited chan<- *rankProc) error {
	cmd := exec.Command(job.Program, job.Args...)
	cmd.Env = env
	if ownSession {
		// A job across hosts: a session of its own (which makes it its
		// process group's leader as startCmd wants), as the wrapper gives
		// a remote rank (setsid). Linux's autogroup scheduling shares a
		// CPU between sessions first: ranks left in gorun's session would
		// share one session's part among them where another host's ranks
		// on the same CPUs (network namespaces, containers of one node)
		// get one each, and the job would run at the pace of the starved
		// ones. A job on one host keeps its ranks in gorun's session,
		// where a rank's sched_yield while it polls hands the CPU to
		// another rank (across sessions it does not, on EEVDF kernels).
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	}
	return startCmd(job, p, cmd, nil, exited)
}

// startRemote runs the rank through ssh and the wrapper, and hands it its
// environment on stdin. gorun keeps stdin open: closing it (or writing
// "stop") makes the wrapper stop the rank.
func startRemote(job Job, p *rankProc, host, rdvIP string, silence time.Duration, env []string, exited chan<- *rankProc) error {
	block, err := envBlock(env)
	if err != nil {
		return err
	}
	args := append(job.SSH.sessionArgs(host, silence), remoteCommand(job.Grace, rdvIP, job.WorkDir, job.Program, job.Args))
	cmd := exec.Command(job.SSH.command(), args...)
	inR, inW, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd.Stdin = inR
	p.stdin = inW
	if err := startCmd(job, p, cmd, inR, exited); err != nil {
		inW.Close()
		return err
	}
	// A pipe holds 64 KiB, so this does not block (envBlock refuses more).
	if _, err := inW.Write(block); err != nil {
		inW.Close()
	}
	return nil
}

func startCmd(job Job, p *rankProc, cmd *exec.Cmd, stdin *os.File, exited chan<- *rankProc) error {
	// Its own process group, so that stopping a rank also stops what it
	// started; and it dies with gorun even if gorun is killed outright (a
	// remote rank's ssh dies, and the wrapper on the remote host stops it).
	// A local rank comes with its own session (startLocal); ssh stays in
	// gorun's, where it can ask for a passphrase.
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	}
	p.cmd = cmd
	// Our own pipes, not cmd.StdoutPipe: a rank's exit is noticed even if
	// something it started still holds the pipe open.
	outR, outW, err := os.Pipe()
	if err != nil {
		return err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return err
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	err = cmd.Start()
	outW.Close()
	errW.Close()
	if stdin != nil {
		stdin.Close()
	}
	if err != nil {
		outR.Close()
		errR.Close()
		return err
	}
	p.pipes.Add(2)
	go p.forward(outR, false)
	go p.forward(errR, true)
	go func() {
		p.err = cmd.Wait()
		p.out.rankExited(p.rank)
		if p.stdin != nil {
			p.stdin.Close()
		}
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
	return nil
}

// forward hands on the stream's lines and status changes (see
// forwardStream); a last line without a newline is still delivered.
func (p *rankProc) forward(r io.Reader, isErr bool) {
	defer p.pipes.Done()
	forwardStream(r, func(l []byte) {
		if isErr {
			p.tail.add(string(l))
		}
		p.out.line(p.rank, isErr, l)
	}, func(s string) {
		p.out.setStatus(p.rank, isErr, s)
	})
	p.out.streamEnded(p.rank, isErr)
}

// stopAll stops every running rank: SIGTERM and SIGCONT to a local rank's
// process group, "stop" to a remote rank's wrapper (which does the same
// there, and SIGKILL after grace); after grace, SIGKILL to local ranks; a
// remote rank whose ssh has not ended a few seconds later has its ssh
// killed, which closes the session and makes the wrapper kill the rank. It
// returns how many ranks it had to kill.
func stopAll(procs []*rankProc, grace time.Duration) (killed int) {
	for _, p := range procs {
		select {
		case <-p.done:
			continue
		default:
		}
		if p.remote {
			p.stdin.Write([]byte("stop\n"))
			p.stdin.Close()
		} else {
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
			// A stopped process (SIGSTOP, Ctrl-Z) keeps SIGTERM pending
			// until it runs again: wake it, so it ends now rather than at
			// SIGKILL after grace.
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGCONT)
		}
	}
	if waitAll(procs, grace) {
		return 0
	}
	sent := map[*rankProc]bool{}
	for _, p := range procs {
		if !p.remote && kill(p) {
			sent[p] = true
		}
	}
	if !waitAll(procs, 5*time.Second) {
		for _, p := range procs {
			if kill(p) {
				sent[p] = true
				// Its wrapper would have ended the session by now: its
				// host did not answer.
				p.unanswered.Store(p.remote)
			}
		}
	}
	return len(sent)
}

// kill sends SIGKILL to p's process group unless p has ended; it says
// whether it did.
func kill(p *rankProc) bool {
	select {
	case <-p.done:
		return false
	default:
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		return true
	}
}

// waitAll reports whether every proc ended within d.
func waitAll(procs []*rankProc, d time.Duration) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for _, p := range procs {
		select {
		case <-p.done:
		case <-deadline.C:
			return false
		}
	}
	return true
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

func isDone(p *rankProc) bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// processStopped says whether pid is stopped by a signal (state T) or by
// a tracer (t).
func processStopped(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && (b[i+2] == 'T' || b[i+2] == 't')
}
