package compose_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/novox/mesh-provisioner/compose"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/registry"
)

// composeCase is a composition and what it must be.
type composeCase struct {
	name    string
	module  string
	needs   []*provisionerv1.NeedRecord
	bad     []*provisionerv1.MalformedKey
	sources compose.Sources
	// entries replace the registry table's of their kinds.
	entries []*provisionerv1.RegistryEntry
	want    *provisionerv1.ComposeResponse
}

// input returns the case's input, read from the registry's table, with
// the collection items every case has.
func (tt composeCase) input(arena *compose.Arena) compose.Input {
	entries := map[string]*provisionerv1.RegistryEntry{}
	for _, e := range append(registry.Table(), tt.entries...) {
		entries[e.GetKind()] = e
	}
	sources := tt.sources
	sources.Registry = func(k string) *provisionerv1.RegistryEntry { return entries[k] }
	items := []*provisionerv1.CollectRecord{{Node: "ace", Collection: "shell:zsh:normal", Contributor: "web", Item: &provisionerv1.CollectItem{Value: "a"}, Revision: 3}}
	return compose.Input{Node: "ace", Module: tt.module, Needs: tt.needs, Malformed: tt.bad, Items: items, Sources: sources, Arena: arena}
}

// caseBuilds are the cases' modules' builds: web is between builds b1
// (wanted) and b2 (newest); db is at b1.
func caseBuilds(_, module string) (string, string) {
	switch module {
	case "web":
		return "b1", "b2"
	case "db":
		return "b1", ""
	}
	return "", ""
}

