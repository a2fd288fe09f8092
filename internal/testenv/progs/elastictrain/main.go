// Command elastictrain is the rank program of gorun's elastic training
// tests and recovery benchmark (e2e/elastic_*_test.go). Unlike
// internal/testenv/progs/elasticprog, which drives p2p directly, it is a training loop
// written against the collective package's elastic API, as a user would:
// collective.RunElastic, an ElasticState with replicated and rank-unique
// state, and an ElasticSampler.
//
// The model is exact: int64 parameters and momentum updated from an int64
// Sum allreduce of per-sample gradients. A Sum of integers does not depend
// on how a global batch is split among ranks, so however many ranks a run
// loses or gains, it must end with exactly the parameters of -reference, a
// one-process run over the same global batches. Every step also allreduces
// a per-sample use count (seen[epoch·L + i]) that is part of the committed
// state: a step that a reset re-runs is counted once, and the final line
// says how many samples each epoch used, and how many were used twice or
// never.
//
// Output (stdout, and with -log-dir also DIR/<pid>.log, which survives a
// cut ssh link):
//
//	start pid=<pid> rank=<r> size=<n> joiner=<bool> gen=<restart count>
//	step <epoch> <steps> <unix-nanos> size=<n> mepoch=<m> gen=<g>   rank 0, after each step's commit
//	interrupted rank=<r> mepoch=<m> steps=<steps done here>: <error>   a step failed: membership change
//	reset rank=<r> mepoch=<m> size=<old>-><new> lost=<ranks> joined=<ranks> commit=<commits> took=<ms>ms
//	final rank=<r> params=<sha256> samples=<per-epoch counts> dup=<n> miss=<n> steps=<n> size=<n> mepoch=<m>
//	left rank=<r> steps=<steps done> why=<why>   it left the job gracefully (SIGTERM) at that commit; exit 0
//
// With -gate-file and -gate-step the job stops before that step and waits,
// committing (so joiners are admitted), until every rank sees the file: a
// test creates it once it has killed, frozen or added what it wanted, so
// the fault always lands in a running job and the test needs no sleeps.
//
// Any error ends the process with exit status 1 and "elastictrain: <error>"
// on stderr (and in the log file).
//
// With -ckpt-dir the program is the restart path's version of the same
// job (gorun --max-restarts, not elastic): it restores from the newest disk
// checkpoint (package checkpoint) at start and saves one every -ckpt-every
// steps.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/collective"
)

const dim = 4

type options struct {
	epochs, length, batch int
	seed                  uint64
	delay                 time.Duration
	gateFile              string
	gateStep              int64
	gatePoll              time.Duration
	ckptDir               string
	ckptEvery             int64
	logDir                string
	reference             bool
}

