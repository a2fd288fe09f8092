package main

import (
	"bytes"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// gorun --help is one page, its flags near the top, each flag once, on one
// line, under its group's heading; the topics are named at its end.
func TestHelpIsOnePage(t *testing.T) {
	out := gorunOutput(t, "--help")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) > 60 {
		t.Errorf("gorun --help is %d lines, want at most 60:\n%s", len(lines), out)
	}
	if i := slices.IndexFunc(lines, func(l string) bool { return strings.HasSuffix(l, " flags:") }); i < 0 || i+1 > 25 {
		t.Errorf("the flags start at line %d, want within the first 25:\n%s", i+1, out)
	}
	root := newGorunCmd()
	root.InitDefaultHelpFlag()
	root.Flags().VisitAll(func(f *pflag.Flag) {
		entry := regexp.MustCompile(`(?m)^  (-\S, |    )--` + regexp.QuoteMeta(f.Name) + `( |$)`)
		if n := len(entry.FindAllString(out, -1)); n != 1 {
			t.Errorf("--%s is listed %d times, want once", f.Name, n)
		}
	})
	for _, l := range lines {
		if strings.HasPrefix(l, "  -") && len(l) > 100 {
			t.Errorf("flag line of %d characters, want at most 100: %q", len(l), l)
		}
	}
	for _, g := range flagGroups {
		if !strings.Contains(out, "\n\n"+g.title+":\n") {
			t.Errorf("--help lacks the heading %q", g.title)
		}
	}
	for _, want := range []string{"Usage:\n  gorun -np N", "\nExamples:\n", "gorun -H node1:4,node2:4", "--min-np 2",
		"--host-discovery-script ./hosts.sh", "gorun bench -np 4", "\nAvailable Commands", "  doctor ", "  bench "} {
		if !strings.Contains(out, want) {
			t.Errorf("--help lacks %q", want)
		}
	}
	end := strings.Join(lines[len(lines)-2:], "\n")
	for _, tp := range helpTopics {
		if !strings.Contains(end, tp.name) {
			t.Errorf("the end of --help does not name the topic %s:\n%s", tp.name, end)
		}
	}
	for _, args := range [][]string{{"-h"}, {"help"}} {
		if o := gorunOutput(t, args...); o != out {
			t.Errorf("gorun %v is not what gorun --help prints:\n%s", args, o)
		}
	}
}

// Every flag of gorun is under one heading of flagGroups, and every name
// there is a flag.
func TestHelpFlagGroups(t *testing.T) {
	root := newGorunCmd()
	root.InitDefaultHelpFlag()
	seen := map[string]string{}
	for _, g := range flagGroups {
		for _, name := range g.flags {
			if root.Flags().Lookup(name) == nil {
				t.Errorf("%s: no flag --%s", g.title, name)
			}
			if prev, ok := seen[name]; ok {
				t.Errorf("--%s is under %s and %s", name, prev, g.title)
			}
			seen[name] = g.title
		}
	}
	root.Flags().VisitAll(func(f *pflag.Flag) {
		if _, ok := seen[f.Name]; !ok {
			t.Errorf("--%s is under no heading of flagGroups", f.Name)
		}
	})
}

