package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestLinksResolve checks every relative link in the repository's
// markdown (a file, and its heading when the link names one) and every
// reference to a section of a markdown file in prose, YAML comments and Go
// strings: `README, "Install"`, `configs/README.md, "Durability"`,
// `the README's "Sizing"`, `docs/scale-out.md §4.2`. Each stale one is
// named with its file and line.
func TestLinksResolve(t *testing.T) {
	root := ".."
	headings := map[string][]string{} // markdown file (from root) -> its headings
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "build" || name == "dist" || name == "data") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(rel) {
		case ".md":
			headings[rel] = markdownHeadings(t, path)
			files = append(files, rel)
		case ".go", ".yaml", ".yml", ".txt", ".tpl", ".sh", ".json":
			files = append(files, rel)
		default:
			if d.Name() == "Dockerfile" || strings.HasSuffix(d.Name(), ".Dockerfile") {
				files = append(files, rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if f == "docs/links_test.go" { // its comments show the forms
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		if strings.HasSuffix(f, ".md") {
			for i, line := range lines {
				for _, problem := range checkLinks(f, line, headings) {
					t.Errorf("%s:%d: %s", f, i+1, problem)
				}
			}
		}
		if !strings.Contains(string(b), ".md") && !strings.Contains(string(b), "README") {
			continue
		}
		for _, p := range checkRefs(f, lines, headings) {
			t.Errorf("%s:%d: %s", f, p.line, p.problem)
		}
	}
}

// markdownLink matches [text](target), not an image's.
var markdownLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// sectionRef matches a reference to a section of a markdown file in
// prose: FILE.md, "Title" / FILE.md's "Title" / README, "Title" / the
// README's "Title" / README "Title"; sectionList the README's figures
// ("A" and "B", "C"); numberRef FILE.md §N.
var (
	sectionRef  = regexp.MustCompile(`((?:[\w./-]+/)?[\w.-]+\.md|README)(?:'s|,)?(?: section)? "([^"]+)"`)
	sectionList = regexp.MustCompile(`((?:[\w./-]+/)?[\w.-]+\.md|README)(?:'s)? [\w ]*\(((?:"[^"]+"(?:,| and|, and)? ?)+)\)`)
	quoted      = regexp.MustCompile(`"([^"]+)"`)
	numberRef   = regexp.MustCompile(`((?:[\w./-]+/)?[\w.-]+\.md) §(\d+(?:\.\d+)*)`)
)

// checkLinks returns the relative links of a markdown line that do not
// resolve.
func checkLinks(file, line string, headings map[string][]string) []string {
	var problems []string
	for _, m := range markdownLink.FindAllStringSubmatch(line, -1) {
		target := m[1]
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			continue
		}
		path, anchor, _ := strings.Cut(target, "#")
		md := file
		if path != "" {
			md = filepath.ToSlash(filepath.Join(filepath.Dir(file), path))
			if _, err := os.Stat(filepath.Join("..", md)); err != nil {
				problems = append(problems, "link to a missing file: "+target)
				continue
			}
		}
		if anchor != "" && strings.HasSuffix(md, ".md") && !hasAnchor(headings[md], anchor) {
			problems = append(problems, "link to a missing section: "+target)
		}
	}
	return problems
}

// refProblem is a reference that does not resolve, at a line.
type refProblem struct {
	line    int
	problem string
}

// commentMark is what starts a comment line, which a reference may
// continue on.
var commentMark = regexp.MustCompile(`^\s*(//|#)?\s*`)

// checkRefs returns the references to sections in lines that do not
// resolve. The lines are read as one text, comment marks dropped, so that
// a reference may run over two lines.
func checkRefs(file string, lines []string, headings map[string][]string) []refProblem {
	var text strings.Builder
	starts := make([]int, len(lines))
	for i, l := range lines {
		starts[i] = text.Len()
		text.WriteString(commentMark.ReplaceAllString(l, "") + " ")
	}
	lineAt := func(off int) int {
		n := 0
		for n+1 < len(starts) && starts[n+1] <= off {
			n++
		}
		return n + 1
	}
	all := text.String()
	var out []refProblem
	check := func(off int, name, title, ref string) {
		md, ok := resolveMarkdown(file, name, headings)
		switch {
		case !ok:
			out = append(out, refProblem{lineAt(off), "reference to a missing file: " + ref})
		case !hasTitle(headings[md], title):
			out = append(out, refProblem{lineAt(off), "reference to a missing section of " + md + ": " + ref})
		}
	}
	for _, m := range sectionRef.FindAllStringSubmatchIndex(all, -1) {
		check(m[0], all[m[2]:m[3]], all[m[4]:m[5]], all[m[0]:m[1]])
	}
	for _, m := range sectionList.FindAllStringSubmatchIndex(all, -1) {
		for _, q := range quoted.FindAllStringSubmatch(all[m[4]:m[5]], -1) {
			check(m[0], all[m[2]:m[3]], q[1], all[m[0]:m[1]])
		}
	}
	for _, m := range numberRef.FindAllStringSubmatchIndex(all, -1) {
		md, ok := resolveMarkdown(file, all[m[2]:m[3]], headings)
		if !ok || !hasNumber(headings[md], all[m[4]:m[5]]) {
			out = append(out, refProblem{lineAt(m[0]), "reference to a missing section: " + all[m[0]:m[1]]})
		}
	}
	return out
}

// resolveMarkdown finds the markdown file a reference names: README is the
// repository's; a path is from the repository's root, else from file's
// directory.
func resolveMarkdown(file, name string, headings map[string][]string) (string, bool) {
	if name == "README" || name == "README.md" {
		return "README.md", true
	}
	if _, ok := headings[name]; ok {
		return name, true
	}
	rel := filepath.ToSlash(filepath.Join(filepath.Dir(file), name))
	_, ok := headings[rel]
	return rel, ok
}

// markdownHeadings returns the headings of the markdown file at path,
// without their #s, outside code blocks.
func markdownHeadings(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var hs []string
	fence := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
			continue
		}
		if fence || !strings.HasPrefix(line, "#") {
			continue
		}
		hs = append(hs, strings.TrimSpace(strings.TrimLeft(line, "#")))
	}
	return hs
}

