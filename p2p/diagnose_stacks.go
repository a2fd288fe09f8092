package p2p

// Goroutine stacks for a hang diagnosis: parsing runtime.Stack's text,
// picking the goroutines that tell what a rank does, and naming where
// one is.

import (
	"bufio"
	"fmt"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Limits that keep a rank's answer small (it travels on the control
// stream, whose frames are at most maxFrame).
const (
	maxStateGoroutines = 8
	maxStateFrames     = 24
)

// Frame is one frame of a goroutine stack.
type Frame struct {
	Func string `json:"func"`
	File string `json:"file"`
	Line int    `json:"line"`
}

// Goroutine is one goroutine's stack, as far as a diagnosis needs it.
type Goroutine struct {
	ID    int    `json:"id"`
	State string `json:"state"` // "running", "syscall", "chan receive", ...
	// Role: "collective" (it runs or waits for a collective call) or
	// "user" (user code, outside any collective).
	Role   string  `json:"role"`
	Frames []Frame `json:"frames"` // innermost first, at most maxStateFrames
}

// allStacks returns every goroutine's stack (runtime.Stack's text).
func allStacks() []byte {
	buf := make([]byte, 256<<10)
	for {
		k := runtime.Stack(buf, true)
		if k < len(buf) || len(buf) >= 64<<20 {
			return buf[:k]
		}
		buf = make([]byte, 2*len(buf))
	}
}

// parseStacks parses runtime.Stack's text: blocks of "goroutine N [state]:"
// followed by pairs of lines "func(args)" and "\tfile:line +0x..".
func parseStacks(b []byte) []Goroutine {
	var gs []Goroutine
	var g *Goroutine
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "goroutine "):
			gs = append(gs, Goroutine{})
			g = &gs[len(gs)-1]
			rest := strings.TrimPrefix(line, "goroutine ")
			id, after, _ := strings.Cut(rest, " ")
			g.ID, _ = strconv.Atoi(id)
			if i, j := strings.Index(after, "["), strings.LastIndex(after, "]"); i >= 0 && j > i {
				g.State = after[i+1 : j]
			}
		case g == nil || line == "":
		case strings.HasPrefix(line, "\t"):
			if len(g.Frames) == 0 {
				continue
			}
			f := &g.Frames[len(g.Frames)-1]
			loc := strings.TrimSpace(line)
			if i := strings.LastIndex(loc, " +0x"); i >= 0 {
				loc = loc[:i]
			}
			if i := strings.LastIndex(loc, ":"); i >= 0 {
				f.File = loc[:i]
				f.Line, _ = strconv.Atoi(loc[i+1:])
			}
		case strings.HasPrefix(line, "created by "), strings.HasPrefix(line, "..."):
			// The creator's frame and elided frames say nothing about
			// where the goroutine is; skip the creator's location line.
			if strings.HasPrefix(line, "created by ") {
				sc.Scan()
			}
		default:
			fn := line
			if i := strings.LastIndex(fn, "("); i > 0 {
				fn = fn[:i]
			}
			g.Frames = append(g.Frames, Frame{Func: fn})
		}
	}
	return gs
}

// mainModule is the module of the program's main package ("" if unknown).
var mainModule = sync.OnceValue(func() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.Main.Path
	}
	return ""
})

const gorunModule = "github.com/gorun/gorun"

// userFrame reports whether f is the user's code: package main, a test,
// or the main module when that is not gorun itself.
func userFrame(f Frame) bool {
	if strings.HasPrefix(f.Func, "main.") || strings.HasSuffix(f.File, "_test.go") {
		return true
	}
	m := mainModule()
	return m != "" && m != gorunModule && (strings.HasPrefix(f.Func, m+".") || strings.HasPrefix(f.Func, m+"/"))
}

// runsCollective reports whether g runs, or waits for, a collective call.
func runsCollective(g Goroutine) bool {
	for _, f := range g.Frames {
		if strings.HasPrefix(f.Func, gorunModule+"/collective.(*Comm).execute") ||
			strings.HasPrefix(f.Func, gorunModule+"/collective.(*Handle).Wait") {
			return true
		}
	}
	return false
}

// busy reports whether a goroutine in state s is doing something (on a CPU
// or in a system call) rather than waiting for other goroutines.
func busy(s string) bool {
	s, _, _ = strings.Cut(s, ",")
	return s == "running" || s == "runnable" || s == "syscall"
}

// relevantGoroutines picks the goroutines a diagnosis shows: with inCall,
// those that run or wait for a collective call first; then the user's
// goroutines outside collectives, busy ones and the main goroutine first.
func relevantGoroutines(all []Goroutine, inCall bool) []Goroutine {
	var coll, user []Goroutine
	for _, g := range all {
		switch {
		case runsCollective(g):
			g.Role = "collective"
			coll = append(coll, g)
		case slices.ContainsFunc(g.Frames, userFrame):
			g.Role = "user"
			user = append(user, g)
		}
	}
	slices.SortStableFunc(user, func(a, b Goroutine) int {
		if ba, bb := busy(a.State), busy(b.State); ba != bb {
			if ba {
				return -1
			}
			return 1
		}
		if (a.ID == 1) != (b.ID == 1) {
			if a.ID == 1 {
				return -1
			}
			return 1
		}
		return a.ID - b.ID
	})
	out := user
	if inCall {
		out = append(coll, user...)
	}
	if len(out) == 0 {
		// Nothing of the user's: show the main goroutine, wherever it is.
		for _, g := range all {
			if g.ID == 1 {
				g.Role = "user"
				out = append(out, g)
			}
		}
	}
	out = out[:min(len(out), maxStateGoroutines)]
	for i := range out {
		out[i].Frames = out[i].Frames[:min(len(out[i].Frames), maxStateFrames)]
	}
	return out
}

// runtimeFrame reports whether f is the Go runtime's own machinery (parking,
// scheduling), which says nothing about what the goroutine waits for.
func runtimeFrame(f Frame) bool {
	return strings.HasPrefix(f.Func, "runtime.") || strings.HasPrefix(f.Func, "internal/")
}

// Top describes the top of g's stack: its innermost frames up to the
// first one of the user's code, e.g. "syscall.read <- syscall.Read <-
// main.blockInSyscall at hangprog/main.go:61 (goroutine 1, syscall)".
func (g Goroutine) Top() string {
	fs := g.Frames
	first := slices.IndexFunc(fs, func(f Frame) bool { return !runtimeFrame(f) })
	if first < 0 {
		first = 0
	}
	last := slices.IndexFunc(fs, userFrame)
	if last < first {
		last = min(first+2, len(fs)-1)
	}
	if len(fs) == 0 {
		return fmt.Sprintf("(goroutine %d, %s, no frames)", g.ID, g.State)
	}
	var names []string
	for i := first; i <= last; i++ {
		if last-first > 4 && i > first+1 && i < last-1 {
			if i == first+2 {
				names = append(names, "…")
			}
			continue
		}
		names = append(names, fs[i].Func)
	}
	at := fs[last]
	return fmt.Sprintf("%s at %s:%d (goroutine %d, %s)", strings.Join(names, " <- "), shortFile(at.File), at.Line, g.ID, g.State)
}

// shortFile keeps the last directory and the file name.
func shortFile(p string) string {
	return filepath.Join(filepath.Base(filepath.Dir(p)), filepath.Base(p))
}
