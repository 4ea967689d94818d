package compose_test

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/compose"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/registry"
)

func ExampleCompose() {
	entries := map[string]*provisionerv1.RegistryEntry{}
	for _, e := range registry.Table() {
		entries[e.GetKind()] = e
	}
	out := compose.Compose(compose.Input{
		Node:    "ace",
		Sources: compose.Sources{Registry: func(kind string) *provisionerv1.RegistryEntry { return entries[kind] }},
		Needs: []*provisionerv1.NeedRecord{
			{Node: "ace", Module: "web", Kind: "bound", Name: "db", Need: &provisionerv1.Need{Provider: "pg", Local: "ro"}},
			{Node: "ace", Module: "web", Kind: "gpu", Name: "cuda", Need: &provisionerv1.Need{}},
			{Node: "ace", Module: "web", Kind: "port", Name: "http", Need: &provisionerv1.Need{}},
			{Node: "ace", Module: "web", Kind: "secret", Name: "token", Need: &provisionerv1.Need{}},
		},
	})
	for _, item := range out.GetPlans()[0].GetItems() {
		if b := item.GetBucket(); b != nil {
			fmt.Printf("%s:%s from %s key %s\n", item.GetKind(), item.GetName(), b.GetBucket(), b.GetKey())
		} else {
			fmt.Printf("%s:%s asked of %s\n", item.GetKind(), item.GetName(), item.GetVerb().GetSubject())
		}
	}
	for _, p := range out.GetProvisions() {
		fmt.Printf("provision: %s writes %s in %s\n", p.GetProvider(), p.GetKey(), p.GetBucket())
	}
	for _, r := range out.GetRefusals() {
		fmt.Printf("refused %s: %s\n", r.GetKey(), r.GetDetail())
	}
	// Output:
	// bound:db from pg_bound key ace.web.db.ro
	// port:http from mesh-controller_assignments key ace.web
	// secret:token asked of mesh-vault.secret
	// provision: pg writes ace.web.db.ro in pg_bound
	// refused ace.web.gpu.cuda: no registry entry answers kind "gpu"
}

// A caller that encodes each composition and drops it reuses one arena: the
// composition's items are made in it, and made again after Reset.
func ExampleArena() {
	entries := map[string]*provisionerv1.RegistryEntry{}
	for _, e := range registry.Table() {
		entries[e.GetKind()] = e
	}
	sources := compose.Sources{Registry: func(kind string) *provisionerv1.RegistryEntry { return entries[kind] }}
	arena := new(compose.Arena)
	for _, node := range []string{"ace", "novox"} {
		out := compose.Compose(compose.Input{
			Node: node, Sources: sources, Arena: arena,
			Needs: []*provisionerv1.NeedRecord{{Node: node, Module: "web", Kind: "port", Name: "http", Need: &provisionerv1.Need{}}},
		})
		encoded, err := proto.Marshal(out)
		if err != nil {
			panic(err)
		}
		// Nothing reads out once it is encoded: the arena is reset for the
		// next node's composition.
		arena.Reset()
		decoded := &provisionerv1.ComposeResponse{}
		if err := proto.Unmarshal(encoded, decoded); err != nil {
			panic(err)
		}
		fmt.Println(decoded.GetPlans()[0].GetItems()[0].GetBucket().GetKey())
	}
	// Output:
	// ace.web
	// novox.web
}

// A composition's digest says whether what the node must apply changed: a
// need or an item written again unchanged, at a new revision, leaves it as
// it was, and a changed item changes it. Its value is part of the contract
// (instances of different versions give equal compositions equal digests),
// pinned here and in the conformance cases.
func ExampleDigest() {
	entries := map[string]*provisionerv1.RegistryEntry{}
	for _, e := range registry.Table() {
		entries[e.GetKind()] = e
	}
	input := func(revision uint64) compose.Input {
		return compose.Input{
			Node:    "ace",
			Sources: compose.Sources{Registry: func(kind string) *provisionerv1.RegistryEntry { return entries[kind] }},
			Needs: []*provisionerv1.NeedRecord{
				{Node: "ace", Module: "web", Kind: "bound", Name: "db", Revision: revision, Need: &provisionerv1.Need{Provider: "pg", Local: "ro"}},
				{Node: "ace", Module: "web", Kind: "gpu", Name: "cuda", Revision: revision, Need: &provisionerv1.Need{}},
				{Node: "ace", Module: "web", Kind: "port", Name: "http", Revision: revision, Need: &provisionerv1.Need{}},
				{Node: "ace", Module: "web", Kind: "secret", Name: "token", Revision: revision, Need: &provisionerv1.Need{}},
				{Node: "ace", Module: "web", Kind: "shell", Name: "zsh:normal", Revision: revision, Need: &provisionerv1.Need{}},
			},
			Items: []*provisionerv1.CollectRecord{
				{Node: "ace", Collection: "shell:zsh:normal", Contributor: "web", Revision: revision,
					Item: &provisionerv1.CollectItem{Value: "export WEB_HOME=/srv/web", Order: 1, Attributes: map[string]string{"b": "2", "a": "1"}}},
			},
		}
	}
	fmt.Println(compose.Digest(compose.Compose(input(7))))
	fmt.Println(compose.Digest(compose.Compose(input(8))))
	changed := input(7)
	changed.Items[0].Item.Order = 2
	fmt.Println(compose.Digest(compose.Compose(changed)))
	// Output:
	// xxh3:2ddc07ef792b2797687a6863a0017850
	// xxh3:2ddc07ef792b2797687a6863a0017850
	// xxh3:cea6a0e94a3dc6c0541592c9a6d964f3
}
