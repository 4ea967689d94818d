package plans_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/compose"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/registry"
	"github.com/novox/mesh-provisioner/service/plans"
)

// meshCopy loads a synthetic mesh of cfg into a copy, as the service's
// watchers would, and returns it with the mesh and the copy's last
// revision of the needs and applied buckets.
func meshCopy(tb testing.TB, cfg synth.Config) (*mirror.Mirror, *synth.Mesh, uint64) {
	tb.Helper()
	mesh := synth.Generate(cfg)
	capture, err := mesh.Capture(registry.Table())
	if err != nil {
		tb.Fatal(err)
	}
	m, err := mirror.Load(capture)
	if err != nil {
		tb.Fatal(err)
	}
	return m, mesh, max(m.Needs.Revision(), m.Applied.Revision())
}

// writer changes one node's needs and builds in the copy, each change at
// the next revision.
type writer struct {
	m        *mirror.Mirror
	node     string
	revision uint64
}

func (w *writer) putNeed(tb testing.TB, module, kind, name string, need *provisionerv1.Need) {
	key, err := keys.NeedKey{Node: w.node, Module: module, Kind: kind, Name: name}.Key()
	if err != nil {
		tb.Fatal(err)
	}
	value, err := proto.Marshal(need)
	if err != nil {
		tb.Fatal(err)
	}
	w.revision++
	w.m.Needs.Apply(key, value, w.revision, false)
}

func (w *writer) deleteNeed(tb testing.TB, module, kind, name string) {
	key, err := keys.NeedKey{Node: w.node, Module: module, Kind: kind, Name: name}.Key()
	if err != nil {
		tb.Fatal(err)
	}
	w.revision++
	w.m.Needs.Apply(key, nil, w.revision, true)
}

func (w *writer) putBuilds(tb testing.TB, module, wanted, newest string) {
	key, err := keys.AppliedKey{Node: w.node, Module: module}.Key()
	if err != nil {
		tb.Fatal(err)
	}
	value, err := proto.Marshal(&provisionerv1.Applied{WantedBuild: wanted, NewestBuild: newest})
	if err != nil {
		tb.Fatal(err)
	}
	w.revision++
	w.m.Applied.Apply(key, value, w.revision, false)
}

// A node's plan composed again module by module, as the writer keeps it,
// is the plan composed whole, through needs written, rewritten unchanged
// and deleted, modules made and emptied, builds moved, values that do not
// decode, and registry entries and providers' manifests changed (the
// modules naming them forgotten), a collection template among them.
func TestComposeChangedDigestsAsCompose(t *testing.T) {
	t.Parallel()
	m, mesh, revision := meshCopy(t, synth.Config{Nodes: 2, Modules: 8, Needs: 6, Builds: 50, Bound: 50})
	node := mesh.Nodes[0]
	w := &writer{m: m, node: node.Name, revision: revision}
	rng := rand.New(rand.NewPCG(1, 2))
	modules := []string{"m0", "m1", "m1-a", "m10", node.Needs[0].Module, node.Needs[len(node.Needs)-1].Module}
	kinds := []string{"port", "secret", "config", "bound", "shell", "nobody"}
	entries := map[string]*provisionerv1.RegistryEntry{}
	for _, e := range registry.Table() {
		entries[e.GetKind()] = e
	}
	registryRevision, manifestRevision := m.Registry.Revision(), m.Manifests.Revision()
	var kept *plans.Kept
	for step := range 400 {
		module, kind := modules[rng.IntN(len(modules))], kinds[rng.IntN(len(kinds))]
		name := fmt.Sprintf("n%d", rng.IntN(4))
		what := rng.IntN(10)
		switch {
		case step%11 == 5: // a registry entry goes or comes back, as the writer then forgets
			registryRevision++
			if entry, ok := entries[kind]; ok && m.RegistryEntry(kind) == nil {
				value, _ := proto.Marshal(entry)
				m.Registry.Apply(kind, value, registryRevision, false)
			} else {
				m.Registry.Apply(kind, nil, registryRevision, true)
			}
			kept = kept.Forgetting([]string{kind}, nil)
		case step%17 == 3: // the shell entry's template names another collection, one with items or none
			shell := proto.Clone(entries["shell"]).(*provisionerv1.RegistryEntry)
			if current := m.RegistryEntry("shell"); current != nil && current.GetBucket().GetCollection() != "plugins" {
				shell.GetBucket().Collection = "plugins"
			}
			value, _ := proto.Marshal(shell)
			registryRevision++
			m.Registry.Apply("shell", value, registryRevision, false)
			kept = kept.Forgetting([]string{"shell"}, nil)
		case step%13 == 7: // a provider's manifest, of another node
			provider := []string{"pg", "redis"}[rng.IntN(2)]
			key, err := keys.ManifestKey{Node: mesh.Nodes[1].Name, Provider: provider}.Key()
			if err != nil {
				t.Fatal(err)
			}
			value, _ := proto.Marshal(&provisionerv1.Manifest{Offers: []*provisionerv1.Offer{{Provision: name}}})
			manifestRevision++
			m.Manifests.Apply(key, value, manifestRevision, false)
			kept = kept.Forgetting(nil, []string{provider})
		case what < 5:
			w.putNeed(t, module, kind, name, &provisionerv1.Need{Placeholder: fmt.Sprintf("${%s:%s}", kind, name), Provider: []string{"", "pg", "redis"}[rng.IntN(3)], Builds: [][]string{nil, {"b1"}, {"b2"}}[rng.IntN(3)]})
		case what < 8:
			w.deleteNeed(t, module, kind, name)
		case step%37 == 36: // a value that does not decode: a malformed need
			key, err := keys.NeedKey{Node: node.Name, Module: module, Kind: kind, Name: name}.Key()
			if err != nil {
				t.Fatal(err)
			}
			w.revision++
			m.Needs.Apply(key, []byte{0xff, 0xff}, w.revision, false)
		case what < 9 && step%50 == 49:
			for _, module := range modules { // most modules at once
				w.putBuilds(t, module, "b1", []string{"", "b2"}[rng.IntN(2)])
			}
		case what < 9:
			w.putBuilds(t, module, []string{"", "b1"}[rng.IntN(2)], []string{"", "b2"}[rng.IntN(2)])
		default:
			n := node.Needs[rng.IntN(len(node.Needs))]
			w.putNeed(t, n.Module, n.Kind, n.Name, n.Need) // written again unchanged
		}
		var got plans.Plan
		got, kept = plans.ComposeChanged(m, node.Name, kept)
		if want := answerDigest(m, node.Name); got.Digest != want {
			t.Fatalf("step %d: composed module by module %s, the answer's %s", step, got.Digest, want)
		}
	}
	if kept.Modules() == 0 {
		t.Fatal("nothing kept")
	}
}

