// Command mnist trains a small neural network on handwritten digits with
// data-parallel SGD over gorun's collectives. Run it alone, or on 4 ranks:
//
//	go run ./cmd/gorun -np 4 ./examples/mnist
//
// It needs no download: 10,000 real MNIST digits are embedded (see
// data/README.md). --data DIR reads the full MNIST or Fashion-MNIST.
//
// Reading order: data.go (IDX files and per-rank sharding), model.go (the
// MLP with its forward and backward pass on gorgonia tensors), cnn.go (the
// optional convolutional network), optim.go
// (SGD and Adam), train.go (the distributed loop: broadcast, Reducer,
// consistency check), balance.go (each rank's share of the global batch
// by its speed), localsgd.go (--sync-every: averaging the models every K
// steps), elastic.go (what changes when gorun --min-np makes the job
// elastic), checkpoint.go (asynchronous saves and resume),
// output.go and progress.go (summaries, progress bar or lines, plot,
// metrics).
//
// With --checkpoint-dir it saves the training state every
// --checkpoint-every steps and at the end, and resumes from the newest
// checkpoint at start (also when gorun --max-restarts relaunches the job):
//
//	go run ./cmd/gorun -np 4 --max-restarts 1 ./examples/mnist --checkpoint-dir /tmp/ck
//
// A save is asynchronous: training stops only while the ranks agree on the
// step and each copies its part of the state aside (a few milliseconds);
// the files are written in the background and the checkpoint is committed
// a few steps later, which its line says:
//
//	checkpoint: step 400 snapshotted in 3ms (training goes on); committed to /tmp/ck/step-000000000400 after 41ms (814 kB)
//
// Until then a restart resumes from the previous checkpoint; the run never
// ends with a save uncommitted. --checkpoint-sync waits for every save
// instead. In an elastic job a save still in flight when the job re-forms
// is abandoned (one log line) and the previous checkpoint kept. The
// location is one of
//
//   - a directory that every rank sees at the same path: a local one for a
//     job on one host, a shared filesystem (NFS, Lustre) across hosts;
//   - a directory with {host} in it, which each rank replaces by its host's
//     name (GORUN_HOST, set by gorun; else the host name), for hosts that
//     do not share a directory: --checkpoint-dir /scratch/ck/{host} keeps
//     every file on its own host and on 2 other hosts (gorun
//     --checkpoint-replicas k for k), so that a checkpoint survives lost
//     hosts;
//   - s3://bucket/prefix, in S3 or any S3-compatible service, configured
//     like every AWS SDK program: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
//     AWS_REGION, AWS_ENDPOINT_URL for a service other than AWS and
//     AWS_S3_FORCE_PATH_STYLE=true for path-style addressing. A missing
//     bucket or refused credentials stop the run before training.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/collective"
)

// Config holds the command line.
type Config struct {
	Data            string
	Epochs          int
	Batch           int // per rank, per micro-batch; 0: derived from the global batch
	GlobalBatch     int // 0: 64, or Batch × ranks × Accumulate when Batch is given
	Accumulate      int // 0: 1, or derived from Batch and GlobalBatch
	Hidden          []int
	Model           string
	Optimizer       string
	LR, Momentum    float64
	Seed            uint64
	Compression     string
	FusionThreshold int
	Timeline        string
	Verbose         bool
	Plot, Metrics   string
	Progress        string
	CPUProfile      string
	CheckpointDir   string
	CheckpointEvery int
	CheckpointSync  bool
	FailAtStep      int
	CommitEvery     int
	Balance         bool // size the ranks' shares by their speed (balance.go)
	BalanceEvery    int
	SlowRank        slowRank
	SyncEvery       int // local SGD when > 1 (localsgd.go)
	OuterLR         float64
	OuterMomentum   float64
	EvalEvery       int // 0: evaluate at the end of each epoch only
}

