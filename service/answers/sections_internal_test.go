package answers

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/registry"
	"github.com/novox/mesh-provisioner/wire"
)

// A whole node composed from its sections is what composeFrom composes,
// after each kind of write a composition reads; a write to one of a node's
// needs composes again that need's section alone, and no other node's.
func TestSectionsComposeAsComposeFromDoes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, mesh, nc := startOnMesh(t, synth.Config{Nodes: 4, Modules: 6, Needs: 5, Builds: 30, Bound: 50})
	kv := bucketsOn(t, nc)
	needs, applied, collect := kv(keys.NeedsBucket), kv(keys.AppliedBucket), kv(keys.CollectBucket)
	bound := kv(wire.BoundBucket("pg"))
	node := mesh.Nodes[1]
	first := node.Needs[0]
	firstKey, err := keys.NeedKey{Node: node.Name, Module: first.Module, Kind: first.Kind, Name: first.Name}.Key()
	if err != nil {
		t.Fatal(err)
	}
	firstValue, err := proto.Marshal(first.Need)
	if err != nil {
		t.Fatal(err)
	}
	portValue, err := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:extra}"})
	if err != nil {
		t.Fatal(err)
	}
	module := first.Module

	// Every node composed, in both encodings, its sections kept.
	check := func(after string) map[string][]*section {
		t.Helper()
		kept := map[string][]*section{}
		for _, n := range mesh.Nodes {
			kept[n.Name] = checkSections(t, s, n.Name, after)
		}
		return kept
	}
	// Each provider's bucket a node names is read once it is first asked.
	for _, n := range mesh.Nodes {
		if _, err := askCompose(s, n.Name, false); err != nil {
			t.Fatal(err)
		}
	}
	before := check("first")

	for _, tt := range []struct {
		name  string
		write func() (wait RevisionWait, err error)
		// newSections is how many of the node's sections are composed
		// again (none of another node's); -1: every one of the node's.
		newSections int // in each encoding
	}{
		{"a need written again unchanged", func() (RevisionWait, error) {
			rev, err := needs.Put(ctx, firstKey, firstValue)
			return RevisionWait{s.mirror.Needs, rev}, err
		}, 1},
		{"a need added to a module", func() (RevisionWait, error) {
			rev, err := needs.Put(ctx, node.Name+"."+module+".port.extra", portValue)
			return RevisionWait{s.mirror.Needs, rev}, err
		}, 1},
		{"a module's first need", func() (RevisionWait, error) {
			rev, err := needs.Put(ctx, node.Name+".aaa.port.extra", portValue)
			return RevisionWait{s.mirror.Needs, rev}, err
		}, 1},
		{"a key out of shape in a module", func() (RevisionWait, error) {
			rev, err := needs.Put(ctx, node.Name+"."+module+".port", portValue)
			return RevisionWait{s.mirror.Needs, rev}, err
		}, 1},
		{"a value that does not decode", func() (RevisionWait, error) {
			rev, err := needs.Put(ctx, firstKey, []byte("\xff\xff"))
			return RevisionWait{s.mirror.Needs, rev}, err
		}, 1},
		{"a need deleted", func() (RevisionWait, error) {
			if err := needs.Delete(ctx, firstKey); err != nil {
				return RevisionWait{}, err
			}
			// Delete returns no revision; the key's history ends with the
			// delete marker, which has it.
			history, err := needs.History(ctx, firstKey)
			if err != nil {
				return RevisionWait{}, err
			}
			return RevisionWait{s.mirror.Needs, history[len(history)-1].Revision()}, nil
		}, 1},
		{"a module's builds", func() (RevisionWait, error) {
			value, err := proto.Marshal(&provisionerv1.Applied{WantedBuild: "b9"})
			if err != nil {
				return RevisionWait{}, err
			}
			rev, err := applied.Put(ctx, node.Name+"."+module, value)
			return RevisionWait{s.mirror.Applied, rev}, err
		}, -1},
		{"a collection item", func() (RevisionWait, error) {
			value, err := proto.Marshal(&provisionerv1.CollectItem{Value: "v"})
			if err != nil {
				return RevisionWait{}, err
			}
			rev, err := collect.Put(ctx, node.Name+".shell_zsh.extra", value)
			return RevisionWait{s.mirror.Collect, rev}, err
		}, -1},
		{"a provider's key", func() (RevisionWait, error) {
			rev, err := bound.Put(ctx, node.Name+".any", []byte("bound"))
			return RevisionWait{s.mirror.Bound.Bucket(wire.BoundBucket("pg")), rev}, err
		}, -1},
		{"a provider's key of another node", func() (RevisionWait, error) {
			rev, err := bound.Put(ctx, "zed.any", []byte("bound"))
			return RevisionWait{s.mirror.Bound.Bucket(wire.BoundBucket("pg")), rev}, err
		}, 0},
	} {
		wait, err := tt.write()
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if !wait.bucket.WaitFor(wctx, wait.revision) {
			t.Fatalf("%s: the copy did not reach revision %d", tt.name, wait.revision)
		}
		cancel()
		after := check(tt.name)
		for _, n := range mesh.Nodes {
			want := 0
			switch {
			case n.Name != node.Name:
			case tt.newSections < 0:
				want = len(after[n.Name])
			default:
				want = 2 * tt.newSections
			}
			if got := newSections(before[n.Name], after[n.Name]); got != want {
				t.Errorf("%s: %d of %s's %d sections composed again, want %d", tt.name, got, n.Name, len(after[n.Name]), want)
			}
		}
		before = after
	}
}

