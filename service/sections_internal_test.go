package service

import (
	"context"
	"fmt"
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
	"github.com/novox/mesh-provisioner/wire"
)

// A whole node composed from its sections is what composeFrom composes,
// after each kind of write a composition reads; a write to one of a node's
// needs composes again that need's section alone, and no other node's.
func TestSectionsComposeAsComposeFromDoes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, mesh, nc := startOnMesh(t, synth.Config{Nodes: 4, Modules: 6, Needs: 5, Builds: 30, Bound: 50}, Config{})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv := func(bucket string) jetstream.KeyValue {
		b, err := js.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
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

	// Every node composed, in both encodings, its sections kept: those
	// of each encoding, one after the other.
	check := func(after string) map[string][]*section {
		t.Helper()
		kept := map[string][]*section{}
		for _, n := range mesh.Nodes {
			req := &provisionerv1.ComposeRequest{Node: n.Name}
			want, _, werr := composeFrom(s.mirror, req, encoding{}, unpaged, reading{views: keepViews})
			if werr != nil {
				t.Fatal(werr)
			}
			for _, enc := range []encoding{{}, {json: true}} {
				data, _, ok := s.composeSections(req, enc, unpaged)
				if !ok { // asked for the first time since what it reads changed
					data, _, ok = s.composeSections(req, enc, unpaged)
				}
				if !ok {
					t.Fatalf("%s: %s, JSON %t: not composed from sections when asked again", after, n.Name, enc.json)
				}
				got := &provisionerv1.ComposeResponse{}
				if enc.json {
					err = protojson.Unmarshal(data, got)
				} else {
					err = proto.Unmarshal(data, got)
				}
				if err != nil {
					t.Fatalf("%s: %s, JSON %t: %v", after, n.Name, enc.json, err)
				}
				if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
					t.Fatalf("%s: %s, JSON %t (-composeFrom +sections):\n%s", after, n.Name, enc.json, diff)
				}
				kept[n.Name] = append(kept[n.Name], s.sections.get(sectionsKey{n.Name, enc.json}, sectionStampOf(s.mirror, n.Name)).sections...)
			}
		}
		return kept
	}
	// Each provider's bucket a node names is read once it is first asked.
	for _, n := range mesh.Nodes {
		if _, err := askCompose(nc, n.Name, false); err != nil {
			t.Fatal(err)
		}
	}
	before := check("first")

	for _, tt := range []struct {
		name  string
		write func() (wait revisionWait, err error)
		// newSections is how many of the node's sections are composed
		// again; -1: every one of every node's.
		newSections int // in each encoding
	}{
		{"a need written again unchanged", func() (revisionWait, error) {
			rev, err := needs.Put(ctx, firstKey, firstValue)
			return revisionWait{s.mirror.Needs, rev}, err
		}, 1},
		{"a need added to a module", func() (revisionWait, error) {
			rev, err := needs.Put(ctx, node.Name+"."+module+".port.extra", portValue)
			return revisionWait{s.mirror.Needs, rev}, err
		}, 1},
		{"a module's first need", func() (revisionWait, error) {
			rev, err := needs.Put(ctx, node.Name+".aaa.port.extra", portValue)
			return revisionWait{s.mirror.Needs, rev}, err
		}, 1},
		{"a key out of shape in a module", func() (revisionWait, error) {
			rev, err := needs.Put(ctx, node.Name+"."+module+".port", portValue)
			return revisionWait{s.mirror.Needs, rev}, err
		}, 1},
		{"a value that does not decode", func() (revisionWait, error) {
			rev, err := needs.Put(ctx, firstKey, []byte("\xff\xff"))
			return revisionWait{s.mirror.Needs, rev}, err
		}, 1},
		{"a need deleted", func() (revisionWait, error) {
			if err := needs.Delete(ctx, firstKey); err != nil {
				return revisionWait{}, err
			}
			e, err := needs.Get(ctx, node.Name+".aaa.port.extra") // a revision at least the delete's
			if err != nil {
				return revisionWait{}, err
			}
			return revisionWait{s.mirror.Needs, e.Revision() + 1}, nil
		}, 1},
		{"a module's builds", func() (revisionWait, error) {
			value, err := proto.Marshal(&provisionerv1.Applied{WantedBuild: "b9"})
			if err != nil {
				return revisionWait{}, err
			}
			rev, err := applied.Put(ctx, node.Name+"."+module, value)
			return revisionWait{s.mirror.Applied, rev}, err
		}, -1},
		{"a collection item", func() (revisionWait, error) {
			value, err := proto.Marshal(&provisionerv1.CollectItem{Value: "v"})
			if err != nil {
				return revisionWait{}, err
			}
			rev, err := collect.Put(ctx, node.Name+".shell_zsh.extra", value)
			return revisionWait{s.mirror.Collect, rev}, err
		}, -1},
		{"a provider's key", func() (revisionWait, error) {
			rev, err := bound.Put(ctx, node.Name+".any", []byte("bound"))
			return revisionWait{s.mirror.Bound.Bucket(wire.BoundBucket("pg")), rev}, err
		}, -1},
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
		if tt.newSections >= 0 {
			for _, n := range mesh.Nodes {
				want := 0
				if n.Name == node.Name {
					want = 2 * tt.newSections
				}
				if got := newSections(before[n.Name], after[n.Name]); got != want {
					t.Errorf("%s: %d of %s's %d sections composed again, want %d", tt.name, got, n.Name, len(after[n.Name]), want)
				}
			}
		}
		before = after
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
	s, mesh, nc := startOnMesh(t, synth.Config{Nodes: 4, Modules: 6, Needs: 5, Bound: 50}, Config{})
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
	if _, err := askCompose(nc, node, false); err != nil {
		t.Fatal(err)
	}
	// The digests the node goes through: one for each count of extra
	// needs, from none.
	const writes = 20
	initial, _, werr := composeFrom(s.mirror, &provisionerv1.ComposeRequest{Node: node}, encoding{}, unpaged, reading{views: keepViews})
	if werr != nil {
		t.Fatal(werr)
	}
	digests := map[string]bool{initial.GetPlanDigest(): true}
	ask := func(asJSON bool) (*provisionerv1.ComposeResponse, error) { return askCompose(nc, node, asJSON) }
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
		want, _, werr := composeFrom(s.mirror, &provisionerv1.ComposeRequest{Node: node}, encoding{}, unpaged, reading{views: keepViews})
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
		t.Error("sections of another stamp were returned")
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
	s, mesh, nc := startOnMesh(t, synth.Config{Nodes: 2, Modules: 6, Needs: 5}, Config{})
	node := mesh.Nodes[0].Name
	// The providers' buckets the node names are read once it is first asked.
	if _, err := askCompose(nc, node, false); err != nil {
		t.Fatal(err)
	}
	req := &provisionerv1.ComposeRequest{Node: node}
	key := sectionsKey{node: node}
	if kept := s.sections.get(key, sectionStampOf(s.mirror, node)); kept == nil || kept.whole || len(kept.sections) > 0 {
		t.Fatalf("asked once: %+v kept, want the note of a node asked once", kept)
	}
	const budget = 1 << 10 // less than the node's composition
	for i := range 2 {
		if _, _, ok := s.composeSections(req, encoding{}, budget); ok {
			t.Fatalf("request %d: answered from sections in more than %d bytes", i, budget)
		}
		if kept := s.sections.get(key, sectionStampOf(s.mirror, node)); kept == nil || !kept.whole {
			t.Fatalf("request %d: %+v kept, want the note of a node too large for sections", i, kept)
		}
	}
	if _, _, ok := s.composeSections(req, encoding{}, unpaged); ok {
		t.Fatal("a node noted too large was composed in sections before what it reads changed")
	}
}
