package compose_test

import (
	"slices"
	"testing"

	"github.com/novox/mesh-provisioner/compose"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/registry"
)

// A PlanDigester digests every case as Digest digests its composition, one
// PlanDigester for every case in turn, in order and reversed: nothing of a
// case digested before it is in another's digest.
func TestPlanDigesterDigestsAsDigest(t *testing.T) {
	t.Parallel()
	cases := composeCases()
	// A module met again after another: needs out of key order make a
	// second plan of it.
	again := cases[0]
	again.name, again.needs = "a module met again", append(slices.Clone(cases[0].needs), cases[0].needs[0])
	cases = append(cases, again)
	var d compose.PlanDigester
	for _, order := range []string{"in order", "reversed"} {
		for _, tt := range cases {
			want := compose.Digest(compose.Compose(tt.input(nil)))
			if got := d.Digest(tt.input(nil)); got != want {
				t.Errorf("%s, %s: PlanDigester %s, Digest of the composition %s", order, tt.name, got, want)
			}
		}
		slices.Reverse(cases)
	}
}

// FuzzPlanDigest holds PlanDigester.Digest to Digest(Compose) for needs made
// of the fuzzer's bytes: each need is four bytes (its module, kind, name
// and what it names: provider, provision, local, builds), read against the
// registry's table, an entry of none, and sources that bind some keys, know
// some providers' manifests and put modules between builds.
//
//	go test ./compose -run '^$' -fuzz FuzzPlanDigest -fuzztime 30s
func FuzzPlanDigest(f *testing.F) {
	for _, seed := range [][]byte{
		{},
		{0, 0, 0, 0},                         // a need of the first kind
		{0, 2, 0, 1, 0, 2, 1, 1, 1, 2, 2, 3}, // bound needs: a provider bound, one not, a manifest offering none
		{0, 4, 0, 0, 0, 5, 1, 0, 1, 4, 2, 0}, // collections, read by two modules
		{1, 1, 0, 0, 2, 13, 0, 0},            // a verb, a kind nobody answers
		{0, 2, 0, 5, 0, 2, 0, 6, 0, 9, 0, 7}, // a bad provider token, builds named
		{2, 0, 0, 0, 0, 0, 0, 0, 2, 0, 1, 0}, // a module met again after another
		{1, 10, 0, 0, 1, 2, 0, 0, 1},         // one module's, malformed keys too
		[]byte("2800070020000000"),           // a plan going on past another module's refusal
	} {
		f.Add(seed)
	}
	kinds := []string{}
	for _, e := range registry.Table() {
		kinds = append(kinds, e.GetKind())
	}
	kinds = append(kinds, "unknown")
	modules := []string{"db", "web", "cache"}
	names := []string{"main", "admin", "db", "cache"}
	providers := []string{"pg", "redis", "nope", ""}
	items := []*provisionerv1.CollectRecord{
		{Node: "ace", Collection: "shell:zsh:normal", Contributor: "web", Item: &provisionerv1.CollectItem{Value: "a"}, Revision: 3},
		{Node: "ace", Collection: "main", Contributor: "db", Item: &provisionerv1.CollectItem{Value: "b", Attributes: map[string]string{"k": "v", "a": "z"}}, Revision: 4},
		{Node: "ace", Collection: "main", Contributor: "web", Item: &provisionerv1.CollectItem{Order: 2}, Revision: 5},
	}
	sources := compose.Sources{
		Builds: caseBuilds,
		Bound: func(_, key string) uint64 {
			if len(key)%3 == 0 {
				return uint64(len(key))
			}
			return 0
		},
		Manifest: func(provider string) *provisionerv1.ManifestRecord {
			switch provider {
			case "pg":
				return &provisionerv1.ManifestRecord{Provider: "pg", Digest: "sha256:aa", Manifest: &provisionerv1.Manifest{Offers: []*provisionerv1.Offer{{Provision: "main"}, {Provision: "ro"}}}}
			case "redis":
				return &provisionerv1.ManifestRecord{Provider: "redis", Digest: "sha256:bb", Manifest: &provisionerv1.Manifest{}}
			}
			return nil
		},
	}
	entries := map[string]*provisionerv1.RegistryEntry{}
	for _, e := range registry.Table() {
		entries[e.GetKind()] = e
	}
	sources.Registry = func(kind string) *provisionerv1.RegistryEntry { return entries[kind] }
	var d compose.PlanDigester
	f.Fuzz(func(t *testing.T, data []byte) {
		in := compose.Input{Node: "ace", Sources: sources, Items: items}
		if len(data)%4 == 3 {
			in.Module = modules[int(data[len(data)-1])%len(modules)]
		}
		if len(data)%4 >= 2 {
			in.Malformed = []*provisionerv1.MalformedKey{{Key: "ace.web.port.bad name", Reason: "a name of spaces"}, {Key: "ace.db", Reason: "too short"}}
		}
		for i := 0; i+4 <= len(data); i += 4 {
			module, kind, name, named := data[i], data[i+1], data[i+2], data[i+3]
			need := &provisionerv1.Need{
				Provider:  providers[int(named)%len(providers)],
				Provision: []string{"", "main", "ro", "other"}[int(named>>2)%4],
				Local:     []string{"", "x"}[int(named>>4)%2],
				Builds:    [][]string{nil, {"b1"}, {"b2"}, {"b0"}}[int(named>>5)%4],
			}
			in.Needs = append(in.Needs, &provisionerv1.NeedRecord{
				Node: "ace", Module: modules[int(module)%len(modules)], Kind: kinds[int(kind)%len(kinds)],
				Name: names[int(name)%len(names)], Need: need, Revision: uint64(i),
			})
		}
		want := compose.Digest(compose.Compose(in))
		if got := d.Digest(in); got != want {
			t.Errorf("PlanDigester %s, Digest of the composition %s", got, want)
		}
	})
}
