package e2e

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv/netns"
)

// Elastic training with real processes: gorun runs internal/testenv/progs/elastictrain,
// a training loop on collective.RunElastic with an exact (int64) model, and
// the tests kill, freeze, cut off and add ranks and hosts under it. Every
// test checks that each rank left ends with the parameters of an
// uninterrupted one-process run (elastictrain -reference), that every epoch
// used each sample exactly once, and that no process is left.
//
// The job runs a fixed number of steps, and waits at a gate step (see
// elastictrain -gate-file) until the test has done what it came for: so a
// kill always lands in a running job, and the test never sleeps to wait.

// etTrainBin is internal/testenv/progs/elastictrain, built by TestMain.
func etTrainBin(t testing.TB) string { return elastictrainBin }

// The rank program's lines, as gorun prints them (after its "[label] "
// prefix).
var (
	etStepRE  = regexp.MustCompile(`(?m)^\[[^\]]+\] step (\d+) (\d+) (\d+) size=(\d+) mepoch=(\d+) gen=(\d+)$`)
	etStartRE = regexp.MustCompile(`(?m)^\[[^\]]+\] start pid=(\d+) rank=(-?\d+) size=\d+ joiner=(\w+) gen=(\d+)$`)
	etResetRE = regexp.MustCompile(`(?m)^\[[^\]]+\] reset rank=(\d+) mepoch=(\d+) size=(\d+)->(\d+) lost=\[([\d,]*)\] joined=\[([\d,]*)\] commit=\d+ took=([\d.]+)ms$`)
	// etResumedRE finds the commit a reset resumed from.
	etResumedRE = regexp.MustCompile(`(?m)^\[[^\]]+\] reset rank=\d+ mepoch=\d+ size=\d+->\d+ lost=\[[\d,]*\] joined=\[[\d,]*\] commit=(\d+) `)
	etFinalRE   = regexp.MustCompile(`(?m)^(?:\[[^\]]+\] )?final rank=(\S+) params=([0-9a-f]{64}) samples=([\d,]+) dup=(\d+) miss=(\d+) steps=(\d+)`)
)

// etStep is one step line.
type etStep struct {
	epoch, steps int
	at           time.Time
	size, mepoch int
	gen          int
}

func etSteps(out string) []etStep {
	var s []etStep
	for _, m := range etStepRE.FindAllStringSubmatch(out, -1) {
		n := make([]int64, 6)
		for i := range n {
			n[i], _ = strconv.ParseInt(m[i+1], 10, 64)
		}
		s = append(s, etStep{int(n[0]), int(n[1]), time.Unix(0, n[2]), int(n[3]), int(n[4]), int(n[5])})
	}
	return s
}

// etConfig is the training job of a test: elastictrain's flags.
type etConfig struct {
	epochs, length, batch int
	gateStep              int
	delay                 time.Duration
}

// etDefault: 2 epochs of 32 steps; the job waits at step 24 of epoch 0
// until the test opens the gate, so every change lands mid-epoch.
var etDefault = etConfig{epochs: 2, length: 256, batch: 8, gateStep: 24, delay: 20 * time.Millisecond}

func (c etConfig) args() []string {
	return []string{"-epochs", strconv.Itoa(c.epochs), "-len", strconv.Itoa(c.length), "-batch", strconv.Itoa(c.batch)}
}

// etReference is the final line an uninterrupted one-process run prints:
// its params hash and per-epoch sample counts.
func etReference(t testing.TB, c etConfig) (params, samples string) {
	t.Helper()
	out, err := exec.Command(etTrainBin(t), append(c.args(), "-reference")...).CombinedOutput()
	m := etFinalRE.FindStringSubmatch(string(out))
	if err != nil || m == nil || m[1] != "ref" {
		t.Fatalf("elastictrain -reference: %v\n%s", err, out)
	}
	return m[2], m[3]
}