func composeCases() []composeCase {
	need := func(module, kind, name string, n *provisionerv1.Need) *provisionerv1.NeedRecord {
		if n == nil {
			n = &provisionerv1.Need{}
		}
		return &provisionerv1.NeedRecord{Node: "ace", Module: module, Kind: kind, Name: name, Need: n, Revision: 7}
	}
	bucket := func(b, k string) *provisionerv1.PlanItem_Bucket {
		return &provisionerv1.PlanItem_Bucket{Bucket: &provisionerv1.BucketKey{Bucket: b, Key: k}}
	}
	builds := caseBuilds
	pgManifest := &provisionerv1.ManifestRecord{Node: "g14", Provider: "pg", Digest: "sha256:aa",
		Manifest: &provisionerv1.Manifest{Offers: []*provisionerv1.Offer{{Provision: "ro"}, {Provision: "db"}}}}
	manifest := func(provider string) *provisionerv1.ManifestRecord {
		if provider == "pg" {
			return pgManifest
		}
		return nil
	}
	bound := func(bucket, key string) uint64 {
		if key == "ace.web.db" || key == "ace.web.cache" {
			return 41
		}
		return 0
	}
	return []composeCase{
		{
			name: "a module between builds: each need once, with the builds whose plan holds it",
			needs: []*provisionerv1.NeedRecord{
				need("db", "port", "admin", &provisionerv1.Need{Builds: []string{"b0"}}),
				need("db", "port", "sql", nil),
				need("web", "port", "http", nil),
				need("web", "port", "old", &provisionerv1.Need{Builds: []string{"b0", "b1"}}),
				need("web", "port", "quic", &provisionerv1.Need{Builds: []string{"b2", "b3"}}),
				need("web", "port", "gone", &provisionerv1.Need{Builds: []string{"b0"}}),
			},
			sources: compose.Sources{Builds: builds},
			want: &provisionerv1.ComposeResponse{Node: "ace", Plans: []*provisionerv1.ModulePlan{
				{Module: "db", WantedBuild: "b1", NewestBuild: "b1", Items: []*provisionerv1.PlanItem{
					{Kind: "port", Name: "sql", Owner: "mesh-controller", Location: bucket("mesh-controller_assignments", "ace.db"), Revision: 7, Builds: []string{"b1"}},
				}},
				{Module: "web", WantedBuild: "b1", NewestBuild: "b2", Items: []*provisionerv1.PlanItem{
					{Kind: "port", Name: "http", Owner: "mesh-controller", Location: bucket("mesh-controller_assignments", "ace.web"), Revision: 7, Builds: []string{"b1", "b2"}},
					{Kind: "port", Name: "old", Owner: "mesh-controller", Location: bucket("mesh-controller_assignments", "ace.web"), Revision: 7, Builds: []string{"b1"}},
					{Kind: "port", Name: "quic", Owner: "mesh-controller", Location: bucket("mesh-controller_assignments", "ace.web"), Revision: 7, Builds: []string{"b2"}},
				}},
			}},
		},
		{
			name: "provisions bound and pending, offered by the provider's manifest",
			needs: []*provisionerv1.NeedRecord{
				need("web", "bound", "db", &provisionerv1.Need{Provider: "pg"}),
				need("web", "bound", "replica", &provisionerv1.Need{Provider: "pg", Provision: "ro"}),
			},
			sources: compose.Sources{Bound: bound, Manifest: manifest},
			want: &provisionerv1.ComposeResponse{Node: "ace",
				Plans: []*provisionerv1.ModulePlan{{Module: "web", Items: []*provisionerv1.PlanItem{
					{Kind: "bound", Name: "db", Owner: "pg", Location: bucket("pg_bound", "ace.web.db"), Revision: 7},
					{Kind: "bound", Name: "replica", Owner: "pg", Location: bucket("pg_bound", "ace.web.ro"), Revision: 7},
				}}},
				Provisions: []*provisionerv1.Provision{
					{Provider: "pg", Bucket: "pg_bound", Key: "ace.web.db", Module: "web", Provision: "db", Name: "db", BoundRevision: 41, ManifestDigest: "sha256:aa"},
					{Provider: "pg", Bucket: "pg_bound", Key: "ace.web.ro", Module: "web", Provision: "ro", Name: "replica", ManifestDigest: "sha256:aa"},
				},
			},
		},
		{
			name: "a provision not offered, and one bound by a provider without a manifest, are refused",
			needs: []*provisionerv1.NeedRecord{
				need("web", "bound", "cache", &provisionerv1.Need{Provider: "redis"}),
				need("web", "bound", "queue", &provisionerv1.Need{Provider: "pg"}),
				need("web", "bound", "stream", &provisionerv1.Need{Provider: "redis"}),
			},
			sources: compose.Sources{Bound: bound, Manifest: manifest},
			want: &provisionerv1.ComposeResponse{Node: "ace",
				Plans: []*provisionerv1.ModulePlan{{Module: "web", Items: []*provisionerv1.PlanItem{
					{Kind: "bound", Name: "stream", Owner: "redis", Location: bucket("redis_bound", "ace.web.stream"), Revision: 7},
				}}},
				Provisions: []*provisionerv1.Provision{
					{Provider: "redis", Bucket: "redis_bound", Key: "ace.web.stream", Module: "web", Provision: "stream", Name: "stream"},
				},
				Refusals: []*provisionerv1.Refusal{
					{Key: "ace.web.bound.cache", Module: "web", Kind: "bound", Name: "cache", Reason: provisionerv1.RefusalReason_REFUSAL_REASON_NO_MANIFEST,
						Detail: `provider "redis" bound key ace.web.cache of redis_bound (revision 41) but has declared no manifest: a node that runs it must write its manifest to mesh-provisioner_manifests`},
					{Key: "ace.web.bound.queue", Module: "web", Kind: "bound", Name: "queue", Reason: provisionerv1.RefusalReason_REFUSAL_REASON_NOT_OFFERED,
						Detail: `provider "pg" does not offer provision "queue": its manifest (sha256:aa) offers "db", "ro"`},
				},
			},
		},
		{
			name:  "a placement and a collection with its items",
			needs: []*provisionerv1.NeedRecord{need("web", "port", "http", nil), need("web", "shell", "zsh:normal", nil)},
			want: &provisionerv1.ComposeResponse{Node: "ace", Plans: []*provisionerv1.ModulePlan{{Module: "web", Items: []*provisionerv1.PlanItem{
				{Kind: "port", Name: "http", Owner: "mesh-controller", Location: bucket("mesh-controller_assignments", "ace.web"), Revision: 7},
				{Kind: "shell", Name: "zsh:normal", Owner: "mesh-provisioner", Location: bucket("mesh-provisioner_collect", "ace.shell=3Azsh=3Anormal.*"),
					Collection: "shell:zsh:normal", Revision: 7, Items: []*provisionerv1.CollectedItem{{Contributor: "web", Item: &provisionerv1.CollectItem{Value: "a"}, Revision: 3}}},
			}}}},
		},
		{
			name:  "a bound need provisions its provider",
			needs: []*provisionerv1.NeedRecord{need("web", "bound", "db", &provisionerv1.Need{Provider: "pg"})},
			want: &provisionerv1.ComposeResponse{Node: "ace",
				Plans:      []*provisionerv1.ModulePlan{{Module: "web", Items: []*provisionerv1.PlanItem{{Kind: "bound", Name: "db", Owner: "pg", Location: bucket("pg_bound", "ace.web.db"), Revision: 7}}}},
				Provisions: []*provisionerv1.Provision{{Provider: "pg", Bucket: "pg_bound", Key: "ace.web.db", Module: "web", Provision: "db", Name: "db"}},
			},
		},
		{
			name:  "a provider's bucket whose keys do not begin with the node is refused",
			needs: []*provisionerv1.NeedRecord{need("web", "bound", "db", &provisionerv1.Need{Provider: "pg"})},
			entries: []*provisionerv1.RegistryEntry{{Kind: "bound", Owner: "<provider>", Description: "d",
				Source: &provisionerv1.RegistryEntry_Bucket{Bucket: &provisionerv1.BucketSource{Bucket: "<provider>_bound", KeyShape: "<module>.<node>.<provision>"}}}},
			want: &provisionerv1.ComposeResponse{Node: "ace", Refusals: []*provisionerv1.Refusal{{
				Key: "ace.web.bound.db", Module: "web", Kind: "bound", Name: "db", Reason: provisionerv1.RefusalReason_REFUSAL_REASON_UNFILLABLE_KEY_SHAPE,
				Detail: `the registry entry of kind "bound" is unusable: key shape <module>.<node>.<provision> of a bucket each provider keeps does not begin with <node>`,
			}}},
		},
		{
			name:   "a module alone, an unknown kind refused",
			module: "db",
			needs:  []*provisionerv1.NeedRecord{need("db", "nosuch", "x", nil), need("web", "port", "http", nil)},
			want: &provisionerv1.ComposeResponse{Node: "ace", Module: "db", Refusals: []*provisionerv1.Refusal{{
				Key: "ace.db.nosuch.x", Module: "db", Kind: "nosuch", Name: "x",
				Reason: provisionerv1.RefusalReason_REFUSAL_REASON_NO_DOMAIN, Detail: `no registry entry answers kind "nosuch"`,
			}}},
		},
		{
			name: "a malformed need key is refused with its parts",
			bad:  []*provisionerv1.MalformedKey{{Bucket: "mesh-provisioner_needs", Key: "ace.web.port", Reason: "too short"}},
			want: &provisionerv1.ComposeResponse{Node: "ace", Refusals: []*provisionerv1.Refusal{{
				Key: "ace.web.port", Module: "web", Kind: "port",
				Reason: provisionerv1.RefusalReason_REFUSAL_REASON_MALFORMED_NEED, Detail: "too short",
			}}},
		},
	}
}

