// Package docs holds the tests that keep the contributor documentation
// true to the code.
package docs

import (
	"bufio"
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/dedupe-stage/dedupe-stage/"

// TestPackageMap checks that the package map in architecture.md, a
// Mermaid graph with one arrow per import between the module's packages,
// has exactly the imports the non-test code has. On a mismatch it prints
// the block to paste.
func TestPackageMap(t *testing.T) {
	want := codeEdges(t, "..")
	got := docEdges(t, "architecture.md")
	if slices.Equal(got, want) {
		return
	}
	for _, e := range want {
		if !slices.Contains(got, e) {
			t.Errorf("architecture.md lacks the import %s", e)
		}
	}
	for _, e := range got {
		if !slices.Contains(want, e) {
			t.Errorf("architecture.md shows the import %s, which the code does not have", e)
		}
	}
	t.Logf("the map as the code has it:\n```mermaid\ngraph TD\n%s```", mermaid(want))
}

// TestInternalImportsNeitherStageNorConfig checks the rule
// architecture.md states: no package under internal/ imports the
// module's stage or config packages (in its non-test code). The code under
// internal/ takes plain values of its own (scaleout.Options,
// status.Target, boot.Dial, the admin.Stage interface), which stage and
// config fill, so that the pipeline and the configuration sit above it.
func TestInternalImportsNeitherStageNorConfig(t *testing.T) {
	for _, e := range codeEdges(t, "..") {
		from, to, _ := strings.Cut(e, " --> ")
		if strings.HasPrefix(from, "internal/") && (to == "stage" || to == "config") {
			t.Errorf("%s imports %s%s: a package under internal/ takes plain values, never the module's stage or config package (docs/architecture.md, \"Packages\")", from, module, to)
		}
	}
}

// codeEdges returns "from --> to" for every import from one of the
// module's packages to another in the non-test Go files under root,
// sorted. The deploy/helm module and testdata are left out.
func codeEdges(t *testing.T, root string) []string {
	t.Helper()
	set := map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); name == "testdata" || name == "helm" || strings.HasPrefix(name, ".") && path != root {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		from := filepath.ToSlash(rel)
		for _, imp := range f.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				return err
			}
			if to, ok := strings.CutPrefix(p, module); ok {
				set[from+" --> "+to] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("reading the module's imports: %v", err)
	}
	edges := make([]string, 0, len(set))
	for e := range set {
		edges = append(edges, e)
	}
	slices.Sort(edges)
	return edges
}

// docEdges returns the arrows of the first ```mermaid block of the file
// at path, as "from --> to", sorted.
func docEdges(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var edges []string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "```mermaid":
			in = true
		case in && line == "```":
			slices.Sort(edges)
			return edges
		case in && strings.Contains(line, "-->"):
			from, to, _ := strings.Cut(line, "-->")
			edges = append(edges, pkgOf(strings.TrimSpace(from))+" --> "+pkgOf(strings.TrimSpace(to)))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	t.Errorf("%s has no ```mermaid block", path)
	return nil
}

// mermaid writes edges as the lines of a Mermaid graph: each package a
// box labelled with its path, each import an arrow.
func mermaid(edges []string) string {
	var b strings.Builder
	seen := map[string]bool{}
	for _, e := range edges {
		from, to, _ := strings.Cut(e, " --> ")
		for _, p := range []string{from, to} {
			if !seen[p] {
				seen[p] = true
				fmt.Fprintf(&b, "  %s[\"%s\"]\n", id(p), p)
			}
		}
	}
	for _, e := range edges {
		from, to, _ := strings.Cut(e, " --> ")
		fmt.Fprintf(&b, "  %s --> %s\n", id(from), id(to))
	}
	return b.String()
}

// id is a package's node id in the Mermaid graph: its path with "_" for
// "/", which Mermaid does not take in an id.
func id(path string) string { return strings.ReplaceAll(path, "/", "_") }

// pkgOf is the package path of a node id (id's inverse: no package path
// of the module has "_" in it).
func pkgOf(id string) string { return strings.ReplaceAll(id, "_", "/") }
