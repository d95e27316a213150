// Package keys extracts the intent key of a NATS message: the value that
// says "this is the same event" across every copy a retry, a redelivery or a
// replay can produce.
//
// A key comes from one of three places, described by a FieldSpec:
//
//   - a header (default Nats-Msg-Id),
//   - a field of a JSON payload, named by a dotted path such as "meta.event_id",
//   - a token of the subject, 1-based, negative counting from the end.
//
// An Extractor is a compiled FieldSpec. A KeyFunc combines a key field with an
// optional scope (a tenant or a source, also a FieldSpec) into the final key
// "scope:key", and checks that the result can be carried as a Nats-Msg-Id
// header value:
//
//	kf, err := keys.NewKeyFunc(keys.KeyConfig{
//		Field: keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "id"},
//		Scope: keys.FieldSpec{Source: keys.SourceHeader, Header: "Webhook-Source"},
//	})
//	key, err := kf.Key(msg.Subject, msg.Header, msg.Data) // "github:evt_123"
//	if err != nil {
//		reason := keys.ReasonOf(err) // "no_key", "bad_payload", ... : dead-letter it
//	}
//
// Every failure is an *Error whose Reason is a stable snake_case word, used
// as a metric label and as a dead-letter header.
//
// Extraction runs once per message, so it is written not to allocate beyond
// the returned key: headers are looked up in place, subjects are scanned in
// place, and JSON payloads are walked by a small scanner that compares member
// names on the path and skips everything else instead of decoding the
// document into maps.
package keys

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
)

// Source names where a field is read from.
type Source string

// The sources a FieldSpec can name.
const (
	// SourceHeader reads a message header.
	SourceHeader Source = "header"
	// SourceJSON reads a field of a JSON object payload.
	SourceJSON Source = "json"
	// SourceSubject reads a token of the message subject.
	SourceSubject Source = "subject"
)

// Defaults used by DefaultKeyConfig and NewKeyFunc.
const (
	// DefaultHeader is the header the key is read from by default.
	DefaultHeader = "Nats-Msg-Id"
	// DefaultMaxLength is the default limit, in bytes, of a final scoped key.
	DefaultMaxLength = 256
	// MaxMaxLength is the largest accepted KeyConfig.MaxLength.
	MaxMaxLength = 4096
	// MaxSubjectToken bounds |FieldSpec.SubjectToken|.
	MaxSubjectToken = 128
	// MaxJSONPathSegments bounds the number of segments of a JSON path.
	MaxJSONPathSegments = 32
)

// Reasons carried by *Error. They are stable: metrics and dead-letter headers
// use them as values.
const (
	// ReasonNoKey: the header is absent or empty, the JSON field is absent or
	// an empty string, a JSON object on the path is missing, or the subject
	// has too few tokens.
	ReasonNoKey = "no_key"
	// ReasonBadPayload: the payload is not valid JSON (including data after
	// the top-level value), or an object on the path names the path's member
	// twice, so that parsers would disagree about which one is the key.
	ReasonBadPayload = "bad_payload"
	// ReasonBadKeyType: the JSON value at the path is an object, an array, a
	// boolean or null.
	ReasonBadKeyType = "bad_key_type"
	// ReasonBadKey: the key is not valid UTF-8 (including a JSON string with
	// an unpaired surrogate escape), or the final key contains whitespace or
	// control characters and so cannot be a header value.
	ReasonBadKey = "bad_key"
	// ReasonNoScope: a scope is configured and the message does not carry it
	// (same cases as ReasonNoKey, for the scope field).
	ReasonNoScope = "no_scope"
	// ReasonBadScope: the scope contains ':' or its JSON value is not a
	// string or a number.
	ReasonBadScope = "bad_scope"
	// ReasonKeyTooLong: the final key is longer than KeyConfig.MaxLength.
	ReasonKeyTooLong = "key_too_long"
)

// Errors about specifications (never returned for messages).
var (
	// ErrBadSpec wraps every error of FieldSpec.Validate and
	// KeyConfig.Validate, and so every error of NewExtractor and NewKeyFunc.
	ErrBadSpec = errors.New("keys: invalid key specification")
)

// Error is why a key could not be taken from a message. It is returned by
// Extractor.Extract and KeyFunc.Key, always as a non-nil *Error.
type Error struct {
	// Reason is one of the Reason* constants: stable, snake_case.
	Reason string
	// Detail is human text naming the field and what was wrong.
	Detail string
}

