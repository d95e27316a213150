package keys

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"go.yaml.in/yaml/v3"
)

// mustExtractor compiles spec or fails the test.
func mustExtractor(tb testing.TB, spec FieldSpec) *Extractor {
	tb.Helper()
	e, err := NewExtractor(spec)
	if err != nil {
		tb.Fatalf("NewExtractor(%+v): %v", spec, err)
	}
	return e
}

// checkResult compares an extraction result with the wanted value or reason.
func checkResult(t *testing.T, got []byte, err error, want, wantReason string) {
	t.Helper()
	if wantReason != "" {
		if err == nil {
			t.Fatalf("got %q, want error %s", got, wantReason)
		}
		var ke *Error
		if !errors.As(err, &ke) {
			t.Fatalf("error %v (%T) is not a *keys.Error", err, err)
		}
		if ke.Reason != wantReason {
			t.Fatalf("reason %q (%v), want %q", ke.Reason, err, wantReason)
		}
		if ke.Detail == "" {
			t.Fatalf("error %v has no detail", err)
		}
		if got != nil {
			t.Fatalf("got %q together with error %v", got, err)
		}
		return
	}
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
	if string(got) != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestExtractHeader(t *testing.T) {
	tests := []struct {
		name       string
		header     string
		hdr        nats.Header
		want       string
		wantReason string
	}{
		{"exact", "Nats-Msg-Id", nats.Header{"Nats-Msg-Id": {"abc"}}, "abc", ""},
		{"first value wins", "Nats-Msg-Id", nats.Header{"Nats-Msg-Id": {"a", "b"}}, "a", ""},
		{"lower-case sender", "Nats-Msg-Id", nats.Header{"nats-msg-id": {"low"}}, "low", ""},
		{"lower-case spec", "nats-msg-id", nats.Header{"Nats-Msg-Id": {"canon"}}, "canon", ""},
		{"exact beats case-insensitive", "Nats-Msg-Id", nats.Header{"NATS-MSG-ID": {"upper"}, "Nats-Msg-Id": {"exact"}}, "exact", ""},
		{"smallest name among case variants", "nats-msg-id", nats.Header{"NATS-MSG-ID": {"upper"}, "Nats-Msg-Id": {"canon"}}, "upper", ""},
		{"unicode value", "Id", nats.Header{"Id": {"ключ-🔑"}}, "ключ-🔑", ""},
		{"nil header", "Nats-Msg-Id", nil, "", ReasonNoKey},
		{"absent", "Nats-Msg-Id", nats.Header{"Other": {"x"}}, "", ReasonNoKey},
		{"prefix is not a match", "Nats-Msg-Id", nats.Header{"Nats-Msg-Id2": {"x"}}, "", ReasonNoKey},
		{"empty value", "Nats-Msg-Id", nats.Header{"Nats-Msg-Id": {""}}, "", ReasonNoKey},
		{"empty first value", "Nats-Msg-Id", nats.Header{"Nats-Msg-Id": {"", "b"}}, "", ReasonNoKey},
		{"no values", "Nats-Msg-Id", nats.Header{"Nats-Msg-Id": {}}, "", ReasonNoKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := mustExtractor(t, FieldSpec{Source: SourceHeader, Header: tt.header})
			got, err := e.Extract("ignored.subject", tt.hdr, []byte(`{"id":"payload"}`))
			checkResult(t, got, err, tt.want, tt.wantReason)
		})
	}
}

func TestExtractSubject(t *testing.T) {
	tests := []struct {
		subject    string
		token      int
		want       string
		wantReason string
	}{
		{"events.github.push", 1, "events", ""},
		{"events.github.push", 2, "github", ""},
		{"events.github.push", 3, "push", ""},
		{"events.github.push", -1, "push", ""},
		{"events.github.push", -3, "events", ""},
		{"single", 1, "single", ""},
		{"single", -1, "single", ""},
		{"events.ключ.x", 2, "ключ", ""},
		{"events.github.push", 4, "", ReasonNoKey},
		{"events.github.push", -4, "", ReasonNoKey},
		{"", 1, "", ReasonNoKey},
		{"", -1, "", ReasonNoKey},
		{"a..b", 2, "", ReasonNoKey},
		{"a.b.", -1, "", ReasonNoKey},
	}
	for _, tt := range tests {
		t.Run(tt.subject+"/"+strconv.Itoa(tt.token), func(t *testing.T) {
			e := mustExtractor(t, FieldSpec{Source: SourceSubject, SubjectToken: tt.token})
			got, err := e.Extract(tt.subject, nats.Header{"Nats-Msg-Id": {"h"}}, nil)
			checkResult(t, got, err, tt.want, tt.wantReason)
		})
	}
}

