package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/gorun/gorun/launcher"
)

// isElastic says whether the flags ask for an elastic job: --min-np below
// -np, --max-np above it, or a host discovery script. (-np may still
// change with a discovery script: validate calls it again after.)
func (f *runFlags) isElastic() bool {
	return f.discovery != "" || f.minNP > 0 && f.minNP < f.np || f.maxNP > f.np
}

// checkElasticFlags checks what can be checked of the elastic flags before
// the hosts are known; it also makes the discovery script's path absolute.
func (f *runFlags) checkElasticFlags(fl *pflag.FlagSet) error {
	if fl.Changed("min-np") && f.minNP < 1 || f.minNP < 0 {
		return fmt.Errorf("--min-np must be at least 1, got %d", f.minNP)
	}
	if fl.Changed("max-np") && f.maxNP < 1 || f.maxNP < 0 {
		return fmt.Errorf("--max-np must be at least 1, got %d", f.maxNP)
	}
	if f.minNP > 0 && f.maxNP > 0 && f.minNP > f.maxNP {
		return fmt.Errorf("--min-np %d is above --max-np %d: the job could never have enough ranks; swap them", f.minNP, f.maxNP)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--discovery-interval", f.discoveryInterval}, {"--elastic-timeout", f.elasticTimeout}, {"--heartbeat-timeout", f.heartbeatTimeout}} {
		if d.v <= 0 {
			return fmt.Errorf("%s must be a positive duration such as 3s, got %v", d.name, d.v)
		}
	}
	if f.heartbeatTimeout < 100*time.Millisecond {
		return fmt.Errorf("--heartbeat-timeout %v is too short for a rank to answer in (pings go out every quarter of it, and a GC pause must not look like a lost rank): use at least 100ms (the default, 3s, is safe on a loaded machine)", f.heartbeatTimeout)
	}
	if _, _, err := parseCooldown(f.cooldown); err != nil {
		return err
	}
	if r := f.rdzvReplicas; r != 1 && r != 3 && r != 5 {
		return fmt.Errorf("--rdzv-replicas must be 1 (gorun's rendezvous alone), 3 or 5 (a group that survives losing 1 or 2 of them), got %d", r)
	}
	if err := f.checkRdzvBackend(fl); err != nil {
		return err
	}
	if f.jobKeyFile != "" {
		path, err := filepath.Abs(f.jobKeyFile)
		if err != nil {
			return err
		}
		f.jobKeyFile = path
	}
	if f.discovery != "" {
		path, err := discoveryPath(f.discovery)
		if err != nil {
			return err
		}
		f.discovery = path
	}
	return nil
}

// discoveryPath finds the discovery script: a path, or a name on PATH. It
// must be an executable file.
func discoveryPath(script string) (string, error) {
	path := script
	if !strings.Contains(script, "/") {
		p, err := exec.LookPath(script)
		if err != nil {
			return "", fmt.Errorf("--host-discovery-script %s: not found on PATH; give its path, e.g. ./%s", script, script)
		}
		path = p
	}
	st, err := os.Stat(path)
	switch {
	case err != nil:
		return "", fmt.Errorf("--host-discovery-script: %v", err)
	case st.IsDir():
		return "", fmt.Errorf("--host-discovery-script %s is a directory: give the script's path", script)
	case st.Mode().Perm()&0o111 == 0:
		return "", fmt.Errorf("--host-discovery-script %s is not executable: chmod +x %s (it must print one host:slots line per host)", script, script)
	}
	return filepath.Abs(path)
}

// parseCooldown reads --blacklist-cooldown: MIN[,MAX], Go durations or
// plain seconds as in Horovod's --blacklist-cooldown-range 10 100; MAX
// defaults to 10×MIN.
func parseCooldown(s string) (base, limit time.Duration, err error) {
	bad := func(why string) error {
		return fmt.Errorf("--blacklist-cooldown %q: %s: write MIN[,MAX], e.g. 10s,100s (a host's cooldown starts at MIN and doubles with each failure in a row, up to MAX)", s, why)
	}
	parse := func(v string) (time.Duration, error) {
		v = strings.TrimSpace(v)
		if secs, err := strconv.ParseFloat(v, 64); err == nil {
			return time.Duration(secs * float64(time.Second)), nil
		}
		return time.ParseDuration(v)
	}
	a, b, hasMax := strings.Cut(s, ",")
	if base, err = parse(a); err != nil || base <= 0 {
		return 0, 0, bad(fmt.Sprintf("%q is not a positive duration", a))
	}
	limit = 10 * base
	if hasMax {
		if limit, err = parse(b); err != nil || limit <= 0 {
			return 0, 0, bad(fmt.Sprintf("%q is not a positive duration", b))
		}
		if limit < base {
			return 0, 0, bad("MAX is below MIN")
		}
	}
	return base, limit, nil
}

// elastic returns the job's elastic settings once -np is known, nil for a
// fixed-size job (which must not be given elastic-only flags).
func (f *runFlags) elastic(fl *pflag.FlagSet) (*launcher.Elastic, error) {
	if f.minNP > f.np && f.discovery != "" && !fl.Changed("np") {
		// -np came from the script's slots: say so, not "raise -np".
		return nil, fmt.Errorf("--min-np %d is above the %d slot%s --host-discovery-script %s lists: the job could never start; list more slots, or lower --min-np", f.minNP, f.np, plural(f.np), f.discovery)
	}
	if f.minNP > f.np {
		return nil, fmt.Errorf("--min-np %d is above -np %d: the job could never start; lower --min-np or raise -np", f.minNP, f.np)
	}
	if f.maxNP > 0 && f.maxNP < f.np {
		return nil, fmt.Errorf("--max-np %d is below -np %d: the job starts with -np ranks; raise --max-np or lower -np", f.maxNP, f.np)
	}
	if !f.isElastic() {
		for _, c := range []struct {
			name string
			set  bool
		}{
			{"--discovery-interval", fl.Changed("discovery-interval")},
			{"--elastic-timeout", fl.Changed("elastic-timeout")},
			{"--heartbeat-timeout", fl.Changed("heartbeat-timeout")},
			{"--blacklist-cooldown", fl.Changed("blacklist-cooldown")},
			{"--job-key-file", fl.Changed("job-key-file")},
			{"--rdzv-replicas", fl.Changed("rdzv-replicas")},
			{"--rdzv-backend", fl.Changed("rdzv-backend")},
			{"--rdzv-endpoints", fl.Changed("rdzv-endpoints")},
			{"--rdzv-id", fl.Changed("rdzv-id")},
			{"--rdzv-conf", fl.Changed("rdzv-conf")},
		} {
			if c.set {
				return nil, fmt.Errorf("%s applies to elastic jobs only: make the job elastic with --min-np below -np (%d), --max-np above it, or --host-discovery-script", c.name, f.np)
			}
		}
		return nil, nil
	}
	minNP := f.minNP
	if minNP == 0 {
		minNP = f.np
	}
	base, limit, err := parseCooldown(f.cooldown)
	if err != nil {
		return nil, err
	}
	etcd, err := f.etcdGroup()
	if err != nil {
		return nil, err
	}
	return &launcher.Elastic{
		MinNP: minNP, MaxNP: f.maxNP, DiscoveryScript: f.discovery,
		DiscoveryInterval: f.discoveryInterval, Timeout: f.elasticTimeout, HeartbeatTimeout: f.heartbeatTimeout,
		CooldownBase: base, CooldownMax: limit, JobKeyFile: f.jobKeyFile, Replicas: f.rdzvReplicas,
		Etcd: etcd,
	}, nil
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
