package p2p

import (
	"slices"
	"strings"
	"testing"
)

func TestRendezvousList(t *testing.T) {
	got, err := rendezvousList("pod-0.job:29400, 3@pod-1.job:29400,4@[::1]:7")
	if err != nil {
		t.Fatal(err)
	}
	want := []groupItem{{ID: 1, Addr: "pod-0.job:29400"}, {ID: 3, Addr: "pod-1.job:29400"}, {ID: 4, Addr: "[::1]:7"}}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for in, msg := range map[string]string{
		"":                   "an empty entry",
		"a:1,,b:2":           "an empty entry",
		"a":                  `rendezvous entry "a": want host:port or ID@host:port`,
		":5":                 `rendezvous entry ":5": want host:port or ID@host:port`,
		"a:0":                `bad port "0"`,
		"x@a:1":              `"x" is not a replica id`,
		"0@a:1":              `"0" is not a replica id`,
		"a:1,1@b:2":          "replica 1 is listed twice",
		"3@a:1,3@b:2":        "replica 3 is listed twice",
		"3@a:1,4@b:99999999": `bad port "99999999"`,
	} {
		if _, err := rendezvousList(in); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("rendezvousList(%q): %v, want an error with %q", in, err, msg)
		}
	}
}
