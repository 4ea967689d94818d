package keys_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/novox/mesh-provisioner/keys"
)

func TestEscape(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, token string
	}{
		{"shell:zsh:normal", "shell=3Azsh=3Anormal"},
		{"environment", "environment"},
		{"a.b", "a=2Eb"},
		{"x=y", "x=3Dy"},
		{"path/to-it_ok", "path/to-it_ok"},
		{"sp ace", "sp=20ace"},
		{"\xff\x00", "=FF=00"},
		{"", ""},
	}
	for _, tt := range tests {
		t.Run(tt.token, func(t *testing.T) {
			t.Parallel()
			if got := keys.Escape(tt.name); got != tt.token {
				t.Errorf("Escape(%q) = %q, want %q", tt.name, got, tt.token)
			}
			got, err := keys.Unescape(tt.token)
			if err != nil || got != tt.name {
				t.Errorf("Unescape(%q) = %q, %v; want %q", tt.token, got, err, tt.name)
			}
		})
	}
}

func TestUnescapeRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		token, reason string
	}{
		{"shell=3azsh", "bad escape"},
		{"shell=3", "cut short"},
		{"shell=", "cut short"},
		{"=41", "written as itself"},
		{"=2D", "written as itself"},
		{"a.b", "holds '.'"},
		{"a:b", "holds ':'"},
		{"=G0", "bad escape"},
	}
	for _, tt := range tests {
		t.Run(tt.token, func(t *testing.T) {
			t.Parallel()
			_, err := keys.Unescape(tt.token)
			if err == nil || !strings.Contains(err.Error(), tt.reason) {
				t.Errorf("Unescape(%q) error = %v, want one saying %q", tt.token, err, tt.reason)
			}
		})
	}
}

func TestParseNeedKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		key    string
		want   keys.NeedKey
		reason string // empty for a good key
	}{
		{key: "ace.web.port.http", want: keys.NeedKey{Node: "ace", Module: "web", Kind: "port", Name: "http"}},
		{key: "ace.web.config.db_url=3D1", want: keys.NeedKey{Node: "ace", Module: "web", Kind: "config", Name: "db_url=1"}},
		{key: "ace.web.shell.zsh=3Anormal", want: keys.NeedKey{Node: "ace", Module: "web", Kind: "shell", Name: "zsh:normal"}},
		{key: "ace.web.config.db_url=1", reason: "token 4 (<name>) has an escape cut short"},
		{key: "ace.web.port", reason: "has 3 tokens, want 4 (<node>.<module>.<kind>.<name>)"},
		{key: "ace.web.port.http.x", reason: "has 5 tokens, want 4"},
		{key: "ace..port.http", reason: "token 2 (<module>) is empty"},
		{key: "ace.web.po:rt.http", reason: "token 3 (<kind>) holds ':'"},
		{key: "", reason: "has 1 tokens, want 4"},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			t.Parallel()
			got, err := keys.ParseNeedKey(tt.key)
			if tt.reason != "" {
				if !errors.Is(err, keys.ErrMalformedKey) || !strings.Contains(err.Error(), tt.reason) {
					t.Fatalf("ParseNeedKey(%q) error = %v, want ErrMalformedKey saying %q", tt.key, err, tt.reason)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseNeedKey(%q): %v", tt.key, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseNeedKey(%q) (-want +got):\n%s", tt.key, diff)
			}
			key, err := got.Key()
			if err != nil || key != tt.key {
				t.Errorf("Key() = %q, %v; want %q", key, err, tt.key)
			}
		})
	}
}

func TestParseCollectKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		key    string
		want   keys.CollectKey
		reason string
	}{
		{key: "ace.shell=3Azsh=3Anormal.web", want: keys.CollectKey{Node: "ace", Collection: "shell:zsh:normal", Contributor: "web"}},
		{key: "ace.environment.db", want: keys.CollectKey{Node: "ace", Collection: "environment", Contributor: "db"}},
		{key: "ace.shell=3a.web", reason: "token 2 (<collection>) has a bad escape"},
		{key: "ace.shell=.web", reason: "cut short"},
		{key: "ace.shell", reason: "has 2 tokens, want 3"},
		{key: "ace.shell.", reason: "token 3 (<contributor>) is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			t.Parallel()
			got, err := keys.ParseCollectKey(tt.key)
			if tt.reason != "" {
				if !errors.Is(err, keys.ErrMalformedKey) || !strings.Contains(err.Error(), tt.reason) {
					t.Fatalf("ParseCollectKey(%q) error = %v, want ErrMalformedKey saying %q", tt.key, err, tt.reason)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseCollectKey(%q): %v", tt.key, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseCollectKey(%q) (-want +got):\n%s", tt.key, diff)
			}
			key, err := got.Key()
			if err != nil || key != tt.key {
				t.Errorf("Key() = %q, %v; want %q", key, err, tt.key)
			}
		})
	}
}

