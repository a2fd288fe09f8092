package launcher

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// BuildIfPackage turns a Go package path such as ./examples/mnist into a
// binary, built once into dir, so every rank runs the same build. Any other
// program is returned unchanged. A directory counts as a package when it
// holds .go files; "./..."-style patterns are refused since they name many.
func BuildIfPackage(ctx context.Context, program, dir string) (string, error) {
	st, err := os.Stat(program)
	if err != nil || !st.IsDir() {
		return program, nil
	}
	gofiles, _ := filepath.Glob(filepath.Join(program, "*.go"))
	if len(gofiles) == 0 {
		return "", fmt.Errorf("%s is a directory without Go files: give an executable or a Go package directory", program)
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("%s is a Go package, but the go command is not on PATH to build it: build it yourself and pass the binary", program)
	}
	pkg := program
	if !filepath.IsAbs(pkg) && !strings.HasPrefix(pkg, ".") {
		pkg = "./" + pkg
	}
	out := filepath.Join(dir, filepath.Base(filepath.Clean(program)))
	cmd := exec.CommandContext(ctx, gobin, "build", "-o", out, pkg)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building %s: %w", program, err)
	}
	return out, nil
}
