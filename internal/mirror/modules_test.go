package mirror

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// A reader of one module's needs finds them by the key's prefix, decoded
// in its scratch or read from the view kept, with no other module's; it
// hears every key's revision without decoding, and the keys held
// otherwise apart.
func TestOneModulesNeeds(t *testing.T) {
	t.Parallel()
	c := New().Needs
	for i, key := range []string{"a.web.port.http", "a.web-x.port.http", "a.web.dir.state", "a.db.port.pg", "a.web.port.bad name", "b.web.port.http"} {
		c.Apply(key, need(t), uint64(i+1), false)
	}
	var scratch Scratch[*provisionerv1.NeedRecord]
	ranges := []struct {
		prefixes []string
		want     []string
	}{
		{[]string{"a.web."}, []string{"a.web.dir.state", "a.web.port.http"}},
		{[]string{"a.db.", "a.web."}, []string{"a.db.port.pg", "a.web.dir.state", "a.web.port.http"}},
		{[]string{"a.db.", "a.web-x.", "a.web."}, []string{"a.db.port.pg", "a.web-x.port.http", "a.web.dir.state", "a.web.port.http"}},
		{[]string{"a.cache.", "a.web-x."}, []string{"a.web-x.port.http"}},
		{nil, []string{}},
	}
	for _, read := range []string{"decoded", "from the view"} {
		if read == "from the view" {
			c.Group("a") // a view kept: read, not decoded
		}
		for _, tt := range ranges {
			if diff := cmp.Diff(tt.want, keysOf(c.RangesInto("a", tt.prefixes, &scratch))); diff != "" {
				t.Errorf("RangesInto(a, %q), %s (-want +got):\n%s", tt.prefixes, read, diff)
			}
		}
	}
	got := c.RangesInto("a", []string{"a.db.", "a.web."}, &scratch)
	if got[1].Record.GetModule() != "web" || got[1].Record.GetKind() != "dir" {
		t.Errorf("RangesInto's second record: %v", got[1].Record)
	}
	if none := c.RangesInto("c", []string{"c.web."}, &scratch); len(none) != 0 {
		t.Errorf("RangesInto of a node without needs: %v", keysOf(none))
	}

	var heard []string
	var revisions []uint64
	c.KeyRevisions("a", func(key string, revision uint64) {
		heard, revisions = append(heard, key), append(revisions, revision)
	})
	if diff := cmp.Diff([]string{"a.db.port.pg", "a.web-x.port.http", "a.web.dir.state", "a.web.port.http"}, heard); diff != "" {
		t.Errorf("KeyRevisions(a) (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]uint64{4, 2, 3, 1}, revisions); diff != "" {
		t.Errorf("KeyRevisions(a)'s revisions (-want +got):\n%s", diff)
	}
	odd := c.Odd("a")
	if len(odd) != 1 || odd[0].Key != "a.web.port.bad name" || odd[0].Malformed == nil {
		t.Errorf("Odd(a) = %v, want the key with a space, malformed", keysOf(odd))
	}
}
