package docs

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// readmeMaxLines and readmeMaxWords bound the README: a page for users,
// read once (STYLE.md: design goes to docs/, measurements to
// bench/RESULTS.md).
const (
	readmeMaxLines = 300 // lines, at most
	readmeMaxWords = 20  // words a sentence, on average, at most
)

// testCommand is the command that runs the tests: the README gives it, in
// its first lines and in Development, and .ci/run runs exactly it.
const testCommand = "bash .ci/test"

func readRepoFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile("../" + rel)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestReadmeForUsers: the README is under readmeMaxLines; its first lines
// run the stage on its embedded default and run the tests; its Install
// comes before any section for contributors; its test command is the one
// .ci/run runs, and Development gives it too; its sentences are short.
func TestReadmeForUsers(t *testing.T) {
	readme := readRepoFile(t, "README.md")
	lines := strings.Split(strings.TrimRight(readme, "\n"), "\n")
	if len(lines) >= readmeMaxLines {
		t.Errorf("README.md has %d lines, want under %d: move design to docs/ and measurements to bench/RESULTS.md", len(lines), readmeMaxLines)
	}
	head := strings.Join(lines[:min(6, len(lines))], "\n")
	for _, want := range []string{"go run ./cmd/dedupe-stage run ", testCommand + " "} {
		if !strings.Contains(head, "    "+want) {
			t.Errorf("the README's first lines do not give %q:\n%s", want, head)
		}
	}
	sections := regexp.MustCompile(`(?m)^## (.+)$`).FindAllStringSubmatch(readme, -1)
	if len(sections) == 0 || sections[0][1] != "Install" {
		t.Errorf("the README's first section is %v, want Install", sections)
	}
	dev := section(readme, "Development")
	if !strings.Contains(dev, "    "+testCommand+" ") {
		t.Errorf("the README's Development section does not give %q:\n%s", testCommand, dev)
	}
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(testCommand) + `\b`).MatchString(readRepoFile(t, ".ci/run")) {
		t.Errorf(".ci/run does not run %q, the README's test command", testCommand)
	}
	words, sentences := sentenceStats(readme)
	if sentences == 0 || float64(words)/float64(sentences) > readmeMaxWords {
		t.Errorf("the README's sentences average %d/%d = %.1f words, want at most %d", words, sentences, float64(words)/float64(max(sentences, 1)), readmeMaxWords)
	}
	t.Logf("README.md: %d lines, %d sentences of %.1f words on average", len(lines), sentences, float64(words)/float64(max(sentences, 1)))
}

// section returns the text of the markdown section titled title.
func section(md, title string) string {
	i := strings.Index(md, "\n## "+title+"\n")
	if i < 0 {
		return ""
	}
	s := md[i+len(title)+5:]
	if j := strings.Index(s, "\n## "); j >= 0 {
		s = s[:j]
	}
	return s
}

// sentenceEnd ends a sentence: ".", "!" or "?" before a space or
// the end of the text.
var sentenceEnd = regexp.MustCompile(`[.!?](\s|$)`)

// sentenceStats counts the words and sentences of a markdown text's
// prose: code blocks, indented code, tables, headings and quotes left out.
func sentenceStats(md string) (words, sentences int) {
	var prose []string
	fence := false
	for _, line := range strings.Split(md, "\n") {
		switch {
		case strings.HasPrefix(line, "```"):
			fence = !fence
			continue
		case fence, strings.HasPrefix(line, "    "), strings.HasPrefix(line, "|"), strings.HasPrefix(line, "#"), strings.HasPrefix(line, ">"):
			continue
		}
		prose = append(prose, strings.TrimPrefix(strings.TrimSpace(line), "- "))
	}
	for _, paragraph := range strings.Split(strings.Join(prose, "\n"), "\n\n") {
		for _, s := range sentenceEnd.Split(strings.Join(strings.Fields(paragraph), " "), -1) {
			if n := len(strings.Fields(s)); n > 0 {
				words += n
				sentences++
			}
		}
	}
	return words, sentences
}
