// Command ckptprog is the rank program of gorun's checkpoint tests: it
// trains a small deterministic model (linear regression with momentum on
// synthetic data) data-parallel, with a barrier checkpoint every few steps,
// and can kill itself once to show that a restarted job ends bit for bit
// where an uninterrupted one ends.
//
//	CKPTPROG_DIR=D        checkpoint directory (required)
//	CKPTPROG_STEPS=S      steps to train (default 60)
//	CKPTPROG_EVERY=K      checkpoint every K steps (default 5)
//	CKPTPROG_SEED=N       seed of the data, the model and the RNGs (default 1)
//	CKPTPROG_KEEP=K       keep the newest K checkpoints (default: the
//	                      package's, 2)
//	CKPTPROG_IO_TIMEOUT=D the storage deadline (checkpoint.WithIOTimeout;
//	                      default: the package's)
//	CKPTPROG_KILL=R:S     rank R sends itself SIGKILL before step S, on the
//	                      first launch only (GORUN_RESTART_COUNT=0)
//	CKPTPROG_KILL=R:S:D   rank R sends itself SIGKILL a random time in [0, D)
//	                      after step S starts, wherever it then is (often in
//	                      the middle of a checkpoint save; if training ends
//	                      first, it waits for the kill there), first launch
//	                      only
//	CKPTPROG_OUT=F        rank 0 writes the final parameters to F, as the hex
//	                      of their float32 bits
//	CKPTPROG_ASYNC=1      save with SaveAsync (the writes run in the background
//	                      while training goes on) and Poll every step; the
//	                      default is Save (either way, Wait before the final
//	                      result)
//	CKPTPROG_PAUSE=S:F    on the first launch only, once the save of step S
//	                      returns (with Save: the checkpoint is committed;
//	                      with SaveAsync: it is started, its writes in the
//	                      background and its commit to come), rank 0 prints
//	                      "ckptprog: paused after saving step S" and opens
//	                      the FIFO F for reading, which blocks it (and the
//	                      others at their next collective) until a writer
//	                      opens F: a test's moment to act
//	CKPTPROG_BENCH=BYTES  instead: time Save of a BYTES-sized state against
//	                      an allreduce of it, and print the numbers
//
// Everything that decides the result is either derived from the seed and
// the step (the data order of each epoch) or in the checkpoint (parameters,
// momentum, each rank's noise RNG and data position).
package main

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/collective"
)

const (
	features = 16
	samples  = 1024
	batch    = 8 // per rank
	lr       = 0.05
	beta     = 0.9
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// fatal ends the rank, saying why; a checkpoint failure among args that a
// restart would meet again ends it with checkpoint.ExitNoRestart, after a
// last line that says so, as gorun wants it.
func fatal(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "ckptprog: "+format+"\n", args...)
	for _, a := range args {
		if err, ok := a.(error); ok {
			if why, ok := checkpoint.NoRestart(err); ok {
				fmt.Fprintf(os.Stderr, "ckptprog: %s; a restart would fail the same way\n", why)
				os.Exit(checkpoint.ExitNoRestart)
			}
		}
	}
	os.Exit(1)
}

func main() {
	ctx := context.Background()
	comm, err := collective.Init(ctx)
	if err != nil {
		fatal("%v", err)
	}
	defer comm.Close()
	dir := os.Getenv("CKPTPROG_DIR")
	if dir == "" {
		fatal("set CKPTPROG_DIR")
	}
	if b := os.Getenv("CKPTPROG_BENCH"); b != "" {
		n, err := strconv.ParseInt(b, 10, 64)
		if err != nil {
			fatal("CKPTPROG_BENCH: %v", err)
		}
		bench(ctx, comm, dir, n)
		return
	}
	train(ctx, comm, dir)
}

