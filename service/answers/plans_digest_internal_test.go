package answers

import (
	"slices"
	"testing"

	"github.com/novox/mesh-provisioner/compose"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/service/plans"
)

// The plans room's digest of a node is the one the answers room's
// composition carries: held here, where both are in reach.

// The writer composes every node in turn: it keeps none of the decoded
// views, which would push out those that requests read again and, bounded
// as they are, hold the bound's worth of memory once every node is read.
func TestComposeForPlansKeepsNoDecodedView(t *testing.T) {
	t.Parallel()
	s, mesh, _ := startOnMesh(t, synth.Config{Nodes: 2, Modules: 3, Needs: 4})
	// A view kept is found again: two reads give the same entries.
	kept := func(node string) bool {
		a, _, _ := s.mirror.Needs.GroupOnce(node)
		b, _, _ := s.mirror.Needs.GroupOnce(node)
		return len(a) > 0 && a[0] == b[0]
	}
	written, read := mesh.Nodes[0].Name, mesh.Nodes[1].Name
	plans.Compose(s.mirror, written)
	if kept(written) {
		t.Errorf("composing %s for its plan digest kept its decoded view", written)
	}
	// A request's composition keeps them, which the check above sees.
	if _, _, werr := composeFrom(s.mirror, &provisionerv1.ComposeRequest{Node: read}, Encoding{}, unpaged, reading{views: keepViews}); werr != nil {
		t.Fatal(werr)
	}
	if !kept(read) {
		t.Errorf("composing %s for a request kept no decoded view", read)
	}
}

// The writer's digest of a node, made without composing it, is the one
// the node's compose answer carries, and it reads keys of the providers'
// buckets the composition reads: every node of a mesh with bound
// keys, manifests, collections and malformed keys, each digested in the
// same scratch in turn, in two orders.
func TestComposeForPlansDigestsAsTheAnswer(t *testing.T) {
	t.Parallel()
	s, mesh, _ := startOnMesh(t, synth.Config{Nodes: 6, Modules: 8, Needs: 12, Bound: 50})
	// The copy follows a provider's bucket once a composition names it,
	// and reads it meanwhile: each is named and read first, as a compose
	// request waits for it, or the writer and the answer after it could
	// read it before and after it came (a CI run on a loaded machine did).
	for _, n := range mesh.Nodes {
		waits, _ := s.boundUnread(n.Name)
		if werr := s.WaitRevisions(waits); werr != nil {
			t.Fatal(werr)
		}
	}
	for _, order := range []string{"in order", "reversed"} {
		for _, n := range mesh.Nodes {
			got := plans.Compose(s.mirror, n.Name)
			want, _, werr := composeFrom(s.mirror, &provisionerv1.ComposeRequest{Node: n.Name}, Encoding{}, unpaged, reading{views: dropViews})
			if werr != nil {
				t.Fatal(werr)
			}
			if len(want.GetPlans()) == 0 || len(want.GetProvisions()) == 0 || len(want.GetRefusals()) == 0 {
				t.Fatalf("%s composes %d plans, %d provisions and %d refusals: the mesh tests too little", n.Name, len(want.GetPlans()), len(want.GetProvisions()), len(want.GetRefusals()))
			}
			if got.Digest != want.GetPlanDigest() {
				t.Errorf("%s, %s: the writer's digest %s, the answer's %s", order, n.Name, got.Digest, want.GetPlanDigest())
			}
			// The buckets a composition reads keys of: its provisions', and
			// those of provisions refused for what the key's revision says.
			var buckets []string
			read := func(bucket string) {
				if !slices.Contains(buckets, bucket) {
					buckets = append(buckets, bucket)
				}
			}
			entries, _, _ := s.mirror.Needs.GroupOnce(n.Name)
			items, _, _ := s.mirror.Collect.GroupOnce(n.Name)
			builds, _ := s.mirror.BuildsOf(n.Name)
			sources := s.mirror.Sources(&builds)
			key := sources.Bound
			sources.Bound = func(bucket, k string) uint64 {
				read(bucket)
				return key(bucket, k)
			}
			in := compose.Input{Node: n.Name, Sources: sources, Items: mirror.WellFormed(nil, items)}
			in.Needs, in.Malformed = mirror.SplitNeeds(nil, nil, entries)
			compose.Compose(in)
			slices.Sort(buckets)
			if !slices.Equal(got.Buckets, buckets) {
				t.Errorf("%s: the writer read keys of %v, the composition of %v", n.Name, got.Buckets, buckets)
			}
		}
		slices.Reverse(mesh.Nodes)
	}
}