// checkSections composes node from its sections in both encodings, fails
// t unless each equals what composeFrom composes, and returns the sections
// kept: those of each encoding, one after the other.
func checkSections(t *testing.T, s *Answers, node, after string) []*section {
	t.Helper()
	req := &provisionerv1.ComposeRequest{Node: node}
	want, _, werr := composeFrom(s.mirror, req, Encoding{}, unpaged, reading{views: keepViews})
	if werr != nil {
		t.Fatal(werr)
	}
	var kept []*section
	for _, enc := range []Encoding{{}, {json: true}} {
		data, _, ok := s.composeSections(req, enc, unpaged)
		if !ok { // asked for the first time since what it reads changed
			data, _, ok = s.composeSections(req, enc, unpaged)
		}
		if !ok {
			t.Fatalf("%s: %s, JSON %t: not composed from sections when asked again", after, node, enc.json)
		}
		got := &provisionerv1.ComposeResponse{}
		var err error
		if enc.json {
			err = protojson.Unmarshal(data, got)
		} else {
			err = proto.Unmarshal(data, got)
		}
		if err != nil {
			t.Fatalf("%s: %s, JSON %t: %v", after, node, enc.json, err)
		}
		// proto.Equal first: cmp.Diff's reflection takes some 20 ms an answer.
		if !proto.Equal(want, got) {
			t.Fatalf("%s: %s, JSON %t (-composeFrom +sections):\n%s", after, node, enc.json, cmp.Diff(want, got, protocmp.Transform()))
		}
		kept = append(kept, s.sections.get(sectionsKey{node, enc.json}, sectionStampOf(s.mirror, node)).sections...)
	}
	return kept
}