// answerDigest is the digest of node's composition made whole, as its
// compose answer carries it.
func answerDigest(m *mirror.Mirror, node string) string {
	entries, _, _ := m.Needs.Group(node)
	items, _, _ := m.Collect.Group(node)
	builds, _ := m.BuildsOf(node)
	needs, malformed := mirror.SplitNeeds(nil, nil, entries)
	in := compose.Input{Node: node, Sources: m.Sources(&builds), Needs: needs, Malformed: malformed, Items: mirror.WellFormed(nil, items)}
	return compose.Digest(compose.Compose(in))
}

// BenchmarkNeedWritten is the CPU from a need written to its node's new
// digest, for a node of 60 modules x 25 needs: composed again module by
// module (ComposeChanged, what the writer does) against composed whole
// (Compose), in the same run. Each op writes the need into the copy, as
// its watcher would, then digests.
//
//	go test ./service/plans -run '^$' -bench BenchmarkNeedWritten
func BenchmarkNeedWritten(b *testing.B) {
	m, mesh, revision := meshCopy(b, synth.Config{Nodes: 1, Modules: 60, Needs: 25, Bound: 50})
	node := mesh.Nodes[0]
	w := &writer{m: m, node: node.Name, revision: revision}
	write := func(i int) {
		n := node.Needs[(i*31)%len(node.Needs)]
		need := proto.Clone(n.Need).(*provisionerv1.Need)
		need.Local = fmt.Sprint(i % 2)
		w.putNeed(b, n.Module, n.Kind, n.Name, need)
	}
	var whole, byModule time.Duration
	b.Run("whole", func(b *testing.B) {
		i := 0
		for b.Loop() {
			write(i)
			plans.Compose(m, node.Name)
			i++
		}
		whole = b.Elapsed() / time.Duration(i)
	})
	b.Run("by module", func(b *testing.B) {
		_, kept := plans.ComposeChanged(m, node.Name, nil)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			write(i)
			_, kept = plans.ComposeChanged(m, node.Name, kept)
			i++
		}
		byModule = b.Elapsed() / time.Duration(i)
	})
	if whole > 0 && byModule > 0 {
		fmt.Printf("BenchmarkNeedWritten: a 60 x 25 node's new digest after a need written: %s by module, %s whole (x%.2f)\n",
			byModule, whole, float64(byModule)/float64(whole))
	}
}