func TestExtractJSON(t *testing.T) {
	tests := []struct {
		name       string
		path       string
		payload    string
		want       string
		wantReason string
	}{
		{"top level", "id", `{"id":"evt_1"}`, "evt_1", ""},
		{"whitespace", "id", " \t\r\n{ \"id\" : \"evt_1\" , \"x\":1 }\n", "evt_1", ""},
		{"after other fields", "id", `{"a":1,"b":"x","c":[1,{"id":"inner"}],"d":{"id":"nested"},"id":"top"}`, "top", ""},
		{"nested", "meta.event_id", `{"meta":{"source":"gh","event_id":"e-42"}}`, "e-42", ""},
		{"deeply nested", "a.b.c", `{"a":{"x":{"c":"no"},"b":{"c":"yes"}}}`, "yes", ""},
		{"skip arrays of objects", "id", `{"list":[{"id":"no"},[["id"]],[]],"id":"yes"}`, "yes", ""},
		{"skip literals", "id", `{"t":true,"f":false,"n":null,"e":{},"a":[],"id":"yes"}`, "yes", ""},
		{"duplicate off the path", "m.id", `{"x":1,"x":2,"m":{"y":1,"y":2,"id":"k"},"n":{"id":1,"id":2}}`, "k", ""},
		{"duplicate inside a skipped array", "id", `{"a":[{"id":1,"id":2}],"id":"k"}`, "k", ""},
		{"same name at another depth", "m.id", `{"id":"top","m":{"id":"k","m":1}}`, "k", ""},
		{"escaped quote and backslash", "id", `{"id":"a\"b\\c\/d"}`, `a"b\c/d`, ""},
		{"escaped controls", "id", `{"id":"a\tb\nc\rd\be\ff"}`, "a\tb\nc\rd\be\ff", ""},
		{"unicode escape", "id", `{"id":"caf\u00e9"}`, "café", ""},
		{"surrogate pair", "id", `{"id":"\ud83d\udd11 key"}`, "🔑 key", ""},
		{"raw unicode", "id", `{"id":"ключ-🔑"}`, "ключ-🔑", ""},
		{"escaped member name", "id", `{"\u0069d":"esc"}`, "esc", ""},
		{"member name with escaped quote skipped", "id", `{"i\"d":"no","id":"yes"}`, "yes", ""},
		{"unicode member name", "ключ", `{"ключ":"v"}`, "v", ""},
		{"string with braces skipped", "id", `{"s":"}{][,\"","id":"yes"}`, "yes", ""},
		{"integer", "n", `{"n":12345}`, "12345", ""},
		{"negative float exponent", "n", `{"n":-1.50e+3}`, "-1.50e+3", ""},
		{"zero", "n", `{"n":0}`, "0", ""},
		{"number before brace", "n", `{"n":7}`, "7", ""},
		{"trailing whitespace", "id", "{\"id\":\"x\"} \r\n\t", "x", ""},

		{"absent", "id", `{"other":"x"}`, "", ReasonNoKey},
		{"empty object", "id", `{}`, "", ReasonNoKey},
		{"empty string", "id", `{"id":""}`, "", ReasonNoKey},
		{"parent absent", "meta.id", `{"id":"x"}`, "", ReasonNoKey},
		{"parent not an object", "meta.id", `{"meta":"x"}`, "", ReasonNoKey},
		{"parent is an array", "meta.id", `{"meta":[{"id":"x"}]}`, "", ReasonNoKey},
		{"parent null", "meta.id", `{"meta":null}`, "", ReasonNoKey},
		{"root is an array", "id", `[{"id":"x"}]`, "", ReasonNoKey},
		{"root is a string", "id", `"id"`, "", ReasonNoKey},
		{"nested only", "id", `{"meta":{"id":"x"}}`, "", ReasonNoKey},

		{"empty payload", "id", ``, "", ReasonBadPayload},
		{"whitespace payload", "id", " \n", "", ReasonBadPayload},
		{"not json", "id", `id=5`, "", ReasonBadPayload},
		{"truncated", "id", `{"a":"x`, "", ReasonBadPayload},
		{"truncated before field", "id", `{"a":[1,2`, "", ReasonBadPayload},
		{"missing colon", "id", `{"id" "x"}`, "", ReasonBadPayload},
		{"missing comma", "id", `{"a":1 "id":"x"}`, "", ReasonBadPayload},
		{"trailing comma", "id", `{"a":1,}`, "", ReasonBadPayload},
		{"bad literal skipped", "id", `{"a":tru,"id":"x"}`, "", ReasonBadPayload},
		{"bad number skipped", "id", `{"a":01,"id":"x"}`, "", ReasonBadPayload},
		{"bad escape", "id", `{"id":"\x"}`, "", ReasonBadPayload},
		{"short unicode escape", "id", `{"id":"\u12"}`, "", ReasonBadPayload},
		{"raw control char", "id", "{\"id\":\"a\x01b\"}", "", ReasonBadPayload},
		{"mismatched brackets", "id", `{"a":[1},"id":"x"}`, "", ReasonBadPayload},
		{"unquoted name", "id", `{id:"x"}`, "", ReasonBadPayload},
		{"value then junk", "id", `{"id":"x" junk}`, "", ReasonBadPayload},
		{"number then junk", "n", `{"n":12abc}`, "", ReasonBadPayload},
		{"leading plus", "n", `{"n":+1}`, "", ReasonBadPayload},
		{"bad root", "id", `nope`, "", ReasonBadPayload},
		{"trailing garbage after value", "id", `{"id":"x"} garbage`, "", ReasonBadPayload},
		{"second top-level value", "id", `{"id":"x"}{"id":"y"}`, "", ReasonBadPayload},
		{"trailing after absent key", "id", `{"a":1} x`, "", ReasonBadPayload},
		{"trailing after non-object root", "id", `[1] ]`, "", ReasonBadPayload},
		{"trailing after wrong type", "id", `{"id":null}}`, "", ReasonBadPayload},
		{"malformed after the value", "id", `{"id":"x","a":tru}`, "", ReasonBadPayload},
		{"unclosed after the value", "id", `{"id":"x","a":1`, "", ReasonBadPayload},
		{"unclosed parent after the value", "m.id", `{"m":{"id":"x"}`, "", ReasonBadPayload},
		{"duplicate key member", "id", `{"id":"first","id":"second"}`, "", ReasonBadPayload},
		{"duplicate key member, same value", "id", `{"id":"k","id":"k"}`, "", ReasonBadPayload},
		{"duplicate key member, escaped", "id", `{"id":"first","\u0069d":"second"}`, "", ReasonBadPayload},
		{"duplicate key member of another type", "id", `{"id":"first","id":null}`, "", ReasonBadPayload},
		{"duplicate parent", "m.id", `{"m":{"id":"first"},"m":{"id":"second"}}`, "", ReasonBadPayload},
		{"duplicate parent without the key", "m.id", `{"m":{"x":1},"m":{"id":"second"}}`, "", ReasonBadPayload},
		{"duplicate parent, first not an object", "m.id", `{"m":1,"m":{"id":"second"}}`, "", ReasonBadPayload},
		{"duplicate parent, first empty", "m.id", `{"m":{},"m":{"id":"second"}}`, "", ReasonBadPayload},
		{"duplicate key member deep", "a.b.c", `{"a":{"b":{"c":"x","d":[],"c":"y"}}}`, "", ReasonBadPayload},
		{"duplicate middle parent", "a.b.c", `{"a":{"b":{"c":"x"},"b":{"c":"y"}}}`, "", ReasonBadPayload},
		{"duplicate after wrong type", "id", `{"id":{"a":1},"id":"k"}`, "", ReasonBadPayload},

		{"object", "id", `{"id":{"a":1}}`, "", ReasonBadKeyType},
		{"array", "id", `{"id":["a"]}`, "", ReasonBadKeyType},
		{"true", "id", `{"id":true}`, "", ReasonBadKeyType},
		{"false", "id", `{"id":false}`, "", ReasonBadKeyType},
		{"null", "id", `{"id":null}`, "", ReasonBadKeyType},

		{"invalid utf-8", "id", "{\"id\":\"a\xffb\"}", "", ReasonBadKey},
		{"invalid utf-8 with escapes", "id", "{\"id\":\"\\n\xff\"}", "", ReasonBadKey},
		{"lone high surrogate", "id", `{"id":"\ud83d"}`, "", ReasonBadKey},
		{"lone low surrogate", "id", `{"id":"\udd11"}`, "", ReasonBadKey},
		{"high surrogate then letter", "id", `{"id":"\ud83d\u0041"}`, "", ReasonBadKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := mustExtractor(t, FieldSpec{Source: SourceJSON, JSONPath: tt.path})
			got, err := e.Extract("s", nil, []byte(tt.payload))
			checkResult(t, got, err, tt.want, tt.wantReason)
		})
	}
}

