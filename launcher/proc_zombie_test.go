package launcher

import (
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"
)

// A process that ended and waits to be reaped is seen as ended; a running
// one (this test) is not.
func TestExitedUnreaped(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc is Linux's")
	}
	if exitedUnreaped(os.Getpid()) {
		t.Fatal("this running test counts as ended")
	}
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	// Not reaped until Wait: a zombie once it exited. Poll /proc until
	// then (the exit is the child's to make; nothing to wait on).
	deadline := time.Now().Add(10 * time.Second)
	for !exitedUnreaped(pid) {
		if time.Now().After(deadline) {
			cmd.Wait()
			t.Fatalf("pid %d: not seen as ended, unreaped, within 10s", pid)
		}
		time.Sleep(time.Millisecond)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
}
