package main

import (
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gorun/gorun/collective"
)

// Two ranks under gorun, rank 1 computing three times as long
// (--slow-rank 1:3): the shares move to rank 0 (reported in a line), both
// ranks end with the same parameters, and the test accuracy is that of the
// even split within 0.5 points (balancing changes the rounding of the
// sums, not what a step averages over).
func TestGorunBalancesASlowRank(t *testing.T) {
	gorun, mnist := binaries(t)
	args := []string{"-np", "2", mnist, "--epochs", "1", "--progress", "off", "--verbose", "--balance-every", "5"}
	even, errEven, code := runCmd(t, gorun, append(args, "--balance=false")...)
	if code != 0 {
		t.Fatalf("even shares: exit %d\n%s%s", code, even, errEven)
	}
	out, errOut, code := runCmd(t, gorun, append(args, "--slow-rank", "1:3")...)
	t.Logf("%s%s", out, errOut)
	if code != 0 {
		t.Fatalf("balanced: exit %d", code)
	}
	lines := regexp.MustCompile(`(?m)^(?:\[[0-9,-]+\] )?balance: shares (\d+), (\d+) \(rank 1 at (0\.\d\d)x the fastest\)$`).FindAllStringSubmatch(out, -1)
	if len(lines) == 0 {
		t.Fatal("no line of balanced shares with rank 1 the slower")
	}
	for _, l := range lines {
		a, _ := strconv.Atoi(l[1])
		b, _ := strconv.Atoi(l[2])
		if a+b != 64 || a <= b || b < 1 {
			t.Errorf("shares %d and %d: want 64 in all, the more on rank 0, at least 1 on rank 1", a, b)
		}
	}
	if strings.Contains(even, "balance: shares") {
		t.Errorf("--balance=false printed shares:\n%s", even)
	}
	hashes := finalHashRe.FindAllStringSubmatch(out, -1)
	if len(hashes) != 2 || hashes[0][1] != hashes[1][1] {
		t.Errorf("the ranks end with different parameters: %q", hashes)
	}
	a1, a2 := finalAccRe.FindStringSubmatch(even), finalAccRe.FindStringSubmatch(out)
	if a1 == nil || a2 == nil {
		t.Fatal("no final accuracy")
	}
	accEven, _ := strconv.ParseFloat(a1[1], 64)
	accBal, _ := strconv.ParseFloat(a2[1], 64)
	if math.Abs(accEven-accBal) > 0.5 {
		t.Errorf("test accuracy %.2f%% balanced, %.2f%% with even shares: more than 0.5 points apart", accBal, accEven)
	}
}

func TestBalanceLine(t *testing.T) {
	for _, tc := range []struct {
		st   collective.BalanceStatus
		want string
	}{
		{collective.BalanceStatus{Shares: []int{23, 22, 11, 8}, Rates: []float64{1000, 980, 500, 380}},
			"balance: shares 23, 22, 11, 8 (rank 3 at 0.38x the fastest)"},
		// A rank not measured yet (0) is not the slowest.
		{collective.BalanceStatus{Shares: []int{40, 24}, Rates: []float64{0, 600}}, "balance: shares 40, 24 (rank 1 at 1.00x the fastest)"},
		{collective.BalanceStatus{Shares: []int{32, 32}}, "balance: shares 32, 32"},
	} {
		if got := balanceLine(tc.st); got != tc.want {
			t.Errorf("balanceLine(%+v) = %q, want %q", tc.st, got, tc.want)
		}
	}
}
