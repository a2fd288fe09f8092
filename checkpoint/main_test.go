package checkpoint

import (
	"os"
	"testing"

	"github.com/gorun/gorun/p2p"
)

// TestMain keeps the hang dumps of the tests whose collectives stall on
// purpose (a rank made to fail or wait) out of the system's temporary
// directory, where they would outlive the test run.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gorun-checkpoint-test-")
	if err != nil {
		panic(err)
	}
	os.Setenv(p2p.EnvHangDir, dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
