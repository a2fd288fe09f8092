package e2e

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// Failover: no single process or host may end the job (issue 28). These
// tests select with -run Failover.

// gorun, which hosts the rendezvous, stopped (SIGSTOP, a debugger, a
// swapping host) for less than the heartbeat bound: the ranks' control
// streams stay within their deadline, so nothing happens: no epoch, no
// loss, the uninterrupted run's parameters.
func TestFailoverGorunPausedWithinHeartbeat(t *testing.T) {
	const heartbeat, pause = 4 * time.Second, time.Second
	j := etStart(t, etDefault, append(etElasticFlags, "--heartbeat-timeout", heartbeat.String())...)
	j.pids(4)
	j.waitStep("step 2", time.Minute, func(s etStep) bool { return s.steps >= 2 })
	pid := j.g.cmd.Process.Pid
	etKill(t, pid, syscall.SIGSTOP)
	// The pause is the fault under test, not a wait for anything.
	time.Sleep(pause)
	etKill(t, pid, syscall.SIGCONT)
	j.open()
	j.finish(4)
	if resets := etResetRE.FindAllString(j.out.String(), -1); len(resets) > 0 {
		t.Errorf("the ranks reset after gorun paused %v (heartbeat bound %v): %q", pause, heartbeat, resets)
	}
	if errOut := j.err.String(); strings.Contains(errOut, "membership epoch") || strings.Contains(errOut, " was lost") {
		t.Errorf("gorun's pause changed the membership:\n%s", errOut)
	}
}