// plain is a heading or title without markdown emphasis and code marks,
// in lower case.
func plain(s string) string {
	return strings.ToLower(strings.NewReplacer("`", "", "*", "").Replace(strings.TrimSpace(s)))
}

// sectionNumber is the number a heading may start with: "12. ", "3.3 ";
// datePrefix the date of a dated measurement: "2026-12-04: ",
// "2026-12-03 and 2026-12-04: ".
var (
	sectionNumber = regexp.MustCompile(`^\d+(\.\d+)*\.? `)
	datePrefix    = regexp.MustCompile(`^\d{4}-\d\d-\d\d( and \d{4}-\d\d-\d\d)?: `)
)

// hasTitle reports whether a heading reads title (markup, a section
// number and a date aside), or starts with it followed by ":" or " (".
func hasTitle(hs []string, title string) bool {
	want := plain(title)
	for _, h := range hs {
		p := datePrefix.ReplaceAllString(sectionNumber.ReplaceAllString(plain(h), ""), "")
		if p == want || strings.HasPrefix(p, want+":") || strings.HasPrefix(p, want+" (") {
			return true
		}
	}
	return false
}

// hasNumber reports whether a heading starts with the section number n.
func hasNumber(hs []string, n string) bool {
	for _, h := range hs {
		if f := strings.Fields(h); len(f) > 0 && strings.TrimSuffix(f[0], ".") == n {
			return true
		}
	}
	return false
}

// slug is GitHub's anchor of a heading.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// hasAnchor reports whether one of the headings has the anchor.
func hasAnchor(hs []string, anchor string) bool {
	for _, h := range hs {
		if slug(h) == anchor {
			return true
		}
	}
	return false
}

// TestCheckerNamesStaleReferences: the checks above fail on each kind of
// stale reference, and pass on good ones.
func TestCheckerNamesStaleReferences(t *testing.T) {
	headings := map[string][]string{
		"README.md":         {"dedupe-stage", "Install", "A scale-out group"},
		"bench/RESULTS.md":  {"State at 10M, 50M and 100M keys", "2026-12-04: where the cost goes (VM-2, quiet)"},
		"docs/scale-out.md": {"3.3 State on a new owner", "12. Code notes"},
	}
	for _, c := range []struct {
		line  string
		stale int
	}{
		{`see the README, "Install"`, 0},
		{`(README, "Performance")`, 1},
		{`the README's measured figures ("Install" and "Performance", "Log rate")`, 2},
		{`bench/RESULTS.md, "where the cost goes"`, 0},
		{`docs/scale-out.md, "Code notes", and docs/scale-out.md §3.3`, 0},
		{`docs/scale-out.md §3.9`, 1},
		{`configs/README.md, "Durability"`, 1}, // no such file in headings
	} {
		if got := checkRefs("deploy/values.yaml", []string{"# " + c.line}, headings); len(got) != c.stale {
			t.Errorf("%q: %d stale (%v), want %d", c.line, len(got), got, c.stale)
		}
	}
	for _, c := range []struct {
		line  string
		stale int
	}{
		{"[install](#install)", 0},
		{"[scale-out](#scale-out)", 1},
		{"[results](bench/RESULTS.md#state-at-10m-50m-and-100m-keys)", 0},
		{"[gone](docs/nothing-here.md)", 1},
		{"[site](https://example.com/x.md#y)", 0},
	} {
		if got := checkLinks("README.md", c.line, headings); len(got) != c.stale {
			t.Errorf("%q: %d stale (%v), want %d", c.line, len(got), got, c.stale)
		}
	}
}