// gorun help TOPIC prints the topic; gorun help help lists the topics, and
// gorun help COMMAND still prints a command's help.
func TestHelpTopics(t *testing.T) {
	for _, tp := range helpTopics {
		if out := gorunOutput(t, "help", tp.name); strings.TrimSpace(out) != tp.text {
			t.Errorf("gorun help %s:\n%s\nwant the topic's text", tp.name, out)
		}
	}
	out := gorunOutput(t, "help", "help")
	for _, tp := range helpTopics {
		if !regexp.MustCompile(`(?m)^  gorun help ` + tp.name + ` +` + regexp.QuoteMeta(tp.short) + `$`).MatchString(out) {
			t.Errorf("gorun help help does not list %s:\n%s", tp.name, out)
		}
	}
	for _, tc := range []struct{ args, want []string }{
		{[]string{"help", "bench"}, []string{"gorun bench launches N ranks", "--sizes"}},
		{[]string{"help", "checkpoint", "ls"}, []string{"gorun checkpoint ls prints one line per checkpoint"}},
		{[]string{"help", "environment"}, []string{"GORUN_LOCAL_RANK", "GORUN_RESTART_COUNT", "GORUN_LISTEN_IP", "GORUN_ALLREDUCE_ALGORITHMS"}},
		{[]string{"help", "job"}, []string{"exits 130 (143 after SIGTERM, 141", "--bind-to core", "at most 30s"}},
		{[]string{"help", "output"}, []string{"[0-3]", "GORUN_TTY=1", "chrome://tracing"}},
		{[]string{"help", "slurm"}, []string{"SLURM_TASKS_PER_NODE", "GORUN_SRUN_OPTS", "--launcher"}},
		{[]string{"help", "config"}, []string{"on the command line win", "np: 8"}},
		{[]string{"help", "build"}, []string{"~/.cache/gorun/build"}},
	} {
		out := gorunOutput(t, tc.args...)
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("gorun %v lacks %q:\n%s", tc.args, w, out)
			}
		}
	}
}

// gorunOutput runs gorun's commands in this process with args, as main
// gives them (through horovodArgs), and returns what they print; it fails
// the test unless they succeed with nothing on stderr. (That the binary
// prints the same is e2e's TestGorunHelpFromTheBinary.)
func gorunOutput(t *testing.T, args ...string) string {
	t.Helper()
	root := newGorunCmd()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(horovodArgs(args))
	if err := root.Execute(); err != nil || errOut.Len() > 0 {
		t.Fatalf("gorun %v: %v\nstdout:\n%s\nstderr:\n%s", args, err, out.String(), errOut.String())
	}
	return out.String()
}

// What a flag's one line in --help leaves out is in a topic: every flag
// is explained in one.
func TestHelpTopicsExplainEveryFlag(t *testing.T) {
	var all strings.Builder
	for _, tp := range helpTopics {
		all.WriteString(tp.text)
	}
	newGorunCmd().Flags().VisitAll(func(f *pflag.Flag) {
		if !strings.Contains(all.String(), "--"+f.Name) {
			t.Errorf("no help topic explains --%s", f.Name)
		}
	})
}

// The topics are under gorun help only: a PROGRAM named like one still runs.
func TestHelpTopicIsNotACommand(t *testing.T) {
	root := newGorunCmd()
	for _, tp := range helpTopics {
		if c, args, err := root.Find([]string{tp.name, "--epochs", "3"}); err != nil || c != root || len(args) != 3 {
			t.Errorf("gorun %s --epochs 3 finds %q %q %v, want gorun itself to run PROGRAM %s", tp.name, c.CommandPath(), args, err, tp.name)
		}
	}
}

// --help names the flags of a job on many hosts; the topic on hosts says
// what those hosts need.
func TestGorunHelpDocumentsFlags(t *testing.T) {
	out := gorunOutput(t, "--help")
	for _, want := range []string{"-np", "-H, --hosts", "--hostfile", "--ssh-port", "--ssh-identity-file", "--network-interface",
		"--start-timeout", "--timeout", "--output-dir", "-x, --env", "--verbose", "--config", "--max-restarts", "--grace",
		"gorun -H node1:4,node2:4"} {
		if !strings.Contains(out, want) {
			t.Errorf("--help lacks %q", want)
		}
	}
	// What hosts need is in the manual's topic on hosts.
	out = strings.Join(strings.Fields(gorunOutput(t, "help", "hosts")), " ")
	for _, want := range []string{"gorun -np 8 -H node1:4,node2:4", "GORUN_SSH_OPTS", "same path on every host", "--ssh-identity-file",
		"a host without :N has 1 slot", "one \"host slots=N\" per line"} {
		if !strings.Contains(out, want) {
			t.Errorf("gorun help hosts lacks %q", want)
		}
	}
}
