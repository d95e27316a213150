package config

import (
	"errors"
	"flag"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/keys"
	"github.com/dedupe-stage/dedupe-stage/window"
	"go.yaml.in/yaml/v3"
)

// mustParse parses src or fails the test.
func mustParse(tb testing.TB, src string) Config {
	tb.Helper()
	c, err := Parse([]byte(src))
	if err != nil {
		tb.Fatalf("Parse(%q): %v", src, err)
	}
	return c
}

func TestDefaultValidates(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v", err)
	}
	w, err := c.Window.Derive()
	if err != nil {
		t.Fatal(err)
	}
	if w.W != 70*time.Minute || w.SetBy.Name != "redelivery" || w.NearFraction != 0.8 {
		t.Fatalf("default window %v, want 1h10m set by redelivery, near 0.8", w)
	}
	if !c.NATS.ShouldCreateStreams() || !c.NATS.IsEmbedded() {
		t.Fatal("default must run embedded and create streams")
	}
	if got := c.OutputDuplicateWindow(); got != 140*time.Second {
		t.Fatalf("computed duplicate window %v, want 2m20s", got)
	}
	if got, want := c.EmbeddedStoreDir(), filepath.Join("data", "nats"); got != want {
		t.Fatalf("EmbeddedStoreDir() = %q, want %q", got, want)
	}
	if got, want := c.State.Dir(), filepath.Join("data", "state"); got != want {
		t.Fatalf("State.Dir() = %q, want %q", got, want)
	}
	// Default() must hand out a fresh value each time.
	d := Default()
	d.Window.Paths[0].Name = "changed"
	d.Input.Subjects[0] = "changed"
	if e := Default(); e.Window.Paths[0].Name != "client-retry" || e.Input.Subjects[0] != "events.>" {
		t.Fatal("Default() shares slices between calls")
	}
}

func TestEmptyInputsGiveDefaults(t *testing.T) {
	for _, src := range []string{"", "\n", "# only a comment\n", "---\n", "~\n", "{}\n"} {
		c, err := Parse([]byte(src))
		if err != nil {
			t.Fatalf("Parse(%q): %v", src, err)
		}
		if !reflect.DeepEqual(c, Default()) {
			t.Fatalf("Parse(%q) differs from Default(): %+v", src, c)
		}
	}
	c, err := Load("")
	if err != nil || !reflect.DeepEqual(c, Default()) {
		t.Fatalf("Load(\"\") = %+v, %v; want Default()", c, err)
	}
}

func TestExamplesLoadAndValidate(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "configs", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 {
		t.Fatalf("found %d example configs (%v), want at least local, webhooks and replay", len(files), files)
	}
	for _, f := range files {
		if strings.HasSuffix(f, ".cases.yaml") {
			continue // a configuration's cases (dedupe-stage test), not a configuration
		}
		t.Run(filepath.Base(f), func(t *testing.T) {
			c, err := Load(f)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if s := c.Summary(); !strings.Contains(s, "window:") || strings.Contains(s, "invalid") {
				t.Fatalf("Summary:\n%s", s)
			}
		})
	}
}

