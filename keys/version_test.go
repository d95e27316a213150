package keys

import (
	"errors"
	"math"
	"math/big"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
)

func TestVersion(t *testing.T) {
	hdr, err := NewVersioner(FieldSpec{Source: SourceHeader, Header: "Version"})
	if err != nil {
		t.Fatal(err)
	}
	js, err := NewVersioner(FieldSpec{Source: SourceJSON, JSONPath: "meta.v"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		v      *Versioner
		hdr    nats.Header
		data   string
		want   uint64
		reason string
	}{
		{name: "header", v: hdr, hdr: nats.Header{"Version": {"42"}}, want: 42},
		{name: "header zero", v: hdr, hdr: nats.Header{"Version": {"0"}}, want: 0},
		{name: "header max", v: hdr, hdr: nats.Header{"Version": {"18446744073709551615"}}, want: math.MaxUint64},
		{name: "header case", v: hdr, hdr: nats.Header{"version": {"7"}}, want: 7},
		{name: "header absent", v: hdr, hdr: nats.Header{}, reason: ReasonNoVersion},
		{name: "header empty", v: hdr, hdr: nats.Header{"Version": {""}}, reason: ReasonNoVersion},
		{name: "header negative", v: hdr, hdr: nats.Header{"Version": {"-1"}}, reason: ReasonBadVersion},
		{name: "header overflow", v: hdr, hdr: nats.Header{"Version": {"18446744073709551616"}}, reason: ReasonBadVersion},
		{name: "header text", v: hdr, hdr: nats.Header{"Version": {"v2"}}, reason: ReasonBadVersion},
		{name: "header space", v: hdr, hdr: nats.Header{"Version": {" 2"}}, reason: ReasonBadVersion},
		{name: "json number", v: js, data: `{"meta":{"v":1234}}`, want: 1234},
		{name: "json string", v: js, data: `{"meta":{"v":"1234"}}`, want: 1234},
		{name: "json escaped digits", v: js, data: `{"meta":{"v":"\u0031"}}`, want: 1},
		{name: "json fraction", v: js, data: `{"meta":{"v":1.5}}`, reason: ReasonBadVersion},
		{name: "json exponent", v: js, data: `{"meta":{"v":1e3}}`, reason: ReasonBadVersion},
		{name: "json negative", v: js, data: `{"meta":{"v":-3}}`, reason: ReasonBadVersion},
		{name: "json bool", v: js, data: `{"meta":{"v":true}}`, reason: ReasonBadVersion},
		{name: "json object", v: js, data: `{"meta":{"v":{}}}`, reason: ReasonBadVersion},
		{name: "json absent", v: js, data: `{"meta":{}}`, reason: ReasonNoVersion},
		{name: "json broken", v: js, data: `{"meta":`, reason: ReasonBadPayload},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.v.Version("s", tc.hdr, []byte(tc.data))
			if tc.reason != "" {
				if r := ReasonOf(err); r != tc.reason {
					t.Fatalf("Version = %d, %v; want reason %s", got, err, tc.reason)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Version = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

func TestVersionSpec(t *testing.T) {
	if _, err := NewVersioner(FieldSpec{Source: SourceSubject, SubjectToken: 1}); !errors.Is(err, ErrBadSpec) {
		t.Fatalf("NewVersioner(subject) = %v, want ErrBadSpec", err)
	}
	c := DefaultKeyConfig()
	c.Version = FieldSpec{Source: SourceSubject, SubjectToken: 1}
	err := c.Validate("key")
	if !errors.Is(err, ErrBadSpec) || err.Error() != "key.version.source: subject, want header or json (a version is read from a header or a JSON path)" {
		t.Fatalf("Validate = %v", err)
	}
	c.Version = FieldSpec{Source: SourceHeader, Header: "Version"}
	if err := c.Validate("key"); err != nil {
		t.Fatalf("Validate = %v", err)
	}
	if got, want := c.String(), `header "Nats-Msg-Id", at most 256 bytes, version from header "Version"`; got != want {
		t.Fatalf("String = %q, want %q", got, want)
	}
}

// FuzzVersion checks ParseVersion against math/big: it accepts exactly the
// strings of 1..20 decimal digits whose value fits a uint64, reads them to
// that value, and FormatVersion's text reads back to it; through a header,
// Versioner answers the same or says bad_version.
func FuzzVersion(f *testing.F) {
	for _, s := range []string{"0", "42", "007", "18446744073709551615", "18446744073709551616", "-1", "+1", "1e3", " 1", "", "٣"} {
		f.Add(s)
	}
	v, err := NewVersioner(FieldSpec{Source: SourceHeader, Header: "V"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > 256 {
			return
		}
		got, perr := ParseVersion([]byte(s))
		want, ok := new(big.Int).SetString(s, 10)
		digits := len(s) > 0
		for _, c := range []byte(s) {
			digits = digits && c >= '0' && c <= '9'
		}
		ok = ok && digits && len(s) <= MaxVersionDigits && want.IsUint64()
		if ok != (perr == nil) {
			t.Fatalf("ParseVersion(%q) = %d, %v; want accepted %v", s, got, perr, ok)
		}
		if !ok {
			if got != 0 {
				t.Fatalf("ParseVersion(%q) = %d with an error", s, got)
			}
		} else {
			if got != want.Uint64() {
				t.Fatalf("ParseVersion(%q) = %d, want %s", s, got, want)
			}
			back, err := ParseVersion([]byte(FormatVersion(got)))
			if err != nil || back != got {
				t.Fatalf("round trip of %d: %d, %v", got, back, err)
			}
			if strconv.FormatUint(got, 10) != FormatVersion(got) {
				t.Fatalf("FormatVersion(%d) = %q", got, FormatVersion(got))
			}
		}
		hv, herr := v.Version("s", nats.Header{"V": {s}}, nil)
		switch {
		case s == "":
			if ReasonOf(herr) != ReasonNoVersion {
				t.Fatalf("Version(empty) = %d, %v; want no_version", hv, herr)
			}
		case ok:
			if herr != nil || hv != got {
				t.Fatalf("Version(%q) = %d, %v; want %d", s, hv, herr, got)
			}
		default:
			if ReasonOf(herr) != ReasonBadVersion {
				t.Fatalf("Version(%q) = %d, %v; want bad_version", s, hv, herr)
			}
		}
	})
}