var ignorePhases = protocmp.IgnoreFields(&provisionerv1.ComposeResponse{}, "phases")

func TestCompose(t *testing.T) {
	t.Parallel()
	for _, tt := range composeCases() {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := compose.Compose(tt.input(nil))
			if diff := cmp.Diff(tt.want, got, protocmp.Transform(), ignorePhases); diff != "" {
				t.Errorf("Compose (-want +got):\n%s", diff)
			}
		})
	}
}

// One arena, reset after each composition, makes every case's messages
// anew, and digests each as Digest does: none keeps a field, or a
// collection's sum, of the case composed before it, whichever that was.
func TestComposeWithAReusedArena(t *testing.T) {
	t.Parallel()
	cases := composeCases()
	arena := new(compose.Arena)
	for _, order := range []string{"in order", "reversed"} {
		for _, tt := range cases {
			got := compose.Compose(tt.input(arena))
			if diff := cmp.Diff(tt.want, got, protocmp.Transform(), ignorePhases); diff != "" {
				t.Errorf("%s, %s: Compose with the arena reset (-want +got):\n%s", order, tt.name, diff)
			}
			if want, got := compose.Digest(tt.want), arena.Digest(got); got != want {
				t.Errorf("%s, %s: the arena's Digest = %s, want Digest's %s", order, tt.name, got, want)
			}
			arena.Reset()
		}
		slices.Reverse(cases)
	}
}