func main() {
	var o options
	flag.IntVar(&o.epochs, "epochs", 2, "epochs to train")
	flag.IntVar(&o.length, "len", 64, "dataset length (samples)")
	flag.IntVar(&o.batch, "batch", 8, "global batch (samples per step, the whole job)")
	seed := flag.Uint64("seed", 42, "seed of the sampler's permutations")
	flag.DurationVar(&o.delay, "delay", 0, "compute time each step stands for (a workload: keeps the job running long enough for a test to act)")
	flag.StringVar(&o.gateFile, "gate-file", "", "with -gate-step: before that step the job waits, committing, until every rank sees this file")
	flag.Int64Var(&o.gateStep, "gate-step", -1, "the step (count of steps done) at which the job waits for -gate-file")
	flag.DurationVar(&o.gatePoll, "gate-poll", 20*time.Millisecond, "how often the ranks look for -gate-file")
	flag.StringVar(&o.ckptDir, "ckpt-dir", "", "restart path: restore from and save disk checkpoints here (package checkpoint)")
	flag.Int64Var(&o.ckptEvery, "ckpt-every", 10, "with -ckpt-dir: save a checkpoint every this many steps")
	flag.StringVar(&o.logDir, "log-dir", "", "also write every output line to DIR/<pid>.log")
	flag.BoolVar(&o.reference, "reference", false, "train alone, without gorun, and print the final line the job must end with")
	flag.Parse()
	o.seed = *seed
	if o.epochs < 1 || o.length < 1 || o.batch < 1 {
		fmt.Fprintf(os.Stderr, "elastictrain: -epochs, -len and -batch must be at least 1 (got %d, %d, %d)\n", o.epochs, o.length, o.batch)
		os.Exit(2)
	}
	if (o.gateFile == "") != (o.gateStep < 0) {
		fmt.Fprintln(os.Stderr, "elastictrain: -gate-file and -gate-step go together")
		os.Exit(2)
	}
	if o.logDir != "" {
		f, err := os.OpenFile(filepath.Join(o.logDir, strconv.Itoa(os.Getpid())+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			fmt.Fprintf(os.Stderr, "elastictrain: -log-dir: %v\n", err)
			os.Exit(1)
		}
		logFile = f
	}
	var err error
	if o.reference {
		err = reference(o)
	} else {
		err = train(o)
	}
	if err != nil {
		msg := "elastictrain: " + strings.ReplaceAll(err.Error(), "\n", " ")
		fmt.Fprintln(os.Stderr, msg)
		if logFile != nil {
			fmt.Fprintln(logFile, msg)
		}
		os.Exit(1)
	}
}

var (
	outMu   sync.Mutex
	stdout  io.Writer = os.Stdout // tests replace it
	logFile *os.File
)

// say prints one output line on stdout and in the log file.
func say(format string, args ...any) {
	line := fmt.Sprintf(format, args...) + "\n"
	outMu.Lock()
	defer outMu.Unlock()
	io.WriteString(stdout, line)
	if logFile != nil {
		logFile.WriteString(line)
	}
}

// model is the exact toy: parameters, momentum, per-sample use counts of
// every epoch, the count of steps done, and the sampler.
type model struct {
	p, m  []int64
	seen  []int64
	steps int64
	s     *collective.ElasticSampler
	l     int
}

func newModel(o options, init int64) *model {
	md := &model{p: make([]int64, dim), m: make([]int64, dim), seen: make([]int64, o.epochs*o.length),
		s: collective.NewElasticSampler(o.length, o.seed), l: o.length}
	for j := range md.p {
		md.p[j] = init + int64(j)
	}
	return md
}

// grads adds the gradient sum over idx, and their use counts, to buf.
func (md *model) grads(buf []int64, idx []int, epoch int) {
	for _, i := range idx {
		for j := range dim {
			buf[j] += int64(i)*31 + int64(j)*7 + md.p[j]%13 + 1
		}
		buf[dim+epoch*md.l+i]++
	}
}

// apply is the optimizer step, the same on every rank.
func (md *model) apply(buf []int64) {
	for j := range dim {
		md.m[j] = md.m[j]*3/4 + buf[j]
		md.p[j] += buf[j] - md.m[j]%101
	}
	for i, v := range buf[dim:] {
		md.seen[i] += v
	}
	md.steps++
}

// final is the line every rank (and -reference) ends with.
func (md *model) final(rank string, extra string) string {
	h := sha256.New()
	for _, v := range append(append([]int64{}, md.p...), md.m...) {
		binary.Write(h, binary.LittleEndian, v)
	}
	epochs := len(md.seen) / md.l
	counts := make([]string, epochs)
	dup, miss := 0, 0
	for e := range epochs {
		n := int64(0)
		for _, c := range md.seen[e*md.l : (e+1)*md.l] {
			n += c
			switch {
			case c == 0:
				miss++
			case c > 1:
				dup += int(c - 1)
			}
		}
		counts[e] = strconv.FormatInt(n, 10)
	}
	return fmt.Sprintf("final rank=%s params=%s samples=%s dup=%d miss=%d steps=%d%s",
		rank, hex.EncodeToString(h.Sum(nil)), strings.Join(counts, ","), dup, miss, md.steps, extra)
}

func reference(o options) error {
	md := newModel(o, 1)
	for md.s.Epoch() < o.epochs {
		for !md.s.EpochDone() {
			e := md.s.Epoch()
			buf := make([]int64, dim+len(md.seen))
			md.grads(buf, md.s.Next(o.batch, 0, 1), e)
			md.apply(buf)
		}
		md.s.NextEpoch()
	}
	say("%s", md.final("ref", ""))
	return nil
}

// localSteps is rank-unique state: how many steps this process (and the
// lost predecessors whose state it adopted) took part in. It exercises
// the buddy copy; the tests do not need its value.
type localSteps struct{ n int64 }

func (u *localSteps) SaveUnique() ([]byte, error) {
	return binary.LittleEndian.AppendUint64(nil, uint64(u.n)), nil
}

func (u *localSteps) RestoreUnique(own []byte, adopted [][]byte) error {
	u.n = 0
	if len(own) == 8 {
		u.n = int64(binary.LittleEndian.Uint64(own))
	}
	for _, a := range adopted {
		if len(a) != 8 {
			return fmt.Errorf("adopted state of %d bytes, want 8", len(a))
		}
		u.n += int64(binary.LittleEndian.Uint64(a))
	}
	return nil
}

func train(o options) error {
	ctx := context.Background()
	gen := os.Getenv(collective.EnvRestartCount)
	if gen == "" {
		gen = "0"
	}
	comm, err := collective.Init(ctx)
	if err != nil {
		return err
	}
	// A joiner: started by gorun as one, or a replaced pod (Init chose).
	joiner := comm.Joiner()
	defer comm.Close()
	// SIGTERM (a deleted pod, gorun scaling down): leave at the next commit.
	defer comm.LeaveOnSignal(syscall.SIGTERM)()
	say("start pid=%d rank=%d size=%d joiner=%v gen=%s", os.Getpid(), comm.Rank(), comm.Size(), joiner, gen)
	if o.ckptDir != "" && comm.Elastic() {
		return errors.New("-ckpt-dir is for the restart path (gorun --max-restarts), not for an elastic job")
	}

	// A joiner starts from other parameters: only the state it receives
	// from a live rank can make its result right.
	init := int64(1)
	if joiner {
		init = 7777
	}
	md := newModel(o, init)
	st := collective.NewElasticState(comm)
	if err := st.Register("p", md.p, "m", md.m, "seen", md.seen, "steps", &md.steps, "sampler", md.s); err != nil {
		return err
	}
	local := &localSteps{}
	if err := st.RegisterUnique("local steps", local); err != nil {
		return err
	}
	st.OnReset(func(ctx context.Context, ev collective.ElasticEvent) error {
		lost := make([]string, len(ev.Lost))
		for i, l := range ev.Lost {
			lost[i] = strconv.Itoa(l.Rank)
		}
		joined := make([]string, len(ev.Joined))
		for i, j := range ev.Joined {
			joined[i] = strconv.Itoa(j)
		}
		say("reset rank=%d mepoch=%d size=%d->%d lost=[%s] joined=[%s] commit=%d took=%.1fms", ev.Rank, ev.Epoch, ev.OldSize, ev.NewSize,
			strings.Join(lost, ","), strings.Join(joined, ","), ev.Step, float64(ev.Took)/float64(time.Millisecond))
		return nil
	})

	var ck *disk
	if o.ckptDir != "" {
		if ck, err = newDisk(ctx, comm, o, md); err != nil {
			return err
		}
	}

	loop := func(ctx context.Context) error {
		for md.s.Epoch() < o.epochs {
			for !md.s.EpochDone() {
				if md.steps == o.gateStep {
					if err := gate(ctx, comm, st, o); err != nil {
						return err
					}
				}
				if o.delay > 0 {
					time.Sleep(o.delay) // the step's compute
				}
				e := md.s.Epoch()
				buf := make([]int64, dim+len(md.seen))
				md.grads(buf, md.s.Next(o.batch, comm.Rank(), comm.Size()), e)
				if err := comm.Allreduce(ctx, buf, collective.Sum, collective.Name("grads")); err != nil {
					return err
				}
				md.apply(buf)
				local.n++
				if err := st.Commit(ctx); err != nil {
					return err
				}
				if ck != nil && md.steps%o.ckptEvery == 0 {
					if err := ck.save(ctx); err != nil {
						return err
					}
				}
				if comm.Rank() == 0 {
					say("step %d %d %d size=%d mepoch=%d gen=%s", e, md.steps, time.Now().UnixNano(), comm.Size(), comm.Epoch(), gen)
				}
			}
			md.s.NextEpoch()
		}
		return nil
	}
	err = collective.RunElastic(ctx, comm, st, func(ctx context.Context) error {
		err := loop(ctx)
		var mc *collective.MembershipChangeError
		if errors.As(err, &mc) {
			say("interrupted rank=%d mepoch=%d steps=%d: %s", comm.Rank(), comm.Epoch(), md.steps, strings.ReplaceAll(err.Error(), "\n", " "))
		}
		return err
	})
	var left *collective.LeftError
	if errors.As(err, &left) {
		say("left rank=%d steps=%d why=%s", left.Rank, md.steps, left.Why)
		return nil
	}
	if err != nil {
		return err
	}
	say("%s", md.final(strconv.Itoa(comm.Rank()), fmt.Sprintf(" size=%d mepoch=%d", comm.Size(), comm.Epoch())))
	return nil
}

// gate holds the job before a step until every rank sees o.gateFile: the
// test's way to say "go on" once it has done what it came for (killed a
// rank, started a host). It changes no state; it commits while it waits,
// so that joiners are admitted.
func gate(ctx context.Context, comm *collective.Comm, st *collective.ElasticState, o options) error {
	for {
		open := []int64{0}
		if _, err := os.Stat(o.gateFile); err == nil {
			open[0] = 1
		}
		if err := comm.Allreduce(ctx, open, collective.Min, collective.Name("gate")); err != nil {
			return err
		}
		if open[0] == 1 {
			return nil
		}
		time.Sleep(o.gatePoll)
		if err := st.Commit(ctx); err != nil {
			return err
		}
	}
}

// disk is the restart path's checkpointing: the same state on disk.
type disk struct {
	mgr             *checkpoint.Manager
	st              *checkpoint.State
	md              *model
	sEpoch, sCursor int64
}

func newDisk(ctx context.Context, comm *collective.Comm, o options, md *model) (*disk, error) {
	d := &disk{md: md}
	d.st = new(checkpoint.State).Tensor("p", md.p).Tensor("m", md.m).Tensor("seen", md.seen).
		Int64("steps", &md.steps).Int64("sampler epoch", &d.sEpoch).Int64("sampler cursor", &d.sCursor)
	var err error
	if d.mgr, err = checkpoint.New(comm, o.ckptDir); err != nil {
		return nil, err
	}
	at, found, err := d.mgr.Restore(ctx, d.st)
	if err != nil {
		return nil, err
	}
	if found {
		// The sampler has no setter: replay it to the saved position (the
		// same permutation on every rank, so the same position).
		for int64(md.s.Epoch()) < d.sEpoch {
			md.s.NextEpoch()
		}
		for int64(md.s.Cursor()) < d.sCursor {
			md.s.Next(o.batch, 0, 1)
		}
		if int64(md.s.Cursor()) != d.sCursor {
			return nil, fmt.Errorf("checkpoint of step %d: sampler cursor %d is not on a batch boundary", at, d.sCursor)
		}
		if comm.Rank() == 0 {
			say("restored step %d from %s", at, o.ckptDir)
		}
	}
	return d, nil
}

func (d *disk) save(ctx context.Context) error {
	d.sEpoch, d.sCursor = int64(d.md.s.Epoch()), int64(d.md.s.Cursor())
	return d.mgr.Save(ctx, d.md.steps, d.st)
}
