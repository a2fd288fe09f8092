package main

import (
	"slices"
	"testing"
)

// Every flag that takes a value is known as such, so "-np" after it is
// still gorun's and PROGRAM is found where it is (these were missed when
// the list was written by hand).
func TestHorovodArgsKnowsEveryValueFlag(t *testing.T) {
	for _, tc := range []struct{ in, want []string }{
		{[]string{"--timeline", "t.json", "-np", "2", "./train", "-np", "3"},
			[]string{"--timeline", "t.json", "--np", "2", "./train", "-np", "3"}},
		{[]string{"bench", "--compression", "fp16", "-np", "4"},
			[]string{"bench", "--compression", "fp16", "--np", "4"}},
		{[]string{"-x", "A=1", "-np", "2", "prog"}, []string{"-x", "A=1", "--np", "2", "prog"}},
		{[]string{"--verbose", "prog", "-np", "2"}, []string{"--verbose", "prog", "-np", "2"}},
	} {
		if got := horovodArgs(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("horovodArgs(%q) = %q; want %q", tc.in, got, tc.want)
		}
	}
	for _, name := range []string{"--timeline", "--compression", "--sizes", "-H", "--grace"} {
		if !takesValue(name) {
			t.Errorf("takesValue(%q) = false", name)
		}
	}
	for _, name := range []string{"--verbose", "--json", "prog"} {
		if takesValue(name) {
			t.Errorf("takesValue(%q) = true", name)
		}
	}
}
