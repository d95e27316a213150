package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestLocalYAMLWritesEveryField keeps configs/local.yaml complete: every
// field of Config, found by its yaml tags, is written out in it, so a field
// added to Config fails here until the file has it. TestExampleContents checks
// that the values are the defaults.
func TestLocalYAMLWritesEveryField(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "configs", "local.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Content) != 1 {
		t.Fatalf("configs/local.yaml holds %d YAML documents, want 1", len(doc.Content))
	}
	missing := missingFields(reflect.TypeOf(Config{}), doc.Content[0], "")
	for _, p := range missing {
		t.Errorf("configs/local.yaml does not write out %s", p)
	}
	if len(missing) > 0 {
		t.Log("every field of config.Config goes into configs/local.yaml with its default value")
	}
}

// TestMissingFieldsFindsAGap checks the check itself: a document that lacks
// fields, nested and inline, gets them named.
func TestMissingFieldsFindsAGap(t *testing.T) {
	var doc yaml.Node
	src := "nats:\n  url: \"\"\n  tls:\n    cert_file: \"\"\nkey:\n  source: header\nwindow:\n  paths:\n    - name: a\n"
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(missingFields(reflect.TypeOf(Config{}), doc.Content[0], ""), " ")
	for _, want := range []string{"nats.tls.ca_file", "nats.embedded", "key.header", "key.scope", "window.paths[0].max", "scale_out"} {
		if !strings.Contains(" "+got+" ", " "+want+" ") {
			t.Errorf("missingFields does not name %s; it names: %s", want, got)
		}
	}
	for _, unwanted := range []string{"nats.url", "nats.tls.cert_file", "nats.embedded.port", "key.source", "window.paths[0].name"} {
		if strings.Contains(" "+got+" ", " "+unwanted+" ") {
			t.Errorf("missingFields names %s, which the document has", unwanted)
		}
	}
}

// missingFields returns the dotted paths of the fields of struct type t, by
// their yaml tags, that the mapping node n lacks, descending into nested
// structs, inline structs and the elements of lists of structs. A section
// absent as a whole is named once.
func missingFields(t reflect.Type, n *yaml.Node, prefix string) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if strings.Contains(opts, "inline") {
			out = append(out, missingFields(ft, n, prefix)...)
			continue
		}
		path := prefix + name
		v := mappingValue(n, name)
		if v == nil {
			out = append(out, path)
			continue
		}
		switch {
		case isSection(ft):
			out = append(out, missingFields(ft, v, path+".")...)
		case ft.Kind() == reflect.Slice && isSection(ft.Elem()):
			if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
				out = append(out, path+"[0]")
				continue
			}
			for j, e := range v.Content {
				out = append(out, missingFields(ft.Elem(), e, path+"["+strconv.Itoa(j)+"].")...)
			}
		}
	}
	return out
}

// isSection tells whether t is written as a YAML mapping of its own fields:
// a struct (Duration and ByteSize are scalars).
func isSection(t reflect.Type) bool { return t.Kind() == reflect.Struct }

// mappingValue returns the value of key in the mapping node n, or nil.
func mappingValue(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}