// Whatever a node writes, in whatever order, its composition from its
// sections is composeFrom's: seeded random writes to its needs (rewritten,
// added, deleted, out of shape, undecodable), among them modules whose
// keys interleave ("<node>.web", out of shape, sorts before web-1's keys,
// which sort before web's), and now and then to its applied records,
// items, a provider's keys and manifest, and the registry: each part of
// sectionStamp, and the needs' identity, is relied on by some step. The
// node is compared after each write.
func TestSectionsComposeAsComposeFromAfterRandomWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, mesh, nc := startOnMesh(t, synth.Config{Nodes: 2, Modules: 17, Needs: 4, Builds: 30, Bound: 50})
	kv := bucketsOn(t, nc)
	needs, applied, collect := kv(keys.NeedsBucket), kv(keys.AppliedBucket), kv(keys.CollectBucket)
	registryKV, manifests := kv(keys.RegistryBucket), kv(keys.ManifestsBucket)
	bound := kv(wire.BoundBucket("pg"))
	node := mesh.Nodes[0]
	manifestKey, err := keys.ManifestKey{Node: node.Name, Provider: "pg"}.Key()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := askCompose(s, node.Name, false); err != nil { // the providers' buckets it names are followed
		t.Fatal(err)
	}
	// settled waits until every copy the writes reach holds them.
	settled := func(step int) {
		t.Helper()
		for _, w := range []struct {
			kv   jetstream.KeyValue
			copy revisionSource
		}{
			{needs, s.mirror.Needs}, {applied, s.mirror.Applied}, {collect, s.mirror.Collect},
			{registryKV, s.mirror.Registry}, {manifests, s.mirror.Manifests},
			{bound, s.mirror.Bound.Bucket(wire.BoundBucket("pg"))},
		} {
			status, err := w.kv.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if last := status.(*jetstream.KeyValueBucketStatus).StreamInfo().State.LastSeq; !w.copy.WaitFor(wctx, last) {
				t.Fatalf("step %d: the copy of %s did not reach revision %d", step, w.kv.Bucket(), last)
			}
			cancel()
		}
	}
	marshal := func(m proto.Message) []byte {
		value, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return value
	}
	needKey := func(n synth.Need) string {
		key, err := keys.NeedKey{Node: node.Name, Module: n.Module, Kind: n.Kind, Name: n.Name}.Key()
		if err != nil {
			t.Fatal(err)
		}
		return key
	}
	rng := rand.New(rand.NewPCG(23, 1))
	builds := [][]string{nil, {"b1"}, {"b2"}}
	checkSections(t, s, node.Name, "before any write")
	for step := range 150 {
		var what string
		var err error
		switch op := rng.IntN(22); {
		case op < 6:
			n := node.Needs[rng.IntN(len(node.Needs))]
			need := proto.CloneOf(n.Need)
			need.Required, need.Builds = rng.IntN(2) == 0, builds[rng.IntN(len(builds))]
			what = "rewrote " + needKey(n)
			_, err = needs.Put(ctx, needKey(n), marshal(need))
		case op < 10:
			module := []string{"web", "web-1", "api", "zz"}[rng.IntN(4)]
			name := fmt.Sprintf("extra%d", rng.IntN(4))
			what = "added " + module + "." + name
			_, err = needs.Put(ctx, node.Name+"."+module+".port."+name, marshal(&provisionerv1.Need{Placeholder: "${port:" + name + "}"}))
		case op < 13:
			key := needKey(node.Needs[rng.IntN(len(node.Needs))])
			if rng.IntN(2) == 0 {
				key = fmt.Sprintf("%s.%s.port.extra%d", node.Name, []string{"web", "web-1", "api", "zz"}[rng.IntN(4)], rng.IntN(4))
			}
			what = "deleted " + key
			err = needs.Delete(ctx, key)
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				err = nil
			}
		case op < 15:
			key := []string{node.Name + ".web", node.Name + ".web-1.port", node.Name + ".zz"}[rng.IntN(3)]
			what = "wrote out of shape " + key
			_, err = needs.Put(ctx, key, []byte("x"))
		case op < 16:
			key := needKey(node.Needs[rng.IntN(len(node.Needs))])
			what = "wrote undecodable " + key
			_, err = needs.Put(ctx, key, []byte("\xff\xff"))
		case op < 17:
			module := node.Needs[rng.IntN(len(node.Needs))].Module
			what = "applied " + module
			_, err = applied.Put(ctx, node.Name+"."+module, marshal(&provisionerv1.Applied{WantedBuild: []string{"", "b1", "b2"}[rng.IntN(3)]}))
		case op < 18:
			item := node.Items[rng.IntN(len(node.Items))]
			key, kerr := keys.CollectKey{Node: node.Name, Collection: item.Collection, Contributor: item.Contributor}.Key()
			if kerr != nil {
				t.Fatal(kerr)
			}
			what = "collected " + key
			_, err = collect.Put(ctx, key, marshal(&provisionerv1.CollectItem{Value: fmt.Sprint(step)}))
		case op < 19:
			// The registry without one of its entries, or whole.
			table := registry.Table()
			if rng.IntN(2) == 0 {
				i := rng.IntN(len(table))
				what = "registry without " + table[i].GetKind()
				table = slices.Delete(table, i, i+1)
			} else {
				what = "registry whole"
			}
			_, err = registry.Reconcile(ctx, registryKV, table)
		case op < 20:
			// pg's manifest offering its first n provisions.
			offers := []*provisionerv1.Offer{}
			for i := range rng.IntN(5) {
				offers = append(offers, &provisionerv1.Offer{Provision: fmt.Sprintf("db%d", i)})
			}
			what = fmt.Sprintf("pg offers %d", len(offers))
			_, err = manifests.Put(ctx, manifestKey, marshal(&provisionerv1.Manifest{Offers: offers}))
		default:
			// A key of pg's that the node's bound needs read, bound or
			// unbound.
			key := node.Name + ".web.db0"
			for _, n := range node.Needs {
				if n.Need.GetProvider() == "pg" && rng.IntN(2) == 0 {
					provision := n.Need.GetProvision()
					if provision == "" {
						provision = n.Name
					}
					key = node.Name + "." + n.Module + "." + provision
					if n.Need.GetLocal() != "" {
						key += "." + n.Need.GetLocal()
					}
				}
			}
			if rng.IntN(2) == 0 {
				what = "bound " + key
				_, err = bound.Put(ctx, key, []byte("bound"))
			} else {
				what = "unbound " + key
				err = bound.Delete(ctx, key)
				if errors.Is(err, jetstream.ErrKeyNotFound) {
					err = nil
				}
			}
		}
		if err != nil {
			t.Fatalf("step %d, %s: %v", step, what, err)
		}
		settled(step)
		checkSections(t, s, node.Name, fmt.Sprintf("step %d, %s", step, what))
	}
}