// etJob is a gorun running elastictrain.
type etJob struct {
	t      testing.TB
	cfg    etConfig
	dir    string // gate file, discovery files, per-process logs
	gate   string
	logDir string
	// Exactly one of these runs it.
	g   *gorunProc
	cmd *exec.Cmd // inside a namespace host
	out *watchedBuffer
	err *watchedBuffer
	// done is closed when gorun exited.
	done chan struct{}
}

func etNewJob(t testing.TB, cfg etConfig) *etJob {
	t.Helper()
	dir := t.TempDir()
	j := &etJob{t: t, cfg: cfg, dir: dir, gate: filepath.Join(dir, "gate"), logDir: filepath.Join(dir, "logs")}
	if err := os.Mkdir(j.logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	return j
}

func (j *etJob) progArgs(extra ...string) []string {
	args := append([]string{etTrainBin(j.t)}, j.cfg.args()...)
	args = append(args, "-delay", j.cfg.delay.String(), "-log-dir", j.logDir)
	if j.cfg.gateStep >= 0 {
		args = append(args, "-gate-file", j.gate, "-gate-step", strconv.Itoa(j.cfg.gateStep))
	}
	return append(args, extra...)
}

// etStart starts gorun on this host with gorunArgs before the program.
func etStart(t *testing.T, cfg etConfig, gorunArgs ...string) *etJob {
	t.Helper()
	j := etNewJob(t, cfg)
	j.g = startGorun(t, j.dir, nil, append(gorunArgs, j.progArgs()...)...)
	j.out, j.err, j.done = j.g.out, j.g.err, j.g.done
	return j
}

// etStartIn starts gorun inside namespace host h of c, with gorunArgs
// before the program (-H and the like).
func etStartIn(t testing.TB, c *netns.Cluster, h *netns.Host, cfg etConfig, gorunArgs ...string) *etJob {
	t.Helper()
	j := etNewJob(t, cfg)
	full := append([]string{"--ssh-identity-file", c.Key}, gorunArgs...)
	cmd := c.Command(h, gorunBin, append(full, j.progArgs()...)...)
	cmd.Env = append(os.Environ(), "GORUN_SSH_OPTS="+c.SSHOpts())
	j.run(cmd)
	return j
}

// run starts cmd (a gorun) for j; the test's cleanup stops it if it still
// runs (SIGTERM, then SIGKILL).
func (j *etJob) run(cmd *exec.Cmd) {
	j.t.Helper()
	j.cmd = cmd
	j.out, j.err, j.done = newWatchedBuffer(), newWatchedBuffer(), make(chan struct{})
	j.cmd.Stdout, j.cmd.Stderr = j.out, j.err
	if err := j.cmd.Start(); err != nil {
		j.t.Fatal(err)
	}
	go func() { j.cmd.Wait(); close(j.done) }()
	j.t.Cleanup(func() { j.stop() })
}

// stop ends gorun as a user would (SIGTERM; SIGKILL if it does not end
// within 30s) and waits for it.
func (j *etJob) stop() {
	select {
	case <-j.done:
		return
	default:
	}
	j.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-j.done:
	case <-time.After(30 * time.Second):
		j.cmd.Process.Kill()
		<-j.done
	}
}

func (j *etJob) fail(format string, args ...any) {
	j.t.Helper()
	j.t.Fatalf("%s\ngorun stdout:\n%s\ngorun stderr:\n%s", fmt.Sprintf(format, args...), j.out, j.err)
}

// waitOut waits until gorun's stdout satisfies ok, which gets it whole.
func (j *etJob) waitOut(what string, limit time.Duration, ok func(out string) bool) string {
	j.t.Helper()
	deadline := time.After(limit)
	for {
		out := j.out.String()
		if ok(out) {
			return out
		}
		select {
		case <-j.out.wrote:
		case <-j.done:
			if out := j.out.String(); ok(out) {
				return out
			}
			j.fail("gorun exited before %s", what)
		case <-deadline:
			j.fail("no %s within %v", what, limit)
		}
	}
}

// waitStep waits for a step line that satisfies ok and returns it.
func (j *etJob) waitStep(what string, limit time.Duration, ok func(etStep) bool) etStep {
	j.t.Helper()
	var got etStep
	j.waitOut(what, limit, func(out string) bool {
		for _, s := range etSteps(out) {
			if ok(s) {
				got = s
				return true
			}
		}
		return false
	})
	return got
}

