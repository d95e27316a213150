package config

import (
	"strings"
	"testing"

	"github.com/dedupe-stage/dedupe-stage/keys"
)

func TestPolicies(t *testing.T) {
	c := mustParse(t, "key:\n  version: {source: json, json_path: meta.version}\nwindow:\n  refresh_on_repeat: true\n")
	if err := c.Validate(); err != nil {
		t.Fatalf("version and sliding window: %v", err)
	}
	if want := (keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "meta.version"}); c.Key.Version != want || !c.Window.RefreshOnRepeat {
		t.Fatalf("parsed key.version %+v, window.refresh_on_repeat %v", c.Key.Version, c.Window.RefreshOnRepeat)
	}

	c.Key.Version = keys.FieldSpec{Source: keys.SourceSubject, SubjectToken: 2}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "key.version.source: subject, want header or json") {
		t.Fatalf("version from a subject token: %v", err)
	}

	so := scaleOutOn()
	so.Key.Version = keys.FieldSpec{Source: keys.SourceHeader, Header: "Order-Version"}
	if err := so.Validate(); err != nil {
		t.Fatalf("version-wins in a group: %v", err)
	}
	so.Window.RefreshOnRepeat = true
	if err := so.Validate(); err != nil {
		t.Fatalf("sliding window in a group: %v", err)
	}
}
