// Command elasticprog is a rank program for gorun's elastic-job tests. It
// is built on p2p and ring directly (not on collective's elastic API), so
// it tests the launcher and the membership layer alone.
//
// It joins the job described by gorun's environment (GORUN_RENDEZVOUS,
// GORUN_JOB_KEY or GORUN_JOB_KEY_FILE, GORUN_RANK, -1 for a joiner, GORUN_SIZE,
// GORUN_HEARTBEAT_TIMEOUT, GORUN_TIMEOUT, GORUN_LISTEN_IP) as an elastic
// member and runs steps: each step is an int64 Sum allreduce of
// [1, joiners waiting, stop requested, step], whose result it checks (the
// first element must be the epoch's size, the last size×step). After a
// membership change it calls Reconfigure; when a member sees joiners
// waiting, every member calls Grow at the same step. In every new epoch
// the members first agree on the step (a Max allreduce), so a joiner and a
// rank that finished the interrupted step one ahead go on together.
//
// It prints, on stdout:
//
//	elasticprog: pid 1234, GORUN_RANK=2             at start
//	elasticprog: epoch 1: rank 1 of 3 at step 57 (lost [2], joined [])   per epoch
//	elasticprog: done at step 80 in epoch 1 as rank 1 of 3               at the end
//
// and exits 0 at the end of the step in which any member saw the file
// named by --until-file. Any other end is an error on stderr and exit 1.
package main

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/p2p"
	"github.com/gorun/gorun/ring"
)

func main() {
	untilFile := flag.String("until-file", "", "exit 0 (every member, at the same step) once this file exists")
	stepTime := flag.Duration("step-time", 10*time.Millisecond, "compute time each step stands for")
	flag.DurationVar(&joinerDelay, "joiner-delay", 0, "a joiner (GORUN_RANK=-1) waits this long before it joins (a slow start)")
	flag.IntVar(&failRank, "fail-after-done", -1, "the process started as this GORUN_RANK exits 3 after it finished and closed cleanly (once --fail-when exists)")
	flag.StringVar(&failWhen, "fail-when", "", "with --fail-after-done: wait for this file before failing")
	flag.StringVar(&exitWhen, "exit-when", "", "a process that finished, closed cleanly and does not fail waits for this file before it exits 0")
	flag.Parse()
	if err := run(*untilFile, *stepTime); err != nil {
		fmt.Fprintf(os.Stderr, "elasticprog: %v\n", err)
		os.Exit(1)
	}
}

var (
	joinerDelay time.Duration
	failRank    = -1
	failWhen    string
	exitWhen    string
)

// waitFile waits until path exists ("": at once).
func waitFile(path string) {
	for path != "" {
		if _, err := os.Stat(path); err == nil {
			return
		}
		time.Sleep(10 * time.Millisecond) // a poll: the test creates it when it likes
	}
}

func envDuration(name string, def time.Duration) (time.Duration, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: %v", name, v, err)
	}
	return d, nil
}