// Error returns "keys: <reason>: <detail>".
func (e *Error) Error() string { return "keys: " + e.Reason + ": " + e.Detail }

// Is reports whether target is an *Error with the same Reason, so that
// errors.Is(err, &keys.Error{Reason: keys.ReasonNoKey}) works. Detail is
// ignored.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t != nil && t.Reason == e.Reason
}

// ReasonOf returns the Reason of the *Error in err's chain, or "" if there is
// none.
func ReasonOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

func newError(reason, format string, args ...any) *Error {
	return &Error{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// specError is a validation error naming a configuration field. It wraps
// ErrBadSpec.
type specError struct {
	field string
	msg   string
}

func (e *specError) Error() string { return e.field + ": " + e.msg }
func (e *specError) Unwrap() error { return ErrBadSpec }

func specErr(field, format string, args ...any) error {
	return &specError{field: field, msg: fmt.Sprintf(format, args...)}
}

// FieldSpec says where one field of a message is read from. The zero value
// (empty Source) means the field is unused.
type FieldSpec struct {
	// Source is header, json or subject; empty means the field is unused.
	Source Source `yaml:"source"`
	// Header is the header name for SourceHeader. The exact name is tried
	// first; if absent, names are compared case-insensitively and, should
	// several differ only in case, the lexically smallest wins. Of a header
	// with several values, the first is used.
	Header string `yaml:"header,omitempty"`
	// JSONPath is the dotted path for SourceJSON, e.g. "id" or
	// "meta.event_id": each segment names a member of an object (names
	// containing '.' cannot be addressed). The value must be a non-empty
	// string (the key is its unescaped text) or a number (the key is the
	// number as written, e.g. "1.50e3"). When an object holds the same name
	// twice, the first occurrence wins.
	JSONPath string `yaml:"json_path,omitempty"`
	// SubjectToken is the 1-based subject token for SourceSubject; negative
	// counts from the end (-1 is the last token).
	SubjectToken int `yaml:"subject_token,omitempty"`
}

// Enabled reports whether the spec names a source. A false means the field
// is unused (an unset scope).
func (s FieldSpec) Enabled() bool { return s.Source != "" }

// String describes the spec, e.g. `header "Nats-Msg-Id"`, `json "meta.id"`,
// `subject token -1` or "unused".
func (s FieldSpec) String() string {
	switch s.Source {
	case "":
		return "unused"
	case SourceHeader:
		return fmt.Sprintf("header %q", s.Header)
	case SourceJSON:
		return fmt.Sprintf("json %q", s.JSONPath)
	case SourceSubject:
		return fmt.Sprintf("subject token %d", s.SubjectToken)
	}
	return fmt.Sprintf("unknown source %q", string(s.Source))
}

// Validate reports whether s can be compiled. field is the configuration
// path of s used in messages (e.g. "key" or "key.scope"); every error names
// the offending field and value, e.g. `key.json_path: "a..b": empty segment`.
// All problems are reported, joined; each wraps ErrBadSpec. An unused spec
// (empty Source) with no other field set is valid.
func (s FieldSpec) Validate(field string) error {
	var errs []error
	add := func(name, format string, args ...any) {
		errs = append(errs, specErr(join(field, name), format, args...))
	}
	source := join(field, "source")
	// Fields that do not belong to the source are an error: they are almost
	// always a typo or a half-changed configuration.
	stray := func(src string) {
		if s.Header != "" && s.Source != SourceHeader {
			add("header", "%q set, but %s is %s", s.Header, source, src)
		}
		if s.JSONPath != "" && s.Source != SourceJSON {
			add("json_path", "%q set, but %s is %s", s.JSONPath, source, src)
		}
		if s.SubjectToken != 0 && s.Source != SourceSubject {
			add("subject_token", "%d set, but %s is %s", s.SubjectToken, source, src)
		}
	}
	switch s.Source {
	case "":
		stray("empty")
	case SourceHeader:
		stray(string(s.Source))
		if err := validHeaderName(s.Header); err != "" {
			add("header", "%q: %s", s.Header, err)
		}
	case SourceJSON:
		stray(string(s.Source))
		if msg := validJSONPath(s.JSONPath); msg != "" {
			add("json_path", "%q: %s", s.JSONPath, msg)
		}
	case SourceSubject:
		stray(string(s.Source))
		if s.SubjectToken == 0 || s.SubjectToken > MaxSubjectToken || s.SubjectToken < -MaxSubjectToken {
			add("subject_token", "%d, want 1..%d or -%d..-1 (1-based; negative counts from the end)",
				s.SubjectToken, MaxSubjectToken, MaxSubjectToken)
		}
	default:
		add("source", "%q, want header, json or subject", string(s.Source))
	}
	return errors.Join(errs...)
}

// join returns the configuration path field.name, or name when field is "".
func join(field, name string) string {
	if field == "" {
		return name
	}
	return field + "." + name
}

// validHeaderName returns "" when name can be a NATS header name, else why not.
func validHeaderName(name string) string {
	if name == "" {
		return "empty, want a header name"
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c <= ' ' || c >= 0x7f || c == ':' {
			return fmt.Sprintf("byte %d (%q) not allowed in a header name", i, c)
		}
	}
	return ""
}

// validJSONPath returns "" when path is a usable dotted path, else why not.
func validJSONPath(path string) string {
	if path == "" {
		return "empty, want a dotted path such as \"id\" or \"meta.event_id\""
	}
	if !utf8.ValidString(path) {
		return "not valid UTF-8"
	}
	n := strings.Count(path, ".") + 1
	if n > MaxJSONPathSegments {
		return fmt.Sprintf("%d segments, want at most %d", n, MaxJSONPathSegments)
	}
	for _, seg := range strings.Split(path, ".") {
		if seg == "" {
			return "empty segment"
		}
	}
	return ""
}

// Extractor reads one field of a message. It is compiled from a FieldSpec by
// NewExtractor, holds no per-message state and is safe for concurrent use.
type Extractor struct {
	spec   FieldSpec
	header string   // SourceHeader
	path   []string // SourceJSON, split on '.'
	token  int      // SourceSubject
}

// NewExtractor compiles spec. An invalid or unused spec is an error wrapping
// ErrBadSpec.
func NewExtractor(spec FieldSpec) (*Extractor, error) {
	if !spec.Enabled() {
		return nil, specErr("source", "empty, want header, json or subject")
	}
	if err := spec.Validate(""); err != nil {
		return nil, err
	}
	e := &Extractor{spec: spec}
	switch spec.Source {
	case SourceHeader:
		e.header = spec.Header
	case SourceJSON:
		e.path = strings.Split(spec.JSONPath, ".")
	case SourceSubject:
		e.token = spec.SubjectToken
	}
	return e, nil
}

// Spec returns the spec e was compiled from.
func (e *Extractor) Spec() FieldSpec { return e.spec }

// Extract returns the field's value as a new slice. It fails with an *Error
// whose Reason is ReasonNoKey, ReasonBadPayload, ReasonBadKeyType or (for a
// JSON string that is not valid UTF-8) ReasonBadKey. A JSON payload is read
// to its end: malformed JSON anywhere, data after the top-level value or a
// member named twice on the path is ReasonBadPayload. The value is not
// checked for whitespace or length; KeyFunc does that for the final key.
func (e *Extractor) Extract(subject string, hdr nats.Header, data []byte) ([]byte, error) {
	v, err := e.find(subject, hdr, data)
	if err != nil {
		return nil, err
	}
	out, err := v.appendTo(make([]byte, 0, v.size()))
	if err != nil {
		return nil, err
	}
	return out, nil
}

// AppendExtract is Extract appending to dst: it allocates nothing when dst
// has room for the value. On error dst is returned unchanged.
func (e *Extractor) AppendExtract(dst []byte, subject string, hdr nats.Header, data []byte) ([]byte, error) {
	v, err := e.find(subject, hdr, data)
	if err != nil {
		return dst, err
	}
	out, err := v.appendTo(dst)
	if err != nil {
		return dst, err
	}
	return out, nil
}

// view is a found value, not yet copied.
type view struct {
	str     string // header value or subject token, when raw == nil
	raw     []byte // JSON string content (between the quotes) or number literal
	isJSON  bool
	escaped bool // raw is a JSON string containing backslash escapes
	jsonStr bool // raw is a JSON string (not a number)
}

// size is an upper bound of the value's length once copied.
func (v *view) size() int {
	if v.isJSON {
		return len(v.raw)
	}
	return len(v.str)
}

// appendTo copies the value to dst, unescaping a JSON string. A JSON string
// that is not valid UTF-8 fails with ReasonBadKey.
func (v *view) appendTo(dst []byte) ([]byte, *Error) {
	if !v.isJSON {
		return append(dst, v.str...), nil
	}
	if !v.jsonStr {
		return append(dst, v.raw...), nil
	}
	if !v.escaped {
		if !utf8.Valid(v.raw) {
			return dst, newError(ReasonBadKey, "json string is not valid UTF-8")
		}
		return append(dst, v.raw...), nil
	}
	out, ok := appendUnescaped(dst, v.raw)
	if !ok {
		return dst, newError(ReasonBadKey, "json string is not valid UTF-8 (invalid bytes or an unpaired surrogate escape)")
	}
	return out, nil
}

// find locates the field without copying it.
func (e *Extractor) find(subject string, hdr nats.Header, data []byte) (view, *Error) {
	switch e.spec.Source {
	case SourceHeader:
		return e.findHeader(hdr)
	case SourceJSON:
		return findJSON(data, e.path, e.spec.JSONPath)
	default:
		return e.findSubject(subject)
	}
}

func (e *Extractor) findHeader(hdr nats.Header) (view, *Error) {
	vals, ok := hdr[e.header]
	if !ok {
		// nats.Header lookups are case-sensitive; senders do not always
		// agree on case, so fall back to a case-insensitive scan. Ranging
		// over a map does not allocate. The smallest matching name wins so
		// that the answer does not depend on map order.
		var best string
		for k, v := range hdr {
			if len(k) == len(e.header) && strings.EqualFold(k, e.header) && (!ok || k < best) {
				best, vals, ok = k, v, true
			}
		}
	}
	if !ok {
		return view{}, newError(ReasonNoKey, "header %q absent", e.header)
	}
	if len(vals) == 0 || vals[0] == "" {
		return view{}, newError(ReasonNoKey, "header %q empty", e.header)
	}
	return view{str: vals[0]}, nil
}

func (e *Extractor) findSubject(subject string) (view, *Error) {
	tok, ok := subjectToken(subject, e.token)
	if !ok {
		return view{}, newError(ReasonNoKey, "subject %q has no token %d", subject, e.token)
	}
	if tok == "" {
		return view{}, newError(ReasonNoKey, "subject %q has an empty token %d", subject, e.token)
	}
	return view{str: tok}, nil
}

// subjectToken returns token idx (1-based, negative from the end) of subject
// without allocating.
func subjectToken(subject string, idx int) (string, bool) {
	if subject == "" || idx == 0 {
		return "", false
	}
	if idx > 0 {
		start := 0
		for n := 1; ; n++ {
			end := strings.IndexByte(subject[start:], '.')
			if n == idx {
				if end < 0 {
					return subject[start:], true
				}
				return subject[start : start+end], true
			}
			if end < 0 {
				return "", false
			}
			start += end + 1
		}
	}
	end := len(subject)
	for n := -1; ; n-- {
		start := strings.LastIndexByte(subject[:end], '.') + 1
		if n == idx {
			return subject[start:end], true
		}
		if start == 0 {
			return "", false
		}
		end = start - 1
	}
}

// KeyConfig says how the final key of a message is built.
type KeyConfig struct {
	// Field is where the key is read from. Default: header Nats-Msg-Id.
	Field FieldSpec `yaml:",inline"`
	// Scope, when enabled, is read too and prefixed: the final key is
	// scope + ":" + key, so equal keys from different tenants or sources
	// stay apart. A scope must not contain ':'. Default: unused.
	Scope FieldSpec `yaml:"scope"`
	// MaxLength is the longest final key accepted, in bytes; 0 means
	// DefaultMaxLength (256). At most MaxMaxLength.
	MaxLength int `yaml:"max_length"`
	// Version, when enabled, is read from a header or a JSON path: an
	// integer that orders the copies of a key (version-wins, see
	// Versioner). It is not part of the key. Default: unused.
	Version FieldSpec `yaml:"version"`
}

// DefaultKeyConfig returns the default: the key is the Nats-Msg-Id header,
// no scope, at most 256 bytes.
func DefaultKeyConfig() KeyConfig {
	return KeyConfig{
		Field:     FieldSpec{Source: SourceHeader, Header: DefaultHeader},
		MaxLength: DefaultMaxLength,
	}
}

// Validate reports whether c can build a KeyFunc. field is the configuration
// path of c used in messages (e.g. "key"); all problems are reported,
// joined, each naming its field and wrapping ErrBadSpec.
func (c KeyConfig) Validate(field string) error {
	var errs []error
	if !c.Field.Enabled() {
		errs = append(errs, specErr(join(field, "source"), "empty, want header, json or subject"))
	}
	errs = append(errs, c.Field.Validate(field), c.Scope.Validate(join(field, "scope")), validVersionSpec(c.Version, join(field, "version")))
	if c.MaxLength < 0 || c.MaxLength > MaxMaxLength {
		errs = append(errs, specErr(join(field, "max_length"), "%d, want 1..%d (0 = default %d)", c.MaxLength, MaxMaxLength, DefaultMaxLength))
	}
	return errors.Join(errs...)
}

// String describes c, e.g. `json "id" scoped by header "Webhook-Source", at
// most 256 bytes`.
func (c KeyConfig) String() string {
	max := c.MaxLength
	if max == 0 {
		max = DefaultMaxLength
	}
	s := fmt.Sprintf("%s, at most %d bytes", c.Field, max)
	if c.Scope.Enabled() {
		s = fmt.Sprintf("%s scoped by %s, at most %d bytes", c.Field, c.Scope, max)
	}
	if c.Version.Enabled() {
		s += fmt.Sprintf(", version from %s", c.Version)
	}
	return s
}

// KeyFunc builds the final key of a message from a KeyConfig. It is safe for
// concurrent use.
type KeyFunc struct {
	cfg   KeyConfig
	field *Extractor
	scope *Extractor // nil when no scope
	max   int
}

// NewKeyFunc validates cfg and compiles it. Errors wrap ErrBadSpec.
func NewKeyFunc(cfg KeyConfig) (*KeyFunc, error) {
	if err := cfg.Validate("key"); err != nil {
		return nil, err
	}
	k := &KeyFunc{cfg: cfg, max: cfg.MaxLength}
	if k.max == 0 {
		k.max = DefaultMaxLength
	}
	var err error
	if k.field, err = NewExtractor(cfg.Field); err != nil {
		return nil, err
	}
	if cfg.Scope.Enabled() {
		if k.scope, err = NewExtractor(cfg.Scope); err != nil {
			return nil, err
		}
	}
	return k, nil
}

// Config returns the configuration k was built from.
func (k *KeyFunc) Config() KeyConfig { return k.cfg }

// Key returns the final key of a message: the key field, or scope + ":" +
// key when a scope is configured; it allocates only the returned slice. An
// error is an *Error whose Reason names the rule broken; the key is checked
// before the scope, so a message missing both fails with ReasonNoKey.
func (k *KeyFunc) Key(subject string, hdr nats.Header, data []byte) ([]byte, error) {
	fv, err := k.field.find(subject, hdr, data)
	if err != nil {
		return nil, err
	}
	var sv view
	n := fv.size()
	if k.scope != nil {
		if sv, err = k.scope.find(subject, hdr, data); err != nil {
			switch err.Reason {
			case ReasonNoKey:
				err.Reason = ReasonNoScope
			case ReasonBadKeyType:
				err.Reason = ReasonBadScope
			}
			err.Detail = "scope: " + err.Detail
			return nil, err
		}
		n += sv.size() + 1
	}
	// Sizes are upper bounds (escapes only shrink), exact without escapes:
	// refuse an oversized key before copying it.
	if n > k.max && !fv.escaped && !sv.escaped {
		return nil, newError(ReasonKeyTooLong, "key is %d bytes, max %d", n, k.max)
	}
	out := make([]byte, 0, n)
	if k.scope != nil {
		if out, err = sv.appendTo(out); err != nil {
			err.Detail = "scope: " + err.Detail
			return nil, err
		}
		if bytes.IndexByte(out, ':') >= 0 {
			return nil, newError(ReasonBadScope, "scope %q contains ':'", out)
		}
		out = append(out, ':')
	}
	if out, err = fv.appendTo(out); err != nil {
		return nil, err
	}
	if len(out) > k.max {
		return nil, newError(ReasonKeyTooLong, "key is %d bytes, max %d", len(out), k.max)
	}
	if i, ok := validKey(out); !ok {
		return nil, newError(ReasonBadKey, "key %q has whitespace, a control character or invalid UTF-8 at byte %d", out, i)
	}
	return out, nil
}

// validKey reports whether key is valid UTF-8 without whitespace or control
// characters, and if not, the offset of the first bad byte.
func validKey(key []byte) (int, bool) {
	for i := 0; i < len(key); {
		c := key[i]
		if c < utf8.RuneSelf {
			if c <= ' ' || c == 0x7f {
				return i, false
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(key[i:])
		if (r == utf8.RuneError && size == 1) || unicode.IsSpace(r) || unicode.IsControl(r) {
			return i, false
		}
		i += size
	}
	return 0, true
}
