package keys

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// maxFuzzInput bounds fuzz inputs so that each run stays fast.
const maxFuzzInput = 4 << 10

// FuzzExtractJSON checks the scanner against encoding/json: a payload that
// is not exactly one valid JSON value is bad_payload; a valid one with
// duplicate member names is either answered or refused for a duplicate
// member (never for its syntax); a valid one without duplicates is never
// bad_payload, and where the path resolves the scanner must find the same
// string or number; where the path does not resolve, it must say no_key;
// where it resolves to another type, bad_key_type. It never panics and only
// returns documented reasons.
func FuzzExtractJSON(f *testing.F) {
	f.Add([]byte(`{"id":"evt_1"}`), "id")
	f.Add([]byte(`{"meta":{"event_id":"e\u00e9\ud83d\udd11"}}`), "meta.event_id")
	f.Fuzz(func(t *testing.T, data []byte, path string) {
		if len(data) > maxFuzzInput || len(path) > 256 {
			return
		}
		spec := FieldSpec{Source: SourceJSON, JSONPath: path}
		if spec.Validate("key") != nil {
			return
		}
		e, err := NewExtractor(spec)
		if err != nil {
			t.Fatalf("NewExtractor(%q) after Validate passed: %v", path, err)
		}
		got, gerr := e.Extract("s", nil, data)
		reason := ReasonOf(gerr)
		switch {
		case gerr == nil:
			if len(got) == 0 {
				t.Fatal("empty key without an error")
			}
		case reason == ReasonNoKey, reason == ReasonBadPayload, reason == ReasonBadKeyType, reason == ReasonBadKey:
		default:
			t.Fatalf("unexpected error %v", gerr)
		}

		// The oracle.
		if strings.ContainsRune(path, utf8.RuneError) {
			return // encoding/json turns invalid name bytes into U+FFFD
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var v any
		if dec.Decode(&v) != nil || dec.InputOffset() != int64(len(bytes.TrimRight(data, " \t\r\n"))) {
			// Not one valid JSON value (encoding/json's Decoder stops after
			// the first value; Unmarshal would also refuse trailing data).
			if json.Valid(data) {
				t.Fatalf("decoder and json.Valid disagree on %q", data)
			}
			if reason != ReasonBadPayload {
				t.Fatalf("invalid JSON: got %q, %v; want bad_payload", got, gerr)
			}
			return
		}
		if hasDuplicateNames(data) {
			// A duplicate on the path is bad_payload; one elsewhere changes
			// nothing. Either way, never a syntax complaint.
			if reason == ReasonBadPayload && !strings.Contains(gerr.Error(), "duplicate member") {
				t.Fatalf("valid JSON with duplicates: got %v; want a duplicate member detail or an answer", gerr)
			}
			return
		}
		if reason == ReasonBadPayload {
			t.Fatalf("valid JSON without duplicates: got %v", gerr)
		}
		for _, seg := range strings.Split(path, ".") {
			obj, ok := v.(map[string]any)
			if !ok {
				if reason != ReasonNoKey {
					t.Fatalf("path %q crosses a non-object; got %q, %v; want no_key", path, got, gerr)
				}
				return
			}
			if v, ok = obj[seg]; !ok {
				if reason != ReasonNoKey {
					t.Fatalf("path %q absent; got %q, %v; want no_key", path, got, gerr)
				}
				return
			}
		}
		switch want := v.(type) {
		case string:
			switch {
			case want == "":
				if reason != ReasonNoKey {
					t.Fatalf("empty string: got %q, %v; want no_key", got, gerr)
				}
			case reason == ReasonBadKey:
				// Refused for invalid UTF-8, which encoding/json replaced.
				if !strings.ContainsRune(want, utf8.RuneError) {
					t.Fatalf("bad_key for %q, which has no replaced bytes: %v", want, gerr)
				}
			case gerr != nil || string(got) != want:
				t.Fatalf("got %q, %v; encoding/json says %q", got, gerr, want)
			}
		case json.Number:
			if gerr != nil || string(got) != string(want) {
				t.Fatalf("got %q, %v; encoding/json says number %s", got, gerr, want)
			}
		default:
			if reason != ReasonBadKeyType {
				t.Fatalf("value %T: got %q, %v; want bad_key_type", want, got, gerr)
			}
		}
	})
}

// hasDuplicateNames reports whether any object in the first JSON value of
// data names a member twice (after unescaping), or whether data cannot be
// tokenized.
func hasDuplicateNames(data []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	type frame struct {
		object   bool
		names    map[string]bool
		wantName bool
	}
	var stack []*frame
	valueDone := func() {
		if n := len(stack); n > 0 && stack[n-1].object {
			stack[n-1].wantName = true
		}
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			return true
		}
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{', '[':
				if n := len(stack); n > 0 && stack[n-1].object {
					stack[n-1].wantName = false
				}
				stack = append(stack, &frame{object: d == '{', names: map[string]bool{}, wantName: d == '{'})
			default:
				stack = stack[:len(stack)-1]
				valueDone()
			}
		} else if s, ok := tok.(string); ok && len(stack) > 0 && stack[len(stack)-1].object && stack[len(stack)-1].wantName {
			top := stack[len(stack)-1]
			if top.names[s] {
				return true
			}
			top.names[s] = true
			top.wantName = false
		} else {
			valueDone()
		}
		if len(stack) == 0 {
			return false
		}
	}
}

func TestHasDuplicateNames(t *testing.T) {
	for in, want := range map[string]bool{
		`{"a":1,"b":{"a":2},"c":[{"a":1},{"a":2}]}`: false,
		`{"a":1,"a":2}`:                     true,
		`{"a":{"x":1,"x":2}}`:               true,
		`{"a":1,"\u0061":2}`:                true,
		`{"a":[1,{"b":1,"b":1}]}`:           true,
		`{"a":"b","b":"a"}`:                 false,
		`{"a":{},"b":[],"c":{"a":{"a":1}}}`: false,
	} {
		if got := hasDuplicateNames([]byte(in)); got != want {
			t.Errorf("hasDuplicateNames(%s) = %v, want %v", in, got, want)
		}
	}
}

// FuzzExtractSubject checks subject token extraction against strings.Split.
func FuzzExtractSubject(f *testing.F) {
	f.Add("events.github.push", 2)
	f.Add("events.github.push", -1)
	f.Fuzz(func(t *testing.T, subject string, token int) {
		if len(subject) > maxFuzzInput {
			return
		}
		spec := FieldSpec{Source: SourceSubject, SubjectToken: token}
		if spec.Validate("key") != nil {
			return
		}
		e, err := NewExtractor(spec)
		if err != nil {
			t.Fatalf("NewExtractor(%d) after Validate passed: %v", token, err)
		}
		got, gerr := e.Extract(subject, nil, nil)
		want := ""
		if subject != "" {
			toks := strings.Split(subject, ".")
			i := token - 1
			if token < 0 {
				i = len(toks) + token
			}
			if i >= 0 && i < len(toks) {
				want = toks[i]
			}
		}
		if want == "" {
			if ReasonOf(gerr) != ReasonNoKey {
				t.Fatalf("Extract(%q, %d) = %q, %v; want no_key", subject, token, got, gerr)
			}
			return
		}
		if gerr != nil || string(got) != want {
			t.Fatalf("Extract(%q, %d) = %q, %v; want %q", subject, token, got, gerr, want)
		}
	})
}
