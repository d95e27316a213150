package casetest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
)

// DefaultStart is the input time of a case's offset 0 when the cases
// file names no start: a fixed time, so that a case judges the same on
// every run.
var DefaultStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Verdict is what the stage did with one message.
type Verdict string

// The verdicts a case can expect.
const (
	// Forwarded: published to the output stream.
	Forwarded Verdict = "forwarded"
	// Repeat: a copy of a key inside its window, acknowledged and dropped.
	Repeat Verdict = "repeat"
	// Stale: under key.version, a copy whose version is not greater than
	// the key's, acknowledged and dropped.
	Stale Verdict = "stale"
	// DeadLetter: published to the dead-letter stream with a reason.
	DeadLetter Verdict = "dead_letter"
	// Dropped: a late event totals.late_events: drop dropped.
	Dropped Verdict = "dropped"
)

// verdicts are the verdicts in the order the format lists them.
var verdicts = []Verdict{Forwarded, Repeat, Stale, DeadLetter, Dropped}

// File is a cases file: the cases of one configuration.
type File struct {
	// Path is the file's path, "" when it was parsed from bytes.
	Path string
	// Start is the input time of offset 0 (start:), DefaultStart when
	// not given.
	Start time.Time
	// Cases are the cases, in the file's order.
	Cases []Case
}

// Case is one case: messages published in order into a fresh stage.
type Case struct {
	// Name names the case in the report; unique in its file.
	Name string
	// Line is the case's line in the file.
	Line int
	// Messages are the case's messages, in order.
	Messages []Message
}

// Message is one input message of a case and what must happen to it.
type Message struct {
	// Line is the message's line in the file.
	Line int
	// Subject is the input subject it is published on.
	Subject string
	// Headers are its headers, one value each.
	Headers map[string]string
	// Payload is its payload (payload:, or json: written as JSON).
	Payload []byte
	// At is its input time as an offset from the file's start; it never
	// goes backwards within a case.
	At time.Duration
	// Want is what must happen to it.
	Want Want
}

// Want is what must happen to a message. Fields left empty are not
// checked.
type Want struct {
	// Verdict is required.
	Verdict Verdict
	// Subject is the output subject of a forward.
	Subject string
	// MsgID is the Nats-Msg-Id of a forward; nil: not checked.
	MsgID *string
	// Headers must be on a forward with these values.
	Headers map[string]string
	// Reason is the reason of a dead letter.
	Reason string
}

// CasesPath returns the cases file beside the configuration file cfgPath:
// configs/webhooks.yaml's is configs/webhooks.cases.yaml.
func CasesPath(cfgPath string) string {
	for _, ext := range []string{".yaml", ".yml"} {
		if base, ok := strings.CutSuffix(cfgPath, ext); ok {
			return base + ".cases" + ext
		}
	}
	return cfgPath + ".cases.yaml"
}

// Load reads and parses the cases file at path.
func Load(path string) (File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return File{}, fmt.Errorf("cases file: %w", err)
	}
	f, err := Parse(data)
	if err != nil {
		return File{}, fmt.Errorf("%s: %w", path, err)
	}
	f.Path = path
	return f, nil
}

// Parse parses a cases file. It is strict: an unknown field, a missing
// verdict, an offset that goes backwards or a reason the stage never
// gives is an error naming its line; every problem is reported.
func Parse(data []byte) (File, error) {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		return File{}, fmt.Errorf("not YAML: %w", err)
	}
	if len(doc.Content) == 0 {
		return File{}, errors.New("empty: want a mapping with a list of cases")
	}
	p := &parser{}
	f := p.file(doc.Content[0])
	return f, errors.Join(p.errs...)
}

// parser collects the problems of a cases file.
type parser struct{ errs []error }

func (p *parser) errorf(n *yaml.Node, format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("line %d: %s", n.Line, fmt.Sprintf(format, args...)))
}

// fields returns the values of mapping n by key, reporting a node that is
// not a mapping and keys that are not allowed.
func (p *parser) fields(n *yaml.Node, what string, allowed ...string) map[string]*yaml.Node {
	if n.Kind != yaml.MappingNode {
		p.errorf(n, "%s: want a mapping of %s", what, strings.Join(allowed, ", "))
		return nil
	}
	out := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !slices.Contains(allowed, k.Value) {
			p.errorf(k, "unknown field %q in %s; its fields are %s", k.Value, what, strings.Join(allowed, ", "))
			continue
		}
		out[k.Value] = v
	}
	return out
}

func (p *parser) file(n *yaml.Node) File {
	f := File{Start: DefaultStart}
	m := p.fields(n, "the cases file", "start", "cases")
	if v := m["start"]; v != nil {
		t, err := time.Parse(time.RFC3339Nano, v.Value)
		if err != nil {
			p.errorf(v, "start: %q is not an RFC 3339 time (2026-01-01T00:00:00Z)", v.Value)
		}
		f.Start = t
	}
	cases := m["cases"]
	if cases == nil || cases.Kind != yaml.SequenceNode || len(cases.Content) == 0 {
		p.errorf(n, "cases: want a list of at least one case")
		return f
	}
	names := map[string]int{}
	for _, cn := range cases.Content {
		c := p.oneCase(cn)
		if first, ok := names[c.Name]; ok && c.Name != "" {
			p.errorf(cn, "case %q: named twice (first on line %d)", c.Name, first)
		}
		names[c.Name] = c.Line
		f.Cases = append(f.Cases, c)
	}
	return f
}

