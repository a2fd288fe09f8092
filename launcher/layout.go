// Where the ranks of a job run: their hosts and places there, the check
// that the remote hosts can be reached, and the address the rendezvous
// listens on.

package launcher

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// makeLayout places job's ranks on its hosts (localhost if none), checks
// the remote hosts over ssh and picks the address the rendezvous listens
// on. It may set job.WorkDir.
// spansHosts reports whether ranks run on other hosts than gorun's.
func (l *layout) spansHosts() bool { return slices.Contains(l.remote, true) }

func makeLayout(ctx context.Context, job *Job) (*layout, error) {
	if len(job.Hosts) == 0 {
		job.Hosts = []Host{{Name: "localhost", Slots: job.NP}}
	}
	pl, err := place(job.Hosts, job.NP)
	if err != nil {
		return nil, err
	}
	lay := &layout{hosts: job.Hosts, pl: pl, remote: make([]bool, len(job.Hosts))}
	// Only hosts that get a rank take part.
	var remotes []string
	for i, h := range job.Hosts {
		if pl.localSize[i] > 0 && !IsLocalHost(h.Name) {
			lay.remote[i] = true
			remotes = append(remotes, h.Name)
		}
		if pl.localSize[i] > 0 {
			lay.used++
		}
	}
	lay.listenIP = "127.0.0.1"
	if len(remotes) == 0 && job.Elastic != nil && job.Elastic.DiscoveryScript != "" && job.NetworkInterface != "" {
		// Remote hosts may come later from the script: they must reach
		// the rendezvous.
		if lay.listenIP, err = interfaceIP(job.NetworkInterface); err != nil {
			return nil, err
		}
		if job.WorkDir == "" {
			if job.WorkDir, err = os.Getwd(); err != nil {
				return nil, err
			}
		}
	}
	if len(remotes) > 0 {
		if job.WorkDir == "" {
			if job.WorkDir, err = os.Getwd(); err != nil {
				return nil, err
			}
		}
		if job.Verbose {
			job.Logf("checking that %s can be reached over %s", strings.Join(remotes, ", "), job.SSH.via())
		}
		t0 := time.Now()
		infos, err := checkHosts(ctx, job.SSH, remotes)
		if err != nil {
			return nil, err
		}
		if job.Verbose {
			job.Logf("all %d remote hosts reachable (%v)", len(remotes), time.Since(t0).Round(time.Millisecond))
		}
		var why string
		if job.NetworkInterface != "" {
			lay.listenIP, err = interfaceIP(job.NetworkInterface)
			why = "--network-interface " + job.NetworkInterface
		} else {
			lay.listenIP, why, err = chooseLauncherIP(infos, remotes)
		}
		if err != nil {
			return nil, err
		}
		if job.Verbose {
			job.Logf("rendezvous and local ranks use %s (%s); remote ranks listen on the address their host reaches it from", lay.listenIP, why)
		}
	}
	return lay, nil
}

// layout is where the ranks of a job run.
type layout struct {
	hosts    []Host
	pl       placement
	remote   []bool // per host: reached with ssh
	used     int    // hosts with at least one rank
	listenIP string // rendezvous and local ranks
}

func (l *layout) multiHost() bool { return l.used > 1 }

// labels are the output prefixes: "rank" on one host, "host:rank" on more.
func (l *layout) labels() []string {
	out := make([]string, len(l.pl.host))
	for r := range out {
		if l.multiHost() {
			out[r] = l.hosts[l.pl.host[r]].Name + ":" + strconv.Itoa(r)
		} else {
			out[r] = strconv.Itoa(r)
		}
	}
	return out
}

// rankHosts is each rank's host on a job of many hosts, else "" for all.
func (l *layout) rankHosts() []string {
	out := make([]string, len(l.pl.host))
	if l.multiHost() {
		for r := range out {
			out[r] = l.hosts[l.pl.host[r]].Name
		}
	}
	return out
}

// rediscover runs the discovery script again and lays the job out on the
// hosts it lists: np ranks (the job's -np), or as many as it lists slots
// if fewer (never below --min-np). job is changed only if that works.
func rediscover(ctx context.Context, job *Job, np int) (*layout, error) {
	e := job.Elastic
	hosts, err := Discover(ctx, e.DiscoveryScript, e.DiscoveryTimeout)
	if err != nil {
		return nil, err
	}
	j := *job
	j.Hosts = hosts
	j.NP = min(np, TotalSlots(hosts))
	if j.NP < max(e.MinNP, 1) {
		return nil, fmt.Errorf("it lists %s, %d slots, below --min-np %d", FormatHosts(hosts), TotalSlots(hosts), max(e.MinNP, 1))
	}
	lay, err := makeLayout(ctx, &j)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(hosts, job.Hosts) {
		job.Logf("restarting on the hosts --host-discovery-script lists now: %s, %d rank%s (was %s)", FormatHosts(hosts), j.NP, plural(j.NP), FormatHosts(job.Hosts))
	}
	*job = j
	return lay, nil
}
