package config

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Duration is a time.Duration that YAML, environment variables and flags
// write as text: any Go duration ("90s", "1h30m", "250ms") plus a "d" suffix
// for days of 24 hours ("3d", "7d", "1d12h", "1.5d"). A bare "0" is zero;
// other numbers without a unit are refused. It prints back in the same form
// ("3d", "1d12h", "10m").
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

const day = 24 * time.Hour

// ParseDuration parses a Go duration with an optional "d" (24h) unit. Units
// may be mixed ("1d12h30m") and carry fractions ("1.5d", "0.5h"); a leading
// sign applies to the whole value.
func ParseDuration(s string) (Duration, error) {
	bad := func(why string) (Duration, error) {
		return 0, fmt.Errorf("invalid duration %q: %s (want e.g. 90s, 10m, 1h30m, 7d)", s, why)
	}
	rest := s
	neg := false
	if rest != "" && (rest[0] == '-' || rest[0] == '+') {
		neg = rest[0] == '-'
		rest = rest[1:]
	}
	if rest == "" {
		return bad("empty")
	}
	if rest == "0" {
		return 0, nil
	}
	// Sum the components as a magnitude so that the most negative duration
	// survives a round trip.
	var total uint64
	for rest != "" {
		var num, unit string
		num, unit, rest = nextComponent(rest)
		v, why := componentValue(num, unit)
		if why != "" {
			return bad(why)
		}
		total += uint64(v)
		if total > 1<<63 || (!neg && total > math.MaxInt64) {
			return bad("out of range")
		}
	}
	if neg {
		return Duration(-int64(total-1) - 1), nil // -(total) without overflow at 1<<63
	}
	return Duration(total), nil
}

// nextComponent splits the first number-and-unit component ("1.5d", "30m")
// off s, returning the number, the unit and what follows.
func nextComponent(s string) (num, unit, rest string) {
	i := 0
	for i < len(s) && (s[i] == '.' || (s[i] >= '0' && s[i] <= '9')) {
		i++
	}
	j := i
	for j < len(s) && s[j] != '.' && (s[j] < '0' || s[j] > '9') {
		j++
	}
	return s[:i], s[i:j], s[j:]
}

// componentValue is the duration of one component, or why it is invalid:
// "d" counts 24h, any other unit is Go's.
func componentValue(num, unit string) (v time.Duration, why string) {
	if num == "" {
		return 0, "missing number"
	}
	if unit == "" {
		return 0, "missing unit"
	}
	if unit != "d" {
		v, err := time.ParseDuration(num + unit)
		if err != nil {
			return 0, "bad component " + strconv.Quote(num+unit)
		}
		return v, ""
	}
	v, err := time.ParseDuration(num + "h")
	if err != nil {
		return 0, "bad number " + strconv.Quote(num)
	}
	if v > math.MaxInt64/24 {
		return 0, "out of range"
	}
	return v * 24, ""
}

// String formats d for YAML and messages: whole days as "Nd", the rest in Go
// form without trailing zero units, e.g. "3d", "1d12h", "1h10m", "90ms",
// "0s". ParseDuration reads it back to the same value.
func (d Duration) String() string {
	t := time.Duration(d)
	if t == 0 {
		return "0s"
	}
	if t == math.MinInt64 {
		return t.String()
	}
	sign := ""
	if t < 0 {
		sign, t = "-", -t
	}
	var b strings.Builder
	b.WriteString(sign)
	if days := t / day; days > 0 {
		b.WriteString(strconv.FormatInt(int64(days), 10))
		b.WriteByte('d')
		t -= days * day
		if t == 0 {
			return b.String()
		}
	}
	s := t.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	b.WriteString(s)
	return b.String()
}

