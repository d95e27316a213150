package casetest

import (
	"strings"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/config"
)

// TestParse checks the cases file's forms: a verdict alone or a mapping,
// a payload as text or as JSON, times after the start.
func TestParse(t *testing.T) {
	f, err := Parse([]byte(`start: 2026-03-01T12:00:00Z
cases:
  - name: one
    messages:
      - {subject: a.b, headers: {K: 7}, json: {id: x, n: 2}, at: 1d2h, want: repeat}
      - subject: a.b
        payload: text
        at: 2d
        want: {verdict: forwarded, subject: out.a.b, msg_id: "", headers: {H: v}}
`))
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC); !f.Start.Equal(want) {
		t.Errorf("start %v, want %v", f.Start, want)
	}
	m := f.Cases[0].Messages
	if got := string(m[0].Payload); got != `{"id":"x","n":2}` {
		t.Errorf("json payload %s", got)
	}
	if m[0].Headers["K"] != "7" || m[0].At != 26*time.Hour || m[0].Want.Verdict != Repeat || m[0].Line != 5 {
		t.Errorf("first message %+v", m[0])
	}
	w := m[1].Want
	if string(m[1].Payload) != "text" || w.Verdict != Forwarded || w.Subject != "out.a.b" || w.MsgID == nil || *w.MsgID != "" || w.Headers["H"] != "v" {
		t.Errorf("second message %+v, want %+v", m[1], w)
	}
}

// TestParseRefuses checks that every problem is reported with its line.
func TestParseRefuses(t *testing.T) {
	_, err := Parse([]byte(`cases:
  - name: a
    messages:
      - {subject: a, want: maybe}
      - {subject: a, want: {verdict: repeat, reason: no_key}}
      - {want: forwarded, payload: x, json: 1}
  - name: a
    messages: []
`))
	for _, want := range []string{
		`line 4: want: verdict "maybe"`,
		"line 5: want: reason is a dead letter's",
		"line 6: a message without a subject",
		"line 6: a message with both payload and json",
		`line 7: case "a": named twice (first on line 2)`,
		`line 7: case "a": messages: want a list of at least one message`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse error lacks %q: %v", want, err)
		}
	}
}

// TestIsolate checks what a session changes in a configuration: the
// connection, the data dir, HTTP, scale-out and PostgreSQL; not the key,
// the window or the partitions.
func TestIsolate(t *testing.T) {
	cfg := config.Default()
	cfg.NATS.URL = "nats://example.com:4222"
	cfg.HTTP.Addr = "0.0.0.0:9464"
	cfg.ScaleOut.Enabled = true
	cfg.Totals.Sinks.Postgres.DSN = "postgres://x@db/ads"
	cfg.State.Partitions = 32
	got := Isolate(cfg, "/tmp/x")
	if got.NATS.URL != "" || got.NATS.Context != "" || got.State.DataDir != "/tmp/x" || got.HTTP.Addr != "" ||
		got.ScaleOut.Enabled || got.Totals.Sinks.Postgres.DSN != "" {
		t.Errorf("Isolate left something outside: %+v", got)
	}
	if got.State.Partitions != 32 || got.Key.String() != cfg.Key.String() {
		t.Errorf("Isolate changed what judges: partitions %d, key %s", got.State.Partitions, got.Key)
	}
	if CasesPath("configs/x.yaml") != "configs/x.cases.yaml" || CasesPath("x.yml") != "x.cases.yml" {
		t.Errorf("CasesPath: %s, %s", CasesPath("configs/x.yaml"), CasesPath("x.yml"))
	}
}