// newSections counts the sections of after that before does not hold.
func newSections(before, after []*section) int {
	kept := map[*section]bool{}
	for _, s := range before {
		kept[s] = true
	}
	n := 0
	for _, s := range after {
		if !kept[s] {
			n++
		}
	}
	return n
}

// Askers ask for whole nodes, in both encodings, while their needs are written:
// every answer is a composition that composeFrom makes of the copy at one
// of the revisions the needs went through, and the race detector sees the
// sections shared.
func TestSectionsSharedByAskersWhileNeedsAreWritten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, mesh, nc := startOnMesh(t, synth.Config{Nodes: 4, Modules: 6, Needs: 5, Bound: 50})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	needs, err := js.KeyValue(ctx, keys.NeedsBucket)
	if err != nil {
		t.Fatal(err)
	}
	value, err := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:extra}"})
	if err != nil {
		t.Fatal(err)
	}
	node := mesh.Nodes[0].Name
	// The providers' buckets the node names are read once it is first asked.
	if _, err := askCompose(s, node, false); err != nil {
		t.Fatal(err)
	}
	// The digests the node goes through: one for each count of extra
	// needs, from none.
	const writes = 20
	initial, _, werr := composeFrom(s.mirror, &provisionerv1.ComposeRequest{Node: node}, Encoding{}, unpaged, reading{views: keepViews})
	if werr != nil {
		t.Fatal(werr)
	}
	digests := map[string]bool{initial.GetPlanDigest(): true}
	ask := func(asJSON bool) (*provisionerv1.ComposeResponse, error) { return askCompose(s, node, asJSON) }
	var wg sync.WaitGroup
	done := make(chan struct{})
	var seen sync.Map // digest -> true
	for asker := range 4 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				got, err := ask(asker%2 == 1)
				if err != nil {
					t.Error(err)
					return
				}
				seen.Store(got.GetPlanDigest(), true)
			}
		})
	}
	for i := range writes {
		rev, err := needs.Put(ctx, fmt.Sprintf("%s.%s.port.extra%02d", node, mesh.Nodes[0].Needs[0].Module, i), value)
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if !s.mirror.Needs.WaitFor(wctx, rev) {
			t.Fatalf("the copy did not reach revision %d", rev)
		}
		cancel()
		want, _, werr := composeFrom(s.mirror, &provisionerv1.ComposeRequest{Node: node}, Encoding{}, unpaged, reading{views: keepViews})
		if werr != nil {
			t.Fatal(werr)
		}
		digests[want.GetPlanDigest()] = true
		for _, asJSON := range []bool{false, true} {
			got, err := ask(asJSON)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got, protocmp.Transform(), protocmp.IgnoreFields(&provisionerv1.ComposeResponse{}, "phases", "revisions")); diff != "" {
				t.Fatalf("write %d, JSON %t (-composeFrom +asked):\n%s", i, asJSON, diff)
			}
		}
	}
	close(done)
	wg.Wait()
	seen.Range(func(digest, _ any) bool {
		if !digests[digest.(string)] {
			t.Errorf("an asker was answered %s, the digest of no revision the node went through", digest)
		}
		return true
	})
}

// The sections kept stay within their budget, the node put last kept, and
// a node's sections larger than an eighth of it are not kept at all.
func TestSectionCacheKeepsWithinItsBudget(t *testing.T) {
	t.Parallel()
	c := newSectionCache(8 << 10)
	for i := range 100 {
		node := sectionsKey{node: fmt.Sprintf("n%d", i)}
		c.put(node, &nodeSections{stamp: sectionStamp{registry: 1}, bytes: 1 << 10})
		if c.get(node, sectionStamp{registry: 1}) == nil {
			t.Fatalf("%s was not kept", node.node)
		}
		if c.bytes > c.limit || len(c.byNode) > 8 {
			t.Fatalf("after %s: %d bytes in %d nodes kept, over the %d bytes allowed", node.node, c.bytes, len(c.byNode), c.limit)
		}
	}
	if c.get(sectionsKey{node: "n99"}, sectionStamp{registry: 2}) != nil {
		t.Error("sections of another Stamp were returned")
	}
	c.put(sectionsKey{node: "large"}, &nodeSections{bytes: 1<<10 + 1})
	if c.get(sectionsKey{node: "large"}, sectionStamp{}) != nil {
		t.Error("sections larger than an eighth of the budget were kept")
	}
}