func TestExtractJSONDuplicateDetail(t *testing.T) {
	tests := []struct {
		path, payload, want string
	}{
		{"id", `{"id":"first","id":"second"}`, `duplicate member "id" on the path "id"`},
		{"meta.id", `{"meta":{"id":"a"},"other":1,"meta":{"id":"b"}}`, `duplicate member "meta" on the path "meta.id"`},
		{"meta.id", `{"meta":{"id":"a","\u0069d":"b"}}`, `duplicate member "id" on the path "meta.id"`},
		{"id", `{"id":"x"} {}`, "data after the top-level value"},
	}
	for _, tt := range tests {
		e := mustExtractor(t, FieldSpec{Source: SourceJSON, JSONPath: tt.path})
		_, err := e.Extract("s", nil, []byte(tt.payload))
		var kerr *Error
		if !errors.As(err, &kerr) || kerr.Reason != ReasonBadPayload || !strings.Contains(kerr.Detail, tt.want) {
			t.Errorf("Extract(%s) at %q: %v; want %s with %q in the detail", tt.payload, tt.path, err, ReasonBadPayload, tt.want)
		}
	}
}

func TestExtractJSONDeepNestingSkipped(t *testing.T) {
	deep := strings.Repeat("[", 500) + strings.Repeat("]", 500)
	e := mustExtractor(t, FieldSpec{Source: SourceJSON, JSONPath: "id"})
	got, err := e.Extract("s", nil, []byte(`{"deep":`+deep+`,"id":"x"}`))
	checkResult(t, got, err, "x", "")
	_, err = e.Extract("s", nil, []byte(`{"deep":`+deep[:700]+`,"id":"x"}`))
	if ReasonOf(err) != ReasonBadPayload {
		t.Fatalf("unbalanced deep nesting: %v, want %s", err, ReasonBadPayload)
	}
}

