package config

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// yamlTypeWords rewrites the errors yaml.v3 reports in Go's terms ("field
// urll not found in type config.NATS", "cannot unmarshal !!str `many` into
// int") in the YAML file's terms: the section, the fields it has, the
// closest one, and what kind of value was expected. Other errors are
// returned unchanged.
func yamlTypeWords(err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		msgs[i] = yamlMessage(m)
	}
	return errors.New(strings.Join(msgs, "\n"))
}

var (
	notFoundRE  = regexp.MustCompile(`^(line \d+): field (\S+) not found in type (\S+)$`)
	unmarshalRE = regexp.MustCompile("^(line \\d+): cannot unmarshal !!(\\w+) `(.*)` into (\\S+)$")
	kindRE      = regexp.MustCompile(`^(line \d+): cannot unmarshal !!(\w+) into (\S+)$`)
)

// yamlKinds names the YAML kinds yaml.v3 reports without a value.
var yamlKinds = map[string]string{"seq": "a list", "map": "a mapping"}

func yamlMessage(m string) string {
	if g := notFoundRE.FindStringSubmatch(m); g != nil {
		section, fields := yamlSection(g[3])
		where := "the section " + section
		if section == "" {
			where = "the top level"
		}
		msg := fmt.Sprintf("%s: unknown field %q in %s", g[1], g[2], where)
		if near := closest(g[2], fields); near != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", near)
		}
		if len(fields) > 0 {
			msg += "; its fields are " + strings.Join(fields, ", ")
		}
		return msg + " (configs/README.md lists every field)"
	}
	if g := unmarshalRE.FindStringSubmatch(m); g != nil {
		return fmt.Sprintf("%s: %q is not %s", g[1], g[3], goTypeWords(g[4]))
	}
	if g := kindRE.FindStringSubmatch(m); g != nil {
		kind, ok := yamlKinds[g[2]]
		if !ok {
			kind = "this value"
		}
		return fmt.Sprintf("%s: %s where %s belongs", g[1], kind, goTypeWords(g[3]))
	}
	return m
}

// goTypeWords names the YAML value a Go type takes.
func goTypeWords(t string) string {
	switch {
	case strings.HasPrefix(t, "[]"):
		return "a list"
	case strings.HasPrefix(t, "map["):
		return "a mapping"
	case strings.HasPrefix(t, "int") || strings.HasPrefix(t, "uint"):
		return "a whole number"
	case strings.HasPrefix(t, "float"):
		return "a number"
	case t == "bool" || t == "*bool":
		return "true or false"
	case t == "string":
		return "a string"
	}
	if section, _ := yamlSection(t); section != "" {
		return "a mapping (the section " + section + ")"
	}
	return "a value of this field's kind"
}

// yamlSection returns the YAML path of the section decoded into the Go type
// named goType (as yaml.v3 prints it, e.g. "config.NATS") and its fields.
func yamlSection(goType string) (string, []string) {
	var path string
	var fields []string
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		if path != "" || t.Kind() != reflect.Struct {
			return
		}
		if t.String() == goType {
			path, fields = strings.TrimSuffix(prefix, "."), yamlFields(t)
			return
		}
		for i := range t.NumField() {
			f := t.Field(i)
			name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			ft := f.Type
			for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
				ft = ft.Elem()
			}
			if strings.Contains(opts, "inline") {
				walk(ft, prefix)
			} else if name != "" && name != "-" {
				walk(ft, prefix+name+".")
			}
		}
	}
	walk(reflect.TypeOf(Config{}), "")
	if path == "" && goType == reflect.TypeOf(Config{}).String() {
		return "", yamlFields(reflect.TypeOf(Config{}))
	}
	return path, fields
}

// yamlFields lists the YAML names of t's fields, inline ones included.
func yamlFields(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case strings.Contains(opts, "inline"):
			out = append(out, yamlFields(f.Type)...)
		case name != "" && name != "-":
			out = append(out, name)
		}
	}
	return out
}

// closest returns the name in names nearest to s (at most two edits away,
// or sharing its first four letters), or "".
func closest(s string, names []string) string {
	best, bestD := "", 3
	for _, n := range names {
		if d := editDistance(s, n); d < bestD {
			best, bestD = n, d
		}
	}
	if best == "" && len(s) >= 4 {
		i := slices.IndexFunc(names, func(n string) bool { return strings.HasPrefix(n, s[:4]) })
		if i >= 0 {
			best = names[i]
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
