package checkpoint

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/internal/testenv/s3test"
)

// trainWithSaves runs steps training steps on every rank (one small
// allreduce each, the gradient's), with a save every `every` steps (Save,
// or with async SaveAsync and a Poll per step), then Wait; state v of a
// save is its step. beforeSave, if set, is called on every rank before
// each save, and beforeWait before the final Wait. It returns each rank's
// error.
func trainWithSaves(comms []*collective.Comm, ms []*Manager, steps, every int64, async bool, beforeSave func(r int, step int64), beforeWait func(r int)) []error {
	return onEach(comms, func(r int, c *collective.Comm) error {
		ctx := context.Background()
		s := newRankState(r)
		for step := int64(1); step <= steps; step++ {
			grad := []float32{float32(step)}
			if err := c.Allreduce(ctx, grad, collective.Sum, collective.Name("grad")); err != nil {
				return fmt.Errorf("rank %d: step %d: %w", r, step, err)
			}
			if async {
				if err := ms[r].Poll(ctx); err != nil {
					return err
				}
			}
			if step%every != 0 {
				continue
			}
			if beforeSave != nil {
				beforeSave(r, step)
			}
			s.fill(float32(step), r)
			save := ms[r].Save
			if async {
				save = ms[r].SaveAsync
			}
			if err := save(ctx, step, s.st); err != nil {
				return err
			}
		}
		if beforeWait != nil {
			beforeWait(r)
		}
		return ms[r].Wait(ctx)
	})
}

// The store stops answering deletions (the proxy holds every DELETE
// unanswered, as a server that hangs) while rank 0 applies retention
// after a save: training goes on, every save commits, each retention that
// could not finish is logged once, by the rank that ran it, naming the
// location, and once deletions work again the last retention removes what
// the others left. Retention is housekeeping: it never holds up a
// collective (the collective timeout here is 10 s, a deletion's deadline a
// minute).
func TestS3RetentionOutageTrainingGoesOn(t *testing.T) {
	v := startVersity(t, "ckpt")
	p := v.StartProxy()
	p.Setenv(t)
	for _, mode := range []struct {
		name  string
		async bool
		fault s3test.Fault
	}{{"sync-hang", false, s3test.Hang}, {"async-hang", true, s3test.Hang}, {"sync-drop", false, s3test.Drop}} {
		t.Run(mode.name, func(t *testing.T) {
			loc := "s3://ckpt/" + mode.name
			comms := newJob(t, 2)
			var lb logBuf
			ms := managers(t, comms, loc, WithKeep(1), WithLogger(lb.logf))
			p.Set("DELETE", mode.fault)
			const steps, every = 8, 2
			start := time.Now()
			// Before the next save, rank 0 waits until the retention of
			// the last one (which deletes the step before it first) met
			// the outage, so that the save finds it unfinished. A save
			// that SaveAsync committed itself, when the next one began,
			// has no retention of its own: the next save's covers it.
			met := map[int64]bool{}
			beforeSave := func(r int, step int64) {
				// An asynchronous save is committed by the Polls of the
				// training steps; here they go on until it is.
				for mode.async && ms[r].flight != nil {
					if err := ms[r].Poll(context.Background()); err != nil {
						t.Errorf("rank %d: %v", r, err)
						return
					}
				}
				last := step - every
				if r != 0 || last < 2*every {
					return
				}
				// A held deletion; or every attempt at a dropped one,
				// after which it fails.
				want, n := "DELETE /ckpt/"+mode.name+"/"+stepKey(last-every)+"/"+ManifestName, 1
				if mode.fault == s3test.Drop {
					n = s3Attempts
				}
				for f := range p.Faulted() {
					if f == want {
						if n--; n == 0 {
							break
						}
					}
				}
				met[last] = true
			}
			// Deletions work again before the final Wait, so that the
			// retention of the last save finishes there.
			errs := trainWithSaves(comms, ms, steps, every, mode.async, beforeSave, func(r int) {
				if r == 0 {
					p.Set("DELETE", s3test.Pass)
				}
			})
			t.Logf("training with a deletion outage took %v; log:\n%s", time.Since(start).Round(time.Millisecond), lb.String())
			mustAll(t, errs)
			// Every retention that met the outage is logged, once.
			re := regexp.MustCompile(`checkpoint: retention of step (\d+) at ` + regexp.QuoteMeta(loc) + `: ([^\n]*); training goes on\n`)
			got := map[int64]int{}
			for _, m := range re.FindAllStringSubmatch(lb.String(), -1) {
				step, _ := strconv.ParseInt(m[1], 10, 64)
				got[step]++
				if !strings.Contains(m[2], "deleting") {
					t.Errorf("retention of step %d: cause %q does not say what failed", step, m[2])
				}
			}
			for step := int64(every); step <= steps; step += every {
				if want := boolI64(met[step]); int64(got[step]) != want {
					t.Errorf("the retention of step %d was logged %d times, want %d", step, got[step], want)
				}
			}
			if len(met) != 2 {
				t.Errorf("the retentions of %d steps met the outage, want 2 (steps 4 and 6)", len(met))
			}
			// The last retention removed every older step.
			entries, err := storeSteps(context.Background(), mustOpenS3(t, loc))
			if err != nil || len(entries) != 1 || entries[0].Step != steps || !entries[0].Committed {
				t.Errorf("after the last retention: %+v %v", entries, err)
			}
			restore(t, comms, loc, steps, steps)
		})
	}
}

