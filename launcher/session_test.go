package launcher

import (
	"context"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestLocalRanksSession: a rank of a job on one host leads a process group
// of its own (stopping it stops what it started) in gorun's session, where
// its yields reach the other ranks (startLocal); e2e's
// TestMultiHostRankSessions covers a job across hosts, whose ranks lead
// sessions of their own.
func TestLocalRanksSession(t *testing.T) {
	line, lines := stdoutLines(t)
	// Fields 5 and 6 of /proc/PID/stat are the process group and the
	// session; sh's comm, "(sh)", has no spaces.
	job := Job{NP: 3, Program: "/bin/sh", Args: []string{"-c", `read -r pid comm state ppid pgrp sid rest < /proc/$$/stat; echo "$pid $pgrp $sid"`},
		Grace: time.Second, Line: line, Logf: func(format string, args ...any) { t.Logf(format, args...) },
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := Run(ctx, job); err != nil {
		t.Fatal(err)
	}
	mySession, err := unix.Getsid(0)
	if err != nil {
		t.Fatal(err)
	}
	got := lines()
	if len(got) != 3 {
		t.Fatalf("ranks printed %q, want 3 lines", got)
	}
	for _, l := range got {
		var pid, pgrp, sid int
		if _, err := fmt.Sscan(l, &pid, &pgrp, &sid); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		if pgrp != pid || sid != mySession {
			t.Errorf("rank process %d: process group %d, session %d; want its own group in gorun's session %d", pid, pgrp, sid, mySession)
		}
	}
}