func TestAppendExtract(t *testing.T) {
	e := mustExtractor(t, FieldSpec{Source: SourceJSON, JSONPath: "id"})
	dst := []byte("prefix:")
	got, err := e.AppendExtract(dst, "s", nil, []byte(`{"id":"a\u00e9"}`))
	checkResult(t, got, err, "prefix:aé", "")
	got, err = e.AppendExtract(dst, "s", nil, []byte(`{"id":null}`))
	if ReasonOf(err) != ReasonBadKeyType || string(got) != "prefix:" {
		t.Fatalf("got %q, %v; want dst unchanged and %s", got, err, ReasonBadKeyType)
	}
}

func TestKeyFunc(t *testing.T) {
	hdrKey := FieldSpec{Source: SourceHeader, Header: "Nats-Msg-Id"}
	jsonID := FieldSpec{Source: SourceJSON, JSONPath: "id"}
	srcHdr := FieldSpec{Source: SourceHeader, Header: "Webhook-Source"}
	tests := []struct {
		name       string
		cfg        KeyConfig
		subject    string
		hdr        nats.Header
		payload    string
		want       string
		wantReason string
	}{
		{"default header", DefaultKeyConfig(), "s", nats.Header{"Nats-Msg-Id": {"m1"}}, "", "m1", ""},
		{"scoped", KeyConfig{Field: jsonID, Scope: srcHdr}, "s", nats.Header{"Webhook-Source": {"github"}}, `{"id":"evt_1"}`, "github:evt_1", ""},
		{"key may contain colons", KeyConfig{Field: jsonID, Scope: srcHdr}, "s", nats.Header{"Webhook-Source": {"gh"}}, `{"id":"a:b"}`, "gh:a:b", ""},
		{"scope from subject", KeyConfig{Field: hdrKey, Scope: FieldSpec{Source: SourceSubject, SubjectToken: 2}}, "events.tenant7.x", nats.Header{"Nats-Msg-Id": {"m"}}, "", "tenant7:m", ""},
		{"numeric scope", KeyConfig{Field: hdrKey, Scope: FieldSpec{Source: SourceJSON, JSONPath: "tenant"}}, "s", nats.Header{"Nats-Msg-Id": {"m"}}, `{"tenant":42}`, "42:m", ""},
		{"escaped key", KeyConfig{Field: jsonID}, "s", nil, `{"id":"caf\u00e9"}`, "café", ""},
		{"exactly max length", KeyConfig{Field: hdrKey, MaxLength: 5}, "s", nats.Header{"Nats-Msg-Id": {"12345"}}, "", "12345", ""},
		{"scoped exactly max length", KeyConfig{Field: jsonID, Scope: srcHdr, MaxLength: 5}, "s", nats.Header{"Webhook-Source": {"ab"}}, `{"id":"cd"}`, "ab:cd", ""},

		{"no key", DefaultKeyConfig(), "s", nil, "", "", ReasonNoKey},
		{"no key beats no scope", KeyConfig{Field: jsonID, Scope: srcHdr}, "s", nil, `{}`, "", ReasonNoKey},
		{"bad payload", KeyConfig{Field: jsonID}, "s", nil, `{`, "", ReasonBadPayload},
		{"bad key type", KeyConfig{Field: jsonID}, "s", nil, `{"id":[1]}`, "", ReasonBadKeyType},
		{"no scope", KeyConfig{Field: jsonID, Scope: srcHdr}, "s", nil, `{"id":"x"}`, "", ReasonNoScope},
		{"empty scope", KeyConfig{Field: jsonID, Scope: srcHdr}, "s", nats.Header{"Webhook-Source": {""}}, `{"id":"x"}`, "", ReasonNoScope},
		{"scope with colon", KeyConfig{Field: jsonID, Scope: srcHdr}, "s", nats.Header{"Webhook-Source": {"a:b"}}, `{"id":"x"}`, "", ReasonBadScope},
		{"scope is an object", KeyConfig{Field: hdrKey, Scope: FieldSpec{Source: SourceJSON, JSONPath: "tenant"}}, "s", nats.Header{"Nats-Msg-Id": {"m"}}, `{"tenant":{}}`, "", ReasonBadScope},
		{"too long", KeyConfig{Field: hdrKey, MaxLength: 5}, "s", nats.Header{"Nats-Msg-Id": {"123456"}}, "", "", ReasonKeyTooLong},
		{"too long with scope", KeyConfig{Field: jsonID, Scope: srcHdr, MaxLength: 5}, "s", nats.Header{"Webhook-Source": {"ab"}}, `{"id":"cde"}`, "", ReasonKeyTooLong},
		{"too long after unescaping", KeyConfig{Field: jsonID, MaxLength: 3}, "s", nil, `{"id":"\u00e9\u00e9"}`, "", ReasonKeyTooLong},
		{"escapes shrink under the limit", KeyConfig{Field: jsonID, MaxLength: 4}, "s", nil, `{"id":"\u00e9\u00e9"}`, "éé", ""},
		{"default limit 256", KeyConfig{Field: hdrKey}, "s", nats.Header{"Nats-Msg-Id": {strings.Repeat("k", 257)}}, "", "", ReasonKeyTooLong},
		{"space", KeyConfig{Field: hdrKey}, "s", nats.Header{"Nats-Msg-Id": {"a b"}}, "", "", ReasonBadKey},
		{"tab from json", KeyConfig{Field: jsonID}, "s", nil, `{"id":"a\tb"}`, "", ReasonBadKey},
		{"newline from json", KeyConfig{Field: jsonID}, "s", nil, `{"id":"a\nb"}`, "", ReasonBadKey},
		{"nul", KeyConfig{Field: jsonID}, "s", nil, `{"id":"a\u0000"}`, "", ReasonBadKey},
		{"del", KeyConfig{Field: hdrKey}, "s", nats.Header{"Nats-Msg-Id": {"a\x7f"}}, "", "", ReasonBadKey},
		{"no-break space", KeyConfig{Field: jsonID}, "s", nil, `{"id":"a\u00a0b"}`, "", ReasonBadKey},
		{"c1 control", KeyConfig{Field: jsonID}, "s", nil, `{"id":"a\u0085b"}`, "", ReasonBadKey},
		{"invalid utf-8 header", KeyConfig{Field: hdrKey}, "s", nats.Header{"Nats-Msg-Id": {"a\xff"}}, "", "", ReasonBadKey},
		{"space in scope", KeyConfig{Field: jsonID, Scope: srcHdr}, "s", nats.Header{"Webhook-Source": {"git hub"}}, `{"id":"x"}`, "", ReasonBadKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kf, err := NewKeyFunc(tt.cfg)
			if err != nil {
				t.Fatalf("NewKeyFunc: %v", err)
			}
			got, err := kf.Key(tt.subject, tt.hdr, []byte(tt.payload))
			checkResult(t, got, err, tt.want, tt.wantReason)
		})
	}
}