func TestParseAppliedAndRegistryKeys(t *testing.T) {
	t.Parallel()
	if got, err := keys.ParseAppliedKey("ace.web"); err != nil || got != (keys.AppliedKey{Node: "ace", Module: "web"}) {
		t.Errorf("ParseAppliedKey(ace.web) = %+v, %v", got, err)
	}
	if _, err := keys.ParseAppliedKey("ace.web.extra"); !errors.Is(err, keys.ErrMalformedKey) {
		t.Errorf("ParseAppliedKey(ace.web.extra) error = %v, want ErrMalformedKey", err)
	}
	if got, err := keys.ParseRegistryKey("port"); err != nil || got != "port" {
		t.Errorf("ParseRegistryKey(port) = %q, %v", got, err)
	}
	if _, err := keys.ParseRegistryKey("port.http"); !errors.Is(err, keys.ErrMalformedKey) {
		t.Errorf("ParseRegistryKey(port.http) error = %v, want ErrMalformedKey", err)
	}
}

func TestFormatRejectsInvalidParts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		key    func() (string, error)
		reason string
	}{
		{"empty node", keys.NeedKey{Module: "web", Kind: "port", Name: "http"}.Key, `node "" is empty`},
		{"dot in module", keys.NeedKey{Node: "ace", Module: "w.b", Kind: "port", Name: "http"}.Key, `module "w.b" holds '.'`},
		{"empty name", keys.NeedKey{Node: "ace", Module: "web", Kind: "port"}.Key, "name is empty"},
		{"wildcard kind", keys.NeedKey{Node: "ace", Module: "web", Kind: "*", Name: "http"}.Key, `kind "*" holds '*'`},
		{"space in applied", keys.AppliedKey{Node: "ace", Module: "my web"}.Key, `module "my web" holds ' '`},
		{"empty collection", keys.CollectKey{Node: "ace", Contributor: "web"}.Key, "collection is empty"},
		{"gt contributor", keys.CollectKey{Node: "ace", Collection: "env", Contributor: ">"}.Key, `contributor ">" holds '>'`},
		{"registry kind", func() (string, error) { return keys.RegistryKey("a.b") }, `kind "a.b" holds '.'`},
		{"node filter", func() (string, error) { return keys.NodeFilter("") }, `node "" is empty`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			key, err := tt.key()
			if !errors.Is(err, keys.ErrInvalidPart) || !strings.Contains(err.Error(), tt.reason) {
				t.Errorf("got %q, %v; want ErrInvalidPart saying %q", key, err, tt.reason)
			}
		})
	}
}

func FuzzCollectionEscape(f *testing.F) {
	for _, seed := range []string{"", "shell:zsh:normal", "a=b", "=3A", "\x00\xff", "plain", "a.b.c"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, name string) {
		token := keys.Escape(name)
		got, err := keys.Unescape(token)
		if err != nil {
			t.Fatalf("Unescape(Escape(%q)=%q): %v", name, token, err)
		}
		if got != name {
			t.Fatalf("round trip of %q gave %q", name, got)
		}
		if name != "" {
			if err := keys.CheckToken(token); err != nil {
				t.Fatalf("Escape(%q) = %q is not a token: %v", name, token, err)
			}
		}
		// The other way: a token that unescapes escapes back to itself.
		if back, err := keys.Unescape(name); err == nil && keys.Escape(back) != name {
			t.Fatalf("Escape(Unescape(%q)) = %q", name, keys.Escape(back))
		}
	})
}

func FuzzParseKeys(f *testing.F) {
	for _, seed := range []string{"ace.web.port.http", "ace.web", "ace.shell=3Azsh.web", "", ".", "a..b", "ace.=ZZ.web", "port"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, key string) {
		check := func(name string, err error, format func() (string, error)) {
			if err != nil {
				if !errors.Is(err, keys.ErrMalformedKey) || err.Error() == "" {
					t.Fatalf("%s(%q): error %v does not wrap ErrMalformedKey", name, key, err)
				}
				return
			}
			again, err := format()
			if err != nil || again != key {
				t.Fatalf("%s(%q) parsed, but formats back as %q, %v", name, key, again, err)
			}
		}
		need, err := keys.ParseNeedKey(key)
		check("ParseNeedKey", err, need.Key)
		applied, err := keys.ParseAppliedKey(key)
		check("ParseAppliedKey", err, applied.Key)
		collect, err := keys.ParseCollectKey(key)
		check("ParseCollectKey", err, collect.Key)
		kind, err := keys.ParseRegistryKey(key)
		check("ParseRegistryKey", err, func() (string, error) { return keys.RegistryKey(kind) })
	})
}
