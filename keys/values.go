package keys

import (
	"errors"
	"strconv"
	"time"
)

// UnixMillisFrom is the smallest integer event time ParseTime reads as Unix
// milliseconds; smaller ones are Unix seconds (up to the year 5138).
const UnixMillisFrom = 100_000_000_000

// ParseTime reads an extracted event time: RFC 3339 text, or a
// non-negative decimal integer as Unix seconds (below UnixMillisFrom) or
// Unix milliseconds. Times after the year 9999 are refused (sinks cannot
// store them). The error says what was wanted; the caller names the field.
func ParseTime(b []byte) (time.Time, error) {
	var at time.Time
	if n, ok := parseDigits(b); ok {
		if n < UnixMillisFrom {
			at = time.Unix(n, 0)
		} else {
			at = time.UnixMilli(n)
		}
	} else {
		var err error
		if at, err = time.Parse(time.RFC3339Nano, string(b)); err != nil {
			return time.Time{}, errors.New("want RFC 3339 text or Unix seconds or milliseconds")
		}
	}
	if at.UTC().Year() > 9999 {
		return time.Time{}, errors.New("after the year 9999")
	}
	return at, nil
}

// ParseValue reads an extracted value: a decimal integer from 0 to
// math.MaxInt64, digits only (no sign, no spaces).
func ParseValue(b []byte) (int64, error) {
	n, ok := parseDigits(b)
	if !ok {
		return 0, errors.New("want an integer from 0 to 9223372036854775807 in decimal digits")
	}
	return n, nil
}

// parseDigits parses 1..19 decimal digits that fit an int64.
func parseDigits(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 19 {
		return 0, false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	return n, err == nil
}