func TestExampleContents(t *testing.T) {
	local, err := Load(filepath.Join("..", "configs", "local.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(local, Default()) {
		t.Errorf("configs/local.yaml must spell out the defaults exactly:\n got %+v\nwant %+v", local, Default())
	}

	wh, err := Load(filepath.Join("..", "configs", "webhooks.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	w, err := wh.Window.Derive()
	if err != nil {
		t.Fatal(err)
	}
	wantKey := keys.KeyConfig{
		Field:     keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "id"},
		Scope:     keys.FieldSpec{Source: keys.SourceHeader, Header: "Webhook-Source"},
		MaxLength: 256,
	}
	switch {
	case w.W != 73*time.Hour || w.SetBy.Name != "webhook-retry":
		t.Errorf("webhooks: window %v, want 73h set by webhook-retry", w)
	case wh.Key != wantKey:
		t.Errorf("webhooks: key %+v, want %+v", wh.Key, wantKey)
	case wh.NATS.URL != "nats://127.0.0.1:4222" || wh.NATS.ShouldCreateStreams():
		t.Errorf("webhooks: nats %+v, want the existing server, streams not created", wh.NATS)
	case wh.Pipeline.OnFingerprintMismatch != FingerprintDeadLetter:
		t.Errorf("webhooks: on_fingerprint_mismatch %q", wh.Pipeline.OnFingerprintMismatch)
	}
	// The key config must really extract "<source>:<id>".
	kf, err := keys.NewKeyFunc(wh.Key)
	if err != nil {
		t.Fatal(err)
	}
	k, err := kf.Key("webhooks.github", map[string][]string{"Webhook-Source": {"github"}}, []byte(`{"id":"evt_1"}`))
	if err != nil || string(k) != "github:evt_1" {
		t.Errorf("webhooks key = %q, %v; want github:evt_1", k, err)
	}

	rp, err := Load(filepath.Join("..", "configs", "replay.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if w, err = rp.Window.Derive(); err != nil || w.SetBy.Name != "stream-replay" || w.SetBy.Max != 7*24*time.Hour {
		t.Errorf("replay: window %v, %v; want set by stream-replay 7d", w, err)
	}
	d := Default()
	if rp.State.Partitions <= d.State.Partitions || rp.Filter.ExpectedKeys <= d.Filter.ExpectedKeys || rp.State.MemoryBudget != 1<<30 {
		t.Errorf("replay: partitions %d, expected_keys %d, memory_budget %v; want more partitions and keys, 1GiB",
			rp.State.Partitions, rp.Filter.ExpectedKeys, rp.State.MemoryBudget)
	}
}

func TestLoadErrors(t *testing.T) {
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Load(missing) = %v, want ErrNotExist", err)
	}
	p := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(p, []byte("nats:\n  urll: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(p)
	if !errors.Is(err, ErrParse) || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "urll") {
		t.Fatalf("Load(bad) = %v, want ErrParse naming the file and the field", err)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{"unknown top-level field", "natz:\n  url: x\n", []string{"line 1", "natz"}},
		{"unknown nested field", "nats:\n  embedded:\n    prot: 5\n", []string{"line 3", "prot"}},
		{"unknown key field", "key:\n  source: json\n  jsonpath: id\n", []string{"line 3", "jsonpath"}},
		{"unknown scope field", "key:\n  scope:\n    hdr: X\n", []string{"line 3", "hdr"}},
		{"unknown window path field", "window:\n  paths:\n    - name: a\n      maximum: 1h\n", []string{"line 4", "maximum"}},
		{"bad duration", "input:\n  ack_wait: 10\n", []string{"line 2", `"10"`, "missing unit"}},
		{"bad duration unit", "window:\n  margin: 3w\n", []string{"line 2", `"3w"`}},
		{"bad byte size", "state:\n  memory_budget: 64M\n", []string{"line 2", `"64M"`, "unknown unit"}},
		{"wrong type", "state:\n  partitions: many\n", []string{"line 2", "many"}},
		{"list for a scalar", "nats:\n  url: [a, b]\n", []string{"line 2"}},
		{"top level list", "- a\n- b\n", []string{"line 1"}},
		{"top level scalar", "hello\n", []string{"line 1"}},
		{"two documents", "log:\n  level: info\n---\nlog:\n  level: debug\n", []string{"more than one YAML document"}},
		{"syntax", "nats: {url: \n", []string{"yaml"}},
		{"duplicate key", "log:\n  level: info\n  level: debug\n", []string{"level", "already defined"}},
		{"several errors at once", "input:\n  ack_wait: x\nstate:\n  memory_budget: y\n", []string{"line 2", "line 4"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.src))
			if !errors.Is(err, ErrParse) {
				t.Fatalf("Parse = %v, want an error wrapping ErrParse", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestNullKeepsDefaults(t *testing.T) {
	c := mustParse(t, "nats:\n  # url: nats://x:4222\ninput:\n  stream:\n  ack_wait:\nstate:\n  memory_budget: ~\n")
	if !reflect.DeepEqual(c, Default()) {
		t.Fatalf("null values changed the config: %+v", c)
	}
	c = mustParse(t, "input:\n  subjects: []\n")
	if len(c.Input.Subjects) != 0 {
		t.Fatalf("subjects: [] gave %q", c.Input.Subjects)
	}
	c = mustParse(t, "window:\n  paths:\n    - name: only\n      max: 3d\n")
	if len(c.Window.Paths) != 1 || c.Window.Paths[0] != (Path{Name: "only", Max: Duration(72 * time.Hour)}) {
		t.Fatalf("paths replace the defaults, got %+v", c.Window.Paths)
	}
}

func TestKeySectionReplacesFieldSpec(t *testing.T) {
	c := mustParse(t, "key:\n  json_path: id\n")
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "key.source: empty") {
		t.Fatalf("json_path without source: %v, want key.source error", err)
	}
	if !errors.Is(err, ErrInvalid) || !errors.Is(err, keys.ErrBadSpec) {
		t.Fatalf("key errors must wrap ErrInvalid and keys.ErrBadSpec: %v", err)
	}
	c = mustParse(t, "key:\n  max_length: 100\n")
	if c.Key.Field != keys.DefaultKeyConfig().Field || c.Key.MaxLength != 100 {
		t.Fatalf("max_length alone must keep the default field: %+v", c.Key)
	}
}

func TestValidateBadConfigs(t *testing.T) {
	tests := []struct {
		name string
		src  string   // YAML over the defaults
		want []string // substrings of the error, starting with the field path
	}{
		{"batch size zero", "pipeline: {batch_size: 0}", []string{"pipeline.batch_size: 0, want 1..10000"}},
		{"batch size huge", "pipeline: {batch_size: 20000}", []string{"pipeline.batch_size: 20000"}},
		{"partitions zero", "state: {partitions: 0}", []string{"state.partitions: 0, want 1..1024"}},
		{"partitions huge", "state: {partitions: 2000}", []string{"state.partitions: 2000"}},
		{"memory budget too small", "state: {partitions: 8, memory_budget: 4MiB}", []string{"state.memory_budget: 4MiB, want >= 8MiB"}},
		{"fp rate zero", "filter: {false_positive_rate: 0}", []string{"filter.false_positive_rate: 0, want in (0, 1)"}},
		{"fp rate one", "filter: {false_positive_rate: 1}", []string{"filter.false_positive_rate: 1"}},
		{"fp rate nan", "filter: {false_positive_rate: .nan}", []string{"filter.false_positive_rate: NaN"}},
		{"generations zero", "filter: {generations: 0}", []string{"filter.generations: 0"}},
		{"expected keys zero", "filter: {expected_keys: 0}", []string{"filter.expected_keys: 0"}},
		{"no window paths", "window: {paths: []}", []string{"window.paths: empty"}},
		{"unnamed path", "window: {paths: [{name: '', max: 1h}]}", []string{"window.paths[0].name"}},
		{"duplicate path", "window: {paths: [{name: a, max: 1h}, {name: a, max: 2h}]}", []string{`window.paths[1].name: "a", already the name of window.paths[0]`}},
		{"non-positive path", "window: {paths: [{name: a, max: 0s}, {name: b, max: -1h}]}", []string{"window.paths[0].max: 0s, want > 0", "window.paths[1].max: -1h, want > 0"}},
		{"negative margin", "window: {margin: -1m}", []string{"window.margin: -1m, want >= 0"}},
		{"near fraction", "window: {near_fraction: 1.5}", []string{"window.near_fraction: 1.5"}},
		{"window overflow", "window: {paths: [{name: a, max: 106751d}], margin: 1d}", []string{"window.paths", "overflow"}},
		{"ack wait zero", "input: {ack_wait: 0s}", []string{"input.ack_wait: 0s, want > 0"}},
		{"connect timeout", "nats: {connect_timeout: -1s}", []string{"nats.connect_timeout: -1s, want > 0"}},
		{"ping interval", "nats: {ping_interval: 0s}", []string{"nats.ping_interval: 0s, want 10ms..10m"}},
		{"max pings out", "nats: {max_pings_out: 0}", []string{"nats.max_pings_out: 0, want 1..100"}},
		{"gc interval", "state: {gc_interval: -1s}", []string{"state.gc_interval: -1s, want >= 0"}},
		{"snapshot interval", "state: {snapshot_interval: -1m}", []string{"state.snapshot_interval: -1m, want >= 0"}},
		{"on damage", "state: {on_damage: repair}", []string{`state.on_damage: "repair", want "refuse" or "rebuild"`}},
		{"filter too large", "filter: {expected_keys: 90000000000, false_positive_rate: 0.0001}", []string{"filter.expected_keys: 90000000000", "limit"}},
		{"linger negative", "pipeline: {batch_linger: -1ms}", []string{"pipeline.batch_linger: -1ms"}},
		{"linger long", "pipeline: {batch_linger: 5s}", []string{"pipeline.batch_linger: 5s, want 0..1s"}},
		{"tls cert without key", "nats: {tls: {cert_file: c.pem}}", []string{`nats.tls.key_file: empty while nats.tls.cert_file is "c.pem"`}},
		{"tls key without cert", "nats: {tls: {key_file: k.pem}}", []string{"nats.tls.cert_file: empty"}},
		{"creds and user", "nats: {url: 'nats://h:4222', creds_file: a.creds, user: u, password: p}", []string{"nats.creds_file: set together with nats.user"}},
		{"token and nkey", "nats: {url: 'nats://h:4222', token: t, nkey_seed_file: s.nk}", []string{"nats.nkey_seed_file: set together with nats.token"}},
		{"password without user", "nats: {url: 'nats://h:4222', password: p}", []string{"nats.password: set while nats.user is empty"}},
		{"bad url scheme", "nats: {url: 'http://h:4222'}", []string{`nats.url: "http://h:4222": scheme "http"`}},
		{"bad url port", "nats: {url: 'nats://h:99999'}", []string{"nats.url", "port"}},
		{"embedded port", "nats: {embedded: {port: 0}}", []string{"nats.embedded.port: 0"}},
		{"embedded host", "nats: {embedded: {host: ''}}", []string{"nats.embedded.host: empty"}},
		{"embedded monitor port", "nats: {embedded: {monitor_port: 70000}}", []string{"nats.embedded.monitor_port: 70000"}},
		{"embedded monitor port is the client port", "nats: {embedded: {monitor_port: 4222}}", []string{"nats.embedded.monitor_port: 4222, the same as nats.embedded.port"}},
		{"embedded password without user", "nats: {embedded: {password: p}}", []string{"nats.embedded.password: set while nats.embedded.user is empty"}},
		{"embedded user without password", "nats: {embedded: {user: u}}", []string{`nats.embedded.user: "u" set while nats.embedded.password is empty`}},
		{"embedded user and token", "nats: {embedded: {user: u, password: p, token: t}}", []string{"nats.embedded.token: set together with nats.embedded.user"}},
		{"system account without password", "nats: {embedded: {system_account: true}}", []string{"nats.embedded.system_password: empty while nats.embedded.system_account is true"}},
		{"system account with token", "nats: {embedded: {system_account: true, system_password: s, token: t}}", []string{"nats.embedded.token: set while nats.embedded.system_account is true"}},
		{"system user is the producer", "nats: {embedded: {system_account: true, system_password: s, user: sys, password: p}}", []string{`nats.embedded.system_user: "sys", the same as nats.embedded.user`}},
		{"negative max age", "input: {max_age: -1h}\ndead_letter: {max_age: -1s}", []string{"input.max_age: -1h, want >= 0", "dead_letter.max_age: -1s, want >= 0"}},
		{"output max age below its duplicate window", "output: {max_age: 1m}", []string{"output.max_age: 1m, shorter than the output duplicate window 2m20s"}},
		{"prefix overlaps input", "output: {subject_prefix: events}", []string{`output.subject_prefix: "events": output subjects "events.>" overlap input subject "events.>"`}},
		{"prefix under input", "output: {subject_prefix: events.deduped}", []string{"output.subject_prefix", "overlap input subject"}},
		{"prefix overlaps wildcard input", "input: {subjects: ['*.orders']}\noutput: {subject_prefix: x}", []string{"output.subject_prefix"}},
		{"prefix with wildcard", "output: {subject_prefix: 'a.*'}", []string{"output.subject_prefix", "wildcards not allowed"}},
		{"prefix empty", "output: {subject_prefix: ''}", []string{`output.subject_prefix: "": empty`}},
		{"dlq overlaps input", "dead_letter: {subject: events.dlq}", []string{`dead_letter.subject: "events.dlq"`, "overlap input subject"}},
		{"dlq overlaps output", "dead_letter: {subject: deduped.dlq}", []string{"dead_letter.subject", "overlap output subjects"}},
		{"bad input subject", "input: {subjects: ['events.>.x', 'a..b']}", []string{"input.subjects[0]", "'>' must be the last token", "input.subjects[1]", "empty token"}},
		{"no input subjects when creating", "input: {subjects: []}", []string{"input.subjects: empty"}},
		{"filter outside subjects", "input: {filter_subject: orders.>}", []string{`input.filter_subject: "orders.>" matches none of input.subjects`}},
		{"same stream", "output: {stream: EVENTS}", []string{`output.stream: "EVENTS", the same as input.stream`}},
		{"dlq same stream", "dead_letter: {stream: EVENTS_DEDUPED}", []string{"dead_letter.stream"}},
		{"stream name with dot", "input: {stream: a.b}", []string{`input.stream: "a.b": byte 1`}},
		{"consumer name empty", "input: {consumer: ''}", []string{"input.consumer"}},
		{"max ack pending below batch", "input: {max_ack_pending: 10}", []string{"input.max_ack_pending: 10, want >= pipeline.batch_size (256)"}},
		{"max deliver zero", "input: {max_deliver: 0}", []string{"input.max_deliver: 0"}},
		{"short duplicate window", "output: {duplicate_window: 30s}", []string{"output.duplicate_window: 30s, want >= input.ack_wait + output.restart_margin (1m10s)"}},
		{"negative restart margin", "output: {restart_margin: -1s}", []string{"output.restart_margin: -1s"}},
		{"unknown publish mode", "output: {publish: batch}", []string{`output.publish: "batch", want auto, atomic or async`}},
		{"batch_max 0", "output: {batch_max: 0}", []string{"output.batch_max: 0, want 1..10000"}},
		{"batch_max too large", "output: {batch_max: 10001}", []string{"output.batch_max: 10001, want 1..10000"}},
		{"no batch in flight", "output: {max_batches_in_flight: 0}", []string{"output.max_batches_in_flight: 0, want 1..1000"}},
		{"max message bytes", "pipeline: {max_message_bytes: 128MiB}", []string{"pipeline.max_message_bytes: 128MiB"}},
		{"publish in flight", "pipeline: {max_publish_in_flight: 0}", []string{"pipeline.max_publish_in_flight: 0"}},
		{"fingerprint policy", "pipeline: {on_fingerprint_mismatch: drop}", []string{`pipeline.on_fingerprint_mismatch: "drop", want "dead-letter" or "repeat"`}},
		{"http addr", "http: {addr: localhost}", []string{`http.addr: "localhost"`}},
		{"log level", "log: {level: verbose}", []string{`log.level: "verbose"`}},
		{"log format", "log: {format: xml}", []string{`log.format: "xml"`}},
		{"key source", "key: {source: body}", []string{`key.source: "body"`}},
		{"key json path", "key: {source: json, json_path: 'a..b'}", []string{`key.json_path: "a..b": empty segment`}},
		{"key scope", "key: {scope: {source: subject, subject_token: 0}}", []string{"key.scope.subject_token: 0"}},
		{"key max length", "key: {max_length: -1}", []string{"key.max_length: -1"}},
		{"data dir", "state: {data_dir: ''}", []string{"state.data_dir"}},
		{"every error reported", "pipeline: {batch_size: 0}\nstate: {partitions: 0}\nlog: {level: x}\nkey: {source: x}",
			[]string{"pipeline.batch_size", "state.partitions", "log.level", "key.source"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustParse(t, tt.src)
			err := c.Validate()
			if err == nil {
				t.Fatal("Validate() = nil, want an error")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error does not wrap ErrInvalid: %v", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
			// Every line of the joined error starts with a field path.
			for _, line := range strings.Split(err.Error(), "\n") {
				if i := strings.Index(line, ": "); i <= 0 || strings.ContainsAny(line[:i], " \"") {
					t.Errorf("error line %q does not start with a field path", line)
				}
			}
			_ = c.Summary() // must not panic on invalid configurations
		})
	}
}

func TestValidateGoodVariants(t *testing.T) {
	for _, src := range []string{
		"output: {duplicate_window: 30s, allow_short_duplicate_window: true}",
		"output: {duplicate_window: 1m10s}",
		"output: {publish: atomic, batch_max: 1, max_batches_in_flight: 1000}",
		"output: {publish: async, batch_max: 10000}",
		"nats: {url: 'nats://a:4222, nats://b:4222', user: u, password: p}",
		"nats: {url: 'tls://h', creds_file: x.creds, tls: {ca_file: ca.pem, cert_file: c.pem, key_file: k.pem}}",
		"nats: {url: 'localhost:4222'}",
		"nats: {embedded: {port: -1}}",
		"nats: {url: 'nats://h:4222'}\ninput: {subjects: []}",
		"nats: {url: 'nats://h:4222'}\ninput: {filter_subject: orders.>}",
		"input: {filter_subject: events.eu.>, max_deliver: 5}",
		"input: {subjects: ['orders.*', 'payments.>']}\noutput: {subject_prefix: deduped.v1}",
		"http: {addr: ''}",
		"http: {addr: ':9464'}",
		"pipeline: {batch_linger: 0s, on_fingerprint_mismatch: repeat}",
		"filter: {enabled: false}",
		"state: {partitions: 1, memory_budget: 8MiB}",
		"window: {margin: 0s, near_fraction: 1}",
		"state: {gc_interval: 0s, snapshot_interval: 0s}",
		"state: {on_damage: rebuild}",
	} {
		c := mustParse(t, src)
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", src, err)
		}
	}
}

func TestSubjectsOverlap(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"a.b", "a.b", true},
		{"a.b", "a.c", false},
		{"a.>", "a.b.c", true},
		{"a.>", "a", false},
		{"a.*", "a.b", true},
		{"a.*", "a.b.c", false},
		{"*.b", "a.*", true},
		{">", "x.y", true},
		{"deduped.>", "events.>", false},
		{"events.>", "events.events.>", true},
		{"a.*.c", "a.b.>", true},
		{"a.*.c", "a.b.d", false},
	}
	for _, tt := range tests {
		if got := subjectsOverlap(tt.a, tt.b); got != tt.want {
			t.Errorf("subjectsOverlap(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
		if got := subjectsOverlap(tt.b, tt.a); got != tt.want {
			t.Errorf("subjectsOverlap(%q, %q) = %v, want %v", tt.b, tt.a, got, tt.want)
		}
	}
}

func TestEnvOverridesFile(t *testing.T) {
	c := mustParse(t, "nats: {url: 'nats://file:4222'}\nstate: {partitions: 4, data_dir: /file}\nlog: {level: warn}\n")
	env := map[string]string{
		"DEDUPE_NATS_URL":      "nats://env:4222",
		"DEDUPE_DATA_DIR":      "/env",
		"DEDUPE_HTTP_ADDR":     ":9999",
		"DEDUPE_PARTITIONS":    "16",
		"DEDUPE_LOG_LEVEL":     "debug",
		"DEDUPE_LOG_FORMAT":    "json",
		"DEDUPE_NATS_USER":     "u",
		"DEDUPE_NATS_PASSWORD": "p",
		"DEDUPE_NATS_TOKEN":    "t",
		"DEDUPE_NATS_CREDS":    "/c.creds",
		"DEDUPE_NATS_NKEY":     "/s.nk",

		// The nats CLI's names, each overridden by the stage's own.
		"NATS_URL":      "nats://natsenv:4222",
		"NATS_CONTEXT":  "cli",
		"NATS_USER":     "nu",
		"NATS_PASSWORD": "np",
		"NATS_TOKEN":    "nt",
		"NATS_CREDS":    "/n.creds",
		"NATS_NKEY":     "/n.nk",
		"NATS_CERT":     "/n.crt",
		"NATS_KEY":      "/n.key",
		"NATS_CA":       "/n-ca.pem",
		"NATS_TIMEOUT":  "9s",

		"DEDUPE_NATS_CONTEXT":       "prod",
		"DEDUPE_NATS_CERT":          "/c.crt",
		"DEDUPE_NATS_KEY":           "/c.key",
		"DEDUPE_NATS_CA":            "/ca.pem",
		"DEDUPE_NATS_TLS_FIRST":     "true",
		"DEDUPE_NATS_JS_DOMAIN":     "hub",
		"DEDUPE_NATS_JS_API_PREFIX": "$JS.x.API",
		"DEDUPE_INPUT_STREAM":       "IN",
		"DEDUPE_OUTPUT_STREAM":      "OUT",
		"DEDUPE_CREATE_STREAMS":     "true",
		"DEDUPE_SYNC_WRITES":        "false",

		"DEDUPE_EMBEDDED_HOST":            "0.0.0.0",
		"DEDUPE_EMBEDDED_PORT":            "14222",
		"DEDUPE_EMBEDDED_MONITOR_PORT":    "18222",
		"DEDUPE_EMBEDDED_USER":            "eu",
		"DEDUPE_EMBEDDED_PASSWORD":        "ep",
		"DEDUPE_EMBEDDED_TOKEN":           "et",
		"DEDUPE_EMBEDDED_SYSTEM_ACCOUNT":  "true",
		"DEDUPE_EMBEDDED_SYSTEM_PASSWORD": "esp",
		"DEDUPE_KEY_HEADER":               "Order-Id",
		"DEDUPE_KEY_VERSION_HEADER":       "Order-Version",
		"DEDUPE_WINDOW_REFRESH_ON_REPEAT": "true",

		"DEDUPE_TOTALS_POSTGRES_DSN": "postgres://env/db",
		"DEDUPE_HTTP_INSPECT":        "false",
		"DEDUPE_HTTP_INSPECT_ADDR":   "127.0.0.1:9465",
		"DEDUPE_SCALE_OUT":           "true",
		"DEDUPE_SCALE_OUT_GROUP":     "g",
		"DEDUPE_INSTANCE":            "i1",
	}
	if err := c.ApplyEnv(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	want := mustParse(t, "nats: {url: 'nats://env:4222', context: prod, user: u, password: p, token: t, creds_file: /c.creds, nkey_seed_file: /s.nk, create_streams: true,\n"+
		"  tls: {cert_file: /c.crt, key_file: /c.key, ca_file: /ca.pem, handshake_first: true}, jetstream_domain: hub, jetstream_api_prefix: '$JS.x.API', connect_timeout: 9s,\n"+
		"  embedded: {host: 0.0.0.0, port: 14222, monitor_port: 18222, user: eu, password: ep, token: et, system_account: true, system_password: esp}}\n"+
		"key: {source: header, header: Order-Id, version: {source: header, header: Order-Version}}\nwindow: {refresh_on_repeat: true}\n"+
		"state: {partitions: 16, data_dir: /env, sync_writes: false}\nhttp: {addr: ':9999', inspect: false, inspect_addr: '127.0.0.1:9465'}\nlog: {level: debug, format: json}\n"+
		"input: {stream: IN}\noutput: {stream: OUT}\ntotals: {sinks: {postgres: {dsn: 'postgres://env/db'}}}\n"+
		"scale_out: {enabled: true, group: g, instance: i1}\n")
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("after ApplyEnv:\n got %+v\nwant %+v", c, want)
	}
	if len(EnvVars()) != len(env) {
		t.Fatalf("test covers %d variables, EnvVars has %d", len(env), len(EnvVars()))
	}

	// Unset and empty variables change nothing.
	before := c
	if err := c.ApplyEnv(func(string) string { return "" }); err != nil || !reflect.DeepEqual(c, before) {
		t.Fatalf("empty environment changed the config or failed: %v", err)
	}

	// Bad values name the variable; the good ones still apply.
	bad := map[string]string{"DEDUPE_PARTITIONS": "many", "DEDUPE_SYNC_WRITES": "perhaps", "DEDUPE_LOG_LEVEL": "error"}
	err := c.ApplyEnv(func(k string) string { return bad[k] })
	if !errors.Is(err, ErrEnv) || !strings.Contains(err.Error(), "DEDUPE_PARTITIONS") || !strings.Contains(err.Error(), "DEDUPE_SYNC_WRITES") {
		t.Fatalf("ApplyEnv(bad) = %v", err)
	}
	if c.Log.Level != "error" || c.State.Partitions != 16 {
		t.Fatalf("after bad env: level %q partitions %d", c.Log.Level, c.State.Partitions)
	}
}

func TestFlagsOverrideEnvAndFile(t *testing.T) {
	c := mustParse(t, "nats: {url: 'nats://file:4222'}\nstate: {partitions: 4}\nlog: {level: warn}\ninput: {stream: FILE_IN}\n")
	env := map[string]string{"DEDUPE_NATS_URL": "nats://env:4222", "DEDUPE_PARTITIONS": "16", "DEDUPE_OUTPUT_STREAM": "ENV_OUT"}
	if err := c.ApplyEnv(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.RegisterFlags(fs)
	err := fs.Parse([]string{"--nats-url", "nats://flag:4222", "--partitions=32", "--log-format", "json",
		"--create-streams", "--sync-writes=false", "--http-addr=", "--data-dir", "/flag", "--output-stream", "FLAG_OUT",
		"--key-header", "Order-Id", "--embedded-host", "0.0.0.0", "--embedded-port", "14222", "--embedded-monitor-port", "18222",
		"--embedded-user", "eu", "--embedded-password", "ep", "--embedded-system-account", "--embedded-system-password", "esp"})
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case c.NATS.URL != "nats://flag:4222":
		t.Errorf("url %q: flag must beat env and file", c.NATS.URL)
	case c.State.Partitions != 32:
		t.Errorf("partitions %d: flag must beat env", c.State.Partitions)
	case c.Output.Stream != "FLAG_OUT":
		t.Errorf("output stream %q: flag must beat env", c.Output.Stream)
	case c.Log.Level != "warn" || c.Input.Stream != "FILE_IN":
		t.Errorf("level %q, input stream %q: values without env or flag come from the file", c.Log.Level, c.Input.Stream)
	case c.Log.Format != "json" || c.State.DataDir != "/flag" || c.HTTP.Addr != "":
		t.Errorf("format %q, data dir %q, http %q", c.Log.Format, c.State.DataDir, c.HTTP.Addr)
	case c.NATS.CreateStreams == nil || !*c.NATS.CreateStreams || !c.NATS.ShouldCreateStreams():
		t.Errorf("--create-streams did not set create_streams")
	case c.State.SyncWrites == nil || *c.State.SyncWrites || c.StateSyncWrites():
		t.Errorf("--sync-writes=false did not clear sync_writes")
	case c.Key.Field != (keys.FieldSpec{Source: keys.SourceHeader, Header: "Order-Id"}):
		t.Errorf("--key-header Order-Id: key %+v", c.Key.Field)
	case c.NATS.Embedded.Host != "0.0.0.0" || c.NATS.Embedded.Port != 14222 || c.NATS.Embedded.MonitorPort != 18222:
		t.Errorf("embedded host/port/monitor port flags: %+v", c.NATS.Embedded)
	case c.NATS.Embedded.User != "eu" || c.NATS.Embedded.Password != "ep" || !c.NATS.Embedded.SystemAccount || c.NATS.Embedded.SystemPassword != "esp":
		t.Errorf("embedded auth flags: %+v", c.NATS.Embedded)
	}

	// Without flags, the env values stay and create_streams stays automatic.
	c2 := mustParse(t, "nats: {url: 'nats://file:4222'}")
	fs2 := flag.NewFlagSet("test", flag.ContinueOnError)
	fs2.SetOutput(io.Discard)
	c2.RegisterFlags(fs2)
	if err := fs2.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if c2.NATS.CreateStreams != nil || c2.NATS.ShouldCreateStreams() {
		t.Fatalf("create_streams %v without the flag, want automatic (false with a URL)", c2.NATS.CreateStreams)
	}
	if err := fs2.Parse([]string{"--create-streams=false"}); err != nil || c2.NATS.CreateStreams == nil || *c2.NATS.CreateStreams {
		t.Fatalf("--create-streams=false: %v, %v", err, c2.NATS.CreateStreams)
	}
	if err := fs2.Parse([]string{"--create-streams=maybe"}); err == nil {
		t.Fatal("--create-streams=maybe accepted")
	}
}

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"0", 0, false},
		{"0s", 0, false},
		{"90s", 90 * time.Second, false},
		{"250ms", 250 * time.Millisecond, false},
		{"1h30m", 90 * time.Minute, false},
		{"1d", 24 * time.Hour, false},
		{"3d", 72 * time.Hour, false},
		{"7d", 168 * time.Hour, false},
		{"1d12h", 36 * time.Hour, false},
		{"1.5d", 36 * time.Hour, false},
		{"2d3h4m5s", 51*time.Hour + 4*time.Minute + 5*time.Second, false},
		{"12h1d", 36 * time.Hour, false},
		{"-1d", -24 * time.Hour, false},
		{"+10m", 10 * time.Minute, false},
		{"1µs", time.Microsecond, false},
		{"106751d", 106751 * 24 * time.Hour, false},
		{"", 0, true},
		{"10", 0, true},
		{"d", 0, true},
		{"1w", 0, true},
		{"1dd", 0, true},
		{"1 d", 0, true},
		{"1d-2h", 0, true},
		{"..d", 0, true},
		{"-", 0, true},
		{"106752d", 0, true},
		{"106751d24h", 0, true},
		{"3D", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseDuration(tt.in)
		if tt.wantErr {
			if err == nil {
				t.Errorf("ParseDuration(%q) = %v, want an error", tt.in, got)
			} else if !strings.Contains(err.Error(), tt.in) {
				t.Errorf("ParseDuration(%q) error %q does not quote the input", tt.in, err)
			}
			continue
		}
		if err != nil || got.D() != tt.want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", tt.in, got.D(), err, tt.want)
		}
	}
}

func TestDurationString(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"},
		{72 * time.Hour, "3d"},
		{36 * time.Hour, "1d12h"},
		{70 * time.Minute, "1h10m"},
		{10 * time.Minute, "10m"},
		{time.Hour, "1h"},
		{90 * time.Second, "1m30s"},
		{time.Millisecond, "1ms"},
		{24*time.Hour + 500*time.Millisecond, "1d500ms"},
		{2*time.Hour + 5*time.Second, "2h0m5s"},
		{-25 * time.Hour, "-1d1h"},
	}
	for _, tt := range tests {
		if got := Duration(tt.d).String(); got != tt.want {
			t.Errorf("Duration(%v).String() = %q, want %q", tt.d, got, tt.want)
		}
	}
}

func TestDurationRoundTrip(t *testing.T) {
	for _, d := range []time.Duration{0, 1, -1, time.Second, 25*time.Hour + 1, 7 * 24 * time.Hour, 1<<62 + 12345,
		math.MaxInt64, math.MinInt64, math.MinInt64 + 1, -36 * time.Hour, 1500 * time.Microsecond} {
		s := Duration(d).String()
		got, err := ParseDuration(s)
		if err != nil || got.D() != d {
			t.Errorf("%d -> %q -> %d, %v", d, s, got, err)
		}
		// Through YAML and text too.
		b, err := yaml.Marshal(struct{ D Duration }{Duration(d)})
		if err != nil {
			t.Fatal(err)
		}
		var back struct{ D Duration }
		if err := yaml.Unmarshal(b, &back); err != nil || back.D.D() != d {
			t.Errorf("YAML %q -> %v, %v; want %v", b, back.D.D(), err, d)
		}
		var txt Duration
		if tb, _ := Duration(d).MarshalText(); txt.UnmarshalText(tb) != nil || txt.D() != d {
			t.Errorf("text round trip of %v failed", d)
		}
	}
}

func TestParseByteSize(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{"0", 0, false},
		{"1048576", 1 << 20, false},
		{"64MiB", 64 << 20, false},
		{"1GiB", 1 << 30, false},
		{"512KB", 512000, false},
		{"512kb", 512000, false},
		{"2 MiB", 2 << 20, false},
		{"1.5GiB", 3 << 29, false},
		{"0.5KB", 500, false},
		{"10B", 10, false},
		{"1TB", 1e12, false},
		{"7PiB", 7 << 50, false},
		{"8191PiB", 8191 << 50, false},
		{"8192PiB", 0, true},
		{"", 0, true},
		{"-1", 0, true},
		{"-1MiB", 0, true},
		{"64M", 0, true},
		{"64 mebibytes", 0, true},
		{"1.5B", 0, true},
		{"0.1KiB", 0, true},
		{"1e6", 0, true},
		{"1..5MiB", 0, true},
		{".5MiB", 0, true},
		{"MiB", 0, true},
		{"99999999999999999999", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseByteSize(tt.in)
		if tt.wantErr {
			if err == nil {
				t.Errorf("ParseByteSize(%q) = %d, want an error", tt.in, got)
			}
			continue
		}
		if err != nil || int64(got) != tt.want {
			t.Errorf("ParseByteSize(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
}

func TestByteSizeRoundTrip(t *testing.T) {
	tests := []struct {
		b    ByteSize
		want string
	}{
		{0, "0B"},
		{1, "1B"},
		{1 << 20, "1MiB"},
		{256 << 20, "256MiB"},
		{1 << 30, "1GiB"},
		{1536, "1536B"},
		{512000, "500KiB"},
		{1_000_000, "1MB"},
		{1_000_001, "1000001B"},
		{math.MaxInt64, "9223372036854775807B"},
	}
	for _, tt := range tests {
		s := tt.b.String()
		if s != tt.want {
			t.Errorf("ByteSize(%d).String() = %q, want %q", int64(tt.b), s, tt.want)
		}
		got, err := ParseByteSize(s)
		if err != nil || got != tt.b {
			t.Errorf("%d -> %q -> %d, %v", int64(tt.b), s, got, err)
		}
		b, err := yaml.Marshal(struct{ B ByteSize }{tt.b})
		if err != nil {
			t.Fatal(err)
		}
		var back struct{ B ByteSize }
		if err := yaml.Unmarshal(b, &back); err != nil || back.B != tt.b {
			t.Errorf("YAML %q -> %d, %v; want %d", b, back.B, err, tt.b)
		}
	}
}

func TestConfigYAMLRoundTrip(t *testing.T) {
	for _, f := range []string{"local.yaml", "webhooks.yaml", "replay.yaml"} {
		c, err := Load(filepath.Join("..", "configs", f))
		if err != nil {
			t.Fatal(err)
		}
		b, err := yaml.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Parse(b)
		if err != nil {
			t.Fatalf("%s: re-parsing the marshalled config: %v\n%s", f, err, b)
		}
		if !reflect.DeepEqual(back, c) {
			t.Fatalf("%s: round trip differs:\n got %+v\nwant %+v\n%s", f, back, c, b)
		}
	}
}

func TestSummary(t *testing.T) {
	c := Default()
	s := c.Summary()
	for _, want := range []string{
		"1h10m0s = redelivery 1h0m0s + margin 10m0s",
		"partitions:  8",
		"4+1 generations of 250000 keys",
		"bits per key",
		"MiB",
		"state.memory_budget 64MiB (one Badger instance for the 8 partitions) + filter 1.93 MiB + table builders 64.00 MiB while writing = 129.93 MiB",
		"badger one instance, 64 MiB for all partitions: up to 3 memtables of",
		"state.sync_writes=true",
		"nats.embedded.sync_always=true",
		"embedded nats-server on 127.0.0.1:4222",
		"stream EVENTS (subjects events.>)",
		"stream EVENTS_DEDUPED (subjects deduped.>, _dedupe.deduped.>), duplicate window 2m20s (computed)",
		"stream DEDUPE_DLQ (subjects dedupe.dlq.>",
		"created",
		"output.publish auto: atomic batches of up to 1000 messages, at most 32 open at once (a batch of fewer than 16 messages goes one message at a time, all in flight together: output.atomic_min_batch) when the stream allows atomic publish",
		// The Badger sizing is the state options' own, printed as is.
		"badger " + c.StateOptions(window.Window{}).BadgerSizing().String(),
	} {
		if !strings.Contains(s, want) {
			t.Errorf("Summary does not contain %q:\n%s", want, s)
		}
	}
	c.NATS.URL = "nats://h:4222"
	c.NATS.Password, c.NATS.User, c.NATS.Token = "secret-password", "alice", "secret-token"
	no := false
	c.State.SyncWrites = &no
	s = c.Summary()
	for _, want := range []string{"server nats://h:4222", "RISK", "must exist", "output.publish auto: one asynchronous publish per message"} {
		if !strings.Contains(s, want) {
			t.Errorf("Summary does not contain %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "secret") {
		t.Errorf("Summary prints a secret:\n%s", s)
	}
	// Invalid configurations are described, not crashed on.
	c = Config{}
	if s := c.Summary(); !strings.Contains(s, "invalid") {
		t.Errorf("Summary of the zero Config:\n%s", s)
	}
}

// TestREADMEDocumentsEverything keeps configs/README.md complete: every YAML
// field (by its full path), every environment variable and every flag.
func TestREADMEDocumentsEverything(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "configs", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	for _, p := range yamlPaths(reflect.TypeOf(Config{}), "") {
		if !strings.Contains(readme, "`"+p+"`") {
			t.Errorf("configs/README.md does not document `%s`", p)
		}
	}
	for name := range EnvVars() {
		if !strings.Contains(readme, name) {
			t.Errorf("configs/README.md does not mention %s", name)
		}
	}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	c := Default()
	c.RegisterFlags(fs)
	fs.VisitAll(func(f *flag.Flag) {
		if !strings.Contains(readme, "--"+f.Name) {
			t.Errorf("configs/README.md does not mention --%s", f.Name)
		}
	})
}

// yamlPaths lists the dotted YAML paths of the leaf fields of t.
func yamlPaths(t reflect.Type, prefix string) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		ft := f.Type
		if ft.Kind() == reflect.Slice {
			ft = ft.Elem()
		}
		path := prefix + name
		if strings.Contains(opts, "inline") {
			out = append(out, yamlPaths(ft, prefix)...)
			continue
		}
		if ft.Kind() == reflect.Struct && ft.PkgPath() != "time" {
			if f.Type.Kind() == reflect.Slice {
				out = append(out, path)
				path += "[]"
			}
			out = append(out, yamlPaths(ft, path+".")...)
			continue
		}
		out = append(out, path)
	}
	return out
}

// TestPublishAtomic checks the output's publish mode for each setting, server
// and stream: auto is atomic only with the embedded server syncing every
// write and a stream that allows it; atomic on a stream that does not allow
// it is an error naming the field.
func TestPublishAtomic(t *testing.T) {
	external := Default()
	external.NATS.URL = "nats://h:4222"
	noSync := Default()
	noSync.NATS.Embedded.SyncAlways = false
	with := func(c Config, mode string) Config { c.Output.Publish = mode; return c }
	cases := []struct {
		name    string
		cfg     Config
		allowed bool
		want    bool
		err     error
	}{
		{"auto, embedded sync_always, stream allows", Default(), true, true, nil},
		{"auto, embedded sync_always, stream does not allow", Default(), false, false, nil},
		{"auto, embedded without sync_always", noSync, true, false, nil},
		{"auto, external server", external, true, false, nil},
		{"atomic, external server, stream allows", with(external, PublishAtomic), true, true, nil},
		{"atomic, stream does not allow", with(Default(), PublishAtomic), false, false, ErrAtomicNotAllowed},
		{"async, stream allows", with(Default(), PublishAsync), true, false, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.cfg.PublishAtomic(c.allowed)
			if got != c.want || !errors.Is(err, c.err) || (c.err == nil && err != nil) {
				t.Errorf("PublishAtomic(%v) = %v, %v; want %v, %v", c.allowed, got, err, c.want, c.err)
			}
		})
	}
	for _, c := range cases {
		// The totals stream follows output.publish without refusing, and
		// scale-out does not make auto atomic.
		want := c.want || (c.err != nil && c.allowed)
		scaled := c.cfg
		scaled.ScaleOut.Enabled = true
		for _, cfg := range []Config{c.cfg, scaled} {
			if got := cfg.SideStreamAtomic(c.allowed); got != want {
				t.Errorf("%s, scale_out %v: SideStreamAtomic(%v) = %v, want %v", c.name, cfg.ScaleOut.Enabled, c.allowed, got, want)
			}
		}
	}
	if !strings.Contains(ErrAtomicNotAllowed.Error(), "output.publish") {
		t.Errorf("ErrAtomicNotAllowed does not name its field: %v", ErrAtomicNotAllowed)
	}
}

// TestStateSyncWritesFollowsTheServer: state.sync_writes unset follows the
// embedded server's sync_always (true with an external server, whose
// setting the stage cannot read); set, it is kept, and check-config's
// durability line names the combination's risk.
func TestStateSyncWritesFollowsTheServer(t *testing.T) {
	yes, no := true, false
	for _, tc := range []struct {
		name       string
		url        string
		serverSync bool
		set        *bool
		want       bool
		summary    string
	}{
		{"embedded, syncs", "", true, nil, true, "nothing acknowledged is lost or forwarded twice"},
		{"embedded, no sync", "", false, nil, false, "the state forgets the same recent writes"},
		{"external", "nats://h:4222", false, nil, true, "the external server's"},
		{"set false beside a syncing server", "", true, &no, false, "keys it forgot are forwarded again"},
		{"set true beside a server without sync", "", false, &yes, true, "events lost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			c.NATS.URL = tc.url
			c.NATS.Embedded.SyncAlways = tc.serverSync
			c.State.SyncWrites = tc.set
			if got := c.StateSyncWrites(); got != tc.want {
				t.Errorf("StateSyncWrites() = %v, want %v", got, tc.want)
			}
			if got := c.StateOptions(window.Window{}).SyncWrites; got != tc.want {
				t.Errorf("the state is opened with SyncWrites %v, want %v", got, tc.want)
			}
			if s := c.Summary(); !strings.Contains(s, tc.summary) {
				t.Errorf("Summary does not say %q:\n%s", tc.summary, s)
			}
		})
	}
}

// TestStaleAfter checks the bound a dead link goes unnoticed: a ping every
// interval, the connection dropped at the ping that finds max_pings_out
// unanswered.
func TestStaleAfter(t *testing.T) {
	n := Default().NATS
	if got := n.StaleAfter(); got != 15*time.Second {
		t.Errorf("default StaleAfter %v, want 15s (5s x (2 + 1))", got)
	}
	n.PingInterval, n.MaxPingsOut = Duration(250*time.Millisecond), 3
	if got := n.StaleAfter(); got != time.Second {
		t.Errorf("StaleAfter with 250ms and 3 pings out: %v, want 1s", got)
	}
}

// TestTotalsReplicas checks that the totals bucket and stream follow the
// replicas of the streams the stage creates unless totals.replicas says
// otherwise.
func TestTotalsReplicas(t *testing.T) {
	for _, tt := range []struct {
		name     string
		scaleOut bool
		streams  int // scale_out.replicas
		totals   int // totals.replicas
		want     int
	}{
		{"one instance", false, 3, 0, 1},
		{"scale-out R3", true, 3, 0, 3},
		{"scale-out R1", true, 1, 0, 1},
		{"set", true, 3, 5, 5},
		{"set without scale-out", false, 3, 3, 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.ScaleOut.Enabled, c.ScaleOut.Replicas, c.Totals.Replicas = tt.scaleOut, tt.streams, tt.totals
			if got := c.TotalsReplicas(); got != tt.want {
				t.Errorf("TotalsReplicas() = %d, want %d", got, tt.want)
			}
		})
	}
	c := Default()
	c.Totals.Replicas = 6
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "totals.replicas: 6, want 0 (as the streams) or 1..5") {
		t.Errorf("Validate with totals.replicas 6: %v", err)
	}
}
