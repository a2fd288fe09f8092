package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv/netns"
)

// BenchmarkElasticRecovery measures what a lost rank costs a running
// 4-rank job of internal/testenv/progs/elastictrain (10 ms of compute per step): the
// time from the fault (kill -9, or SIGSTOP, of rank 2) to the job's next
// completed step, on one host and on 2 namespace hosts (2 ranks each, the
// victim on the remote one), elastic (gorun --min-np 2, default 3 s
// heartbeat bound) and on the restart path (gorun --max-restarts 1, the
// same job restoring from a disk checkpoint saved every 10 steps).
//
//	s/recovery  fault to the first step completed without the victim
//	            (elastic: in the new membership epoch; restart: by the
//	            relaunched job)
//	s/regain    fault to the completion of the step the fault
//	            interrupted: the restart path also re-does the steps
//	            since its last checkpoint
//
// SIGTERM is a graceful leave (the victim leaves at its next commit, no
// step is re-run): there, recovery is the time to the next completed step
// (the job does not stop), and regain the time to the first step
// completed without the victim.
//
// Run it with go test -run '^$' -bench ElasticRecovery -benchtime 3x
// ./e2e/ (as root for the 2-host rows; they are skipped without
// network namespaces). It prints a table at the end.
func BenchmarkElasticRecovery(b *testing.B) {
	type row struct {
		hosts          int
		fault          string // "kill -9" or "SIGSTOP"
		path           string // "elastic" or "restart"
		recov, regain  []time.Duration
		skipped        string
		heartbeatBound time.Duration
	}
	var rows []*row
	for _, hosts := range []int{1, 2} {
		for _, c := range []struct{ fault, path string }{{"kill -9", "elastic"}, {"SIGSTOP", "elastic"}, {"SIGTERM", "elastic"}, {"kill -9", "restart"}} {
			r := &row{hosts: hosts, fault: c.fault, path: c.path, heartbeatBound: 3 * time.Second}
			rows = append(rows, r)
			name := fmt.Sprintf("%dhost/%s/%s", hosts, strings.ReplaceAll(strings.ReplaceAll(c.fault, " ", ""), "-", ""), c.path)
			b.Run(name, func(b *testing.B) {
				var cl *netns.Cluster
				if hosts > 1 {
					if why := netns.Unavailable(); why != "" {
						r.skipped = why
						b.Skip(why)
					}
					cl = netns.New(b, 2)
				}
				r.recov, r.regain = nil, nil
				for range b.N {
					rec, reg := etRecoverOnce(b, cl, c.fault, c.path)
					r.recov = append(r.recov, rec)
					r.regain = append(r.regain, reg)
				}
				b.ReportMetric(etMean(r.recov).Seconds(), "s/recovery")
				b.ReportMetric(etMean(r.regain).Seconds(), "s/regain")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
	var t strings.Builder
	fmt.Fprintf(&t, "\nElastic recovery at np=4 (time from the fault to the next completed step; regain: to the completion of the interrupted step)\n")
	fmt.Fprintf(&t, "%-8s %-8s %-26s %-26s %-26s %s\n", "hosts", "fault", "path", "recovery mean (min-max)", "regain mean (min-max)", "runs")
	elastic := map[string]time.Duration{}
	for _, r := range rows {
		path := "elastic (--min-np 2)"
		if r.path == "restart" {
			path = "--max-restarts 1, ckpt/10"
		}
		if r.skipped != "" || len(r.recov) == 0 {
			fmt.Fprintf(&t, "%-8d %-8s %-26s skipped: %s\n", r.hosts, r.fault, path, r.skipped)
			continue
		}
		span := func(d []time.Duration) string {
			return fmt.Sprintf("%.3fs (%.3f-%.3f)", etMean(d).Seconds(), slices.Min(d).Seconds(), slices.Max(d).Seconds())
		}
		fmt.Fprintf(&t, "%-8d %-8s %-26s %-26s %-26s %d", r.hosts, r.fault, path, span(r.recov), span(r.regain), len(r.recov))
		key := fmt.Sprint(r.hosts, r.fault)
		switch {
		case r.path == "elastic":
			elastic[key] = etMean(r.recov)
		case elastic[key] > 0:
			fmt.Fprintf(&t, "   restart/elastic: %.1fx (recovery), %.1fx (regain)", float64(etMean(r.recov))/float64(elastic[key]), float64(etMean(r.regain))/float64(elastic[key]))
		}
		t.WriteString("\n")
	}
	fmt.Fprintf(&t, "Goals: kill -9 on one host <= 1s; SIGSTOP <= heartbeat bound (3s) + 1s; SIGTERM: next step <= one step (10ms) + 100ms, no step re-run; restart path >= 10x slower.\n")
	fmt.Print(t.String())
}

func etMean(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	var s time.Duration
	for _, x := range d {
		s += x
	}
	return s / time.Duration(len(d))
}

// etBenchConfig runs long enough (about 40 epochs of 32 steps of 10 ms)
// for any fault; the benchmark stops it once it has its figure.
var etBenchConfig = etConfig{epochs: 40, length: 256, batch: 8, gateStep: -1, delay: 10 * time.Millisecond}

// etRecoverOnce runs one job, faults rank 2 once it runs steadily, and
// returns the time to the next completed step and to the completion of the
// interrupted step.
func etRecoverOnce(b *testing.B, cl *netns.Cluster, fault, path string) (recovery, regain time.Duration) {
	b.Helper()
	j := etNewJob(b, etBenchConfig)
	gorunArgs := []string{"-np", "4", "--min-np", "2", "--blacklist-cooldown", "10m"}
	var prog []string
	if path == "restart" {
		gorunArgs = []string{"-np", "4", "--max-restarts", "1", "--grace", "2s"}
		prog = []string{"-ckpt-dir", filepath.Join(j.dir, "ckpt"), "-ckpt-every", "10"}
	}
	var cmd *exec.Cmd
	if cl == nil {
		cmd = exec.Command(gorunBin, append(gorunArgs, j.progArgs(prog...)...)...)
	} else {
		h0, h1 := cl.Hosts[0], cl.Hosts[1]
		full := append([]string{"--ssh-identity-file", cl.Key, "-H", fmt.Sprintf("%s:2,%s:2", h0.IP, h1.IP)}, gorunArgs...)
		cmd = cl.Command(h0, gorunBin, append(full, j.progArgs(prog...)...)...)
		cmd.Env = append(os.Environ(), "GORUN_SSH_OPTS="+cl.SSHOpts())
	}
	j.run(cmd)
	pids := j.pids(4)
	j.waitStep("step 20", time.Minute, func(s etStep) bool { return s.steps >= 20 })
	victim := pids[2]
	sig := syscall.SIGKILL
	if fault == "SIGSTOP" {
		sig = syscall.SIGSTOP
		defer syscall.Kill(victim, syscall.SIGCONT)
	}
	if fault == "SIGTERM" {
		t0 := time.Now()
		etKill(b, victim, syscall.SIGTERM)
		next := j.waitStep("a step after SIGTERM", 2*time.Minute, func(s etStep) bool { return s.at.After(t0) })
		without := j.waitStep("a step without the victim", 2*time.Minute, func(s etStep) bool { return s.mepoch >= 1 })
		steps := etSteps(j.out.String())
		for i := 1; i < len(steps); i++ {
			if steps[i].steps <= steps[i-1].steps {
				b.Errorf("step %d printed after step %d: a graceful leave re-ran a step", steps[i].steps, steps[i-1].steps)
			}
		}
		j.stop()
		j.noneLeft()
		return next.at.Sub(t0), without.at.Sub(t0)
	}
	t0 := time.Now()
	etKill(b, victim, sig)
	after := func(s etStep) bool {
		if path == "restart" {
			return s.gen == 1
		}
		return s.mepoch >= 1
	}
	first := j.waitStep("a step after the fault", 2*time.Minute, after)
	// The last step done before the fault: the next one is the one it
	// interrupted.
	done := 0
	for _, s := range etSteps(j.out.String()) {
		if !after(s) && s.at.Before(t0) {
			done = max(done, s.steps)
		}
	}
	again := j.waitStep(fmt.Sprintf("step %d after the fault", done+1), 2*time.Minute, func(s etStep) bool { return after(s) && s.steps > done })
	if fault == "SIGSTOP" {
		syscall.Kill(victim, syscall.SIGCONT)
	}
	j.stop()
	j.noneLeft()
	return first.at.Sub(t0), again.at.Sub(t0)
}
