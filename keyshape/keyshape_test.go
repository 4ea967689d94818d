package keyshape_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/novox/mesh-provisioner/keyshape"
	"github.com/novox/mesh-provisioner/registry"
)

func TestShapeFilter(t *testing.T) {
	t.Parallel()
	ks, err := keyshape.Parse("<node>.<collection>.<contributor>")
	if err != nil {
		t.Fatal(err)
	}
	got, err := ks.Filter(keyshape.Values{Node: "ace", Collection: "shell:zsh:normal"})
	if err != nil || got != "ace.shell=3Azsh=3Anormal.*" {
		t.Errorf("Filter() = %q, %v", got, err)
	}
}

func TestCollectionOf(t *testing.T) {
	t.Parallel()
	collections := map[string]string{}
	for _, e := range registry.Table() {
		if tmpl := e.GetBucket().GetCollection(); tmpl != "" {
			collections[e.GetKind()] = keyshape.CollectionOf(tmpl, e.GetKind(), "zsh:normal")
		}
	}
	want := map[string]string{"collected": "zsh:normal", "shell": "shell:zsh:normal", "environment": "environment:zsh:normal", "contribution": "contribution:zsh:normal"}
	if diff := cmp.Diff(want, collections); diff != "" {
		t.Errorf("collections read (-want +got):\n%s", diff)
	}
}

func TestShapeRender(t *testing.T) {
	t.Parallel()
	tests := []struct {
		shape  string
		values keyshape.Values
		want   string
		reason string
	}{
		{"<node>.<module>.<provision>[.<local>]", keyshape.Values{Node: "ace", Module: "web", Provision: "db"}, "ace.web.db", ""},
		{"<node>.<module>.<provision>[.<local>]", keyshape.Values{Node: "ace", Module: "web", Provision: "db", Local: "ro"}, "ace.web.db.ro", ""},
		{"<node>.<collection>.<contributor>", keyshape.Values{Node: "ace", Collection: "shell:zsh:normal", Contributor: "web"}, "ace.shell=3Azsh=3Anormal.web", ""},
		{"plans.<node>", keyshape.Values{Node: "ace"}, "plans.ace", ""},
		{"<node>.<module>", keyshape.Values{Node: "ace"}, "", "no value for <module>"},
		{"<node>.<module>", keyshape.Values{Node: "ace", Module: "a.b"}, "", `<module> "a.b" holds '.'`},
		{"<node>[.<module>.<local>]", keyshape.Values{Node: "ace", Local: "x"}, "", "all of its values or none"},
	}
	for _, tt := range tests {
		t.Run(tt.want+tt.reason, func(t *testing.T) {
			t.Parallel()
			ks, err := keyshape.Parse(tt.shape)
			if err != nil {
				t.Fatal(err)
			}
			if ks.String() != tt.shape {
				t.Errorf("String() = %q, want %q", ks.String(), tt.shape)
			}
			got, err := ks.Render(tt.values)
			if tt.reason != "" {
				if !errors.Is(err, keyshape.ErrCannotRender) || !strings.Contains(err.Error(), tt.reason) {
					t.Errorf("Render() = %q, %v; want ErrCannotRender saying %q", got, err, tt.reason)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("Render() = %q, %v; want %q", got, err, tt.want)
			}
			if filter, err := ks.Filter(tt.values); err != nil || filter != tt.want {
				t.Errorf("Filter() = %q, %v; want %q where every value is given", filter, err, tt.want)
			}
		})
	}
}

func TestShapeLeadsWith(t *testing.T) {
	t.Parallel()
	tests := []struct {
		shape, name string
		want        bool
	}{
		{"<node>.<module>.<provision>[.<local>]", "node", true},
		{"<node>.<module>", "module", false},
		{"plans.<node>", "node", false},
		{"<module>.<node>", "node", false},
		{"<node>", "node", true},
	}
	for _, tt := range tests {
		t.Run(tt.shape+" "+tt.name, func(t *testing.T) {
			t.Parallel()
			ks, err := keyshape.Parse(tt.shape)
			if err != nil {
				t.Fatal(err)
			}
			if got := ks.LeadsWith(tt.name); got != tt.want {
				t.Errorf("LeadsWith(%q) = %v, want %v", tt.name, got, tt.want)
			}
		})
	}
}

// A shape parsed again, as every composition parses its registry's, is
// the shape parsed first; one that does not parse fails again.
func TestParseAgain(t *testing.T) {
	t.Parallel()
	for range 2 {
		ks, err := keyshape.Parse("<node>.<module>.<provision>[.<local>]")
		if err != nil || ks.String() != "<node>.<module>.<provision>[.<local>]" || !ks.LeadsWith("node") {
			t.Errorf("Parse() = %v, %v", ks, err)
		}
		if _, err := keyshape.Parse("<node>.<nobody>"); !errors.Is(err, keyshape.ErrInvalid) {
			t.Errorf("Parse(<node>.<nobody>) = %v, want ErrInvalid", err)
		}
	}
}