// BenchmarkRegistryEntryChanged is the CPU from a registry entry changed to
// a 60 x 25 node's new digest: the modules whose needs are of its kind
// composed again (Kept.Forgetting, what the writer does) against the node
// composed whole, for a kind one module names (a need of a kind no module
// of the synthetic mesh names, written to one) and for the one the most
// modules name. Each op takes the entry away or puts it back.
//
//	go test ./service/plans -run '^$' -bench BenchmarkRegistryEntryChanged
func BenchmarkRegistryEntryChanged(b *testing.B) {
	m, mesh, _ := meshCopy(b, synth.Config{Nodes: 1, Modules: 60, Needs: 25, Bound: 50})
	node := mesh.Nodes[0]
	modulesOf := map[string]map[string]bool{}
	for _, n := range node.Needs {
		if modulesOf[n.Kind] == nil {
			modulesOf[n.Kind] = map[string]bool{}
		}
		modulesOf[n.Kind][n.Module] = true
	}
	var most string
	for kind, modules := range modulesOf {
		if m.RegistryEntry(kind) != nil && (most == "" || len(modules) > len(modulesOf[most])) {
			most = kind
		}
	}
	// A kind of the registry's shape that one module names: the synthetic
	// mesh names each kind in most modules.
	const fewest = "rare"
	rare := proto.Clone(m.RegistryEntry(most)).(*provisionerv1.RegistryEntry)
	rare.Kind = fewest
	revision := m.Registry.Revision() + 1
	value, _ := proto.Marshal(rare)
	m.Registry.Apply(fewest, value, revision, false)
	w := &writer{m: m, node: node.Name, revision: max(m.Needs.Revision(), m.Applied.Revision())}
	w.putNeed(b, node.Needs[0].Module, fewest, "one", &provisionerv1.Need{Placeholder: "${rare:one}"})
	modulesOf[fewest] = map[string]bool{node.Needs[0].Module: true}
	toggle := func(kind string, entry []byte) {
		revision++
		if m.RegistryEntry(kind) == nil {
			m.Registry.Apply(kind, entry, revision, false)
		} else {
			m.Registry.Apply(kind, nil, revision, true)
		}
	}
	for _, kind := range []string{fewest, most} {
		entry, _ := proto.Marshal(m.RegistryEntry(kind))
		var whole, byModule time.Duration
		b.Run(kind+"/whole", func(b *testing.B) {
			for b.Loop() {
				toggle(kind, entry)
				plans.Compose(m, node.Name)
			}
			whole = b.Elapsed() / time.Duration(b.N)
		})
		b.Run(kind+"/by module", func(b *testing.B) {
			_, kept := plans.ComposeChanged(m, node.Name, nil)
			for b.Loop() {
				toggle(kind, entry)
				_, kept = plans.ComposeChanged(m, node.Name, kept.Forgetting([]string{kind}, nil))
			}
			byModule = b.Elapsed() / time.Duration(b.N)
		})
		if m.RegistryEntry(kind) == nil {
			toggle(kind, entry)
		}
		if whole > 0 && byModule > 0 {
			fmt.Printf("BenchmarkRegistryEntryChanged: kind %s, named by %d of 60 modules: %s by module, %s whole (x%.2f)\n",
				kind, len(modulesOf[kind]), byModule, whole, float64(byModule)/float64(whole))
		}
	}
}

// BenchmarkSmallNodeChanged is the writer's cost a node of bench-scale's
// mesh (10 modules x 3 needs) when a registry entry nearly every node
// names changes: each node composed again with that kind forgotten, as a
// pass does.
//
//	go test ./service/plans -run '^$' -bench BenchmarkSmallNodeChanged
func BenchmarkSmallNodeChanged(b *testing.B) {
	benchNodeChanged(b, synth.Config{Nodes: 2000, Modules: 10, Needs: 3}, "config")
}

// BenchmarkMidNodeChanged is BenchmarkSmallNodeChanged for a node of
// bench-plans' mesh (30 modules x 10 needs) and the kind its registry
// change renames a bucket of ("access", which about two modules in five
// of such a node name): the modules that name it composed again.
//
//	go test ./service/plans -run '^$' -bench BenchmarkMidNodeChanged
func BenchmarkMidNodeChanged(b *testing.B) {
	benchNodeChanged(b, synth.Config{Nodes: 1000, Modules: 30, Needs: 10}, "access")
}

// benchNodeChanged composes the nodes of a mesh of cfg again, one after
// the other, each with kind forgotten, as a pass does once its registry
// entry changed.
func benchNodeChanged(b *testing.B, cfg synth.Config, kind string) {
	m, mesh, _ := meshCopy(b, cfg)
	kept := make([]*plans.Kept, len(mesh.Nodes))
	for i, n := range mesh.Nodes {
		_, kept[i] = plans.ComposeChanged(m, n.Name, nil)
	}
	i := 0
	for b.Loop() {
		j := i % len(mesh.Nodes)
		_, kept[j] = plans.ComposeChanged(m, mesh.Nodes[j].Name, kept[j].Forgetting([]string{kind}, nil))
		i++
	}
}
