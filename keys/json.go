package keys

import (
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// This file holds the JSON path scanner: one pass over the payload that
// checks its syntax (RFC 8259, except the UTF-8 of skipped strings), decodes
// nothing and allocates nothing in the common case. The rules a user sees,
// a member named twice on the path among them, are key.json_path's in
// configs/README.md.

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
		var opened, more bool
		var err *Error
		if stack, opened, err = s.valueStart(stack); err != nil {
			return err
		}
		if opened {
			continue
		}
		if stack, more, err = s.valueEnd(stack); err != nil || !more {
			return err
		}
	}
}

// valueStart scans the value at the cursor, or only its opening when it is
// a non-empty object or array: then it pushes the container on stack (and
// reads an object's first member name) and opened is true.
func (s *scanner) valueStart(stack []byte) (_ []byte, opened bool, err *Error) {
	s.ws()
	switch c := s.peek(); {
	case c == '{' || c == '[':
		s.i++
		s.ws()
		if end := c + 2; s.peek() == end { // '}' and ']' follow '{' and '[' by 2
			s.i++
			return stack, false, nil
		}
		if c == '{' {
			if _, _, err := s.memberName(); err != nil {
				return stack, false, err
			}
		}
		return append(stack, c), true, nil
	case c == '"':
		_, _, err = s.str()
	case c == '-' || isDigit(c):
		_, err = s.number()
	default:
		_, err = s.literal()
	}
	return stack, false, err
}

// valueEnd closes the containers on stack that end after a value, until
// another value is due (more is true; an object's member name is read) or
// stack is empty.
func (s *scanner) valueEnd(stack []byte) (_ []byte, more bool, err *Error) {
	for len(stack) > 0 {
		s.ws()
		top := stack[len(stack)-1]
		c := s.peek()
		if c == ',' {
			s.i++
			if top == '{' {
				if _, _, err := s.memberName(); err != nil {
					return stack, false, err
				}
			}
			return stack, true, nil
		}
		if c != top+2 { // '}' and ']' follow '{' and '[' by 2
			if top == '{' {
				return stack, false, s.syntax("',' or '}'")
			}
			return stack, false, s.syntax("',' or ']'")
		}
		s.i++
		stack = stack[:len(stack)-1]
	}
	return stack, false, nil
}

// findJSON finds the value at path in data; pathStr is the dotted path,
// for messages. It reads the whole document, so that a syntax error, a
// member named twice on the path or data after the top-level value is
// ReasonBadPayload whatever the path finds.
func findJSON(data []byte, path []string, pathStr string) (view, *Error) {
	s := scanner{data: data}
	s.ws()
	if s.i >= len(data) {
		return view{}, newError(ReasonBadPayload, "payload is empty, want a JSON object")
	}
	open, answer, err := s.descend(path, pathStr)
	if err != nil {
		return view{}, err
	}
	var v view
	if open == len(path) {
		v, answer = s.leaf(pathStr)
		if answer != nil && answer.Reason == ReasonBadPayload {
			return view{}, answer
		}
	}
	// Finish the objects still open, innermost first.
	for d := open - 1; d >= 0; d-- {
		if err := s.closeObject(path[d], pathStr); err != nil {
			return view{}, err
		}
	}
	s.ws()
	if s.i < len(data) {
		return view{}, newError(ReasonBadPayload, "invalid JSON at byte %d: data after the top-level value", s.i)
	}
	return v, answer
}

// descend enters, from the cursor, the object holding each segment of path
// and leaves the cursor at the value of the last it found. open counts the
// objects entered and not closed (the one at depth d holds path[d]);
// absent says why the path is absent, err is a syntax error.
func (s *scanner) descend(path []string, pathStr string) (open int, absent, err *Error) {
	for depth, seg := range path {
		if c := s.peek(); c != '{' {
			if !startsValue(c) {
				return open, nil, s.syntax("a JSON value")
			}
			if err := s.skip(); err != nil {
				return open, nil, err
			}
			if depth == 0 {
				return open, newError(ReasonNoKey, "json %q absent: payload is not a JSON object", pathStr), nil
			}
			return open, newError(ReasonNoKey, "json %q absent: %q is not an object", pathStr, joinPath(path[:depth])), nil
		}
		s.i++
		s.ws()
		if s.peek() == '}' {
			s.i++
			return open, newError(ReasonNoKey, "json %q absent", pathStr), nil
		}
		found, err := s.findMember(seg)
		if err != nil {
			return open, nil, err
		}
		if !found {
			return open, newError(ReasonNoKey, "json %q absent", pathStr), nil
		}
		open++
	}
	return open, nil, nil
}

// findMember reads the members of the object the cursor is inside, from
// its first, until one named seg (found: the cursor is at its value) or the
// object's end (the cursor is after its '}').
func (s *scanner) findMember(seg string) (found bool, err *Error) {
	for {
		name, escaped, err := s.memberName()
		if err != nil {
			return false, err
		}
		if nameEquals(name, escaped, seg) {
			return true, nil
		}
		if err := s.skip(); err != nil {
			return false, err
		}
		s.ws()
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return false, nil
		default:
			return false, s.syntax("',' or '}'")
		}
	}
}

// closeObject reads the rest of an object on the path, the cursor after a
// member's value, to its '}', refusing a second member named seg.
func (s *scanner) closeObject(seg, pathStr string) *Error {
	for {
		s.ws()
		switch s.peek() {
		case ',':
			s.i++
			name, escaped, err := s.memberName()
			if err != nil {
				return err
			}
			if nameEquals(name, escaped, seg) {
				return newError(ReasonBadPayload, "duplicate member %q on the path %q: readers would disagree about which one counts", seg, pathStr)
			}
			if err := s.skip(); err != nil {
				return err
			}
		case '}':
			s.i++
			return nil
		default:
			return s.syntax("',' or '}'")
		}
	}
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
