// --output-dir: a file of each rank's stdout and of its stderr.

package launcher

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
)

// outputFiles are the per-rank files of --output-dir.
type outputFiles struct {
	dir   string
	mu    sync.Mutex
	files [][2]*os.File // rank -> stdout, stderr
}

func openOutputDir(dir string, np int) (*outputFiles, error) {
	o := &outputFiles{dir: dir}
	for range np {
		if err := o.add(); err != nil {
			o.close()
			return nil, err
		}
	}
	return o, nil
}

// ensure makes sure DIR/rank.N exists for every N <= n (an elastic job's
// process n; a restarted job's processes use the files of the attempt
// before, which has the same numbers).
func (o *outputFiles) ensure(n int) error {
	for {
		o.mu.Lock()
		have := len(o.files)
		o.mu.Unlock()
		if have > n {
			return nil
		}
		if err := o.add(); err != nil {
			return err
		}
	}
}

// add creates DIR/rank.N/{stdout,stderr} for the next rank N.
func (o *outputFiles) add() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	d := filepath.Join(o.dir, "rank."+strconv.Itoa(len(o.files)))
	if err := os.MkdirAll(d, 0o755); err != nil {
		return fmt.Errorf("--output-dir: %w", err)
	}
	var fs [2]*os.File
	for i, name := range []string{"stdout", "stderr"} {
		f, err := os.Create(filepath.Join(d, name))
		if err != nil {
			if fs[0] != nil {
				fs[0].Close()
			}
			return fmt.Errorf("--output-dir: %w", err)
		}
		fs[i] = f
	}
	o.files = append(o.files, fs)
	return nil
}

func (o *outputFiles) write(rank int, isErr bool, line []byte) {
	buf := make([]byte, 0, len(line)+1)
	buf = append(append(buf, line...), '\n')
	o.mu.Lock()
	if rank >= 0 && rank < len(o.files) {
		o.files[rank][b2i(isErr)].Write(buf)
	}
	o.mu.Unlock()
}

func (o *outputFiles) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, fs := range o.files {
		for _, f := range fs {
			if f != nil {
				f.Close()
			}
		}
	}
}
