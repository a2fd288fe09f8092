package main

import (
	"slices"
	"strings"
	"testing"
)

// --help lists the elastic flags, gorun help elastic explains them, and
// the single-dash -np of horovodrun still works among them.
func TestElasticFlagsInHelpAndArgs(t *testing.T) {
	out := gorunOutput(t, "--help")
	for _, want := range []string{"Elastic flags:", "--min-np", "--max-np", "--host-discovery-script", "--discovery-interval", "--elastic-timeout",
		"--heartbeat-timeout", "--blacklist-cooldown", "--job-key-file"} {
		if !strings.Contains(out, want) {
			t.Errorf("--help lacks %q", want)
		}
	}
	out = gorunOutput(t, "help", "elastic")
	for _, want := range []string{"GORUN_ELASTIC=1", "grows back to -np", "never banned for good", "room above is for ranks started by hand",
		"GORUN_JOB_KEY_FILE=FILE", "10×MIN"} {
		if !strings.Contains(out, want) {
			t.Errorf("gorun help elastic lacks %q", want)
		}
	}
	in := []string{"--min-np", "2", "--elastic-timeout", "60s", "--host-discovery-script", "./h.sh", "-np", "4", "./train", "-np", "3"}
	want := []string{"--min-np", "2", "--elastic-timeout", "60s", "--host-discovery-script", "./h.sh", "--np", "4", "./train", "-np", "3"}
	if got := horovodArgs(in); !slices.Equal(got, want) {
		t.Errorf("horovodArgs(%q) = %q; want %q", in, got, want)
	}
}
