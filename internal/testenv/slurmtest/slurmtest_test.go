package slurmtest

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// The cluster runs a two-node job step, each task on its own node under the
// node's host name, and leaves nothing behind.
func TestSlurmCluster(t *testing.T) {
	c := New(t, 2)
	out := c.Run(t, c.Nodes[0], 30*time.Second, "srun", "-N", "2", "-n", "2", "-w", "node[1-2]", "sh", "-c", `echo "$SLURM_PROCID $(cat /proc/sys/kernel/hostname) $SLURM_STEP_NODELIST"`)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	slices.Sort(lines)
	if want := []string{"0 node1 node[1-2]", "1 node2 node[1-2]"}; !slices.Equal(lines, want) {
		t.Fatalf("srun printed %q, want %q\n%s", lines, want, c.Logs())
	}
	c.NoneLeft(t, 10*time.Second)
}
