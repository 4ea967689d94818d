package keys_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

func TestEcho(t *testing.T) {
	t.Parallel()
	a64 := strings.Repeat("a", 64)
	tests := []struct {
		name, in, want string
	}{
		{"empty", "", ""},
		{"short", "ace", "ace"},
		{"64 characters, whole", a64, a64},
		{"65 characters, cut", a64 + "b", a64 + "…"},
		{"70,000 characters, cut", strings.Repeat("a", 70_000), a64 + "…"},
		{"characters, not bytes", strings.Repeat("é", 65), strings.Repeat("é", 64) + "…"},
		{"bytes that are no UTF-8 count one each", strings.Repeat("\xff", 65), strings.Repeat("\xff", 64) + "…"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := keys.Echo(tt.in); got != tt.want {
				t.Errorf("Echo(%d bytes) = %q, want %q", len(tt.in), got, tt.want)
			}
		})
	}
}

// Every sentence of the package that echoes a name or a key echoes it cut,
// and a name longer than a request may give is refused with the limit.
func TestErrorsEchoNamesCut(t *testing.T) {
	t.Parallel()
	if keys.MaxNameLen != wire.MaxNameLen {
		t.Fatalf("keys.MaxNameLen %d, wire.MaxNameLen %d: the service and the keys' checks differ", keys.MaxNameLen, wire.MaxNameLen)
	}
	long := strings.Repeat("a", 70_000)
	cut := `"` + long[:64] + `…"`
	tests := []struct {
		name string
		err  func() error
		is   error
		want string
	}{
		{"a node over the limit", func() error { _, err := keys.NodeFilter(long); return err }, keys.ErrInvalidPart,
			`invalid key part: node ` + cut + ` is 70000 bytes, more than the 256 a name may take: shorten it`},
		{"a node no key can hold", func() error { _, err := keys.NodeFilter(long[:100] + "."); return err }, keys.ErrInvalidPart,
			`invalid key part: node ` + cut + ` holds '.' at byte 100; a token holds only A-Z a-z 0-9 - _ = /`},
		{"a module no key can hold", func() error { _, err := keys.AppliedKey{Node: "ace", Module: long + "*"}.Key(); return err }, keys.ErrInvalidPart,
			`invalid key part: module ` + cut + ` holds '*' at byte 70000; a token holds only A-Z a-z 0-9 - _ = /`},
		{"a key of too many tokens", func() error { _, err := keys.ParseAppliedKey(long + ".b.c"); return err }, keys.ErrMalformedKey,
			`malformed key: ` + cut + ` has 3 tokens, want 2 (<node>.<module>)`},
		{"a key with a bad token", func() error { _, err := keys.ParseNeedKey(long + ".web.po:rt.x"); return err }, keys.ErrMalformedKey,
			`malformed key: ` + cut + `: token 3 (<kind>) holds ':' at byte 2; a token holds only A-Z a-z 0-9 - _ = /`},
		{"a key with a bad escape", func() error { _, err := keys.ParseNeedKey(long + ".web.port.x=4"); return err }, keys.ErrMalformedKey,
			`malformed key: ` + cut + `: token 4 (<name>) has an escape cut short at byte 1; an escape is = and two upper-case hex digits`},
		{"a provider's key of too few tokens", func() error { return keys.CheckBoundKey(long) }, keys.ErrMalformedKey,
			`malformed key: ` + cut + ` has 1 tokens; a provider's key is <node>.<module>.<provision>[.<local>]`},
		{"a provider's key with a bad token", func() error { return keys.CheckBoundKey("ace.web." + long + "*") }, keys.ErrMalformedKey,
			`malformed key: provision ` + cut + ` holds '*' at byte 70000; a token holds only A-Z a-z 0-9 - _ = /`},
		{"a length over the limit", func() error { return keys.CheckLength("--module", long) }, nil,
			`--module ` + cut + ` is 70000 bytes, more than the 256 a name may take: shorten it`},
		{"a length at the limit", func() error { return keys.CheckLength("--module", long[:256]) }, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.err()
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Errorf("error\n  %s\nwant\n  %s", got, tt.want)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %v does not wrap %v", err, tt.is)
			}
		})
	}
}
