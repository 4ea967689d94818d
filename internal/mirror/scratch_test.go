package mirror

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// Groups read in turn into one Scratch, a large one before a small one,
// read as Group reads them: nothing the last read made shows in the next,
// neither a need's field nor an item's attributes. A group whose view a
// request kept is that view.
func TestGroupIntoReadsAsGroup(t *testing.T) {
	t.Parallel()
	m := New()
	put := func(c followed, key string, msg proto.Message) {
		b, err := proto.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		c.Apply(key, b, 1, false)
	}
	for i := range 40 { // big: every field set
		put(m.Needs, fmt.Sprintf("big.web.port.p%02d", i), &provisionerv1.Need{Placeholder: "${port:p}", Provider: "pg", Provision: "db", Local: "x", Required: true})
		put(m.Collect, fmt.Sprintf("big.plugins.m%02d", i), &provisionerv1.CollectItem{Value: "v", Order: 3, Attributes: map[string]string{"version": "1"}})
	}
	for i := range 5 { // small: none
		put(m.Needs, fmt.Sprintf("small.web.port.p%02d", i), &provisionerv1.Need{})
		put(m.Collect, fmt.Sprintf("small.plugins.m%02d", i), &provisionerv1.CollectItem{})
	}
	m.Needs.Apply("small.web.port.bad", []byte{0xff}, 1, false) // malformed
	m.Needs.MarkLoaded()
	m.Collect.MarkLoaded()
	var needs Scratch[*provisionerv1.NeedRecord]
	var items Scratch[*provisionerv1.CollectRecord]
	for _, node := range []string{"big", "small", "big", "small"} {
		gotNeeds, _, _ := m.Needs.GroupInto(node, &needs)
		wantNeeds, _, _ := m.Needs.GroupOnce(node)
		if diff := cmp.Diff(wantNeeds, gotNeeds, protocmp.Transform(), cmp.AllowUnexported(Entry[*provisionerv1.NeedRecord]{})); diff != "" {
			t.Errorf("%s's needs into a scratch differ from GroupOnce's (-want +got):\n%s", node, diff)
		}
		gotItems, _, _ := m.Collect.GroupInto(node, &items)
		wantItems, _, _ := m.Collect.GroupOnce(node)
		if diff := cmp.Diff(wantItems, gotItems, protocmp.Transform(), cmp.AllowUnexported(Entry[*provisionerv1.CollectRecord]{})); diff != "" {
			t.Errorf("%s's items into a scratch differ from GroupOnce's (-want +got):\n%s", node, diff)
		}
	}
	kept, _, _ := m.Needs.Group("small")
	if got, _, _ := m.Needs.GroupInto("small", &needs); &got[0] != &kept[0] {
		t.Error("GroupInto of a group whose view is kept made another")
	}
}
