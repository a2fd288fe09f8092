package membership

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The machine stays free of I/O, goroutines and clock reads: what lets
// every replica of a rendezvous apply the same events to the same result,
// and these tests run without a network.
func TestMembershipIsPure(t *testing.T) {
	allowed := []string{"cmp", "encoding/json", "errors", "fmt", "slices", "strconv", "strings", "time"}
	files, _ := filepath.Glob("*.go")
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if !slices.Contains(allowed, path) {
				t.Errorf("%s imports %q: the machine may import only %v", name, path, allowed)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				t.Errorf("%s: a goroutine at %v", name, fset.Position(n.Pos()))
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok && x.Name == "time" &&
					slices.Contains([]string{"Now", "Since", "Until", "After", "AfterFunc", "NewTimer", "NewTicker", "Sleep", "Tick"}, n.Sel.Name) {
					t.Errorf("%s: time.%s at %v: the driver gives the time", name, n.Sel.Name, fset.Position(n.Pos()))
				}
			}
			return true
		})
	}
}
