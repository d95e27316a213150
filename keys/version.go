package keys

import (
	"errors"
	"strconv"

	"github.com/nats-io/nats.go"
)

// Reasons of a version (KeyConfig.Version) that cannot be read. They are
// stable, like the key's: dead-letter headers and metrics use them.
const (
	// ReasonNoVersion: a version is configured and the message does not
	// carry it (the same cases as ReasonNoKey, for the version field).
	ReasonNoVersion = "no_version"
	// ReasonBadVersion: the version is not a decimal integer from 0 to
	// 18446744073709551615 (a JSON string of such digits is accepted), or
	// its JSON value is not a string or a number.
	ReasonBadVersion = "bad_version"
)

// MaxVersionDigits is the most decimal digits a version may have: those of
// the largest uint64.
const MaxVersionDigits = 20

// ParseVersion reads a version: 1..MaxVersionDigits decimal digits that
// fit a uint64, nothing else (no sign, no spaces, no fraction or
// exponent). The error says what was wanted; the caller names the field.
func ParseVersion(b []byte) (uint64, error) {
	if len(b) == 0 || len(b) > MaxVersionDigits {
		return 0, errBadVersion
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, errBadVersion
		}
	}
	v, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		return 0, errBadVersion
	}
	return v, nil
}

var errBadVersion = errors.New("want an integer from 0 to 18446744073709551615 in decimal digits")

// Versioner reads the version of a message, for version-wins: of two
// copies of a key, the one with the greater version is the newer. It is
// compiled from a FieldSpec by NewVersioner, holds no per-message state and
// is safe for concurrent use.
type Versioner struct {
	ex *Extractor
}

// NewVersioner compiles spec, a header or a JSON path (a subject token is
// refused: a subject names where an event goes, not its order). Errors wrap
// ErrBadSpec.
func NewVersioner(spec FieldSpec) (*Versioner, error) {
	if err := validVersionSpec(spec, ""); err != nil {
		return nil, err
	}
	ex, err := NewExtractor(spec)
	if err != nil {
		return nil, err
	}
	return &Versioner{ex: ex}, nil
}

// validVersionSpec reports whether spec can name a version: unused, a
// header or a JSON path.
func validVersionSpec(spec FieldSpec, field string) error {
	if spec.Source == SourceSubject {
		return specErr(join(field, "source"), "subject, want header or json (a version is read from a header or a JSON path)")
	}
	return spec.Validate(field)
}

// Version returns the message's version. It fails with an *Error whose
// Reason is ReasonNoVersion (the field is absent or empty),
// ReasonBadVersion (see ParseVersion; also a JSON value that is not a
// string or a number) or, for a JSON payload that cannot be read,
// ReasonBadPayload.
func (v *Versioner) Version(subject string, hdr nats.Header, data []byte) (uint64, error) {
	fv, kerr := v.ex.find(subject, hdr, data)
	if kerr != nil {
		switch kerr.Reason {
		case ReasonNoKey:
			kerr.Reason = ReasonNoVersion
		case ReasonBadKeyType:
			kerr.Reason = ReasonBadVersion
		}
		kerr.Detail = "version: " + kerr.Detail
		return 0, kerr
	}
	raw := fv.raw
	if !fv.isJSON {
		raw = []byte(fv.str) // does not escape: ParseVersion keeps no reference
	}
	if fv.escaped {
		// Digits are never escaped in practice; an escape is read as text.
		var ok bool
		if raw, ok = appendUnescaped(nil, fv.raw); !ok {
			return 0, newError(ReasonBadVersion, "version: json string is not valid UTF-8")
		}
	}
	n, err := ParseVersion(raw)
	if err != nil {
		return 0, newError(ReasonBadVersion, "version %q: %v", truncate(raw), err)
	}
	return n, nil
}

// truncate shortens a malformed value for an error's detail.
func truncate(b []byte) []byte {
	const most = 64
	if len(b) > most {
		return b[:most]
	}
	return b
}

// FormatVersion writes v as ParseVersion reads it.
func FormatVersion(v uint64) string { return strconv.FormatUint(v, 10) }
