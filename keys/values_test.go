package keys

import (
	"testing"
	"time"
)

func TestParseTime(t *testing.T) {
	tests := []struct {
		in   string
		want time.Time // zero: refused
	}{
		{"2026-01-01T00:00:00Z", time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"2026-01-01T01:00:00.5+01:00", time.Date(2026, 1, 1, 0, 0, 0, 5e8, time.UTC)},
		{"1767225600", time.Unix(1767225600, 0)},
		{"1767225600123", time.UnixMilli(1767225600123)},
		{"99999999999", time.Unix(99999999999, 0)}, // the largest read as seconds
		{"100000000000", time.UnixMilli(100000000000)},
		{"0", time.Unix(0, 0)},
		{"", time.Time{}},
		{"-1", time.Time{}},
		{"1.5", time.Time{}},
		{"yesterday", time.Time{}},
		{"10000-01-01T00:00:00Z", time.Time{}},
		{"9223372036854775807", time.Time{}}, // milliseconds after 9999
		{"99999999999999999999", time.Time{}},
	}
	for _, tt := range tests {
		got, err := ParseTime([]byte(tt.in))
		if tt.want.IsZero() {
			if err == nil {
				t.Errorf("ParseTime(%q) = %v, want an error", tt.in, got)
			}
			continue
		}
		if err != nil || !got.Equal(tt.want) {
			t.Errorf("ParseTime(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestParseValue(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "42": 42, "9223372036854775807": 1<<63 - 1} {
		if got, err := ParseValue([]byte(in)); err != nil || got != want {
			t.Errorf("ParseValue(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1", "+1", " 1", "1e3", "1.0", "9223372036854775808", "abc"} {
		if got, err := ParseValue([]byte(in)); err == nil {
			t.Errorf("ParseValue(%q) = %d, want an error", in, got)
		}
	}
}
