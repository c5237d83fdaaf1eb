package toolkitconfig

import (
	"bytes"
	"fmt"
	"strings"
)

// scanTopLevel calls fn with each key = value of the document's top level, before its first
// table header: the key (a dotted key's parts joined by NUL, so that it never equals a plain
// key) and the value's text (a scalar as written, a string with its quotes). Values of every
// kind are skipped over correctly, so that a string or array spanning lines is never taken for
// a key or a header. It reports a document it cannot read, with the line.
func scanTopLevel(doc []byte, fn func(key, value string) error) error {
	s := &scanner{doc: bytes.TrimPrefix(doc, []byte("\xef\xbb\xbf"))}
	for {
		s.skipSpace(true)
		switch c, ok := s.peek(); {
		case !ok || c == '[':
			return nil // the end, or the first table: the top level is over
		case c == '#':
			s.skipComment()
			continue
		}
		key, err := s.key()
		if err != nil {
			return err
		}
		if c, ok := s.peek(); !ok || c != '=' {
			return s.errorf("want '=' after key %q", strings.ReplaceAll(key, "\x00", "."))
		}
		s.pos++
		s.skipSpace(false)
		start := s.pos
		if err := s.value(); err != nil {
			return err
		}
		value := strings.TrimRight(string(s.doc[start:s.pos]), " \t")
		if err := s.endOfLine(); err != nil {
			return err
		}
		if err := fn(key, value); err != nil {
			return s.errorf("%w", err)
		}
	}
}

type scanner struct {
	doc []byte
	pos int
}

func (s *scanner) peek() (byte, bool) {
	if s.pos >= len(s.doc) {
		return 0, false
	}
	return s.doc[s.pos], true
}

func (s *scanner) errorf(format string, args ...any) error {
	line := 1 + bytes.Count(s.doc[:min(s.pos, len(s.doc))], []byte("\n"))
	return fmt.Errorf("line %d: %w", line, fmt.Errorf(format, args...))
}

// skipSpace skips blanks, and newlines too when lines is set.
func (s *scanner) skipSpace(lines bool) {
	for ; s.pos < len(s.doc); s.pos++ {
		switch s.doc[s.pos] {
		case ' ', '\t':
		case '\r', '\n':
			if !lines {
				return
			}
		default:
			return
		}
	}
}

func (s *scanner) skipComment() {
	if i := bytes.IndexByte(s.doc[s.pos:], '\n'); i >= 0 {
		s.pos += i
	} else {
		s.pos = len(s.doc)
	}
}

// endOfLine accepts blanks and a comment up to the end of the line or the document.
func (s *scanner) endOfLine() error {
	s.skipSpace(false)
	c, ok := s.peek()
	switch {
	case !ok || c == '\n':
		return nil
	case c == '\r' && s.pos+1 < len(s.doc) && s.doc[s.pos+1] == '\n':
		return nil
	case c == '#':
		s.skipComment()
		return nil
	}
	return s.errorf("unexpected %q after a value", c)
}

// key reads a bare, quoted or dotted key, and the blanks after it.
func (s *scanner) key() (string, error) {
	var parts []string
	for {
		s.skipSpace(false)
		c, ok := s.peek()
		switch {
		case !ok:
			return "", s.errorf("a key without a value")
		case c == '"' || c == '\'':
			start := s.pos
			if err := s.singleLineString(c); err != nil {
				return "", err
			}
			parts = append(parts, string(s.doc[start+1:s.pos-1]))
		default:
			start := s.pos
			for s.pos < len(s.doc) && isBareKeyChar(s.doc[s.pos]) {
				s.pos++
			}
			if s.pos == start {
				return "", s.errorf("unexpected %q where a key should be", c)
			}
			parts = append(parts, string(s.doc[start:s.pos]))
		}
		s.skipSpace(false)
		if c, ok := s.peek(); !ok || c != '.' {
			return strings.Join(parts, "\x00"), nil
		}
		s.pos++
	}
}

func isBareKeyChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// value skips one value: a string of any of the four kinds, an array, an inline table, or a
// scalar up to the comment or the end of the line.
func (s *scanner) value() error {
	rest := s.doc[s.pos:]
	switch {
	case bytes.HasPrefix(rest, []byte(`"""`)), bytes.HasPrefix(rest, []byte(`'''`)):
		return s.multiLineString(rest[0])
	case len(rest) > 0 && (rest[0] == '"' || rest[0] == '\''):
		return s.singleLineString(rest[0])
	case len(rest) > 0 && (rest[0] == '[' || rest[0] == '{'):
		return s.nested()
	}
	start := s.pos
	for s.pos < len(s.doc) && s.doc[s.pos] != '#' && s.doc[s.pos] != '\n' && s.doc[s.pos] != '\r' {
		s.pos++
	}
	if len(bytes.TrimSpace(s.doc[start:s.pos])) == 0 {
		return s.errorf("a key without a value")
	}
	return nil
}

// singleLineString skips a basic ("…", with escapes) or literal ('…') string on one line.
func (s *scanner) singleLineString(quote byte) error {
	for s.pos++; s.pos < len(s.doc); s.pos++ {
		switch c := s.doc[s.pos]; {
		case c == '\\' && quote == '"':
			s.pos++
		case c == quote:
			s.pos++
			return nil
		case c == '\n':
			return s.errorf("a string that does not end on its line")
		}
	}
	return s.errorf("a string that does not end")
}

// multiLineString skips a multi-line basic or literal string; up to two quotes may precede the
// closing three (they belong to the string).
func (s *scanner) multiLineString(quote byte) error {
	delim := bytes.Repeat([]byte{quote}, 3)
	for s.pos += 3; s.pos < len(s.doc); s.pos++ {
		if s.doc[s.pos] == '\\' && quote == '"' {
			s.pos++
			continue
		}
		if bytes.HasPrefix(s.doc[s.pos:], delim) {
			s.pos += 3
			for i := 0; i < 2 && s.pos < len(s.doc) && s.doc[s.pos] == quote; i++ {
				s.pos++
			}
			return nil
		}
	}
	return s.errorf("a multi-line string that does not end")
}

// nested skips an array or inline table, with what it holds, over as many lines as it spans.
func (s *scanner) nested() error {
	depth := 0
	for s.pos < len(s.doc) {
		rest := s.doc[s.pos:]
		switch c := rest[0]; {
		case bytes.HasPrefix(rest, []byte(`"""`)), bytes.HasPrefix(rest, []byte(`'''`)):
			if err := s.multiLineString(c); err != nil {
				return err
			}
			continue
		case c == '"' || c == '\'':
			if err := s.singleLineString(c); err != nil {
				return err
			}
			continue
		case c == '#':
			s.skipComment()
			continue
		case c == '[' || c == '{':
			depth++
		case c == ']' || c == '}':
			depth--
			if depth == 0 {
				s.pos++
				return nil
			}
		}
		s.pos++
	}
	return s.errorf("an array or inline table that does not end")
}
