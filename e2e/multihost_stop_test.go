package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv/netns"
)

// A frozen rank on a remote host (SIGSTOP) is stopped as soon as the job
// fails: the remote wrapper wakes it with SIGCONT along with SIGTERM, rather
// than wait --grace to SIGKILL it.
func TestMultiHostFrozenRankStopsWithoutWaitingForGrace(t *testing.T) {
	const grace = 90 * time.Second
	c := netns.New(t, 2)
	h0, h1 := c.Hosts[0], c.Hosts[1]
	stdout, stderr, code, took := gorunIn(t, c, h0, []string{"TESTPROG_MODE=freeze", "TESTPROG_VICTIM=2"}, 3*time.Minute,
		"-H", fmt.Sprintf("%s:1,%s:2", h0.IP, h1.IP), "--timeout", "4s", "--grace", grace.String(), testprogBin)
	if code == 0 {
		t.Errorf("exit 0 although rank 2 froze\nstdout:\n%s\nstderr:\n%s", stdout, stderr)
	}
	if took > grace/2 {
		t.Errorf("gorun took %v with --grace %v: the remote frozen rank waited for SIGKILL\nstderr:\n%s", took.Round(time.Millisecond), grace, stderr)
	}
	t.Logf("job with a frozen remote rank ended after %v (--grace %v)", took.Round(time.Millisecond), grace)
	noneLeft(t, c)
}
