package compose_test

import (
	"bytes"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/novox/mesh-provisioner/compose"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// Every field of a composition's plans, provisions and refusals is in its
// digest, but the revisions at which needs and items were written: a field
// added to the contract and forgotten by Digest fails here.
func TestDigestReadsEveryField(t *testing.T) {
	t.Parallel()
	base := func() *provisionerv1.ComposeResponse {
		return &provisionerv1.ComposeResponse{
			Node: "ace",
			Plans: []*provisionerv1.ModulePlan{{Module: "web", Items: []*provisionerv1.PlanItem{{
				Kind: "shell", Collection: "shell:zsh:normal",
				Location: &provisionerv1.PlanItem_Bucket{Bucket: &provisionerv1.BucketKey{}},
				Items:    []*provisionerv1.CollectedItem{{Item: &provisionerv1.CollectItem{}}},
			}, {
				Kind: "secret", Location: &provisionerv1.PlanItem_Verb{Verb: &provisionerv1.VerbSource{}},
			}}}},
			Provisions: []*provisionerv1.Provision{{}},
			Refusals:   []*provisionerv1.Refusal{{}},
		}
	}
	ignored := map[protoreflect.FullName]bool{
		"mesh.provisioner.v1.PlanItem.revision":      true,
		"mesh.provisioner.v1.CollectedItem.revision": true,
		"mesh.provisioner.v1.PlanItem.items":         true, // below, by its item
	}
	want := compose.Digest(base())
	// Each scalar field of each message reached from base, set in turn.
	messages := func(c *provisionerv1.ComposeResponse) []protoreflect.Message {
		plan := c.GetPlans()[0]
		collection, verb := plan.GetItems()[0], plan.GetItems()[1]
		return []protoreflect.Message{
			plan.ProtoReflect(), collection.ProtoReflect(), verb.ProtoReflect(),
			collection.GetBucket().ProtoReflect(), verb.GetVerb().ProtoReflect(),
			collection.GetItems()[0].ProtoReflect(), collection.GetItems()[0].GetItem().ProtoReflect(),
			c.GetProvisions()[0].ProtoReflect(), c.GetRefusals()[0].ProtoReflect(),
		}
	}
	for i := range messages(base()) {
		fields := messages(base())[i].Descriptor().Fields()
		for j := range fields.Len() {
			fd := fields.Get(j)
			if ignored[fd.FullName()] || fd.Message() != nil && !fd.IsList() || fd.ContainingOneof() != nil {
				continue
			}
			c := base()
			m := messages(c)[i]
			switch {
			case fd.IsList() && fd.Kind() == protoreflect.StringKind:
				m.Mutable(fd).List().Append(protoreflect.ValueOfString("b2"))
			case fd.IsList() || fd.IsMap():
				if fd.IsMap() && fd.MapValue().Kind() == protoreflect.StringKind {
					m.Mutable(fd).Map().Set(protoreflect.ValueOfString("k").MapKey(), protoreflect.ValueOfString("v"))
				} else {
					continue // a list of messages: set through its elements
				}
			case fd.Kind() == protoreflect.StringKind:
				m.Set(fd, protoreflect.ValueOfString("x"))
			case fd.Kind() == protoreflect.Uint64Kind:
				m.Set(fd, protoreflect.ValueOfUint64(7))
			case fd.Kind() == protoreflect.Int32Kind:
				m.Set(fd, protoreflect.ValueOfInt32(7))
			case fd.Kind() == protoreflect.BoolKind:
				m.Set(fd, protoreflect.ValueOfBool(true))
			case fd.Kind() == protoreflect.EnumKind:
				m.Set(fd, protoreflect.ValueOfEnum(1))
			default:
				t.Fatalf("field %s of kind %s: teach this test to set it", fd.FullName(), fd.Kind())
			}
			if compose.Digest(c) == want {
				t.Errorf("setting %s leaves the digest as it was", fd.FullName())
			}
		}
	}
	c := base()
	c.GetPlans()[0].GetItems()[0].Revision = 9
	c.GetPlans()[0].GetItems()[0].GetItems()[0].Revision = 9
	if compose.Digest(c) != want {
		t.Error("the revisions at which a need and an item were written changed the digest")
	}
}

// An arena's Digest keeps no collection's sum from one digest to the
// next: two nodes whose collections share a name and not their items
// digest apart, each as Digest digests it.
func TestArenaDigestForgetsCollections(t *testing.T) {
	t.Parallel()
	withItem := func(value string) *provisionerv1.ComposeResponse {
		return &provisionerv1.ComposeResponse{Node: "ace", Plans: []*provisionerv1.ModulePlan{{Module: "web", Items: []*provisionerv1.PlanItem{{
			Kind: "shell", Name: "zsh:normal", Collection: "shell:zsh:normal",
			Location: &provisionerv1.PlanItem_Bucket{Bucket: &provisionerv1.BucketKey{Bucket: "mesh-provisioner_collect", Key: "ace.shell=3Azsh=3Anormal.*"}},
			Items:    []*provisionerv1.CollectedItem{{Contributor: "web", Item: &provisionerv1.CollectItem{Value: value}}},
		}}}}}
	}
	a, b := withItem("a"), withItem("b")
	if compose.Digest(a) == compose.Digest(b) {
		t.Fatal("Digest reads no collection item: nothing to tell apart")
	}
	arena := new(compose.Arena)
	for _, c := range []*provisionerv1.ComposeResponse{a, b, a} {
		if got, want := arena.Digest(c), compose.Digest(c); got != want {
			t.Errorf("the arena's Digest of the item %q = %s, want Digest's %s", c.GetPlans()[0].GetItems()[0].GetItems()[0].GetItem().GetValue(), got, want)
		}
	}
}

// The digest writes a collected item by hand as protobuf-go's
// deterministic marshalling does: the same bytes for every item, so that
// no plan digest changes.
func TestAppendCollectItem(t *testing.T) {
	t.Parallel()
	// A field added to CollectItem must be written by appendCollectItem too.
	if n := (&provisionerv1.CollectItem{}).ProtoReflect().Descriptor().Fields().Len(); n != 3 {
		t.Fatalf("CollectItem has %d fields; appendCollectItem writes 3", n)
	}
	withUnknown := &provisionerv1.CollectItem{Value: "v"}
	withUnknown.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 9, protowire.VarintType), 7))
	for _, tt := range []struct {
		name string
		item *provisionerv1.CollectItem
	}{
		{"nil", nil},
		{"empty", &provisionerv1.CollectItem{}},
		{"a value", &provisionerv1.CollectItem{Value: "export A=1"}},
		{"an order", &provisionerv1.CollectItem{Order: 300}},
		{"a negative order", &provisionerv1.CollectItem{Order: -1}},
		{"attributes", &provisionerv1.CollectItem{Value: "v", Order: 2, Attributes: map[string]string{"version": "1", "a": "", "": "z", "é": "ü"}}},
		{"many attributes", &provisionerv1.CollectItem{Attributes: map[string]string{"f": "6", "e": "5", "d": "4", "c": "3", "b": "2", "a": "1"}}},
		{"a long value", &provisionerv1.CollectItem{Value: strings.Repeat("x", 300)}},
		{"a value not UTF-8", &provisionerv1.CollectItem{Value: "\xff"}},
		{"an attribute not UTF-8", &provisionerv1.CollectItem{Attributes: map[string]string{"k": "\xff"}}},
		{"unknown fields", withUnknown},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			want := compose.AppendMessage([]byte("head"), tt.item)
			if got := compose.AppendCollectItem([]byte("head"), tt.item); !bytes.Equal(got, want) {
				t.Errorf("appendCollectItem wrote %x, the deterministic encoding is %x", got, want)
			}
		})
	}
}

// FuzzAppendCollectItem is TestAppendCollectItem for items of the
// fuzzer's making.
//
//	go test ./compose -run '^$' -fuzz FuzzAppendCollectItem -fuzztime 30s
func FuzzAppendCollectItem(f *testing.F) {
	f.Add("export A=1", int32(0), "", "", "", "")
	f.Add("", int32(-5), "version", "1", "a", "")
	f.Add("\xff", int32(1<<30), "", "\xfe", "b", "b")
	f.Fuzz(func(t *testing.T, value string, order int32, k1, v1, k2, v2 string) {
		item := &provisionerv1.CollectItem{Value: value, Order: order}
		if k1 != "" || v1 != "" || k2 != "" || v2 != "" {
			item.Attributes = map[string]string{k1: v1, k2: v2}
		}
		want := compose.AppendMessage(nil, item)
		if got := compose.AppendCollectItem(nil, item); !bytes.Equal(got, want) {
			t.Errorf("appendCollectItem wrote %x, the deterministic encoding is %x", got, want)
		}
	})
}
