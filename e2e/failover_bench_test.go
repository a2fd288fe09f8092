package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// BenchmarkFailover measures the replicated rendezvous (--rdzv-replicas 3)
// on 3 namespace hosts, np 4 (rank 0 with gorun on host 0, ranks 1 and 2
// on host 1, rank 3 on host 2), elastictrain with 20 ms of compute per
// step, heartbeat bound 2 s:
//
//	s/recovery   from cutting the link of host 1, whose rank 1 hosts the
//	             leading replica, to the first step rank 0 completes in a
//	             new membership epoch
//	ms/step      the mean step of a job without faults, steps 4 to 20 of
//	             its first epoch, with 3 replicas and with gorun's
//	             rendezvous alone, alternated run by run so that both see
//	             the same load; step-ratio is 3 replicas over alone
//
// Run it with go test -run '^$' -bench Failover -benchtime 3x ./e2e/ (as
// root: it needs network namespaces).
func BenchmarkFailover(b *testing.B) {
	b.Run("leader-host-loss", func(b *testing.B) {
		var took []time.Duration
		for range b.N {
			j, c := failoverJob(b)
			j.waitStep("step 3", time.Minute, func(s etStep) bool { return s.steps >= 3 })
			cut := time.Now()
			etIP(b, c, c.Hosts[1], "link", "set", "eth0", "down")
			s := j.waitStep("a step of a new epoch", time.Minute, func(s etStep) bool { return s.mepoch >= 1 })
			took = append(took, s.at.Sub(cut))
			j.open()
			etIP(b, c, c.Hosts[1], "link", "set", "eth0", "up")
			j.stop()
		}
		b.ReportMetric(median(took).Seconds(), "s/recovery")
		b.Logf("leader's host cut off: next step after %v (runs: %v)", median(took).Round(time.Millisecond), took)
	})
	b.Run("step-cost", func(b *testing.B) {
		cfg := etDefault
		cfg.gateStep = 24
		per := map[int][]time.Duration{}
		for range b.N {
			for _, replicas := range []int{1, 3} {
				j, _ := failoverJobOf(b, cfg, replicas)
				j.waitStep("step 20", time.Minute, func(s etStep) bool { return s.steps >= 20 })
				var at []time.Time
				for _, s := range etSteps(j.out.String()) {
					if s.mepoch == 0 && s.epoch == 0 && s.steps >= 4 && s.steps <= 20 {
						at = append(at, s.at)
					}
				}
				slices.SortFunc(at, func(x, y time.Time) int { return x.Compare(y) })
				if len(at) < 2 {
					b.Fatalf("%d step lines between steps 4 and 20", len(at))
				}
				per[replicas] = append(per[replicas], at[len(at)-1].Sub(at[0])/time.Duration(len(at)-1))
				j.open()
				j.stop()
			}
		}
		alone, group := median(per[1]), median(per[3])
		b.ReportMetric(float64(alone.Microseconds())/1000, "ms/step-alone")
		b.ReportMetric(float64(group.Microseconds())/1000, "ms/step-3-replicas")
		b.ReportMetric(float64(group)/float64(alone), "step-ratio")
		b.Logf("%s", fmt.Sprintf("mean step: alone %v, 3 replicas %v (runs: %v, %v)", alone, group, per[1], per[3]))
	})
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}
