package e2e

import (
	"context"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv/slurmtest"
)

// srunStep is an srun that a test started on a node of a Slurm cluster
// and whose output it watches.
type srunStep struct {
	t      *testing.T
	c      *slurmtest.Cluster
	cmd    *exec.Cmd
	out    *watchedBuffer
	done   chan struct{} // closed when srun exited; err is then set
	err    error
	cancel context.CancelFunc
}

// startSrun starts srun args on node1 with env added to its environment;
// the test's cleanup kills it if it still runs.
func startSrun(t *testing.T, c *slurmtest.Cluster, env []string, args ...string) *srunStep {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	s := &srunStep{t: t, c: c, out: newWatchedBuffer(), done: make(chan struct{}), cancel: cancel}
	s.cmd = c.Command(ctx, c.Nodes[0], "srun", args...)
	s.cmd.Env = append(s.cmd.Env, env...)
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	if err := s.cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	go func() { s.err = s.cmd.Wait(); close(s.done) }()
	t.Cleanup(func() {
		select {
		case <-s.done:
		default:
			s.cmd.Process.Kill()
			<-s.done
		}
		cancel()
	})
	return s
}

// waitOut waits until srun's output satisfies ok, or fails the test
// after limit, or once srun exited without it.
func (s *srunStep) waitOut(what string, limit time.Duration, ok func(string) bool) string {
	s.t.Helper()
	deadline := time.After(limit)
	for {
		text := s.out.String()
		if ok(text) {
			return text
		}
		select {
		case <-s.out.wrote:
		case <-s.done:
			if text := s.out.String(); ok(text) {
				return text
			}
			s.t.Fatalf("srun exited (%v) without %s:\n%s\n%s", s.err, what, s.out, s.c.Logs())
		case <-deadline:
			s.t.Fatalf("srun's output lacks %s within %v:\n%s\n%s", what, limit, s.out, s.c.Logs())
		}
	}
}

// wait waits for srun to exit, at most limit, and returns its error.
func (s *srunStep) wait(limit time.Duration) error {
	s.t.Helper()
	select {
	case <-s.done:
		return s.err
	case <-time.After(limit):
		s.t.Fatalf("srun did not end within %v:\n%s\n%s", limit, s.out, s.c.Logs())
		return nil
	}
}

// srunElasticEnv is the environment of an elastic job's srun: the job key
// file, the heartbeat bound of the elastic tests.
func srunElasticEnv(keyFile string) []string {
	return []string{"GORUN_JOB_KEY_FILE=" + keyFile, "GORUN_ELASTIC=1",
		"GORUN_HEARTBEAT_TIMEOUT=" + etHeartbeat.String(), "GORUN_TIMEOUT=60s"}
}

// elastictrain's lines as srun --label prints them.
var (
	// srunFinalRE is the final line.
	srunFinalRE = regexp.MustCompile(`(?m)^\d+: final rank=(\S+) params=([0-9a-f]{64}) samples=([\d,]+) dup=(\d+) miss=(\d+) steps=(\d+)`)
	// srunStartRE is the start line: task, pid, rank, joiner.
	srunStartRE = regexp.MustCompile(`(?m)^(\d+): start pid=(\d+) rank=(-?\d+) size=\d+ joiner=(\w+) `)
	// srunResetRE is a reset line: task, new size, lost, joined, the
	// commit it resumed from.
	srunResetRE = regexp.MustCompile(`(?m)^(\d+): reset rank=\d+ mepoch=\d+ size=\d+->(\d+) lost=\[([\d,]*)\] joined=\[([\d,]*)\] commit=(\d+) `)
	// srunStepRE is a step line (rank 0's, after each commit): task,
	// epoch, steps done.
	srunStepRE = regexp.MustCompile(`(?m)^(\d+): step (\d+) (\d+) `)
)

// checkSrunFinals checks the final lines in text: want of them, each with
// the uninterrupted run's parameters and samples and every step done.
func checkSrunFinals(t *testing.T, cfg etConfig, text string, want int) {
	t.Helper()
	params, samples := etReference(t, cfg)
	total := cfg.epochs * ((cfg.length + cfg.batch - 1) / cfg.batch)
	finals := srunFinalRE.FindAllStringSubmatch(text, -1)
	if len(finals) != want {
		t.Errorf("%d final lines, want %d:\n%s", len(finals), want, text)
	}
	for _, m := range finals {
		if m[2] != params || m[3] != samples || m[4] != "0" || m[5] != "0" {
			t.Errorf("final line %q: want the uninterrupted run's params %s and samples %s, none used twice or never", m[0], params, samples)
		}
		if m[6] != strconv.Itoa(total) {
			t.Errorf("final line %q: %s steps, want %d", m[0], m[6], total)
		}
	}
}

// sallocGrantedRE finds the job id in salloc's "Granted job allocation".
var sallocGrantedRE = regexp.MustCompile(`Granted job allocation (\d+)`)