func run(untilFile string, stepTime time.Duration) error {
	if untilFile == "" {
		return errors.New("--until-file is required: the test says when to stop by creating it")
	}
	if os.Getenv(collective.EnvElastic) != "1" {
		return errors.New("GORUN_ELASTIC is not 1: run me under gorun with --min-np below -np or a --host-discovery-script")
	}
	rank, err := strconv.Atoi(os.Getenv(collective.EnvRank))
	if err != nil {
		return fmt.Errorf("GORUN_RANK: %v", err)
	}
	size, _ := strconv.Atoi(os.Getenv(collective.EnvSize))
	keyText := os.Getenv(collective.EnvJobKey)
	if f := os.Getenv(collective.EnvJobKeyFile); keyText == "" && f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		keyText = strings.TrimSpace(string(b))
	}
	key, err := hexKey(keyText)
	if err != nil {
		return err
	}
	hb, err := envDuration(collective.EnvHeartbeatTimeout, 0)
	if err != nil {
		return err
	}
	timeout, err := envDuration(collective.EnvTimeout, collective.DefaultTimeout)
	if err != nil {
		return err
	}
	fmt.Printf("elasticprog: pid %d, GORUN_RANK=%d\n", os.Getpid(), rank)
	if rank < 0 {
		time.Sleep(joinerDelay)
	}
	cfg := p2p.Config{Rank: rank, Size: size, JobKey: key, Rendezvous: os.Getenv(collective.EnvRendezvous),
		ListenIP: os.Getenv(collective.EnvListenIP), DataPlane: os.Getenv(collective.EnvDataPlane),
		Timeout: timeout, Elastic: true, HeartbeatTimeout: hb}
	if os.Getenv(collective.EnvVerbose) != "" {
		cfg.Logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, "p2p: "+format+"\n", args...) }
	}
	ctx := context.Background()
	// A joiner waits in Join until the members admit it (Grow): as long
	// as the job runs, which is gorun's to bound.
	node, err := p2p.Join(ctx, cfg)
	if err != nil {
		return err
	}
	defer node.Close()
	view, err := node.Reconfigure(ctx) // the current epoch's view
	if err != nil {
		return err
	}
	m := &member{node: node, timeout: timeout}
	if err := m.newEpoch(ctx, view); err != nil {
		return err
	}
	for {
		time.Sleep(stepTime) // the step's compute, not synchronisation
		stop := int64(0)
		if _, err := os.Stat(untilFile); err == nil {
			stop = 1
		}
		pending := int64(min(node.PendingJoiners(), 1))
		res, err := m.allreduce(ctx, ring.Sum, []int64{1, pending, stop, m.step})
		if err != nil {
			if err := m.recover(ctx, err); err != nil {
				return err
			}
			continue
		}
		if n := int64(node.Size()); res[0] != n || res[3] != n*m.step {
			return fmt.Errorf("epoch %d step %d: rank %d: allreduce gave %v, want [%d _ _ %d]: members are not in step", node.Epoch(), m.step, node.Rank(), res, n, n*m.step)
		}
		m.step++
		if res[2] > 0 {
			fmt.Printf("elasticprog: done at step %d in epoch %d as rank %d of %d\n", m.step, node.Epoch(), node.Rank(), node.Size())
			if err := node.Close(); err != nil {
				return err
			}
			if rank != failRank || rank < 0 {
				waitFile(exitWhen)
				return nil
			}
			waitFile(failWhen)
			fmt.Fprintf(os.Stderr, "elasticprog: failing after it finished (--fail-after-done %d)\n", failRank)
			os.Exit(3)
		}
		if res[1] > 0 {
			epoch := node.Epoch()
			v, err := node.Grow(ctx)
			if err != nil {
				if err := m.recover(ctx, err); err != nil {
					return err
				}
				continue
			}
			if v.Epoch != epoch {
				if err := m.newEpoch(ctx, v); err != nil {
					if err := m.recover(ctx, err); err != nil {
						return err
					}
				}
			}
		}
	}
}

// member is this process's part of the job in the current epoch.
type member struct {
	node    *p2p.Node
	timeout time.Duration
	r       *ring.Ring
	seq     uint64 // collectives in this epoch
	step    int64
}

// recover follows a membership change into the next epoch; any other
// error is final.
func (m *member) recover(ctx context.Context, err error) error {
	var mc *p2p.MembershipChangeError
	if !errors.As(err, &mc) && !errors.As(m.node.Err(), &mc) {
		return err
	}
	for {
		v, err := m.node.Reconfigure(ctx)
		if err != nil {
			return err
		}
		err = m.newEpoch(ctx, v)
		if err == nil {
			return nil
		}
		if !errors.As(err, &mc) && !errors.As(m.node.Err(), &mc) {
			return err
		}
	}
}

// newEpoch sets up the ring of the epoch v describes and agrees with the
// other members on the step to go on from.
func (m *member) newEpoch(ctx context.Context, v p2p.View) error {
	r, err := ring.New(ring.Config{Rank: v.Rank, Size: v.Size}, m.node.Transport())
	if err != nil {
		return err
	}
	m.r, m.seq = r, 0
	res, err := m.allreduce(ctx, ring.Max, []int64{m.step})
	if err != nil {
		return err
	}
	m.step = res[0]
	lost := make([]int, len(v.Lost))
	for i, l := range v.Lost {
		lost[i] = l.Rank
	}
	fmt.Printf("elasticprog: epoch %d: rank %d of %d at step %d (lost %v, joined %v)\n", v.Epoch, v.Rank, v.Size, m.step, lost, v.Joined)
	return nil
}

func (m *member) allreduce(ctx context.Context, op ring.Op, vals []int64) ([]int64, error) {
	buf := make([]byte, 8*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint64(buf[8*i:], uint64(v))
	}
	m.seq++
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	if err := m.r.Allreduce(ctx, ring.Call{Kind: ring.Allreduce, Seq: m.seq, Op: op, DType: ring.Int64, Count: len(vals)}, buf); err != nil {
		return nil, err
	}
	out := make([]int64, len(vals))
	for i := range out {
		out[i] = int64(binary.LittleEndian.Uint64(buf[8*i:]))
	}
	return out, nil
}

func hexKey(s string) ([]byte, error) {
	b, err := hex.DecodeString(s)
	if err != nil || len(b) < 16 {
		return nil, errors.New("GORUN_JOB_KEY is not a hex key of at least 32 digits: run me under gorun")
	}
	return b, nil
}