func parseFlags(args []string) (*Config, error) {
	c := &Config{}
	fs := flag.NewFlagSet("mnist", flag.ContinueOnError)
	fs.StringVar(&c.Data, "data", "", "directory with {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] (full MNIST, Fashion-MNIST); default: the embedded 8,000/2,000 digits")
	fs.IntVar(&c.Epochs, "epochs", 10, "passes over the training set")
	fs.IntVar(&c.Batch, "batch", 0, "samples per rank per micro-batch (the local batch); default: the global batch shared out between the ranks")
	fs.IntVar(&c.GlobalBatch, "global-batch", 0, "samples per optimizer step over all ranks (default 64 whatever the number of ranks, or batch × ranks × accumulate when --batch is given)")
	fs.IntVar(&c.Accumulate, "accumulate", 0, "micro-batches per optimizer step (backward passes per step); default 1, or derived from --batch and --global-batch")
	fs.StringVar(&c.Model, "model", "mlp", "mlp, or cnn (a 5×5 convolution with 8 channels, 2×2 max-pooling, then the --hidden layers)")
	hidden := fs.String("hidden", "128", "hidden layer sizes, comma-separated, e.g. 256,128")
	fs.StringVar(&c.Optimizer, "optimizer", "sgd", "sgd (with momentum) or adam")
	fs.Float64Var(&c.LR, "lr", 0, "learning rate (default 0.03 for sgd, 0.001 for adam)")
	fs.Float64Var(&c.Momentum, "momentum", 0.9, "SGD momentum")
	fs.Uint64Var(&c.Seed, "seed", 1, "seed of the initial weights and of the data order: the same seed gives the same run")
	fs.StringVar(&c.Compression, "compression", "none", "gradient compression on the wire: none, fp16, bf16 or int8")
	fs.IntVar(&c.FusionThreshold, "fusion-threshold", 0, "largest fusion buffer in bytes (0: the Reducer's default, 64 MiB; -1: one allreduce per tensor)")
	fs.StringVar(&c.Timeline, "timeline", "", "write a Chrome trace of the collectives to this file (one per rank: FILE.rankN; gorun --timeline merges them)")
	fs.BoolVar(&c.Verbose, "verbose", false, "let every rank print, not just rank 0")
	fs.StringVar(&c.Plot, "plot", "", "write loss and accuracy curves to this PNG file (rank 0)")
	fs.StringVar(&c.Metrics, "metrics", "", "append one JSON object per epoch to this file (rank 0)")
	fs.StringVar(&c.Progress, "progress", "auto", "progress on stderr: auto (a live bar when there is a terminal, else nothing), on (the bar, or a plain line every tenth of an epoch without a terminal), off")
	fs.StringVar(&c.CheckpointDir, "checkpoint-dir", "", "save checkpoints here and resume from the newest one at start (also after gorun --max-restarts): a directory the ranks share, a per-host directory with {host} in it (replaced by the rank's host name; gorun --checkpoint-replicas copies it to other hosts), or s3://bucket/prefix (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL, AWS_S3_FORCE_PATH_STYLE)")
	fs.IntVar(&c.CheckpointEvery, "checkpoint-every", 100, "optimizer steps between checkpoints (with --checkpoint-dir); a save is asynchronous: training goes on while it is written, and it is committed a few steps later")
	fs.BoolVar(&c.CheckpointSync, "checkpoint-sync", false, "wait for every checkpoint to be written and committed instead of saving in the background")
	fs.IntVar(&c.FailAtStep, "fail-at-step", 0, "testing aid: the last rank fails after this optimizer step on the first launch (GORUN_RESTART_COUNT unset or 0); in an elastic job it kills itself with SIGKILL, as kill -9 would")
	fs.IntVar(&c.CommitEvery, "commit-every", 1, "in an elastic job, optimizer steps between in-memory commits (0: only at the end of each epoch); a lost rank costs the steps since the last commit, and a rank leaves (SIGTERM) at the next one")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "write a CPU profile of this rank to this file (rank N writes FILE.rankN when N > 0)")
	fs.BoolVar(&c.Balance, "balance", true, "size each rank's share of the global batch by its measured speed, so that a slower rank does not hold the others up; the result is the same up to float rounding (--balance=false: even shares, bit-for-bit reproducible runs)")
	fs.IntVar(&c.BalanceEvery, "balance-every", 25, "optimizer steps between re-plans of the shares (with --balance)")
	slow := fs.String("slow-rank", "", "testing aid: R:F makes rank R compute F times as long (it sleeps F-1 times its compute), e.g. 3:2.0")
	fs.IntVar(&c.SyncEvery, "sync-every", 1, "local SGD: each rank steps on its own gradients and the models are averaged every K steps (1: the gradients are averaged at every step)")
	fs.Float64Var(&c.OuterLR, "outer-lr", 1, "local SGD: the factor of the mean delta applied at an average (1: plain model averaging)")
	fs.Float64Var(&c.OuterMomentum, "outer-momentum", 0, "local SGD: momentum of the outer step, applied as Nesterov's (DiLoCo: 0.9 with --outer-lr 0.7)")
	fs.IntVar(&c.EvalEvery, "eval-every", 0, "also evaluate the test set every N optimizer steps and print the time of training so far (0: at the end of each epoch only)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, s := range strings.Split(*hidden, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("--hidden %q: want positive layer sizes like 256,128", *hidden)
		}
		c.Hidden = append(c.Hidden, n)
	}
	if c.LR == 0 {
		c.LR = map[string]float64{"sgd": 0.03, "adam": 0.001}[c.Optimizer]
	}
	switch {
	case c.Epochs <= 0:
		return nil, fmt.Errorf("--epochs %d must be positive", c.Epochs)
	case given["batch"] && c.Batch <= 0:
		return nil, fmt.Errorf("--batch %d must be positive", c.Batch)
	case given["global-batch"] && c.GlobalBatch <= 0:
		return nil, fmt.Errorf("--global-batch %d must be positive", c.GlobalBatch)
	case c.CommitEvery < 0:
		return nil, fmt.Errorf("--commit-every %d must not be negative (0: commit only at the end of each epoch)", c.CommitEvery)
	case c.Accumulate < 0:
		return nil, fmt.Errorf("--accumulate %d must not be negative", c.Accumulate)
	case c.BalanceEvery <= 0:
		return nil, fmt.Errorf("--balance-every %d must be positive", c.BalanceEvery)
	case c.SyncEvery <= 0:
		return nil, fmt.Errorf("--sync-every %d must be positive (1: average the gradients at every step)", c.SyncEvery)
	case c.EvalEvery < 0:
		return nil, fmt.Errorf("--eval-every %d must not be negative", c.EvalEvery)
	case c.OuterLR <= 0:
		return nil, fmt.Errorf("--outer-lr %g must be positive", c.OuterLR)
	case c.OuterMomentum < 0 || c.OuterMomentum >= 1:
		return nil, fmt.Errorf("--outer-momentum %g must be in [0, 1)", c.OuterMomentum)
	}
	var err error
	if c.SlowRank, err = parseSlowRank(*slow); err != nil {
		return nil, err
	}
	switch c.Progress {
	case "auto", "on", "off":
	default:
		return nil, fmt.Errorf("--progress %q: want auto, on or off", c.Progress)
	}
	return c, nil
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err == flag.ErrHelp {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mnist:", err)
		os.Exit(2)
	}
	// Ctrl-C stops the rank. So does SIGTERM, except in an elastic job,
	// where it is a graceful leave at the next commit (Train): the other
	// ranks go on without losing a step, as a cluster that takes the node
	// away (a deleted pod, a preempted job, a shrinking host list) expects.
	sigs := []os.Signal{os.Interrupt}
	if os.Getenv(collective.EnvElastic) != "1" {
		sigs = append(sigs, syscall.SIGTERM)
	}
	ctx, stop := signal.NotifyContext(context.Background(), sigs...)
	defer stop()
	// Every rank writes its own profile and timeline: check both before any
	// work. (Rank 0's --plot and --metrics are checked in Train.)
	for _, f := range []struct{ flag, path string }{{"--cpuprofile", cfg.CPUProfile}, {"--timeline", cfg.Timeline}} {
		if err := checkOutputFile(f.flag, f.path); err != nil {
			fmt.Fprintln(os.Stderr, "mnist:", err)
			os.Exit(2)
		}
	}
	if cfg.CPUProfile != "" {
		stopProfile, err := startCPUProfile(cfg.CPUProfile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "mnist: --cpuprofile %s: %v\n", cfg.CPUProfile, err)
			os.Exit(2)
		}
		defer stopProfile()
	}
	if err := Train(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "mnist:", err)
		os.Exit(exitStatus(err))
	}
}