// waitResets waits until n reset lines of membership epoch mepoch or later
// are printed, and returns them all.
func (j *etJob) waitResets(n, mepoch int, limit time.Duration) [][]string {
	j.t.Helper()
	var got [][]string
	j.waitOut(fmt.Sprintf("%d reset lines of membership epoch %d", n, mepoch), limit, func(out string) bool {
		got = nil
		for _, m := range etResetRE.FindAllStringSubmatch(out, -1) {
			if e, _ := strconv.Atoi(m[2]); e >= mepoch {
				got = append(got, m)
			}
		}
		return len(got) >= n
	})
	return got
}

// pids maps the ranks the job started with to their PIDs.
func (j *etJob) pids(np int) map[int]int {
	j.t.Helper()
	pids := map[int]int{}
	j.waitOut(fmt.Sprintf("%d start lines", np), time.Minute, func(out string) bool {
		for _, m := range etStartRE.FindAllStringSubmatch(out, -1) {
			pid, _ := strconv.Atoi(m[1])
			r, _ := strconv.Atoi(m[2])
			if m[3] == "false" && m[4] == "0" {
				pids[r] = pid
			}
		}
		return len(pids) >= np
	})
	return pids
}

// allPIDs lists every process elastictrain said it was, so far.
func (j *etJob) allPIDs() []int {
	var pids []int
	for _, m := range etStartRE.FindAllStringSubmatch(j.out.String(), -1) {
		pid, _ := strconv.Atoi(m[1])
		pids = append(pids, pid)
	}
	return pids
}

func (j *etJob) open() {
	j.t.Helper()
	if err := os.WriteFile(j.gate, nil, 0o644); err != nil {
		j.t.Fatal(err)
	}
}

// finish waits for gorun to exit and checks the result: exit 0, want final
// lines (one per rank left, ranks 0..want-1) all with the reference's
// parameters and exact sample counts, and every process it started gone.
func (j *etJob) finish(want int) {
	j.t.Helper()
	select {
	case <-j.done:
	case <-time.After(2 * time.Minute):
		j.fail("gorun did not exit within 2m")
	}
	code := -1
	if j.g != nil {
		code = j.g.cmd.ProcessState.ExitCode()
	} else {
		code = j.cmd.ProcessState.ExitCode()
	}
	out := j.out.String()
	if code != 0 {
		j.fail("gorun exited %d, want 0", code)
	}
	params, samples := etReference(j.t, j.cfg)
	finals := etFinalRE.FindAllStringSubmatch(out, -1)
	var ranks []string
	for _, m := range finals {
		ranks = append(ranks, m[1])
		if m[2] != params {
			j.t.Errorf("rank %s ended with parameters %s, want the reference's %s", m[1], m[2], params)
		}
		if m[3] != samples || m[4] != "0" || m[5] != "0" {
			j.t.Errorf("rank %s: samples per epoch %s, %s used twice, %s never; want %s, 0, 0", m[1], m[3], m[4], m[5], samples)
		}
	}
	slices.Sort(ranks)
	var wantRanks []string
	for r := range want {
		wantRanks = append(wantRanks, strconv.Itoa(r))
	}
	if !slices.Equal(ranks, wantRanks) {
		j.t.Errorf("final lines of ranks %v, want %v", ranks, wantRanks)
	}
	// Rank 0 (never a victim here) prints each step once it committed it,
	// and a reset resumes from the newest commit every survivor holds: a
	// step is printed again only when rank 0 had committed it and another
	// survivor had not (its buddy copy never arrived), so that the job
	// resumed from the commit before it. (A step may go unprinted: one
	// whose commit failed on rank 0. The final lines' step counts prove
	// every step was done.)
	resumed := map[int]bool{}
	for _, m := range etResumedRE.FindAllStringSubmatch(out, -1) {
		c, _ := strconv.Atoi(m[1])
		resumed[c] = true
	}
	steps := etSteps(out)
	total := j.cfg.epochs * ((j.cfg.length + j.cfg.batch - 1) / j.cfg.batch)
	var missing []int
	next := 1
	for _, st := range steps {
		if st.steps < next && !(st.steps == next-1 && resumed[st.steps-1]) {
			j.t.Errorf("step %d printed again after step %d, and no reset resumed from commit %d: a committed step was done twice", st.steps, next-1, st.steps-1)
		}
		for ; next < st.steps; next++ {
			missing = append(missing, next)
		}
		next = max(next, st.steps+1)
	}
	for ; next <= total; next++ {
		missing = append(missing, next)
	}
	if len(missing) > 0 {
		j.t.Logf("steps %v were not printed by rank 0 (their commit failed there); gorun stdout:\n%s", missing, out)
	}
	for _, m := range finals {
		if m[6] != strconv.Itoa(total) {
			j.t.Errorf("rank %s ended after %s steps, want %d", m[1], m[6], total)
		}
	}
	j.noneLeft()
	if j.t.Failed() {
		j.t.Logf("gorun stdout:\n%s\ngorun stderr:\n%s", out, j.err)
	}
}

