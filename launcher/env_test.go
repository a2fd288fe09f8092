package launcher

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Every rank gets GORUN_HOST: its host as Job.Hosts names it ("localhost"
// when it names none), in fixed-size and elastic jobs, over a user's -x
// GORUN_HOST.
func TestRankEnvHost(t *testing.T) {
	for _, tc := range []struct {
		name    string
		hosts   []Host
		np      int
		elastic bool
		want    []string // "rank host", sorted
	}{
		{"one host", nil, 2, false, []string{"0 localhost", "1 localhost"}},
		// Both are this host, reached without ssh, but named apart.
		{"two names", []Host{{"localhost", 2}, {"127.0.0.1", 1}}, 3, false, []string{"0 localhost", "1 localhost", "2 127.0.0.1"}},
		{"elastic", []Host{{"127.0.0.1", 1}, {"localhost", 1}}, 2, true, []string{"0 127.0.0.1", "1 localhost"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			line, lines := stdoutLines(t)
			job := Job{NP: tc.np, Program: "/bin/sh", Args: []string{"-c", `echo "$GORUN_RANK $GORUN_HOST"`},
				Env: []string{"GORUN_HOST=from-x"}, Hosts: tc.hosts, Grace: time.Second,
				Line: line, Logf: func(format string, args ...any) { t.Logf(format, args...) },
			}
			if tc.elastic {
				job.Elastic = &Elastic{MinNP: 1}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := Run(ctx, job); err != nil {
				t.Fatal(err)
			}
			got := lines()
			slices.Sort(got)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("ranks printed %q, want %q", got, tc.want)
			}
		})
	}
}

// stdoutLines returns a Job.Line that keeps the ranks' stdout lines
// (stderr goes to the test's log), and a function that returns them.
func stdoutLines(t *testing.T) (func(rank int, stderr bool, line []byte), func() []string) {
	var mu sync.Mutex
	var got []string
	line := func(rank int, stderr bool, line []byte) {
		mu.Lock()
		defer mu.Unlock()
		if stderr {
			t.Logf("rank %d stderr: %s", rank, line)
			return
		}
		got = append(got, strings.TrimSpace(string(line)))
	}
	return line, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}
