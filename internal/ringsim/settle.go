package ringsim

import (
	"runtime"
	"runtime/metrics"
	"sync"
)

// Settling: how the simulator knows that every goroutine of the simulated
// ranks has done all it can at the current virtual instant, so that the
// clock may move on.
//
// The ranks run the real schedules, whose goroutines wait for each other
// on channels the simulator does not see (a pipelined sender waiting for
// its receiver's progress, the hierarchical schedule's queues). All the
// simulator sees are the calls into its transport. So it asks the Go
// scheduler instead: a simulation runs with GOMAXPROCS 1, where the
// simulator's goroutine, while it runs, is the only one that runs, and
// every other goroutine is either waiting (on a channel, a mutex, the
// transport) or runnable, in a run queue. The scheduler's count of
// runnable goroutines (runtime/metrics "/sched/goroutines/runnable"),
// which it reads under its own lock, is then exact: with one P nobody else
// can make a goroutine runnable while it is read (the schedules make no
// system calls and set no timers). When it is zero, every goroutine of the
// ranks waits for something only the simulator can give: a message's
// arrival. Until then the simulator yields (runtime.Gosched), and the
// goroutines that can run do.
//
// Runtime goroutines (the garbage collector's sweeper, finalizers) that
// happen to be runnable only make the simulator yield once more; they
// cannot make it move on too early. Two simulations in one process would
// each see the other's goroutines forever runnable, so simulations take
// turns (running).

// running serializes simulations within a process.
var running sync.Mutex

// runnableMetric is the scheduler's count of runnable goroutines.
const runnableMetric = "/sched/goroutines/runnable:goroutines"

// exclusive runs f with GOMAXPROCS 1 and no other simulation running.
func exclusive(f func() error) error {
	running.Lock()
	defer running.Unlock()
	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	return f()
}

// settler waits until no other goroutine can run.
type settler struct {
	sample []metrics.Sample
}

func newSettler() *settler {
	return &settler{sample: []metrics.Sample{{Name: runnableMetric}}}
}

// settle returns once no goroutine but the caller's is runnable. It must
// run under exclusive.
func (s *settler) settle() {
	for {
		metrics.Read(s.sample)
		if s.sample[0].Value.Kind() != metrics.KindUint64 {
			panic("ringsim: this Go runtime does not count runnable goroutines (" + runnableMetric + ")")
		}
		if s.sample[0].Value.Uint64() == 0 {
			return
		}
		runtime.Gosched()
	}
}