// An arena not reset keeps every composition made in it as it was made:
// many compositions, enough to fill the arena's arrays and replace them.
func TestArenaKeepsCompositionsUntilReset(t *testing.T) {
	t.Parallel()
	cases := composeCases()
	arena := new(compose.Arena)
	var made []*provisionerv1.ComposeResponse
	for range 50 {
		for _, tt := range cases {
			made = append(made, compose.Compose(tt.input(arena)))
		}
	}
	for i, got := range made {
		tt := cases[i%len(cases)]
		if diff := cmp.Diff(tt.want, got, protocmp.Transform(), ignorePhases); diff != "" {
			t.Fatalf("%s, composition %d of the arena, read once %d more were made (-want +got):\n%s", tt.name, i, len(made)-1-i, diff)
		}
	}
}

// A composition made a module at a time by one Composer is the composition
// of all the needs at once, and its parts' DigestParts digest it as Digest
// digests it whole: each case, and the needs of every case at once, with
// the first case's sources.
func TestComposeInParts(t *testing.T) {
	t.Parallel()
	cases := composeCases()
	all := composeCase{name: "every case's needs", sources: cases[0].sources}
	seen := map[string]bool{}
	for _, tt := range cases {
		if tt.module != "" {
			continue
		}
		for _, n := range tt.needs {
			if key := needKey(t, n); !seen[key] {
				seen[key] = true
				all.needs = append(all.needs, n)
			}
		}
		all.bad = append(all.bad, tt.bad...)
	}
	slices.SortFunc(all.needs, func(a, b *provisionerv1.NeedRecord) int { return strings.Compare(needKey(t, a), needKey(t, b)) })
	for _, tt := range append(cases, all) {
		if tt.module != "" {
			continue
		}
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			whole := compose.Compose(tt.input(nil))
			composer := compose.NewComposer(tt.input(nil))
			got := &provisionerv1.ComposeResponse{Node: whole.GetNode()}
			var digests []compose.DigestPart
			var digester compose.PartDigester
			modules := moduleParts(tt.needs, tt.bad)
			for _, m := range modules {
				part := composer.Part(m.needs, m.bad)
				got.Plans = append(got.Plans, part.GetPlans()...)
				got.Provisions = append(got.Provisions, part.GetProvisions()...)
				got.Refusals = append(got.Refusals, part.GetRefusals()...)
				digests = append(digests, digester.Part(part))
			}
			if tt.name == all.name && len(modules) < 3 {
				t.Fatalf("%d parts: the cases' needs are of too few modules to test parts", len(modules))
			}
			if diff := cmp.Diff(whole, got, protocmp.Transform(), ignorePhases); diff != "" {
				t.Errorf("parts, one a module (-whole +parts):\n%s", diff)
			}
			if d, want := compose.DigestOf(whole.GetNode(), "", digests...), compose.Digest(whole); d != want {
				t.Errorf("DigestOf the parts %s, Digest of the whole %s", d, want)
			}
		})
	}
}

// moduleParts splits needs and malformed keys, each in key order, into
// runs of one module, in key order.
func moduleParts(needs []*provisionerv1.NeedRecord, bad []*provisionerv1.MalformedKey) []modulePart {
	var parts []modulePart
	at := func(module string) *modulePart {
		if len(parts) == 0 || parts[len(parts)-1].module != module {
			parts = append(parts, modulePart{module: module})
		}
		return &parts[len(parts)-1]
	}
	for _, n := range needs {
		p := at(n.GetModule())
		p.needs = append(p.needs, n)
	}
	for _, b := range bad { // after every need: a module part of its own
		_, rest, _ := strings.Cut(b.GetKey(), ".")
		module, _, _ := strings.Cut(rest, ".")
		p := at("malformed " + module)
		p.bad = append(p.bad, b)
	}
	return parts
}

type modulePart struct {
	module string
	needs  []*provisionerv1.NeedRecord
	bad    []*provisionerv1.MalformedKey
}