// MarshalText implements encoding.TextMarshaler (used for JSON) as String.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler as ParseDuration.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// MarshalYAML writes d as its String form.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// UnmarshalYAML reads a scalar with ParseDuration; errors carry the line.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: want a duration such as 10m or 3d, found %s", n.Line, n.ShortTag())}}
	}
	v, err := ParseDuration(n.Value)
	if err != nil {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %v", n.Line, err)}}
	}
	*d = v
	return nil
}

// ByteSize is a number of bytes that YAML, environment variables and flags
// write either as a plain integer (1048576) or with a unit: binary KiB, MiB,
// GiB, TiB, PiB (powers of 1024) or decimal KB, MB, GB, TB, PB (powers of
// 1000), and B. Units are case-insensitive, may follow a space and may carry
// a fraction that comes to whole bytes ("1.5GiB", "0.5KB"). Negative sizes
// are refused. It prints back with the largest unit that divides it exactly
// ("64MiB", "512KB"), or as a plain integer.
type ByteSize int64

var byteUnits = []struct {
	name string
	mult int64
}{
	{"PiB", 1 << 50}, {"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
	{"PB", 1e15}, {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3},
	{"B", 1},
}

// ParseByteSize parses a size such as "1048576", "64MiB", "512KB" or "1.5 GiB".
func ParseByteSize(s string) (ByteSize, error) {
	bad := func(why string) (ByteSize, error) {
		return 0, fmt.Errorf("invalid size %q: %s (want e.g. 1048576, 64MiB, 1GiB, 512KB)", s, why)
	}
	i := 0
	for i < len(s) && (s[i] == '.' || (s[i] >= '0' && s[i] <= '9')) {
		i++
	}
	num, unit := s[:i], strings.TrimLeft(s[i:], " ")
	if num == "" {
		if strings.HasPrefix(s, "-") {
			return bad("negative")
		}
		return bad("missing number")
	}
	if strings.Count(num, ".") > 1 || num[0] == '.' || num[len(num)-1] == '.' {
		return bad("bad number")
	}
	mult := int64(0)
	if unit == "" {
		mult = 1
	}
	for _, u := range byteUnits {
		if strings.EqualFold(unit, u.name) {
			mult = u.mult
		}
	}
	if mult == 0 {
		return bad("unknown unit " + strconv.Quote(unit) + ", want B, KB, MB, GB, TB, PB, KiB, MiB, GiB, TiB or PiB")
	}
	r, ok := new(big.Rat).SetString(num)
	if !ok {
		return bad("bad number")
	}
	r.Mul(r, new(big.Rat).SetInt64(mult))
	if !r.IsInt() {
		return bad("not a whole number of bytes")
	}
	if !r.Num().IsInt64() {
		return bad("out of range")
	}
	return ByteSize(r.Num().Int64()), nil
}

// String formats b with the largest unit that divides it exactly, binary
// units first ("64MiB", "512KB"), else in bytes ("1000001B").
func (b ByteSize) String() string {
	if b == 0 {
		return "0B"
	}
	if b > 0 {
		for _, u := range byteUnits {
			if int64(b)%u.mult == 0 {
				return strconv.FormatInt(int64(b)/u.mult, 10) + u.name
			}
		}
	}
	return strconv.FormatInt(int64(b), 10) + "B"
}

// MarshalText implements encoding.TextMarshaler as String.
func (b ByteSize) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler as ParseByteSize.
func (b *ByteSize) UnmarshalText(t []byte) error {
	v, err := ParseByteSize(string(t))
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// MarshalYAML writes b as its String form.
func (b ByteSize) MarshalYAML() (any, error) { return b.String(), nil }

// UnmarshalYAML reads a scalar with ParseByteSize; errors carry the line.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: want a size such as 64MiB, found %s", n.Line, n.ShortTag())}}
	}
	v, err := ParseByteSize(n.Value)
	if err != nil {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %v", n.Line, err)}}
	}
	*b = v
	return nil
}

// MiB is 1<<20 bytes.
const MiB ByteSize = 1 << 20