func TestErrorIs(t *testing.T) {
	kf, err := NewKeyFunc(DefaultKeyConfig())
	if err != nil {
		t.Fatal(err)
	}
	_, err = kf.Key("s", nil, nil)
	if !errors.Is(err, &Error{Reason: ReasonNoKey}) {
		t.Fatalf("errors.Is(%v, no_key) = false", err)
	}
	if errors.Is(err, &Error{Reason: ReasonBadKey}) {
		t.Fatalf("errors.Is(%v, bad_key) = true", err)
	}
	if got := err.Error(); !strings.HasPrefix(got, "keys: no_key: ") || !strings.Contains(got, "Nats-Msg-Id") {
		t.Fatalf("Error() = %q", got)
	}
	if ReasonOf(errors.New("other")) != "" {
		t.Fatal("ReasonOf(non-keys error) != \"\"")
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name      string
		cfg       KeyConfig
		wantField []string // substrings the error must contain; nil = valid
	}{
		{"default", DefaultKeyConfig(), nil},
		{"json with scope", KeyConfig{Field: FieldSpec{Source: SourceJSON, JSONPath: "meta.id"}, Scope: FieldSpec{Source: SourceSubject, SubjectToken: -1}}, nil},
		{"no source", KeyConfig{}, []string{"key.source: empty"}},
		{"unknown source", KeyConfig{Field: FieldSpec{Source: "body"}}, []string{`key.source: "body", want header, json or subject`}},
		{"header empty", KeyConfig{Field: FieldSpec{Source: SourceHeader}}, []string{`key.header: "": empty`}},
		{"header with colon", KeyConfig{Field: FieldSpec{Source: SourceHeader, Header: "a:b"}}, []string{`key.header: "a:b"`}},
		{"header with space", KeyConfig{Field: FieldSpec{Source: SourceHeader, Header: "a b"}}, []string{`key.header: "a b"`}},
		{"json path empty", KeyConfig{Field: FieldSpec{Source: SourceJSON}}, []string{`key.json_path: "": empty`}},
		{"json path empty segment", KeyConfig{Field: FieldSpec{Source: SourceJSON, JSONPath: "a..b"}}, []string{`key.json_path: "a..b": empty segment`}},
		{"json path trailing dot", KeyConfig{Field: FieldSpec{Source: SourceJSON, JSONPath: "a."}}, []string{`key.json_path: "a.": empty segment`}},
		{"json path invalid utf-8", KeyConfig{Field: FieldSpec{Source: SourceJSON, JSONPath: "a\xff"}}, []string{`key.json_path`, "UTF-8"}},
		{"json path too deep", KeyConfig{Field: FieldSpec{Source: SourceJSON, JSONPath: strings.Repeat("a.", 40) + "a"}}, []string{`key.json_path`, "41 segments"}},
		{"subject token zero", KeyConfig{Field: FieldSpec{Source: SourceSubject}}, []string{"key.subject_token: 0"}},
		{"subject token too large", KeyConfig{Field: FieldSpec{Source: SourceSubject, SubjectToken: 1000}}, []string{"key.subject_token: 1000"}},
		{"stray json path", KeyConfig{Field: FieldSpec{Source: SourceHeader, Header: "X", JSONPath: "id"}}, []string{`key.json_path: "id" set, but key.source is header`}},
		{"stray header", KeyConfig{Field: FieldSpec{Source: SourceSubject, SubjectToken: 1, Header: "X"}}, []string{`key.header: "X" set, but key.source is subject`}},
		{"stray token", KeyConfig{Field: FieldSpec{Source: SourceJSON, JSONPath: "id", SubjectToken: 2}}, []string{`key.subject_token: 2 set, but key.source is json`}},
		{"scope without source", KeyConfig{Field: DefaultKeyConfig().Field, Scope: FieldSpec{Header: "X"}}, []string{`key.scope.header: "X" set, but key.scope.source is empty`}},
		{"bad scope", KeyConfig{Field: DefaultKeyConfig().Field, Scope: FieldSpec{Source: SourceJSON, JSONPath: ".x"}}, []string{`key.scope.json_path: ".x"`}},
		{"negative max length", KeyConfig{Field: DefaultKeyConfig().Field, MaxLength: -1}, []string{"key.max_length: -1"}},
		{"huge max length", KeyConfig{Field: DefaultKeyConfig().Field, MaxLength: 5000}, []string{"key.max_length: 5000"}},
		{"all errors reported", KeyConfig{Field: FieldSpec{Source: SourceJSON}, Scope: FieldSpec{Source: "x"}, MaxLength: -5},
			[]string{"key.json_path", "key.scope.source", "key.max_length"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate("key")
			_, nerr := NewKeyFunc(tt.cfg)
			if tt.wantField == nil {
				if err != nil || nerr != nil {
					t.Fatalf("Validate: %v; NewKeyFunc: %v; want valid", err, nerr)
				}
				return
			}
			if err == nil || nerr == nil {
				t.Fatalf("Validate: %v; NewKeyFunc: %v; want errors", err, nerr)
			}
			if !errors.Is(err, ErrBadSpec) || !errors.Is(nerr, ErrBadSpec) {
				t.Fatalf("errors do not wrap ErrBadSpec: %v / %v", err, nerr)
			}
			for _, w := range tt.wantField {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestNewExtractorRejectsUnused(t *testing.T) {
	if _, err := NewExtractor(FieldSpec{}); !errors.Is(err, ErrBadSpec) {
		t.Fatalf("NewExtractor(unused) = %v, want ErrBadSpec", err)
	}
	if (FieldSpec{}).Enabled() || !DefaultKeyConfig().Field.Enabled() {
		t.Fatal("Enabled is wrong")
	}
}

func TestKeyConfigYAML(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		want    KeyConfig
		wantErr string
	}{
		{"empty keeps default", `{}`, DefaultKeyConfig(), ""},
		{"max length only keeps field", `max_length: 64`, KeyConfig{Field: DefaultKeyConfig().Field, MaxLength: 64}, ""},
		{"other header", `{source: header, header: X-Id}`, KeyConfig{Field: FieldSpec{Source: SourceHeader, Header: "X-Id"}, MaxLength: 256}, ""},
		{"json replaces the whole field", "source: json\njson_path: id\nscope:\n  source: header\n  header: Webhook-Source\n",
			KeyConfig{Field: FieldSpec{Source: SourceJSON, JSONPath: "id"}, Scope: FieldSpec{Source: SourceHeader, Header: "Webhook-Source"}, MaxLength: 256}, ""},
		{"path without source drops default source", `json_path: id`, KeyConfig{Field: FieldSpec{JSONPath: "id"}, MaxLength: 256}, ""},
		{"subject", `{source: subject, subject_token: -1}`, KeyConfig{Field: FieldSpec{Source: SourceSubject, SubjectToken: -1}, MaxLength: 256}, ""},
		{"unknown field", `{source: header, header: X, jsonpath: id}`, KeyConfig{}, "field jsonpath not found"},
		{"unknown scope field", "scope: {source: header, hdr: X}", KeyConfig{}, "field hdr not found"},
		{"version keeps the key field", "version: {source: json, json_path: meta.v}",
			KeyConfig{Field: DefaultKeyConfig().Field, Version: FieldSpec{Source: SourceJSON, JSONPath: "meta.v"}, MaxLength: 256}, ""},
		{"unknown version field", "version: {source: header, hdr: X}", KeyConfig{}, "field hdr not found"},
		{"not a mapping", `[1]`, KeyConfig{}, "want a mapping"},
		{"bad type", `max_length: lots`, KeyConfig{}, "cannot unmarshal"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := DefaultKeyConfig()
			err := yaml.Unmarshal([]byte(tt.yaml), &got)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
	// Round trip through Marshal.
	in := KeyConfig{Field: FieldSpec{Source: SourceJSON, JSONPath: "id"}, Scope: FieldSpec{Source: SourceHeader, Header: "S"}, MaxLength: 100}
	b, err := yaml.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	out := DefaultKeyConfig()
	if err := yaml.Unmarshal(b, &out); err != nil || out != in {
		t.Fatalf("round trip: %+v, %v; want %+v\n%s", out, err, in, b)
	}
}

func TestStrings(t *testing.T) {
	cfg := KeyConfig{Field: FieldSpec{Source: SourceJSON, JSONPath: "id"}, Scope: FieldSpec{Source: SourceHeader, Header: "Webhook-Source"}}
	if got, want := cfg.String(), `json "id" scoped by header "Webhook-Source", at most 256 bytes`; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
	if got, want := (FieldSpec{Source: SourceSubject, SubjectToken: -1}).String(), "subject token -1"; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
}

func TestNoAllocations(t *testing.T) {
	hdr := nats.Header{"Nats-Msg-Id": {"abc"}}
	payload := []byte(`{"a":[1,2,{"b":"c"}],"meta":{"x":"y","id":"e\u00e9"}}`)
	dst := make([]byte, 0, 64)
	cases := []struct {
		name string
		spec FieldSpec
		max  float64
	}{
		{"header", FieldSpec{Source: SourceHeader, Header: "Nats-Msg-Id"}, 0},
		{"header case-insensitive", FieldSpec{Source: SourceHeader, Header: "nats-msg-id"}, 0},
		{"json", FieldSpec{Source: SourceJSON, JSONPath: "meta.id"}, 0},
		{"subject", FieldSpec{Source: SourceSubject, SubjectToken: -2}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := mustExtractor(t, c.spec)
			allocs := testing.AllocsPerRun(100, func() {
				if _, err := e.AppendExtract(dst[:0], "a.b.c", hdr, payload); err != nil {
					t.Fatal(err)
				}
			})
			if allocs > c.max {
				t.Fatalf("AppendExtract allocates %v times per call, want %v", allocs, c.max)
			}
			allocs = testing.AllocsPerRun(100, func() {
				if _, err := e.Extract("a.b.c", hdr, payload); err != nil {
					t.Fatal(err)
				}
			})
			if allocs > 1 {
				t.Fatalf("Extract allocates %v times per call, want 1 (the result)", allocs)
			}
		})
	}
	kf, err := NewKeyFunc(KeyConfig{Field: FieldSpec{Source: SourceJSON, JSONPath: "meta.id"}, Scope: FieldSpec{Source: SourceHeader, Header: "Nats-Msg-Id"}})
	if err != nil {
		t.Fatal(err)
	}
	if allocs := testing.AllocsPerRun(100, func() {
		if _, err := kf.Key("a.b.c", hdr, payload); err != nil {
			t.Fatal(err)
		}
	}); allocs > 1 {
		t.Fatalf("Key allocates %v times per call, want 1 (the result)", allocs)
	}
}