func startCPUProfile(path string) (stop func(), err error) {
	if r := os.Getenv("GORUN_RANK"); r != "" && r != "0" {
		path += ".rank" + r
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// checkRankPaths checks, before any training, the paths this rank will
// write: the plot (rank 0) and the checkpoint directory (every rank, with
// {host} replaced as checkpoint.New does; it is created if missing, as
// checkpoint.New would). An s3:// location is checked by checkpoint.New
// (the bucket and the credentials). The metrics file is created right away by
// output.openMetrics.
func checkRankPaths(cfg *Config, rank int) error {
	if rank == 0 {
		if err := checkOutputFile("--plot", cfg.Plot); err != nil {
			return err
		}
	}
	if cfg.CheckpointDir == "" {
		return nil
	}
	dir, err := checkpoint.ExpandHost(cfg.CheckpointDir)
	if err != nil {
		return fmt.Errorf("--checkpoint-dir: %w", err)
	}
	if checkpoint.IsRemote(dir) {
		return nil
	}
	name := dir // in messages: as given, and what it means on this host
	if dir != cfg.CheckpointDir {
		name = fmt.Sprintf("%s (%s on this host)", cfg.CheckpointDir, dir)
	}
	if st, err := os.Stat(dir); err == nil && !st.IsDir() {
		return fmt.Errorf("--checkpoint-dir %s is a file, not a directory", name)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("--checkpoint-dir %s cannot be created: %w", name, err)
	}
	if err := unix.Access(dir, unix.W_OK); err != nil {
		return fmt.Errorf("--checkpoint-dir %s is not writable: %w", name, err)
	}
	return nil
}

// checkOutputFile fails, naming the flag, when path could not be created
// later: its directory is missing or not writable, or path is a directory.
func checkOutputFile(flagName, path string) error {
	if path == "" {
		return nil
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return fmt.Errorf("%s %s is a directory; give a file name", flagName, path)
	}
	dir := filepath.Dir(path)
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s %s: directory %s does not exist; create it or choose another path", flagName, path, dir)
	case err != nil:
		return fmt.Errorf("%s %s: %w", flagName, path, err)
	case !st.IsDir():
		return fmt.Errorf("%s %s: %s is not a directory", flagName, path, dir)
	}
	if err := unix.Access(dir, unix.W_OK); err != nil {
		return fmt.Errorf("%s %s: cannot write in %s: %w", flagName, path, dir, err)
	}
	return nil
}
