// What a job is (Job) and how gorun runs it (Run): checking the job,
// laying it out on its hosts, and running attempts of it until one
// succeeds, --max-restarts is spent, or a rank says that a restart would
// fail the same way (ExitNoRestart).

package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// Job describes what to launch.
type Job struct {
	NP      int      // number of ranks
	Program string   // executable path (or a Go package directory, see BuildIfPackage)
	Args    []string // its arguments
	Env     []string // extra NAME=VALUE pairs for every rank

	Timeout      time.Duration // collective timeout handed to ranks (GORUN_TIMEOUT); 0 = their default
	StartTimeout time.Duration // every rank must register within this; 0 = 30 s
	Grace        time.Duration // between SIGTERM and SIGKILL when stopping ranks; 0 = 5 s
	MaxRestarts  int           // relaunch the whole job this many times after a failure (not after a rank exits with ExitNoRestart)

	// Elastic, if set, makes the job elastic (see Elastic): a rank's
	// failure, once the job runs, costs a membership change instead of the
	// job, and MaxRestarts only counts failures of the job as a whole.
	Elastic *Elastic

	// Hosts lists where ranks run, filled in order (host 0 takes the first
	// Slots ranks, and so on). Nil means every rank on this host. Hosts for
	// which IsLocalHost is true run their ranks without ssh; the others are
	// reached with SSH and run Program (same path) in WorkDir (same path).
	Hosts            []Host
	SSH              SSH
	WorkDir          string // working directory of remote ranks; "" = gorun's
	NetworkInterface string // interface name or CIDR ranks listen on when hosts are remote; "" = pick one
	OutputDir        string // if set, also write DIR/rank.N/{stdout,stderr}

	Stdout, Stderr io.Writer // where prefixed rank output goes; nil = os.Stdout, os.Stderr
	// Console, if set, is where output goes instead (one Console can be
	// shared with BuildIfPackage, so its status line and messages are
	// drawn the same way); nil = NewConsole(Stdout, Stderr).
	Console *Console
	// Line, if set, receives every complete output line instead of the
	// default "[rank] line" writer (which folds identical lines of several
	// ranks, draws the ranks' statuses on a terminal, and leaves out what
	// the ranks write to stderr while the job is stopped from outside); the
	// ranks' statuses are then not shown.
	Line func(rank int, stderr bool, line []byte)
	// FoldWindow is how long a line waits for other ranks to print the
	// same, to be printed once for all of them; 0 = DefaultFoldWindow,
	// negative = never fold.
	FoldWindow time.Duration
	Verbose    bool
	Logf       func(format string, args ...any) // gorun's own messages; nil = to the Console
}

// Run launches the job and waits for it. It returns nil when every rank
// exited 0, a *RankError when a rank failed (after stopping the others), a
// *HostError when a remote host could not be reached (before starting
// anything), or a *StoppedError when ctx ended or the output was closed
// (after stopping every rank).
func Run(ctx context.Context, job Job) error {
	if job.NP < 1 {
		return fmt.Errorf("-np must be at least 1, got %d", job.NP)
	}
	if job.Program == "" {
		return errors.New("no program to run: write gorun -np N PROGRAM [ARGS...]")
	}
	if e := job.Elastic; e != nil {
		switch {
		case e.MinNP < 0 || e.MinNP > job.NP:
			return fmt.Errorf("elastic job: --min-np %d must be between 1 and -np %d", e.MinNP, job.NP)
		case e.MaxNP != 0 && e.MaxNP < job.NP:
			return fmt.Errorf("elastic job: --max-np %d is below -np %d", e.MaxNP, job.NP)
		case e.Timeout < 0 || e.HeartbeatTimeout < 0 || e.DiscoveryInterval < 0 || e.DiscoveryTimeout < 0 || e.CooldownBase < 0 || e.CooldownMax < 0:
			return errors.New("elastic job: durations must not be negative")
		}
	}
	if job.StartTimeout <= 0 {
		job.StartTimeout = 30 * time.Second
	}
	if job.Grace <= 0 {
		job.Grace = 5 * time.Second
	}
	if job.Stdout == nil {
		job.Stdout = os.Stdout
	}
	if job.Stderr == nil {
		job.Stderr = os.Stderr
	}
	if job.Console == nil {
		job.Console = NewConsole(job.Stdout, job.Stderr)
	}
	if job.Logf == nil {
		job.Logf = job.Console.Logf
	}
	// gorun's output closing (gorun ... | head) stops the job like Ctrl-C.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-job.Console.Closed():
			cancel(job.Console.closedErr())
		case <-ctx.Done():
		}
	}()
	lay, err := makeLayout(ctx, &job)
	if err != nil {
		return err
	}
	np := job.NP // a restart may have fewer ranks if fewer slots are listed
	var files *outputFiles
	if job.OutputDir != "" {
		if files, err = openOutputDir(job.OutputDir, job.NP); err != nil {
			return err
		}
		defer files.close()
	}
	for attempt := 0; ; attempt++ {
		err = runOnce(ctx, job, lay, files, attempt)
		if err == nil || ctx.Err() != nil || attempt >= job.MaxRestarts {
			return err
		}
		var he *HostError
		if errors.As(err, &he) {
			return err
		}
		var nr *NoRestartError
		if errors.As(err, &nr) {
			job.Logf("%s", nr.why(job.MaxRestarts))
			return err
		}
		job.Logf("restart %d of %d (GORUN_RESTART_COUNT=%d) after failure: %v", attempt+1, job.MaxRestarts, attempt+1, err)
		if e := job.Elastic; e != nil && e.DiscoveryScript != "" {
			// Restart where the script says the hosts are now, not on its
			// first list.
			if l, err := rediscover(ctx, &job, np); err != nil {
				job.Logf("--host-discovery-script %s before the restart: %v; restarting on the hosts it listed last (%s)", e.DiscoveryScript, err, FormatHosts(job.Hosts))
			} else {
				lay = l
			}
		}
	}
}
