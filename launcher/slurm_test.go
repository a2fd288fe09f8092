package launcher

import (
	"slices"
	"strings"
	"testing"
)

func TestSlurmAllocation(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	for _, tc := range []struct {
		name    string
		getenv  func(string) string
		want    []Host
		inAlloc bool
		err     string
	}{
		{"outside", env(), nil, false, ""},
		{"tasks per node", env("SLURM_JOB_ID", "7", "SLURM_JOB_NODELIST", "node[01-03]", "SLURM_TASKS_PER_NODE", "2(x2),1"),
			[]Host{{"node01", 2}, {"node02", 2}, {"node03", 1}}, true, ""},
		{"cpus when no tasks", env("SLURM_JOB_ID", "7", "SLURM_JOB_NODELIST", "a1,b[2,4]", "SLURM_JOB_CPUS_PER_NODE", "4(x3)"),
			[]Host{{"a1", 4}, {"b2", 4}, {"b4", 4}}, true, ""},
		{"a node without a task", env("SLURM_JOB_ID", "7", "SLURM_JOB_NODELIST", "n[1-2]", "SLURM_TASKS_PER_NODE", "3,0"),
			[]Host{{"n1", 3}}, true, ""},
		{"count mismatch", env("SLURM_JOB_ID", "7", "SLURM_JOB_NODELIST", "n[1-3]", "SLURM_TASKS_PER_NODE", "2(x2)"),
			nil, true, "SLURM_TASKS_PER_NODE=2(x2) gives 2 counts for the 3 nodes"},
		{"bad list", env("SLURM_JOB_ID", "7", "SLURM_JOB_NODELIST", "n[3-1]", "SLURM_TASKS_PER_NODE", "1"),
			nil, true, "SLURM_JOB_NODELIST"},
		{"no counts", env("SLURM_JOB_ID", "7", "SLURM_JOB_NODELIST", "n1"),
			nil, true, "cannot tell the slots of n1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hosts, inAlloc, err := SlurmAllocation(tc.getenv)
			if inAlloc != tc.inAlloc || !slices.Equal(hosts, tc.want) {
				t.Errorf("got %v, in allocation %v; want %v, %v", hosts, inAlloc, tc.want, tc.inAlloc)
			}
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("error %v, want one containing %q", err, tc.err)
			}
		})
	}
}

// Under srun, a rank is a one-task step on its host, and the command line
// gorun hands ssh is the last argument, run by the shell that sets
// SSH_CONNECTION; the failure message names srun.
func TestSlurmSrunArgs(t *testing.T) {
	s := SSH{Port: 2222, Srun: &Srun{Options: []string{"--partition=gpu"}}}
	args := s.args("node2")
	if s.command() != "srun" || !slices.Contains(args, "--nodelist=node2") || !slices.Contains(args, "--overlap") ||
		!slices.Contains(args, "--partition=gpu") || slices.Contains(args, "2222") {
		t.Errorf("srun %q", args)
	}
	if n := len(args); args[n-3] != "sh" || args[n-2] != "-c" || args[n-1] != srunShell {
		t.Errorf("srun's command does not end in sh -c srunShell: %q", args)
	}
	// Quiet twice for a rank (no "task 0: Exited with exit code" line),
	// once for the check (srun's errors say why a host is unreachable).
	if q := strings.Count(strings.Join(args, " "), "--quiet"); q != 2 {
		t.Errorf("rank's srun has --quiet %d times, want 2: %q", q, args)
	}
	check := s.checkArgs("node2")
	if q := strings.Count(strings.Join(check, " "), "--quiet"); q != 1 || !slices.Contains(check, "--immediate=10") {
		t.Errorf("check's srun has --quiet %d times (want 1), and --immediate=10 (SSH's default connect timeout)?: %q", q, check)
	}
	he := &HostError{Hosts: []string{"node2"}, Errors: []string{"srun: error: Invalid node name specified"}, Via: s.via()}
	if want := "cannot reach host node2 over srun: srun: error: Invalid node name specified"; !strings.Contains(he.Error(), want) {
		t.Errorf("%q lacks %q", he.Error(), want)
	}
}