func mustOpenS3(t *testing.T, loc string) *s3Store {
	t.Helper()
	s, err := openS3(context.Background(), loc)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The server freezes (SIGSTOP) while an asynchronous save is being written:
// the Wait that follows ends within the storage deadline (WithIOTimeout),
// on every rank, with a storage error naming the location, not a
// collective timeout; once the server runs again the next save commits.
func TestS3StoppedServerDuringAsyncSave(t *testing.T) {
	v := startVersity(t, "ckpt")
	loc := "s3://ckpt/job"
	comms := newJob(t, 2)
	const deadline = 3 * time.Second
	var lb logBuf
	ms := managers(t, comms, loc, WithIOTimeout(deadline), WithLogger(lb.logf))
	mustAll(t, saveAsyncAll(comms, ms, 1, 1))
	var once sync.Once
	testHook = func(p string, rank int) error {
		if p == "write" && rank == 1 {
			once.Do(v.Stop) // after rank 1's first object, before its second
		}
		return nil
	}
	t.Cleanup(func() { testHook = nil })
	took := make([]time.Duration, len(comms))
	errs := onEach(comms, func(r int, c *collective.Comm) error {
		s := newRankState(r)
		s.fill(2, r)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := ms[r].SaveAsync(ctx, 2, s.st); err != nil {
			return fmt.Errorf("SaveAsync: %w", err)
		}
		t0 := time.Now()
		err := ms[r].Wait(ctx)
		took[r] = time.Since(t0)
		return err
	})
	testHook = nil
	v.Cont()
	t.Logf("log:\n%s", lb.String())
	for r, err := range errs {
		t.Logf("rank %d: Wait returned after %v: %v", r, took[r].Round(time.Millisecond), err)
		if err == nil || !strings.HasPrefix(err.Error(), "checkpoint: async save of step 2: ") || !strings.Contains(err.Error(), loc+"/step-000000000002") {
			t.Errorf("rank %d: %v, want a failed async save naming %s", r, err, loc)
		} else if strings.Contains(err.Error(), "collective timeout") {
			t.Errorf("rank %d: a collective timeout, not a storage error: %v", r, err)
		}
		// The deadline, a second for the cancelled requests to end, and
		// the agreement on the outcome.
		if took[r] > deadline+5*time.Second {
			t.Errorf("rank %d: Wait took %v, beyond the storage deadline %v", r, took[r], deadline)
		}
	}
	// The rank whose write or manifest hung says so; the others name it.
	if !strings.Contains(errs[0].Error()+errs[1].Error(), "not done within the storage deadline (3s, WithIOTimeout)") {
		t.Errorf("no rank says that its store did not answer within the storage deadline")
	}
	mustAll(t, saveAsyncAll(comms, ms, 3, 3))
	restore(t, comms, loc, 3, 3)
}
