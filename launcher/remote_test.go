package launcher

import (
	"bufio"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The remote wrapper, run here by sh as ssh would run it on a remote host,
// stops a rank that is itself stopped (SIGSTOP) at once, not at SIGKILL
// after the grace period.
func TestWrapperStopsAFrozenRankWithoutWaitingForGrace(t *testing.T) {
	const grace = 60 * time.Second
	cmd := exec.Command("sh", "-c", remoteCommand(grace, "127.0.0.1", t.TempDir(), "sh", []string{"-c", "echo $$; kill -STOP $$; exec sleep 300"}))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	rankPID := 0
	t.Cleanup(func() {
		if rankPID > 0 {
			syscall.Kill(-rankPID, syscall.SIGKILL)
		}
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	})
	block, err := envBlock([]string{"GORUN_RANK=0", "GORUN_LISTEN_IP=127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	stdin.Write(block)
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if rankPID, err = strconv.Atoi(strings.TrimSpace(line)); err != nil {
		t.Fatalf("the rank did not start: %q %v", line, err)
	}
	waitForState(t, rankPID, 'T')

	start := time.Now()
	stdin.Write([]byte("stop\n"))
	select {
	case <-done:
	case <-time.After(grace / 2):
		t.Fatalf("the wrapper has not stopped its frozen rank %v after \"stop\"; it waits for SIGKILL after the grace period (%v)", grace/2, grace)
	}
	if ws := cmd.ProcessState.Sys().(syscall.WaitStatus); ws.ExitStatus() != 128+int(syscall.SIGTERM) {
		t.Errorf("wrapper exit status %d, want %d (the rank ended by SIGTERM)", ws.ExitStatus(), 128+int(syscall.SIGTERM))
	}
	t.Logf("the frozen rank stopped %v after \"stop\" (grace %v)", time.Since(start).Round(time.Millisecond), grace)
}

// waitForState waits until process pid is in the given state (/proc/PID/stat:
// 'T' stopped), which the process reaches on its own.
func waitForState(t *testing.T, pid int, state byte) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			t.Fatalf("process %d: %v", pid, err)
		}
		// "pid (comm) S ...": the state follows the last ')'.
		if s := string(b); strings.LastIndexByte(s, ')')+2 < len(s) && s[strings.LastIndexByte(s, ')')+2] == state {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d never reached state %c: %s", pid, state, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
