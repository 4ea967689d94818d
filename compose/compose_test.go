package compose_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/novox/mesh-provisioner/compose"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/registry"
)

func TestMemoReusesOnlyWhatIsUnchanged(t *testing.T) {
	t.Parallel()
	entries := map[string]*provisionerv1.RegistryEntry{}
	for _, e := range registry.Table() {
		entries[e.GetKind()] = e
	}
	needs := []*provisionerv1.NeedRecord{
		{Node: "ace", Module: "web", Kind: "port", Name: "http", Need: &provisionerv1.Need{}},
		{Node: "ace", Module: "web", Kind: "shell", Name: "zsh:normal", Need: &provisionerv1.Need{}},
	}
	items := []*provisionerv1.CollectRecord{{Node: "ace", Collection: "shell:zsh:normal", Contributor: "web", Item: &provisionerv1.CollectItem{Value: "a"}}}
	in := compose.Input{Node: "ace", Registry: func(k string) *provisionerv1.RegistryEntry { return entries[k] }, Needs: needs, Items: items}
	ignorePhases := protocmp.IgnoreFields(&provisionerv1.ComposeResponse{}, "phases")

	first, memo := compose.Compose(in)
	in.Memo = memo
	second, again := compose.Compose(in)
	if again != memo {
		t.Error("nothing changed, yet the memo was made anew")
	}
	if diff := cmp.Diff(first, second, protocmp.Transform(), ignorePhases); diff != "" {
		t.Errorf("composition with the memo (-without +with):\n%s", diff)
	}
	if first.GetPlans()[0].GetItems()[0] != second.GetPlans()[0].GetItems()[0] {
		t.Error("the port need was resolved again")
	}

	// New collection items show although the shell need is reused.
	in.Items = []*provisionerv1.CollectRecord{items[0], {Node: "ace", Collection: "shell:zsh:normal", Contributor: "z", Item: &provisionerv1.CollectItem{Value: "b"}}}
	third, _ := compose.Compose(in)
	if got := len(third.GetPlans()[0].GetItems()[1].GetItems()); got != 2 {
		t.Errorf("the shell collection shows %d items, want 2", got)
	}
	if got := len(first.GetPlans()[0].GetItems()[1].GetItems()); got != 1 {
		t.Errorf("an earlier answer changed: its shell collection shows %d items", got)
	}

	// A changed need and a changed entry are resolved again.
	in.Needs = []*provisionerv1.NeedRecord{needs[0], {Node: "ace", Module: "web", Kind: "shell", Name: "bash:login", Need: &provisionerv1.Need{}}}
	moved := &provisionerv1.RegistryEntry{Kind: "port", Owner: "mesh-ports", Source: &provisionerv1.RegistryEntry_Bucket{Bucket: &provisionerv1.BucketSource{Bucket: "mesh-ports", KeyShape: "<node>.<name>"}}}
	in.Registry = func(k string) *provisionerv1.RegistryEntry {
		if k == "port" {
			return moved
		}
		return entries[k]
	}
	fourth, _ := compose.Compose(in)
	got := fourth.GetPlans()[0].GetItems()
	if got[0].GetBucket().GetKey() != "ace.http" || got[1].GetCollection() != "shell:bash:login" {
		t.Errorf("after changes: port key %q, shell collection %q", got[0].GetBucket().GetKey(), got[1].GetCollection())
	}
}
