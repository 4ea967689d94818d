package keys

import (
	"fmt"
	"strings"
)

// tokenByte reports whether a token may hold b. escaped says whether b may
// stand in an escaped collection token as itself: '=' may not, since it
// starts an escape.
func tokenByte(b byte, escaped bool) bool {
	switch {
	case 'A' <= b && b <= 'Z', 'a' <= b && b <= 'z', '0' <= b && b <= '9':
		return true
	case b == '-' || b == '_' || b == '/':
		return true
	case b == '=':
		return !escaped
	}
	return false
}

// CheckToken returns nil if s can stand as one token of a key: not empty, and
// only A-Z a-z 0-9 - _ = /. The error names the first byte that cannot.
func CheckToken(s string) error {
	if s == "" {
		return fmt.Errorf("is empty")
	}
	for i := 0; i < len(s); i++ {
		if !tokenByte(s[i], false) {
			return fmt.Errorf("holds %q at byte %d; a token holds only A-Z a-z 0-9 - _ = /", s[i], i)
		}
	}
	return nil
}

const hexDigits = "0123456789ABCDEF"

// Escape returns the token that stands for a collection's or a need's name in
// a key: every byte outside A-Z a-z 0-9 - _ / (so also '.', ':' and '=') is
// written '=' and two upper-case hex digits.
func Escape(name string) string {
	for i := 0; i < len(name); i++ {
		if !tokenByte(name[i], true) {
			var buf [64]byte
			return string(AppendEscaped(buf[:0], name))
		}
	}
	return name
}

// AppendEscaped appends the token Escape returns to b.
func AppendEscaped(b []byte, name string) []byte {
	for i := 0; i < len(name); i++ {
		c := name[i]
		if tokenByte(c, true) {
			b = append(b, c)
			continue
		}
		b = append(b, '=', hexDigits[c>>4], hexDigits[c&0x0F])
	}
	return b
}

// Unescape returns the name a token written by Escape stands for. It
// accepts exactly the tokens Escape writes: an escape must be '='
// and two upper-case hex digits of a byte that needs escaping, so that every
// name has one token and every token one name.
func Unescape(token string) (string, error) {
	if strings.IndexByte(token, '=') < 0 {
		for i := 0; i < len(token); i++ {
			if !tokenByte(token[i], true) {
				return "", fmt.Errorf("holds %q at byte %d; an escaped token holds only A-Z a-z 0-9 - _ / and =XX escapes", token[i], i)
			}
		}
		return token, nil
	}
	var b strings.Builder
	b.Grow(len(token))
	for i := 0; i < len(token); i++ {
		c := token[i]
		if c != '=' {
			if !tokenByte(c, true) {
				return "", fmt.Errorf("holds %q at byte %d; an escaped token holds only A-Z a-z 0-9 - _ / and =XX escapes", c, i)
			}
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(token) {
			return "", fmt.Errorf("has an escape cut short at byte %d; an escape is = and two upper-case hex digits", i)
		}
		hi, lo := strings.IndexByte(hexDigits, token[i+1]), strings.IndexByte(hexDigits, token[i+2])
		if hi < 0 || lo < 0 {
			return "", fmt.Errorf("has a bad escape %q at byte %d; an escape is = and two upper-case hex digits", token[i:i+3], i)
		}
		c = byte(hi<<4 | lo)
		if tokenByte(c, true) {
			return "", fmt.Errorf("escapes %q at byte %d, which is written as itself", c, i)
		}
		b.WriteByte(c)
		i += 2
	}
	return b.String(), nil
}
