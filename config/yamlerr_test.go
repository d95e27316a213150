package config

import (
	"strings"
	"testing"
)

// TestParseErrorsSpeakYAML: errors about the file name its sections and
// fields, suggest the field meant, and say what kind of value was wanted,
// instead of Go's type names.
func TestParseErrorsSpeakYAML(t *testing.T) {
	tests := []struct {
		name, src string
		want      []string
	}{
		{"typo in a section", "nats:\n  urll: x\n", []string{`line 2: unknown field "urll" in the section nats (did you mean "url"?)`, "its fields are url, create_streams"}},
		{"typo at the top", "natz: {}\n", []string{`line 1: unknown field "natz" in the top level (did you mean "nats"?)`}},
		{"nested section", "nats:\n  embedded:\n    prot: 5\n", []string{`unknown field "prot" in the section nats.embedded (did you mean "port"?)`}},
		{"inline limits", "output:\n  max_ages: 1h\n", []string{`unknown field "max_ages" in the section output (did you mean "max_age"?)`}},
		{"list item", "window:\n  paths:\n    - name: a\n      maxx: 1h\n", []string{`unknown field "maxx" in the section window.paths (did you mean "max"?)`}},
		{"key section", "key:\n  source: json\n  jsonpath: id\n", []string{`unknown field "jsonpath" in the section key (did you mean "json_path"?)`}},
		{"not a number", "state:\n  partitions: many\n", []string{`line 2: "many" is not a whole number`}},
		{"not a boolean", "state:\n  sync_writes: maybe\n", []string{`line 2: "maybe" is not true or false`}},
		{"list for a string", "nats:\n  url: [a, b]\n", []string{"line 2: a list where a string belongs"}},
		{"scalar for a section", "http: 5\n", []string{`line 1: "5" is not a mapping (the section http)`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.src))
			if err == nil {
				t.Fatal("Parse accepted it")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			for _, goWords := range []string{"not found in type", "config.", "cannot unmarshal", "!!"} {
				if strings.Contains(err.Error(), goWords) {
					t.Errorf("error %q still speaks Go (%q)", err, goWords)
				}
			}
		})
	}
}