func needKey(t *testing.T, n *provisionerv1.NeedRecord) string {
	t.Helper()
	key, err := keys.NeedKey{Node: n.GetNode(), Module: n.GetModule(), Kind: n.GetKind(), Name: n.GetName()}.Key()
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// Each plan item that reads a collection lists that collection's items in
// the order given, whether the items come in key order (each collection's
// together) or not.
func TestComposeListsEachCollectionsItems(t *testing.T) {
	t.Parallel()
	item := func(collection, contributor string) *provisionerv1.CollectRecord {
		return &provisionerv1.CollectRecord{Node: "ace", Collection: collection, Contributor: contributor, Item: &provisionerv1.CollectItem{Value: contributor}}
	}
	needs := []*provisionerv1.NeedRecord{
		{Node: "ace", Module: "db", Kind: "shell", Name: "bash", Need: &provisionerv1.Need{}},
		{Node: "ace", Module: "web", Kind: "shell", Name: "bash", Need: &provisionerv1.Need{}},
		{Node: "ace", Module: "web", Kind: "shell", Name: "zsh", Need: &provisionerv1.Need{}},
	}
	entries := map[string]*provisionerv1.RegistryEntry{}
	for _, e := range registry.Table() {
		entries[e.GetKind()] = e
	}
	for _, tt := range []struct {
		name  string
		items []*provisionerv1.CollectRecord
		want  map[string][]string // contributors by collection
	}{
		{"in key order", []*provisionerv1.CollectRecord{item("shell:bash", "db"), item("shell:bash", "web"), item("shell:zsh", "web")},
			map[string][]string{"shell:bash": {"db", "web"}, "shell:zsh": {"web"}}},
		{"a collection met again", []*provisionerv1.CollectRecord{item("shell:bash", "db"), item("shell:zsh", "web"), item("shell:bash", "web"), item("shell:zsh", "db")},
			map[string][]string{"shell:bash": {"db", "web"}, "shell:zsh": {"web", "db"}}},
		{"none", nil, map[string][]string{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := compose.Compose(compose.Input{Node: "ace", Needs: needs, Items: tt.items, Sources: compose.Sources{Registry: func(k string) *provisionerv1.RegistryEntry { return entries[k] }}})
			if n := len(got.GetPlans()); n != 2 {
				t.Fatalf("%d plans, want db's and web's", n)
			}
			for _, plan := range got.GetPlans() {
				for _, it := range plan.GetItems() {
					var contributors []string
					for _, c := range it.GetItems() {
						contributors = append(contributors, c.GetContributor())
					}
					if diff := cmp.Diff(tt.want[it.GetCollection()], contributors); diff != "" {
						t.Errorf("%s's item of %s lists (-want +got):\n%s", plan.GetModule(), it.GetCollection(), diff)
					}
				}
			}
		})
	}
}

// An arena keeps its entries' providers' buckets from one composition to
// the next, but only so many: each need names the provider it likes.
func TestAnArenaKeepsSomeProvidersBuckets(t *testing.T) {
	t.Parallel()
	entries := map[string]*provisionerv1.RegistryEntry{}
	for _, e := range registry.Table() {
		entries[e.GetKind()] = e
	}
	in := compose.Input{Node: "ace", Arena: new(compose.Arena), Sources: compose.Sources{Registry: func(k string) *provisionerv1.RegistryEntry { return entries[k] }}}
	const providers = 3 * compose.MaxProviderBuckets
	for i := range providers {
		in.Needs = append(in.Needs, &provisionerv1.NeedRecord{Node: "ace", Module: "web", Kind: "bound", Name: fmt.Sprintf("n%04d", i), Need: &provisionerv1.Need{Provider: fmt.Sprintf("p%04d", i)}})
	}
	got := compose.Compose(in)
	for i, p := range got.GetProvisions() {
		if want := fmt.Sprintf("p%04d_bound", i); p.GetBucket() != want {
			t.Fatalf("provision %d is in bucket %s, want %s", i, p.GetBucket(), want)
		}
	}
	if len(got.GetProvisions()) != providers {
		t.Fatalf("%d provisions, want %d", len(got.GetProvisions()), providers)
	}
	if n := compose.ProviderBucketsKept(in.Arena); n > compose.MaxProviderBuckets {
		t.Errorf("the arena keeps %d providers' buckets, more than %d", n, compose.MaxProviderBuckets)
	}
}
