package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Graceful leaves with real processes (internal/testenv/progs/elastictrain leaves on
// SIGTERM at its next commit, as collective.Comm.LeaveOnSignal does): the
// others go on from that commit, and no collective of theirs fails, so no
// step is run again.

// etLeftRE is elastictrain's line when it left the job.
var etLeftRE = regexp.MustCompile(`(?m)^\[[^\]]+\] left rank=(\d+) steps=(\d+) why=(\S+)$`)

// checkLeft checks what a job that lost ranks only by graceful leaves
// printed: a left line per leaver, no survivor interrupted (a collective
// failed: a step would be run again), and gorun's line for each.
func (j *etJob) checkLeft(leavers int) {
	j.t.Helper()
	out, errOut := j.out.String(), j.err.String()
	if n := len(etLeftRE.FindAllString(out, -1)); n != leavers {
		j.t.Errorf("%d left lines, want %d", n, leavers)
	}
	if strings.Contains(out, "] interrupted ") {
		j.t.Errorf("a rank's step was interrupted: a graceful leave must not fail any collective (nor re-run a step)")
	}
	if n := strings.Count(errOut, " left the job (SIGTERM): "); n != leavers {
		j.t.Errorf("gorun said %d times that a rank left the job (SIGTERM), want %d", n, leavers)
	}
	if strings.Contains(errOut, " was lost") {
		j.t.Errorf("gorun called a graceful leave a loss")
	}
}

// SIGTERM to each rank in turn (rank 0 included), at a random step: it
// leaves at its next commit, handing its state over, and the job goes on
// from there with 3 ranks, with no step run again, to the uninterrupted
// run's parameters.
func TestElasticTrainSIGTERMLeaves(t *testing.T) {
	for victim := range 4 {
		t.Run(fmt.Sprintf("rank %d", victim), func(t *testing.T) {
			j := etStart(t, etDefault, etElasticFlags...)
			pids := j.pids(4)
			at := 1 + rand.IntN(8)
			j.waitStep(fmt.Sprintf("step %d", at), time.Minute, func(s etStep) bool { return s.steps >= at })
			etKill(t, pids[victim], syscall.SIGTERM)
			resets := j.waitResets(3, 1, time.Minute)
			out := j.waitOut("the left line", time.Minute, func(out string) bool { return etLeftRE.MatchString(out) })
			left := etLeftRE.FindStringSubmatch(out)
			for _, m := range resets {
				if m[3] != "4" || m[4] != "3" || m[5] != strconv.Itoa(victim) {
					t.Errorf("reset %q: want 4->3 ranks, lost rank %d", m[0], victim)
				}
			}
			if left[1] != strconv.Itoa(victim) || left[3] != "SIGTERM" {
				t.Errorf("left line %q: want rank %d, SIGTERM", left[0], victim)
			}
			j.open()
			j.finish(3)
			j.checkLeft(1)
			want := fmt.Sprintf("gorun: rank %d (pid %d) left the job (SIGTERM): the job goes on with 3 ranks; no step lost", victim, pids[victim])
			if !strings.Contains(j.err.String(), want) {
				t.Errorf("gorun's stderr lacks %q", want)
			}
			t.Logf("SIGTERM after step %d; rank %d left after step %s", at, victim, left[2])
		})
	}
}

// A discovery script that grows the job and then shrinks it: gorun stops
// the ranks beyond the slots it lists with SIGTERM, they leave at a
// commit, and the job goes on with no step run again.
func TestElasticTrainDiscoveryShrinks(t *testing.T) {
	j := etNewJob(t, etDefault)
	hosts := filepath.Join(j.dir, "hosts")
	script := filepath.Join(j.dir, "discover.sh")
	write := func(list string) {
		t.Helper()
		// Rewritten whole by a rename, as a real script's source would be.
		if err := os.WriteFile(hosts+".new", []byte(list), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(hosts+".new", hosts); err != nil {
			t.Fatal(err)
		}
	}
	write("localhost:2\n")
	if err := os.WriteFile(script, []byte("#!/bin/sh\ncat "+hosts+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	j.g = startGorun(t, j.dir, nil, append([]string{"--min-np", "1", "--host-discovery-script", script,
		"--discovery-interval", "200ms"}, j.progArgs()...)...)
	j.out, j.err, j.done = j.g.out, j.g.err, j.g.done
	j.pids(2)
	j.waitStep("step 2", time.Minute, func(s etStep) bool { return s.steps >= 2 })
	write("localhost:4\n")
	j.waitResets(4, 1, time.Minute)
	// The job waits at its gate (etDefault), committing: the leaves
	// happen there.
	write("localhost:1\n")
	j.waitOut("3 left lines", time.Minute, func(out string) bool { return len(etLeftRE.FindAllString(out, -1)) == 3 })
	j.open()
	j.waitStep("a step at size 1", time.Minute, func(s etStep) bool { return s.size == 1 })
	j.finish(1)
	j.checkLeft(3)
	t.Logf("gorun said:\n%s", j.err)
}
