package codeshape

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines is the longest a non-test function may be, from its func
// line to its closing brace.
const maxFuncLines = 80

// readsBetterWhole lists the functions allowed past maxFuncLines: a
// scanner or decoder that reads better as one loop than cut into steps.
var readsBetterWhole = map[string]bool{
	"keys/json.go findJSON":          true, // a JSON scanner's one loop
	"bloom/snapshot.go ReadSnapshot": true, // a decoder, field after field
}

// TestFunctionLength fails on a non-test function longer than
// maxFuncLines: cut it along its own step comments.
func TestFunctionLength(t *testing.T) {
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	seen := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			seen++
			lines := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			name := filepath.ToSlash(rel) + " " + fd.Name.Name
			if lines > maxFuncLines && !readsBetterWhole[name] {
				t.Errorf("%s is %d lines, over %d: cut it along its steps", name, lines, maxFuncLines)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A walk from the wrong directory would find nothing and pass.
	if seen < 500 {
		t.Fatalf("found %d functions under %s, want the whole repository's (over 500)", seen, root)
	}
}