func train(ctx context.Context, comm *collective.Comm, dir string) {
	rank, n := comm.Rank(), comm.Size()
	steps, every := int64(envInt("CKPTPROG_STEPS", 60)), int64(envInt("CKPTPROG_EVERY", 5))
	seed := uint64(envInt("CKPTPROG_SEED", 1))
	killRank, killStep := -1, int64(-1)
	var killWithin time.Duration
	if k := os.Getenv("CKPTPROG_KILL"); k != "" {
		f := strings.Split(k, ":")
		killRank, _ = strconv.Atoi(f[0])
		if len(f) > 1 {
			ks, _ := strconv.Atoi(f[1])
			killStep = int64(ks)
		}
		if len(f) > 2 {
			killWithin, _ = time.ParseDuration(f[2])
		}
	}
	firstLaunch := os.Getenv("GORUN_RESTART_COUNT") == "" || os.Getenv("GORUN_RESTART_COUNT") == "0"
	async := os.Getenv("CKPTPROG_ASYNC") == "1"
	pauseStep, pauseFIFO := int64(-1), ""
	if p := os.Getenv("CKPTPROG_PAUSE"); p != "" && firstLaunch {
		s, f, ok := strings.Cut(p, ":")
		ps, err := strconv.ParseInt(s, 10, 64)
		if !ok || err != nil || f == "" {
			fatal("CKPTPROG_PAUSE=%q: want STEP:FIFO", p)
		}
		pauseStep, pauseFIFO = ps, f
	}
	// saved is called once Save or SaveAsync of step s returns.
	saved := func(s int64) {
		if rank == 0 && s == pauseStep {
			fmt.Printf("ckptprog: paused after saving step %d\n", s)
			f, err := os.Open(pauseFIFO) // blocks until a writer opens it
			if err != nil {
				fatal("CKPTPROG_PAUSE: %v", err)
			}
			f.Close()
			fmt.Printf("ckptprog: going on after step %d\n", s)
		}
	}
	var saveTimes []time.Duration // of each Save

	// The data set: x ~ U(-1,1), y = x·wTrue + noise, the same on every rank.
	data := rand.New(rand.NewPCG(seed, 0xda7a))
	wTrue := make([]float32, features)
	for i := range wTrue {
		wTrue[i] = float32(data.NormFloat64())
	}
	xs := make([][]float32, samples)
	ys := make([]float32, samples)
	for s := range xs {
		xs[s] = make([]float32, features)
		for i := range xs[s] {
			xs[s][i] = float32(data.Float64()*2 - 1)
		}
		for i := range wTrue {
			ys[s] += xs[s][i] * wTrue[i]
		}
		ys[s] += float32(data.NormFloat64() * 0.01)
	}

	// The state: replicated parameters and momentum; per rank, the RNG that
	// draws gradient noise and the data position.
	w := make([]float32, features+1) // weights and bias
	mom := make([]float32, features+1)
	noise := rand.NewPCG(seed, uint64(rank)+1)
	var pos int64 // samples of the current epoch this rank has consumed
	st := new(checkpoint.State).Tensor("w", w).Tensor("momentum", mom).Binary("noise", noise).Int64("pos", &pos)
	var opts []checkpoint.Option
	if k := envInt("CKPTPROG_KEEP", 0); k > 0 {
		opts = append(opts, checkpoint.WithKeep(k))
	}
	if d := os.Getenv("CKPTPROG_IO_TIMEOUT"); d != "" {
		io, err := time.ParseDuration(d)
		if err != nil {
			fatal("CKPTPROG_IO_TIMEOUT: %v", err)
		}
		opts = append(opts, checkpoint.WithIOTimeout(io))
	}
	ckpt, err := checkpoint.New(comm, dir, opts...)
	if err != nil {
		fatal("%v", err)
	}
	start, found, err := ckpt.Restore(ctx, st)
	if err != nil {
		fatal("%v", err)
	}
	if rank == 0 {
		if found {
			fmt.Printf("resumed from the checkpoint of step %d\n", start)
		} else {
			fmt.Println("fresh start")
		}
	}
	nr := rand.New(noise)
	perEpoch := int64(samples / (batch * n))
	var order []int
	orderEpoch := int64(-1)
	grad := make([]float32, features+1)
	armed := false // a delayed SIGKILL of this rank is pending
	for step := start; step < steps; step++ {
		if firstLaunch && rank == killRank && step == killStep {
			if killWithin > 0 {
				d := time.Duration(rand.Int64N(int64(killWithin)))
				armed = true
				go func() {
					time.Sleep(d)
					fmt.Printf("rank %d: SIGKILL %v after step %d started\n", rank, d, step)
					syscall.Kill(os.Getpid(), syscall.SIGKILL)
				}()
			} else {
				fmt.Printf("rank %d: SIGKILL before step %d\n", rank, step)
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		}
		epoch := step / perEpoch
		if epoch != orderEpoch { // data order from seed and epoch
			order = rand.New(rand.NewPCG(seed, uint64(epoch)+100)).Perm(samples)
			orderEpoch = epoch
		}
		if step%perEpoch == 0 {
			pos = 0
		}
		clear(grad)
		for b := range batch {
			s := order[(pos+int64(b))*int64(n)+int64(rank)]
			pred := w[features]
			for i, x := range xs[s] {
				pred += w[i] * x
			}
			e := pred - ys[s]
			for i, x := range xs[s] {
				grad[i] += e * x / batch
			}
			grad[features] += e / batch
		}
		pos += batch
		for i := range grad {
			grad[i] += float32(nr.NormFloat64() * 1e-3) // per-rank noise
		}
		if err := comm.Allreduce(ctx, grad, collective.Avg, collective.Name("grad")); err != nil {
			fatal("step %d: %v", step, err)
		}
		for i := range w {
			mom[i] = beta*mom[i] + grad[i]
			w[i] -= lr * mom[i]
		}
		if async {
			// Collective, every step: commits the save in flight once
			// every rank has written its files.
			if err := ckpt.Poll(ctx); err != nil {
				fatal("step %d: %v", step, err)
			}
		}
		if (step+1)%every == 0 {
			if async {
				if err := ckpt.SaveAsync(ctx, step+1, st); err != nil {
					fatal("%v", err)
				}
				saved(step + 1)
			} else {
				if err := ckpt.Save(ctx, step+1, st); err != nil {
					fatal("%v", err)
				}
				saveTimes = append(saveTimes, ckpt.LastSave().Total)
				saved(step + 1)
			}
		}
	}
	if armed {
		// Training ended before the delayed SIGKILL: wait for it, so that
		// the first launch always dies (here, the others in their next
		// collective or done).
		<-make(chan struct{})
	}
	// The last save's commit (SaveAsync) and the deletion of old
	// checkpoints, which runs in the background (both).
	if err := ckpt.Wait(ctx); err != nil {
		fatal("%v", err)
	}
	if rank == 0 {
		var loss float64
		for s := range xs {
			pred := w[features]
			for i, x := range xs[s] {
				pred += w[i] * x
			}
			loss += float64((pred - ys[s]) * (pred - ys[s]))
		}
		fmt.Printf("done: %d steps, loss %.6f\n", steps, loss/samples)
		if len(saveTimes) > 0 {
			slices.Sort(saveTimes)
			fmt.Printf("saves: %d, median %v, max %v\n", len(saveTimes), saveTimes[len(saveTimes)/2], saveTimes[len(saveTimes)-1])
		}
		if out := os.Getenv("CKPTPROG_OUT"); out != "" {
			var raw []byte
			for _, v := range append(append([]float32(nil), w...), mom...) {
				raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(v))
			}
			if err := os.WriteFile(out, []byte(hex.EncodeToString(raw)+"\n"), 0o644); err != nil {
				fatal("%v", err)
			}
		}
	}
}

