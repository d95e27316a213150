package keys

import (
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// This file holds the JSON path scanner. It walks the payload once, from the
// start to the end, comparing member names of the objects on the path and
// skipping every other value: nothing is decoded into maps and nothing is
// allocated except, rarely, a nesting stack deeper than 64 levels while
// skipping or an escaped member name longer than 64 bytes.
//
// What it reads it checks against the JSON grammar (RFC 8259): strings with
// their escapes and the absence of raw control characters, numbers, the
// literals, the structure of objects and arrays, and nothing but whitespace
// after the top-level value. The UTF-8 validity of skipped strings is not
// checked.
//
// An object on the key's path that names the path's member twice is refused
// (ReasonBadPayload) rather than resolved: encoding/json and most other
// parsers take the last duplicate, a scanner that stopped at the first would
// take the first, and two readers of one message would then disagree about
// its key. Duplicates elsewhere in the document cannot change the key and
// are not looked for.

// strSpecial marks the bytes that end the fast path inside a string: the
// closing quote, a backslash and the control characters JSON forbids raw.
var strSpecial = func() (t [256]bool) {
	for c := 0; c < 0x20; c++ {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// scanner is a cursor over a JSON document.
type scanner struct {
	data []byte
	i    int
}

// syntax is the error for malformed JSON at the cursor.
func (s *scanner) syntax(what string) *Error {
	if s.i >= len(s.data) {
		return newError(ReasonBadPayload, "invalid JSON: unexpected end of payload, want %s", what)
	}
	return newError(ReasonBadPayload, "invalid JSON at byte %d: found %q, want %s", s.i, s.data[s.i], what)
}

// ws skips JSON whitespace.
func (s *scanner) ws() {
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek returns the byte at the cursor, or 0 at the end.
func (s *scanner) peek() byte {
	if s.i < len(s.data) {
		return s.data[s.i]
	}
	return 0
}

// str scans a string whose opening quote is at the cursor. It returns the
// content between the quotes and whether it holds escapes, and leaves the
// cursor after the closing quote.
func (s *scanner) str() (raw []byte, escaped bool, err *Error) {
	s.i++ // opening quote
	start := s.i
	d := s.data
	for i := start; i < len(d); {
		// Fast path over ordinary bytes.
		for i < len(d) && !strSpecial[d[i]] {
			i++
		}
		if i >= len(d) {
			break
		}
		c := d[i]
		switch {
		case c == '"':
			s.i = i + 1
			return d[start:i], escaped, nil
		case c == '\\':
			escaped = true
			if i+1 >= len(d) {
				s.i = len(d)
				return nil, false, s.syntax("an escape")
			}
			switch d[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(d) || !isHex(d[i+2]) || !isHex(d[i+3]) || !isHex(d[i+4]) || !isHex(d[i+5]) {
					s.i = i
					return nil, false, newError(ReasonBadPayload, "invalid JSON at byte %d: bad \\u escape", i)
				}
				i += 6
			default:
				s.i = i
				return nil, false, newError(ReasonBadPayload, "invalid JSON at byte %d: bad escape", i)
			}
		case c < 0x20:
			s.i = i
			return nil, false, s.syntax("no control character inside a string")
		default:
			i++
		}
	}
	s.i = len(d)
	return nil, false, s.syntax("the end of a string")
}

// number scans a number at the cursor and returns its text.
func (s *scanner) number() ([]byte, *Error) {
	d := s.data
	start := s.i
	i := s.i
	if i < len(d) && d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && d[i] >= '1' && d[i] <= '9':
		for i++; i < len(d) && isDigit(d[i]); i++ {
		}
	default:
		s.i = i
		return nil, s.syntax("a digit")
	}
	if i < len(d) && d[i] == '.' {
		i++
		if i >= len(d) || !isDigit(d[i]) {
			s.i = i
			return nil, s.syntax("a digit after '.'")
		}
		for ; i < len(d) && isDigit(d[i]); i++ {
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if i >= len(d) || !isDigit(d[i]) {
			s.i = i
			return nil, s.syntax("a digit in the exponent")
		}
		for ; i < len(d) && isDigit(d[i]); i++ {
		}
	}
	s.i = i
	return d[start:i], nil
}

// literal scans true, false or null at the cursor and returns its name.
func (s *scanner) literal() (string, *Error) {
	for _, lit := range [...]string{"true", "false", "null"} {
		if len(s.data)-s.i >= len(lit) && string(s.data[s.i:s.i+len(lit)]) == lit {
			s.i += len(lit)
			return lit, nil
		}
	}
	return "", s.syntax("a value")
}

// memberName scans `"name" :` at the cursor (after whitespace) and leaves the
// cursor at the value.
func (s *scanner) memberName() (raw []byte, escaped bool, err *Error) {
	s.ws()
	if s.peek() != '"' {
		return nil, false, s.syntax("a member name")
	}
	if raw, escaped, err = s.str(); err != nil {
		return nil, false, err
	}
	s.ws()
	if s.peek() != ':' {
		return nil, false, s.syntax("':'")
	}
	s.i++
	s.ws()
	return raw, escaped, nil
}

// skip scans one value of any kind at the cursor, checking its syntax.
func (s *scanner) skip() *Error {
	var buf [64]byte
	stack := buf[:0] // open containers: '{' or '['
	for {
		// A value is expected at the cursor.
		s.ws()
		switch c := s.peek(); {
		case c == '{':
			s.i++
			s.ws()
			if s.peek() == '}' {
				s.i++
				break
			}
			stack = append(stack, '{')
			if _, _, err := s.memberName(); err != nil {
				return err
			}
			continue
		case c == '[':
			s.i++
			s.ws()
			if s.peek() == ']' {
				s.i++
				break
			}
			stack = append(stack, '[')
			continue
		case c == '"':
			if _, _, err := s.str(); err != nil {
				return err
			}
		case c == '-' || isDigit(c):
			if _, err := s.number(); err != nil {
				return err
			}
		default:
			if _, err := s.literal(); err != nil {
				return err
			}
		}
		// A value ended: close containers until another value is due.
		for {
			if len(stack) == 0 {
				return nil
			}
			s.ws()
			top := stack[len(stack)-1]
			c := s.peek()
			if c == ',' {
				s.i++
				if top == '{' {
					if _, _, err := s.memberName(); err != nil {
						return err
					}
				}
				break
			}
			if (top == '{' && c == '}') || (top == '[' && c == ']') {
				s.i++
				stack = stack[:len(stack)-1]
				continue
			}
			if top == '{' {
				return s.syntax("',' or '}'")
			}
			return s.syntax("',' or ']'")
		}
	}
}

// findJSON finds the value at path in data. pathStr is the dotted path, for
// messages.
//
// It reads the whole document: after the wanted value (or after learning
// that it is absent) it finishes every object on the path, refusing a second
// member with the path's name there, and then refuses anything but
// whitespace after the top-level value. Either is ReasonBadPayload, and so is
// a syntax error anywhere; otherwise the answer for the path stands.
func findJSON(data []byte, path []string, pathStr string) (view, *Error) {
	s := scanner{data: data}
	s.ws()
	if s.i >= len(data) {
		return view{}, newError(ReasonBadPayload, "payload is empty, want a JSON object")
	}
	// open counts the objects on the path that were entered and not yet
	// closed: the object at depth d holds path[d].
	open := 0
	var v view
	var answer *Error
descend:
	for depth, seg := range path {
		// The cursor is at the value that should be an object holding seg.
		if c := s.peek(); c != '{' {
			if !startsValue(c) {
				return view{}, s.syntax("a JSON value")
			}
			if err := s.skip(); err != nil {
				return view{}, err
			}
			if depth == 0 {
				answer = newError(ReasonNoKey, "json %q absent: payload is not a JSON object", pathStr)
			} else {
				answer = newError(ReasonNoKey, "json %q absent: %q is not an object", pathStr, joinPath(path[:depth]))
			}
			break
		}
		s.i++
		s.ws()
		if s.peek() == '}' {
			s.i++
			answer = newError(ReasonNoKey, "json %q absent", pathStr)
			break
		}
		open++
		for {
			name, escaped, err := s.memberName()
			if err != nil {
				return view{}, err
			}
			if nameEquals(name, escaped, seg) {
				continue descend
			}
			if err := s.skip(); err != nil {
				return view{}, err
			}
			s.ws()
			switch s.peek() {
			case ',':
				s.i++
				continue
			case '}':
				s.i++
				open--
				answer = newError(ReasonNoKey, "json %q absent", pathStr)
				break descend
			}
			return view{}, s.syntax("',' or '}'")
		}
	}
	if open == len(path) {
		v, answer = s.leaf(pathStr)
		if answer != nil && answer.Reason == ReasonBadPayload {
			return view{}, answer
		}
	}
	// Finish the objects still open, innermost first: the cursor is after
	// the value of path[d] (or of another member) in the object at depth d.
	for d := open - 1; d >= 0; d-- {
		for {
			s.ws()
			switch s.peek() {
			case ',':
				s.i++
				name, escaped, err := s.memberName()
				if err != nil {
					return view{}, err
				}
				if nameEquals(name, escaped, path[d]) {
					return view{}, newError(ReasonBadPayload, "duplicate member %q on the path %q: readers would disagree about which one counts", path[d], pathStr)
				}
				if err := s.skip(); err != nil {
					return view{}, err
				}
				continue
			case '}':
				s.i++
			default:
				return view{}, s.syntax("',' or '}'")
			}
			break
		}
	}
	s.ws()
	if s.i < len(data) {
		return view{}, newError(ReasonBadPayload, "invalid JSON at byte %d: data after the top-level value", s.i)
	}
	return v, answer
}

// leaf reads the wanted value at the cursor and leaves the cursor after it.
// A value of the wrong type is read too (skipped), so that the rest of the
// document can still be checked; the error says what it was.
func (s *scanner) leaf(pathStr string) (view, *Error) {
	switch c := s.peek(); {
	case c == '"':
		raw, escaped, err := s.str()
		if err != nil {
			return view{}, err
		}
		if len(raw) == 0 {
			return view{}, newError(ReasonNoKey, "json %q is an empty string", pathStr)
		}
		return view{raw: raw, isJSON: true, jsonStr: true, escaped: escaped}, nil
	case c == '-' || isDigit(c):
		raw, err := s.number()
		if err != nil {
			return view{}, err
		}
		return view{raw: raw, isJSON: true}, nil
	case c == '{' || c == '[':
		if err := s.skip(); err != nil {
			return view{}, err
		}
		kind := "an object"
		if c == '[' {
			kind = "an array"
		}
		return view{}, newError(ReasonBadKeyType, "json %q is %s, want a string or a number", pathStr, kind)
	default:
		lit, err := s.literal()
		if err != nil {
			return view{}, err
		}
		kind := "a boolean"
		if lit == "null" {
			kind = "null"
		}
		return view{}, newError(ReasonBadKeyType, "json %q is %s, want a string or a number", pathStr, kind)
	}
}

// nameEquals reports whether the member name raw (escaped or not) equals seg.
func nameEquals(raw []byte, escaped bool, seg string) bool {
	if !escaped {
		return string(raw) == seg
	}
	// Unescaping never lengthens, so a raw name shorter than seg cannot
	// match.
	if len(raw) < len(seg) {
		return false
	}
	var buf [64]byte
	name, ok := appendUnescaped(buf[:0], raw)
	return ok && string(name) == seg
}

// appendUnescaped appends the unescaped content of a JSON string (escapes
// already checked by scanner.str) to dst. It reports false when the result
// would not be valid UTF-8: invalid bytes or an unpaired surrogate escape.
// (encoding/json replaces those with U+FFFD; here they are refused, because
// replacing would map distinct keys to one.)
func appendUnescaped(dst, raw []byte) ([]byte, bool) {
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			if c < utf8.RuneSelf {
				dst = append(dst, c)
				i++
				continue
			}
			r, size := utf8.DecodeRune(raw[i:])
			if r == utf8.RuneError && size == 1 {
				return dst, false
			}
			dst = append(dst, raw[i:i+size]...)
			i += size
			continue
		}
		switch raw[i+1] {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r := hex4(raw[i+2:])
			i += 6
			if utf16.IsSurrogate(r) {
				if r >= 0xdc00 || i+6 > len(raw) || raw[i] != '\\' || raw[i+1] != 'u' {
					return dst, false
				}
				r2 := hex4(raw[i+2:])
				if r2 < 0xdc00 || r2 > 0xdfff {
					return dst, false
				}
				r = utf16.DecodeRune(r, r2)
				i += 6
			}
			dst = utf8.AppendRune(dst, r)
			continue
		default: // '"', '\\', '/'
			dst = append(dst, raw[i+1])
		}
		i += 2
	}
	return dst, true
}

// hex4 decodes four hex digits (already checked).
func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		default:
			r |= rune(c - 'A' + 10)
		}
	}
	return r
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isHex(c byte) bool {
	return isDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// startsValue reports whether c can start a JSON value.
func startsValue(c byte) bool {
	switch c {
	case '{', '[', '"', '-', 't', 'f', 'n':
		return true
	}
	return isDigit(c)
}

// joinPath joins path segments with '.' (error path only).
func joinPath(segs []string) string { return strings.Join(segs, ".") }
