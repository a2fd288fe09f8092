package hostlist

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestExpand(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []string
	}{
		{"plain name", "node1", []string{"node1"}},
		{"plain names", "alpha,beta, gamma", []string{"alpha", "beta", "gamma"}},
		{"range", "node[1-3]", []string{"node1", "node2", "node3"}},
		{"zero padding", "node[01-03,07]", []string{"node01", "node02", "node03", "node07"}},
		{"padding kept across a width change", "n[08-10]", []string{"n08", "n09", "n10"}},
		{"no padding without a leading zero", "n[8-10]", []string{"n8", "n9", "n10"}},
		{"three-digit padding", "gpu[001-002]", []string{"gpu001", "gpu002"}},
		{"single number in brackets", "node[07]", []string{"node07"}},
		{"several ranges", "n[1-2,5-6,9]", []string{"n1", "n2", "n5", "n6", "n9"}},
		{"several prefixes", "a[1-2],b3,c[08-10]", []string{"a1", "a2", "b3", "c08", "c09", "c10"}},
		{"suffix after the bracket", "n[1-2].cluster", []string{"n1.cluster", "n2.cluster"}},
		{"two groups, first slowest", "rack[1-2]-node[1-2]", []string{"rack1-node1", "rack1-node2", "rack2-node1", "rack2-node2"}},
		{"dashes in plain names", "login-1,node-a", []string{"login-1", "node-a"}},
		{"duplicates kept", "n1,n1", []string{"n1", "n1"}},
		{"zero", "n[0-1]", []string{"n0", "n1"}},
	} {
		got, err := Expand(tc.in)
		if err != nil {
			t.Errorf("%s: Expand(%q): %v", tc.name, tc.in, err)
			continue
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: Expand(%q) = %q, want %q", tc.name, tc.in, got, tc.want)
		}
	}
}

func TestExpandLarge(t *testing.T) {
	got, err := Expand("n[00000-99999]")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 100000 || got[0] != "n00000" || got[12345] != "n12345" || got[99999] != "n99999" {
		t.Fatalf("Expand(n[00000-99999]) = %d names, first %q, last %q", len(got), got[0], got[len(got)-1])
	}
	// One name more than the cap fails before anything is expanded, however
	// the names are spread over the list.
	for _, in := range []string{fmt.Sprintf("extra,n[1-%d]", MaxNames), fmt.Sprintf("a[1-%d]b[0-1]", MaxNames/2+1), fmt.Sprintf("n[0-%d]", MaxNames)} {
		if _, err := Expand(in); err == nil || !strings.Contains(err.Error(), "more than") {
			t.Errorf("Expand(%q) of MaxNames+1 names or more: err = %v, want a cap error", in, err)
		}
	}
}

func TestExpandErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "empty host list"},
		{"   ", "empty host list"},
		{"node[1-3", "'[' without ']'"},
		{"node1-3]", "']' without '['"},
		{"node[1-[2]]", "nested"},
		{"node[3-1]", "reversed"},
		{"node[a-c]", "not a number"},
		{"node[1-x]", "not a number"},
		{"node[-3]", "missing number"},
		{"node[1-]", "missing number"},
		{"node[]", "empty brackets"},
		{"node[1,,2]", "missing number"},
		{"a,,b", "empty host name"},
		{"a,", "empty host name"},
		{"node[+1-2]", "not a number"},
		{"node[99999999999999999999]", "too large"},
		{"node[0-999999999999]", "more than"},
		{"a[0-1023]b[0-1023]c[0-1]", "more than"},
	} {
		got, err := Expand(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Expand(%q) = %d names, %v; want an error containing %q", tc.in, len(got), err, tc.want)
		}
	}
}

func TestExpandCounts(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
	}{
		{"4", []int{4}},
		{"2(x3),1", []int{2, 2, 2, 1}},
		{"1,3(x2)", []int{1, 3, 3}},
		{"2(x2),1,4(x1)", []int{2, 2, 1, 4}},
		{" 0 ", []int{0}},
	} {
		got, err := ExpandCounts(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ExpandCounts(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "x", "-1", "2(3)", "2(x0)", "2(x-1)", "2(x3", "2x3)", "2(xa)", "1,,2", fmt.Sprintf("1(x%d),1", MaxNames)} {
		if got, err := ExpandCounts(in); err == nil {
			t.Errorf("ExpandCounts(%q) = %v, want an error", in, got)
		}
	}
}