// bench times a Save of a state of the given size against an allreduce of
// the same buffer (a stand-in for a training step's communication).
func bench(ctx context.Context, comm *collective.Comm, dir string, size int64) {
	w := make([]float32, size/4)
	for i := range w {
		w[i] = float32(i)
	}
	st := new(checkpoint.State).Tensor("w", w)
	ckpt, err := checkpoint.New(comm, dir)
	if err != nil {
		fatal("%v", err)
	}
	iters := envInt("CKPTPROG_ITERS", 5)
	var saves, writes, ars []time.Duration
	for i := range iters {
		t0 := time.Now()
		if err := comm.Allreduce(ctx, w, collective.Avg); err != nil {
			fatal("%v", err)
		}
		ars = append(ars, time.Since(t0))
		if err := ckpt.Save(ctx, int64(i+1), st); err != nil {
			fatal("%v", err)
		}
		s := ckpt.LastSave()
		saves, writes = append(saves, s.Total), append(writes, s.Write)
	}
	clear(w)
	t0 := time.Now()
	if _, _, err := ckpt.Restore(ctx, st); err != nil {
		fatal("%v", err)
	}
	restore := time.Since(t0)
	if w[12345] != 12345 {
		fatal("restore: w[12345] = %v", w[12345])
	}
	med := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	save, write, ar := med(saves), med(writes), med(ars)
	mib := float64(size) / (1 << 20)
	if comm.Rank() == 0 {
		fmt.Printf("state %.0f MiB, %d ranks, median of %d: save %v (%.0f MiB/s; min %v, max %v), rank 0 wrote its %.1f MiB shard in %v (%.0f MiB/s); allreduce of the same buffer %v; one save = %.2f allreduces; restore (rank 0 reads and verifies all shards, broadcasts) %v\n",
			mib, comm.Size(), iters, save.Round(time.Millisecond), mib/save.Seconds(), saves[0].Round(time.Millisecond), saves[len(saves)-1].Round(time.Millisecond),
			mib/float64(comm.Size()), write.Round(time.Millisecond), mib/float64(comm.Size())/write.Seconds(), ar.Round(time.Millisecond), save.Seconds()/ar.Seconds(), restore.Round(time.Millisecond))
	}
}
