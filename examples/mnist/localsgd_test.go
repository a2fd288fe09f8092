package main

import (
	"math"
	"regexp"
	"strings"
	"testing"
)

// Local SGD in an elastic job of 4 ranks, averaging every 4 steps: the
// ranks end with one model (the epochs end with an average, and the
// consistency check passes), every epoch uses every sample once, and the
// accuracy is near that of averaging the gradients at every step. When
// rank 2 is lost after step 21, between the averages of steps 20 and 24,
// the survivors go back to the average of step 20 and run steps 21-24
// again without it; they too end with one model, every sample used once,
// and near the same accuracy.
func TestLocalSGDLosesARank(t *testing.T) {
	every := runJob(t, 4, true, -1, 0, "--balance=false")
	local := runJob(t, 4, true, -1, 0, "--sync-every", "4", "--eval-every", "8")
	for i, p := range local {
		if p.res.Hash != local[0].res.Hash || len(p.res.Resets) != 0 {
			t.Errorf("process %d ends with %s after %d resets; process 0 with %s", i, p.res.Hash, len(p.res.Resets), local[0].res.Hash)
		}
	}
	steps := local[0].res.Steps
	checkSamplesOnce(t, local, steps)
	out := local[0].out.String()
	if !strings.Contains(out, "mnist: local SGD: each rank steps on its own gradients, and the ranks average their models every 4 steps") {
		t.Errorf("rank 0's output does not say it runs local SGD:\n%s", out)
	}
	evals := regexp.MustCompile(`(?m)^eval: step (\d+) \(epoch \d\), [0-9.]+ s of training, test accuracy [0-9.]+%$`).FindAllStringSubmatch(out, -1)
	if len(evals) != elasticEpochs*steps/8 {
		t.Errorf("%d evaluation lines, want one every 8 steps (%d):\n%s", len(evals), elasticEpochs*steps/8, out)
	}
	gotLocal, gotEvery := finalAcc(local[0]), finalAcc(every[0])
	t.Logf("test accuracy after %d epochs: %.2f%% averaging every 4 steps, %.2f%% every step", elasticEpochs, gotLocal, gotEvery)
	if math.Abs(gotLocal-gotEvery) > 1 {
		t.Errorf("local SGD: test accuracy %.2f%%, %.2f%% averaging every step: more than 1 point apart", gotLocal, gotEvery)
	}

	procs := runJob(t, 4, true, 2, 21, "--sync-every", "4")
	alive := survivors(procs)
	if len(alive) != 3 {
		t.Fatalf("%d survivors, want 3", len(alive))
	}
	for i, p := range alive {
		if p.res.Hash != alive[0].res.Hash || len(p.res.Resets) != 1 {
			t.Errorf("survivor %d ends with %s after %d resets; survivor 0 with %s", i, p.res.Hash, len(p.res.Resets), alive[0].res.Hash)
		}
		// Back to the commit of the average of step 20: steps 21-24 are
		// run again in membership epoch 1, step 20 is not.
		if p.steps[20].epoch != 0 || p.steps[21].epoch != 1 || p.steps[24].epoch != 1 {
			t.Errorf("survivor %d ran steps 20, 21 and 24 in membership epochs %d, %d and %d, want 0, 1 and 1",
				i, p.steps[20].epoch, p.steps[21].epoch, p.steps[24].epoch)
		}
	}
	checkSamplesOnce(t, procs, steps)
	got := finalAcc(alive[0])
	t.Logf("test accuracy %.2f%% after losing rank 2 at step 21, %.2f%% without", got, gotLocal)
	if math.Abs(got-gotLocal) > 1 {
		t.Errorf("test accuracy %.2f%% after the loss, %.2f%% without: more than 1 point apart", got, gotLocal)
	}
}

// Flags local SGD cannot honour are refused before any training.
func TestLocalSGDFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--sync-every", "4", "--accumulate", "2"}, "--sync-every 4 steps each rank on the gradient of its whole share"},
		{[]string{"--sync-every", "4", "--eval-every", "10"}, "--eval-every 10 is not a multiple of --sync-every 4"},
		{[]string{"--sync-every", "0"}, "--sync-every 0 must be positive"},
		{[]string{"--outer-momentum", "1"}, "--outer-momentum 1 must be in [0, 1)"},
		{[]string{"--slow-rank", "3"}, `--slow-rank "3": want RANK:FACTOR`},
	} {
		err := func() error {
			cfg, err := parseFlags(tc.args)
			if err != nil {
				return err
			}
			plan, err := planBatches(cfg.Batch, cfg.GlobalBatch, cfg.Accumulate, 4)
			if err != nil {
				return err
			}
			return checkLocalSGD(cfg, plan)
		}()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error with %q", tc.args, err, tc.want)
		}
	}
}