// A node whose composition does not fit one answer is composed in
// sections once, then whole (and paged) while what its composition reads
// beyond its needs is unchanged: its sections are not made again for
// nothing at each request.
func TestSectionsGiveWayToPagesForALargeNode(t *testing.T) {
	t.Parallel()
	s, mesh, _ := startOnMesh(t, synth.Config{Nodes: 2, Modules: 6, Needs: 5})
	node := mesh.Nodes[0].Name
	// The providers' buckets the node names are read once it is first asked.
	if _, err := askCompose(s, node, false); err != nil {
		t.Fatal(err)
	}
	req := &provisionerv1.ComposeRequest{Node: node}
	key := sectionsKey{node: node}
	if kept := s.sections.get(key, sectionStampOf(s.mirror, node)); kept == nil || kept.whole || len(kept.sections) > 0 {
		t.Fatalf("asked once: %+v kept, want the note of a node asked once", kept)
	}
	budget := Budget{Fill: 1 << 10, Most: 1 << 20} // filled with less than the node's composition
	for i := range 2 {
		if _, _, ok := s.composeSections(req, Encoding{}, budget); ok {
			t.Fatalf("request %d: answered from sections in more than %d bytes", i, budget.Fill)
		}
		if kept := s.sections.get(key, sectionStampOf(s.mirror, node)); kept == nil || !kept.whole {
			t.Fatalf("request %d: %+v kept, want the note of a node too large for sections", i, kept)
		}
	}
	if _, _, ok := s.composeSections(req, Encoding{}, unpaged); ok {
		t.Fatal("a node noted too large was composed in sections before what it reads changed")
	}
}

// A composition built in sections for one request has its tail added in
// the room the sections left (Encoding.JoinOwned), not to a copy, and is
// cached as the answer's prefix, clipped: an answer made of it later with
// another tail is new, and leaves the first answer's bytes as they were
// sent. Each decodes to what composeFrom composes.
func TestABuiltCompositionIsCachedAsItsAnswersPrefix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, mesh, nc := startOnMesh(t, synth.Config{Nodes: 2, Modules: 6, Needs: 5, Bound: 50})
	needs := bucketsOn(t, nc)(keys.NeedsBucket)
	node := mesh.Nodes[0]
	if _, err := askCompose(s, node.Name, false); err != nil { // noted, its providers' buckets read
		t.Fatal(err)
	}
	value, err := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:extra}"})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := needs.Put(ctx, node.Name+"."+node.Needs[0].Module+".port.extra", value)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if !s.mirror.Needs.WaitFor(wctx, rev) {
		t.Fatalf("the copy did not reach revision %d", rev)
	}
	want, _, werr := composeFrom(s.mirror, &provisionerv1.ComposeRequest{Node: node.Name}, Encoding{}, unpaged, reading{views: keepViews})
	if werr != nil {
		t.Fatal(werr)
	}
	verb, in := s.Compose(), &provisionerv1.ComposeRequest{Node: node.Name}
	answer, body, werr := verb.Respond(s, in, Encoding{}, 0)
	if werr != nil {
		t.Fatal(werr)
	}
	if len(body) == 0 || &body[0] != &answer[0] || cap(body) != len(body) {
		t.Fatalf("the body cached is not the answer's prefix, clipped (the tail went to a copy?): len %d cap %d, answer %d", len(body), cap(body), len(answer))
	}
	sent := slices.Clone(answer)
	// Asked again after a wait: the answer cached with another tail.
	again, _, _, ok := verb.Lookup(s, in, Encoding{}, time.Millisecond)
	if !ok {
		t.Fatal("the answer built was not cached")
	}
	if &again[0] == &answer[0] {
		t.Error("the answer reused shares the first answer's bytes")
	}
	if !slices.Equal(answer, sent) {
		t.Error("the first answer's bytes changed once its body was reused")
	}
	for name, data := range map[string][]byte{"built": answer, "reused": again} {
		got := &provisionerv1.ComposeResponse{}
		if err := proto.Unmarshal(data, got); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if diff := cmp.Diff(want.GetPlans(), got.GetPlans(), protocmp.Transform()); diff != "" {
			t.Errorf("%s: plans (-composeFrom +answer):\n%s", name, diff)
		}
		if got.GetPlanDigest() != want.GetPlanDigest() || got.GetRevisions().GetNeeds() < rev {
			t.Errorf("%s: digest %s at needs %d, want %s at %d or later", name, got.GetPlanDigest(), got.GetRevisions().GetNeeds(), want.GetPlanDigest(), rev)
		}
	}
}