func (p *parser) oneCase(n *yaml.Node) Case {
	c := Case{Line: n.Line}
	m := p.fields(n, "a case", "name", "messages")
	if v := m["name"]; v == nil || v.Value == "" {
		p.errorf(n, "a case without a name")
	} else {
		c.Name = v.Value
	}
	msgs := m["messages"]
	if msgs == nil || msgs.Kind != yaml.SequenceNode || len(msgs.Content) == 0 {
		p.errorf(n, "case %q: messages: want a list of at least one message", c.Name)
		return c
	}
	for i, mn := range msgs.Content {
		msg := p.message(mn)
		if i > 0 && msg.At < c.Messages[i-1].At {
			p.errorf(mn, "case %q, message %d: at %v is before the message before it (%v): the input stream stores in order",
				c.Name, i+1, config.Duration(msg.At), config.Duration(c.Messages[i-1].At))
		}
		c.Messages = append(c.Messages, msg)
	}
	return c
}

func (p *parser) message(n *yaml.Node) Message {
	msg := Message{Line: n.Line}
	m := p.fields(n, "a message", "subject", "headers", "payload", "json", "at", "want")
	if v := m["subject"]; v == nil || v.Value == "" {
		p.errorf(n, "a message without a subject")
	} else {
		msg.Subject = v.Value
	}
	if v := m["headers"]; v != nil {
		if err := v.Decode(&msg.Headers); err != nil {
			p.errorf(v, "headers: want a mapping of names to values: %v", err)
		}
	}
	switch pl, js := m["payload"], m["json"]; {
	case pl != nil && js != nil:
		p.errorf(n, "a message with both payload and json: give one")
	case pl != nil:
		msg.Payload = []byte(pl.Value)
	case js != nil:
		var v any
		if err := js.Decode(&v); err != nil {
			p.errorf(js, "json: %v", err)
			break
		}
		b, err := json.Marshal(v)
		if err != nil {
			p.errorf(js, "json: cannot be written as JSON: %v", err)
		}
		msg.Payload = b
	}
	if v := m["at"]; v != nil {
		var d config.Duration
		if err := v.Decode(&d); err != nil || d < 0 {
			p.errorf(v, "at: %q, want a duration from the start such as 0s, 90s, 3h, 2d", v.Value)
		}
		msg.At = d.D()
	}
	if v := m["want"]; v == nil {
		p.errorf(n, "a message without want: (forwarded, repeat, stale, dead_letter or dropped)")
	} else {
		msg.Want = p.want(v)
	}
	return msg
}

// want reads want: either a verdict alone (want: repeat) or a mapping.
func (p *parser) want(n *yaml.Node) Want {
	var w Want
	var m map[string]*yaml.Node
	if n.Kind == yaml.ScalarNode {
		w.Verdict = Verdict(n.Value)
	} else {
		m = p.fields(n, "want", "verdict", "subject", "msg_id", "headers", "reason")
		if v := m["verdict"]; v != nil {
			w.Verdict = Verdict(v.Value)
		}
	}
	if !slices.Contains(verdicts, w.Verdict) {
		p.errorf(n, "want: verdict %q, want one of forwarded, repeat, stale, dead_letter, dropped", w.Verdict)
	}
	if v := m["subject"]; v != nil {
		w.Subject = v.Value
	}
	if v := m["msg_id"]; v != nil {
		id := v.Value
		w.MsgID = &id
	}
	if v := m["headers"]; v != nil {
		if err := v.Decode(&w.Headers); err != nil {
			p.errorf(v, "want.headers: want a mapping of names to values: %v", err)
		}
	}
	if v := m["reason"]; v != nil {
		w.Reason = v.Value
		if !slices.Contains(deadletter.Reasons(), deadletter.Reason(w.Reason)) {
			p.errorf(v, "want.reason: %q is not a reason the stage dead-letters with; its reasons are %s", w.Reason, reasonList())
		}
	}
	if w.Verdict != Forwarded && (w.Subject != "" || w.MsgID != nil || w.Headers != nil) {
		p.errorf(n, "want: subject, msg_id and headers are a forward's; this message wants %s", w.Verdict)
	}
	if w.Verdict != DeadLetter && w.Reason != "" {
		p.errorf(n, "want: reason is a dead letter's; this message wants %s", w.Verdict)
	}
	return w
}

// reasonList is the dead-letter reasons, comma separated.
func reasonList() string {
	var names []string
	for _, r := range deadletter.Reasons() {
		names = append(names, string(r))
	}
	return strings.Join(names, ", ")
}