// noneLeft fails the test if a process the job started still runs: by the
// PIDs the ranks printed, and (on this host) by the test's marker.
func (j *etJob) noneLeft() {
	j.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var left []string
		for _, pid := range j.allPIDs() {
			if processRunning(pid) {
				left = append(left, fmt.Sprintf("pid %d", pid))
			}
		}
		if j.g != nil {
			if t, ok := j.t.(*testing.T); ok {
				left = append(left, ranksAlive(t, j.g.cmd.Process.Pid)...)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			j.t.Errorf("processes left after the job: %v", left)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logOf returns what process pid wrote to its log (-log-dir).
func (j *etJob) logOf(pid int) string {
	b, _ := os.ReadFile(filepath.Join(j.logDir, strconv.Itoa(pid)+".log"))
	return string(b)
}

// waitLog polls (the log is a file: nothing to wait on) until pid's log
// contains want.
func (j *etJob) waitLog(pid int, want string, limit time.Duration) {
	j.t.Helper()
	deadline := time.Now().Add(limit)
	for !strings.Contains(j.logOf(pid), want) {
		if time.Now().After(deadline) {
			j.fail("pid %d's log lacks %q within %v; it holds:\n%s", pid, want, limit, j.logOf(pid))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func etKill(t testing.TB, pid int, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatalf("kill -%d %d: %v", sig, pid, err)
	}
}

// The common flags of the single-host tests: np 4, min 2, no joiner in a
// lost rank's place during the test (a joiner would be fine for the
// result, but the tests count final lines). Killed ranks are noticed by
// their broken links, not the heartbeat: its bound stays the default.
var etElasticFlags = []string{"-np", "4", "--min-np", "2", "--blacklist-cooldown", "10m"}

// etHeartbeat is the bound of the tests that freeze or cut off ranks:
// short for a quick test, long enough for no false alarm under -race on a
// busy machine.
const etHeartbeat = 2 * time.Second

// kill -9 of one rank, and of two at once: the others reset, re-run the
// interrupted step and finish with the reference's parameters.
func TestElasticTrainKilledRanks(t *testing.T) {
	for _, tc := range []struct {
		name    string
		victims []int
	}{{"one", []int{2}}, {"two", []int{1, 3}}} {
		t.Run(tc.name, func(t *testing.T) {
			j := etStart(t, etDefault, etElasticFlags...)
			pids := j.pids(4)
			j.waitStep("step 3", time.Minute, func(s etStep) bool { return s.steps >= 3 })
			killed := time.Now()
			for _, r := range tc.victims {
				etKill(t, pids[r], syscall.SIGKILL)
			}
			left := 4 - len(tc.victims)
			// Every survivor resets; with two victims the job may take one
			// or two epochs to lose both.
			resets := j.waitResets(left, 1, time.Minute)
			first := resets[0]
			j.waitOut(fmt.Sprintf("resets to %d ranks", left), time.Minute, func(out string) bool {
				n := 0
				for _, m := range etResetRE.FindAllStringSubmatch(out, -1) {
					if m[4] == strconv.Itoa(left) {
						n++
					}
				}
				return n >= left
			})
			j.open()
			s := j.waitStep(fmt.Sprintf("a step at size %d", left), time.Minute, func(s etStep) bool { return s.size == left })
			j.finish(left)
			for _, r := range tc.victims {
				want := fmt.Sprintf("gorun: rank %d (pid %d) was lost: killed by signal 9 (SIGKILL)", r, pids[r])
				if !strings.Contains(j.err.String(), want) {
					t.Errorf("gorun's stderr lacks %q:\n%s", want, j.err)
				}
			}
			t.Logf("killed rank(s) %v; first reset: %s; first step at size %d completed %v after the kill",
				tc.victims, first[0], left, s.at.Sub(killed).Round(time.Millisecond))
		})
	}
}

// SIGSTOP of a rank: it is lost after the heartbeat bound and the others
// go on; gorun ends the stopped process (the job would otherwise never end).
func TestElasticTrainFrozenRank(t *testing.T) {
	j := etStart(t, etDefault, append(etElasticFlags, "--heartbeat-timeout", etHeartbeat.String())...)
	pids := j.pids(4)
	j.waitStep("step 3", time.Minute, func(s etStep) bool { return s.steps >= 3 })
	victim := pids[1]
	frozen := time.Now()
	etKill(t, victim, syscall.SIGSTOP)
	t.Cleanup(func() { syscall.Kill(victim, syscall.SIGCONT) })
	resets := j.waitResets(3, 1, time.Minute)
	detected := time.Since(frozen)
	for _, m := range resets {
		if m[3] != "4" || m[4] != "3" || m[5] != "1" {
			t.Errorf("reset %q: want 4->3 ranks, lost rank 1", m[0])
		}
	}
	lost := fmt.Sprintf("rank 1 (pid %d) was lost", victim)
	if err := j.err.waitFor(lost, 1, time.Minute, j.done); err != nil {
		j.fail("the frozen rank was not ended: %v", err)
	}
	j.open()
	j.finish(3)
	if log := j.logOf(victim); strings.Contains(log, "final") {
		t.Errorf("the frozen rank finished:\n%s", log)
	}
	t.Logf("frozen rank lost and the others reset %v after SIGSTOP (--heartbeat-timeout %v); gorun said:\n%s",
		detected.Round(time.Millisecond), etHeartbeat, j.err)
}

func etLastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndexByte(s, '\n')+1:]
}

// A rank killed while the job resets from the loss of another: at the
// first sign of the reset (a survivor's step failed: "interrupted"), and
// once the first survivor finished its reset ("reset" line) while others
// may still be in theirs.
func TestElasticTrainKilledDuringReset(t *testing.T) {
	for _, tc := range []struct{ name, trigger string }{{"interrupted", "] interrupted rank="}, {"reset", "] reset rank="}} {
		t.Run(tc.name, func(t *testing.T) {
			j := etStart(t, etDefault, etElasticFlags...)
			pids := j.pids(4)
			j.waitStep("step 3", time.Minute, func(s etStep) bool { return s.steps >= 3 })
			etKill(t, pids[2], syscall.SIGKILL)
			j.waitOut(tc.trigger, time.Minute, func(out string) bool { return strings.Contains(out, tc.trigger) })
			etKill(t, pids[1], syscall.SIGKILL)
			j.waitOut("2 resets to 2 ranks", time.Minute, func(out string) bool {
				n := 0
				for _, m := range etResetRE.FindAllStringSubmatch(out, -1) {
					if m[4] == "2" {
						n++
					}
				}
				return n >= 2
			})
			j.open()
			j.finish(2)
			var resets []string
			lost := map[string]bool{}
			for _, m := range etResetRE.FindAllStringSubmatch(j.out.String(), -1) {
				resets = append(resets, m[0])
				if m[1] == "0" {
					for _, r := range strings.Split(m[5], ",") {
						lost[r] = true
					}
				}
			}
			t.Logf("resets:\n%s", strings.Join(resets, "\n"))
			// Rank 0's resets name both losses, each with its rank at
			// the commit before it (ranks 1 and 2 either way), even when
			// the second loss overtook the first epoch while it formed.
			if len(lost) != 2 || !lost["1"] || !lost["2"] {
				t.Errorf("rank 0's resets report lost ranks %v, want 1 and 2", slices.Sorted(maps.Keys(lost)))
			}
		})
	}
}

// A host added by the discovery script: gorun starts a joiner there, the
// ranks admit it at a commit and give it the state (it starts from other
// parameters), and it ends with everybody else's.
func TestElasticTrainHostJoins(t *testing.T) {
	j := etNewJob(t, etDefault)
	hosts := filepath.Join(j.dir, "hosts")
	script := filepath.Join(j.dir, "discover.sh")
	if err := os.WriteFile(hosts, []byte("localhost:3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(script, []byte("#!/bin/sh\ncat "+hosts+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	j.g = startGorun(t, j.dir, nil, append([]string{"--min-np", "2", "--max-np", "4", "--host-discovery-script", script,
		"--discovery-interval", "200ms"}, j.progArgs()...)...)
	j.out, j.err, j.done = j.g.out, j.g.err, j.g.done
	j.pids(3)
	j.waitStep("step 3", time.Minute, func(s etStep) bool { return s.steps >= 3 && s.size == 3 })
	// Rewritten whole by a rename, as a real script's source would be.
	if err := os.WriteFile(hosts+".new", []byte("localhost:4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(hosts+".new", hosts); err != nil {
		t.Fatal(err)
	}
	resets := j.waitResets(4, 1, time.Minute)
	for _, m := range resets {
		if m[3] != "3" || m[4] != "4" || m[6] != "3" {
			t.Errorf("reset %q: want 3->4 ranks, joined rank 3", m[0])
		}
	}
	j.open()
	j.waitStep("a step at size 4", time.Minute, func(s etStep) bool { return s.size == 4 })
	j.finish(4)
	if !strings.Contains(j.out.String(), "joiner=true") {
		t.Errorf("no joiner started")
	}
	t.Logf("gorun said:\n%s", j.err)
}

// The multi-host tests: gorun and its rendezvous on host 0, ranks on 2 or
// 3 namespace hosts (internal/testenv/netns; skipped without root and namespaces).

// etRemotePIDs lists the elastictrain processes in host h.
func etRemotePIDs(c *netns.Cluster, h *netns.Host, bin string) []int {
	var pids []int
	for _, pid := range c.PIDs(h) {
		if strings.HasPrefix(netns.Cmdline(pid), bin) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func etIP(t testing.TB, c *netns.Cluster, h *netns.Host, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", append([]string{"-n", h.NS}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("ip -n %s %v: %v: %s", h.NS, args, err, out)
	}
}

// A whole host lost: every process in its namespace killed (sshd's
// session processes and gorun's remote wrappers too), and, separately, its
// link cut. The ranks on the other host go on.
func TestElasticTrainMultiHostLost(t *testing.T) {
	for _, how := range []string{"killed", "link cut"} {
		t.Run(strings.ReplaceAll(how, " ", "_"), func(t *testing.T) {
			c := netns.New(t, 2)
			h0, h1 := c.Hosts[0], c.Hosts[1]
			bin := etTrainBin(t)
			j := etStartIn(t, c, h0, etDefault, "-H", fmt.Sprintf("%s:2,%s:2", h0.IP, h1.IP), "--min-np", "2",
				"--blacklist-cooldown", "10m", "--heartbeat-timeout", etHeartbeat.String(), "--grace", "2s")
			j.pids(4)
			j.waitStep("step 3", time.Minute, func(s etStep) bool { return s.steps >= 3 })
			remote := etRemotePIDs(c, h1, bin)
			if len(remote) != 2 {
				j.fail("%d elastictrain processes on %s, want 2", len(remote), h1.IP)
			}
			start := time.Now()
			switch how {
			case "killed":
				for _, pid := range c.PIDs(h1) {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			case "link cut":
				etIP(t, c, h1, "link", "set", "eth0", "down")
			}
			j.waitResets(2, 1, time.Minute)
			took := time.Since(start)
			j.open()
			j.waitOut("2 final lines", time.Minute, func(out string) bool { return len(etFinalRE.FindAllString(out, -1)) >= 2 })
			if how == "link cut" {
				// The cut-off ranks stop by themselves, saying why; then the
				// link comes back so that gorun's ssh sessions can end.
				for _, pid := range remote {
					j.waitLog(pid, "cut off from the rendezvous", time.Minute)
					if log := j.logOf(pid); strings.Contains(log, "final") || strings.Contains(log, "mepoch=1") {
						t.Errorf("cut-off pid %d went on in a job of its own:\n%s", pid, log)
					}
				}
				etIP(t, c, h1, "link", "set", "eth0", "up")
			}
			j.finish(2)
			noneLeft(t, c)
			t.Logf("host %s %s: the ranks on %s reset %v later; gorun exited %v after the cut; it said:\n%s", h1.IP, how, h0.IP, took.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), j.err)
			if how == "link cut" {
				t.Logf("a cut-off rank said: %s", etLastLine(j.logOf(remote[0])))
			}
		})
	}
}

// A partition: host 0, with gorun's rendezvous and 1 rank, is cut off from
// hosts 1 and 2, which still reach each other and hold 2 of the 3 ranks.
// Only the rendezvous' side goes on; the other ranks stop with a clear
// message (CutOffError) and never form a job of their own.
func TestElasticTrainMultiHostPartition(t *testing.T) {
	c := netns.New(t, 3)
	h0, h1, h2 := c.Hosts[0], c.Hosts[1], c.Hosts[2]
	bin := etTrainBin(t)
	j := etStartIn(t, c, h0, etDefault, "-H", fmt.Sprintf("%s:1,%s:1,%s:1", h0.IP, h1.IP, h2.IP), "--min-np", "1",
		"--blacklist-cooldown", "10m", "--heartbeat-timeout", etHeartbeat.String(), "--grace", "2s")
	j.pids(3)
	j.waitStep("step 3", time.Minute, func(s etStep) bool { return s.steps >= 3 })
	var cut []int
	for _, h := range []*netns.Host{h1, h2} {
		cut = append(cut, etRemotePIDs(c, h, bin)...)
	}
	if len(cut) != 2 {
		j.fail("%d elastictrain processes on %s and %s, want 2", len(cut), h1.IP, h2.IP)
	}
	// Blackhole routes both ways between host 0 and the others.
	routes := [][2]*netns.Host{{h0, h1}, {h0, h2}, {h1, h0}, {h2, h0}}
	for _, r := range routes {
		etIP(t, c, r[0], "route", "add", "blackhole", r[1].IP+"/32")
	}
	healed := false
	heal := func() {
		if !healed {
			healed = true
			for _, r := range routes {
				exec.Command("ip", "-n", r[0].NS, "route", "del", "blackhole", r[1].IP+"/32").Run()
			}
		}
	}
	t.Cleanup(heal)
	resets := j.waitResets(1, 1, time.Minute)
	if m := resets[0]; m[4] != "1" {
		t.Errorf("reset %q: want 1 rank left", m[0])
	}
	j.open()
	j.waitOut("1 final line", time.Minute, func(out string) bool { return len(etFinalRE.FindAllString(out, -1)) >= 1 })
	for _, pid := range cut {
		j.waitLog(pid, "cut off from the rendezvous", time.Minute)
		if log := j.logOf(pid); strings.Contains(log, "final") || strings.Contains(log, "mepoch=1") || strings.Contains(log, "reset ") {
			t.Errorf("cut-off pid %d went on in a job of its own:\n%s", pid, log)
		}
	}
	heal()
	j.finish(1)
	noneLeft(t, c)
	t.Logf("the cut-off side said: %s", etLastLine(j.logOf(cut[0])))
}
